"""README.md's Python blocks run as written, and its JSONL example rows are rows of the real task files.

Each block runs in a scratch folder laid out like a clone beside the task data (``../shared/datasets``
is the data folder the tests use), with the session's embedding cache and an empty user config. One
thing is shrunk: the quick start's ``run_study`` call gets 1 trial of 2 epochs on a few examples with
1 worker and 1 final seed instead of its 8 x 10 epochs. Its arguments are first bound to the real
signature, so an argument the README names and ``run_study`` lacks still fails here.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import re
import textwrap
from pathlib import Path

import pytest

from ilge_search.study import StudyOptions

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
SHRUNK_STUDY = {"n_trials": 1, "max_train": 90, "max_eval": 60, "max_epochs": 2, "workers": 1, "final_seeds": 1}


def _blocks(language: str) -> list:
    """The fenced blocks of ``language``, list-indented ones included, dedented."""
    found = re.finditer(rf"^( *)```{language}\n(.*?)^\1```", README, flags=re.S | re.M)
    return [textwrap.dedent(match.group(2)) for match in found]


def _loads_a_model(block: str) -> bool:
    return "ILGEClassifier(" in block or "run_study(" in block


def _python_params() -> list:
    params = []
    for number, block in enumerate(_blocks("python")):
        first = next(line for line in block.splitlines() if line.strip() and not line.startswith(("import", "from")))
        marks = [pytest.mark.slow, pytest.mark.realmodel] if _loads_a_model(block) else []
        name = re.sub(r"\W+", "_", first)[:30]
        params.append(pytest.param(block, id=f"{number}-{name}", marks=marks))
    return params


@pytest.fixture()
def clone(tmp_path, data_dir, cache_dir, monkeypatch):
    """A working folder with ``../shared/datasets`` beside it, as for a clone next to the shared data."""
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "datasets").symlink_to(Path(data_dir).resolve(), target_is_directory=True)
    work = tmp_path / "clone"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("ILGE_SEARCH_CACHE", str(cache_dir))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # the shipped recommended defaults
    monkeypatch.delenv("ILGE_SEARCH_DATA", raising=False)
    monkeypatch.delenv("ILGE_SEARCH_DEFAULTS", raising=False)
    return work


@pytest.fixture()
def shrunk_run_study(monkeypatch):
    import ilge_search
    from ilge_search.study import run_study

    calls = []

    def shrunk(*args, **kwargs):
        inspect.signature(run_study).bind(*args, **kwargs)  # what the README passes must exist
        calls.append(kwargs)
        options = kwargs.get("options") or StudyOptions()
        return run_study(*args, **{**kwargs, "options": options.replace(**SHRUNK_STUDY)})

    monkeypatch.setattr(ilge_search, "run_study", shrunk)
    return calls


def test_the_readme_has_the_blocks_this_file_runs():
    python = _blocks("python")
    assert len(python) >= 3
    assert sum(_loads_a_model(block) for block in python) >= 2
    assert any("build_aggregator(" in block for block in python)
    assert len(_blocks("json")) >= 2


@pytest.mark.parametrize("block", _python_params())
def test_python_block_runs_as_written(block, clone, shrunk_run_study):
    out = io.StringIO()
    namespace: dict = {"__name__": "__readme__"}
    with contextlib.redirect_stdout(out):
        exec(compile(block, "README.md", "exec"), namespace)
    printed = out.getvalue()
    if "run_study(" in block:
        assert len(shrunk_run_study) == 1
        assert shrunk_run_study[0]["options"].data.data_dir == "../shared/datasets"
        lines = printed.splitlines()
        assert [line.split()[0].split(":")[:3] for line in lines] == [
            ["minilm-l6", "trec", "cayley"],
            ["minilm-l6", "trec", "last-layer"],
        ], printed
        assert all(0.0 < float(line.split()[1]) <= 1.0 for line in lines), printed  # a test accuracy
        assert (clone / "studies" / "ilge.db").is_file()  # the default storage, relative to where it ran
    elif "ILGEClassifier(" in block:
        accuracy = float(printed.split()[-1])
        assert accuracy > 0.7, printed  # TREC's 6 question types from 500 texts (chance: about 0.2)
        assert (clone / "my-classifier" / "ilge_classifier.json").is_file()
    if "build_aggregator(" in block:
        assert tuple(namespace["logits"].shape) == (8, 6)


@pytest.mark.parametrize("block", _blocks("json"), ids=lambda block: next(iter(json.loads(block))))
def test_the_jsonl_example_rows_are_rows_of_the_shared_data(block, data_dir):
    row = json.loads(block)
    assert "\n" not in block.strip(), "one JSONL row per block"
    task = "trec" if "text" in row else "stsb"
    with open(Path(data_dir) / task / "train.jsonl", encoding="utf-8") as rows:
        assert any({key: json.loads(line).get(key) for key in row} == row for line in rows), row
