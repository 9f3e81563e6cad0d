"""Every Python block of README.md and of every documentation page (docs/*.md) runs as written, and the JSONL
example rows are rows of the real task files.

Each block runs in a scratch folder laid out like a clone beside the task data (``../shared/datasets`` is the
data folder the tests use, ``examples/`` the clone's own), with the session's embedding cache and an empty user
config. One thing is shrunk: a ``run_study`` call gets 1 trial of 2 epochs on a few examples with 1 worker and 1
final seed instead of its budget. Its arguments are first bound to the real signature, so an argument the docs
name and ``run_study`` lacks still fails here.
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
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHRUNK_STUDY = {"n_trials": 1, "max_train": 90, "max_eval": 60, "max_epochs": 2, "workers": 1, "final_seeds": 1}


def _where(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _blocks(language: str, pages=PAGES) -> list:
    """(page, block) for the fenced blocks of ``language``, list-indented ones included, dedented."""
    found = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(rf"^( *)```{language}\n(.*?)^\1```", text, flags=re.S | re.M):
            found.append((page, textwrap.dedent(match.group(2))))
    return found


def _loads_a_model(block: str) -> bool:
    return any(call in block for call in ("ILGEClassifier(", "ILGETagger(", "run_study("))


def _python_params() -> list:
    params = []
    for number, (page, block) in enumerate(_blocks("python")):
        first = next(line for line in block.splitlines() if line.strip() and not line.startswith(("import", "from")))
        marks = [pytest.mark.slow, pytest.mark.realmodel] if _loads_a_model(block) else []
        name = re.sub(r"\W+", "_", first)[:30]
        params.append(pytest.param(page, block, id=f"{page.stem}-{number}-{name}", marks=marks))
    return params


@pytest.fixture()
def clone(tmp_path, data_dir, cache_dir, monkeypatch):
    """A working folder with ``examples/`` in it and ``../shared/datasets`` beside it, as for a clone next to
    the shared data."""
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "datasets").symlink_to(Path(data_dir).resolve(), target_is_directory=True)
    work = tmp_path / "clone"
    work.mkdir()
    (work / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
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
        inspect.signature(run_study).bind(*args, **kwargs)  # what the docs pass must exist
        calls.append(kwargs)
        options = kwargs.get("options") or StudyOptions()
        return run_study(*args, **{**kwargs, "options": options.replace(**SHRUNK_STUDY)})

    monkeypatch.setattr(ilge_search, "run_study", shrunk)
    return calls


def test_the_docs_have_the_blocks_this_file_runs():
    python = [block for _, block in _blocks("python")]
    assert len(python) >= 4
    assert sum(_loads_a_model(block) for block in python) >= 3
    assert any("build_aggregator(" in block for block in python)
    assert [page.name for page, _ in _blocks("python", [ROOT / "README.md"])] == ["README.md"]  # its 5 lines
    assert len(_blocks("json", ROW_PAGES)) >= 2


def _check_quick_start(printed: str, calls: list, clone: Path) -> None:
    """The user guide's quick start: two studies on the shipped banking77 subset, each printing its test
    accuracy."""
    assert len(calls) == 1
    assert calls[0]["options"].data.data_dir == "examples/data"
    lines = printed.splitlines()
    assert [line.split()[0].split(":")[:3] for line in lines] == [
        ["minilm-l6", "banking77", "cayley"],
        ["minilm-l6", "banking77", "last-layer"],
    ], printed
    assert all(0.0 < float(line.split()[1]) <= 1.0 for line in lines), printed  # a test accuracy
    assert (clone / "studies" / "ilge.db").is_file()  # the default storage, relative to where it ran


@pytest.mark.parametrize("page, block", _python_params())
def test_python_block_runs_as_written(page, block, clone, shrunk_run_study):
    out = io.StringIO()
    namespace: dict = {"__name__": "__docs__"}
    with contextlib.redirect_stdout(out):
        exec(compile(block, _where(page), "exec"), namespace)
    printed = out.getvalue()
    if 'run_study("minilm-l6", "banking77"' in block:
        _check_quick_start(printed, shrunk_run_study, clone)
    elif "ILGEClassifier(" in block:
        # banking77's 77 intents from a third of the shipped subset, about 7 per intent (chance: about 0.013;
        # measured 0.62), or TREC's 6 question types from 500 texts (chance: about 0.2)
        accuracy = float(printed.split()[-1])
        assert accuracy > (0.5 if "banking77" in block else 0.7), printed
        if ".save(" in block:
            assert (clone / "my-classifier" / "ilge_classifier.json").is_file()
    if "build_aggregator(" in block and "logits" in namespace:
        assert tuple(namespace["logits"].shape) == (8, 6)


ROW_PAGES = [ROOT / "docs" / "guide.md"]  # where the JSONL layout's example rows are quoted from the shared data


@pytest.mark.parametrize(
    "page, block", _blocks("json", ROW_PAGES), ids=lambda value: value.name if isinstance(value, Path) else "row"
)
def test_the_jsonl_example_rows_are_rows_of_the_shared_data(page, block, data_dir):
    row = json.loads(block)
    assert "\n" not in block.strip(), f"one JSONL row per block ({_where(page)})"
    task = "trec" if "text" in row else "ud_ewt_pos" if "tokens" in row else "stsb"
    with open(Path(data_dir) / task / "train.jsonl", encoding="utf-8") as rows:
        assert any({key: json.loads(line).get(key) for key in row} == row for line in rows), row
