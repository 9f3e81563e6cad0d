"""Every refusal of ``run`` leaves the folder it was pointed at exactly as it was.

Each case runs ``ilge-search run`` with the storage, the cache and the artifact store inside one folder and
compares the folder's files (names and bytes) before and after: no SQLite file, no ``.lock``, no artifact or
cache folder. The refusals come from ``study/plan.py``'s ``check_run`` (the settings against the data, the
storage, a name already used for other data, ``--warm-start``) and the command line's own checks; before, every
check that needed the stored studies ran after the storage had been opened for writing, so a refused warm start
left an empty database and its lock behind.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from click.testing import CliRunner
from reliability_helpers import MODEL, labelled, one_line_error, sqlite_url, write_task

from ilge_search.cli import cli
from ilge_search.record import Identity


def snapshot(folder: Path) -> dict[str, str]:
    """Every file and folder under ``folder``: relative path -> content hash (``dir`` for folders)."""
    out = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        out[key] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture()
def place(tmp_path) -> Path:
    """The folder a run is pointed at: a small custom task in it, nothing else yet."""
    labels = [f"l{i}" for i in range(4)]
    write_task(
        tmp_path / "task",
        {"train": labelled(40, labels), "validation": labelled(16, labels, 200), "test": labelled(16, labels, 300)},
    )
    return tmp_path


def run_in(place: Path, *more: str, db: str = "studies/s.db"):
    args = ["run", "--model", MODEL, "--task", str(place / "task"), "--storage", sqlite_url(place / db)]
    args += ["--cache-dir", str(place / "cache"), "--device", "cpu", "--quiet", "--n-trials", "2"]
    return CliRunner().invoke(cli, [*args, *more])


def assert_refused_and_untouched(place: Path, *more: str, db: str = "studies/s.db") -> str:
    before = snapshot(place)
    message = one_line_error(run_in(place, *more, db=db))
    assert snapshot(place) == before, f"a refused run changed {place}: {message}"
    return message


REFUSALS = {
    "warm start larger than the portfolio": (("--warm-start", "50"), "--warm-start 50"),
    "warm start on a baseline encoder": (("--warm-start", "2", "--encoder", "last-layer"), "last-layer has none"),
    "threads above the CPUs": (("--threads", "100000"), "--threads"),
    "shots cut again by max-train": (("--shots", "10", "--max-train", "20"), "--shots"),
    "more folds than the largest label": (("--cv", "40"), "fold"),
    "a study name with a control character": (("--study-name", "a\nb"), "control"),
    "one study name for two encoders": (("--study-name", "x", "--encoder", "cayley", "--encoder", "fc"), "one"),
    "artifact folder under a file": (("--artifact-dir", "{place}/task/train.jsonl/artifacts"), "artifact"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_refused_run_on_a_new_storage_creates_nothing(place, case, no_model_loads):
    options, expected = REFUSALS[case]
    options = tuple(option.replace("{place}", str(place)) for option in options)
    message = assert_refused_and_untouched(place, *options)
    assert expected in message


def test_a_refused_run_on_an_existing_storage_changes_no_byte(place, no_model_loads):
    """A storage that holds studies: a refused warm start and a name used for other data leave the database,
    and the folder around it, byte for byte as they were (no ``.lock`` beside it either)."""
    from ilge_search.testing.store import add_study

    db = place / "studies" / "s.db"
    db.parent.mkdir()
    add_study(sqlite_url(db), Identity(model="minilm-l6", task="trec", encoder="cayley"), study_name="taken")
    assert_refused_and_untouched(place, "--warm-start", "50")
    message = assert_refused_and_untouched(place, "--study-name", "taken")
    assert "taken" in message


def test_an_unreadable_shipped_portfolio_is_refused_before_the_storage_exists(place, monkeypatch, no_model_loads):
    import ilge_search.record.portfolio as shipped

    broken = place / "portfolio.json"
    broken.write_text("{ not json")
    monkeypatch.setattr(shipped, "SHIPPED_PORTFOLIO_PATH", broken)
    message = assert_refused_and_untouched(place, "--warm-start", "2")
    assert "not valid JSON" in message


def test_a_warm_start_of_a_model_folder_outside_the_table_is_refused_before_anything_loads(
    place, synthetic, no_model_loads
):
    """A local model folder the model table does not know is bucketed by its config's hidden size, so its
    warm start is checked with the others (before: after the extraction, the storage and the cache made)."""
    before = snapshot(place)
    args = ["run", "--model", synthetic.model, "--task", str(place / "task"), "--storage", sqlite_url(place / "s.db")]
    args += ["--cache-dir", str(place / "cache"), "--device", "cpu", "--quiet", "--warm-start", "50"]
    message = one_line_error(CliRunner().invoke(cli, args))
    assert "--warm-start 50" in message and snapshot(place) == before


def test_a_storage_folder_that_cannot_be_made_is_refused_before_the_data_is_read(place, no_model_loads):
    """A file where the storage's folder would be: one line, and no folder or file made anywhere."""
    (place / "blocked").write_text("a file, not a folder")
    message = assert_refused_and_untouched(place, db="blocked/studies/s.db")
    assert "cannot be made" in message


def test_checks_that_pass_open_the_storage_for_writing(place, no_model_loads):
    """The write opening moved after the checks: checks that pass still hand the run a storage it can write,
    the SQLite file created then."""
    from ilge_search.study import StudyOptions
    from ilge_search.study.plan import check_run

    db = place / "studies" / "s.db"
    options = StudyOptions.from_flat(n_trials=1, cache_dir=str(place / "cache"), device="cpu", progress=False)
    check = check_run(MODEL, str(place / "task"), "cayley", sqlite_url(db), options)
    assert db.is_file()
    assert check.opened_storage().load_study(check.names["cayley"]) is None
