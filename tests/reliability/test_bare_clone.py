"""A bare clone (no ``../shared``, no ``--data-dir``, no network) gets what the docs promise: `tasks` and `run`
read the same folder (the shipped ``examples/data`` for banking77), `tasks` says which folder that is, and a task
only the hub has fails at once, in one line, when the hub cannot be reached.

Before: `tasks` without ``--data-dir`` listed banking77 as not offline with no classes although the clone ships
it; `run` on a hub task without network retried every request 5 times (about 26 s) before its error.
"""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner

from ilge_search.cli import cli
from ilge_search.report.catalog import task_catalog
from ilge_search.settings import SHIPPED_DATA_DIR, registered_task_dir
from ilge_search.study.data import DataSpec
from ilge_search.study.runner import study_source
from ilge_search.tasks.core import TaskError, load_task
from ilge_search.testing import refuse_model_loads


@pytest.fixture()
def no_data_folder(monkeypatch, tmp_path):
    """No ``$ILGE_SEARCH_DATA`` and a working folder with nothing beside it, as in a bare clone."""
    monkeypatch.delenv("ILGE_SEARCH_DATA", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_tasks_and_run_read_banking77_from_the_shipped_subset(no_data_folder):
    shipped = SHIPPED_DATA_DIR / "banking77"
    assert registered_task_dir("banking77") == SHIPPED_DATA_DIR
    assert registered_task_dir("trec") is None  # a task the clone does not ship still loads from the hub
    rows = task_catalog().set_index("task")
    assert bool(rows.loc["banking77", "offline"]) is True
    assert rows.loc["banking77", "classes_or_scores"] == "77 classes"
    assert rows.loc["banking77", "splits"] == "train 1540 / validation 308 / test 770"
    assert rows.loc["banking77", "source"] == str(shipped) == load_task("banking77").source  # what run reads
    assert rows.loc["trec", "source"].startswith("hf:") and not rows.loc["trec", "offline"]
    recorded = study_source(DataSpec(model="minilm-l6", task="banking77"))
    assert recorded.data_dir_resolved == str(SHIPPED_DATA_DIR)  # export and explain find it again


def test_tasks_says_which_folder_it_read(no_data_folder, tmp_path):
    shown = CliRunner().invoke(cli, ["tasks"])
    assert shown.exit_code == 0, shown.output
    note = shown.output.strip().splitlines()[-1]
    assert note.startswith("task data: ") and str(SHIPPED_DATA_DIR) in note and "hub" in note
    given = CliRunner().invoke(cli, ["--data-dir", str(tmp_path), "tasks"])
    assert given.output.strip().splitlines()[-1] == f"task data: {tmp_path} (every registered task is read from it)"


def test_a_given_data_folder_still_holds_every_registered_task(no_data_folder, tmp_path):
    with pytest.raises(TaskError, match="is not in the data dir"):
        load_task("banking77", tmp_path)  # no fallback behind an explicit folder


class _UnreachableHub:
    """The hub's HTTP session on a machine without network: every request fails to connect."""

    def __init__(self) -> None:
        self.requests = 0

    def head(self, url, **kwargs):
        self.requests += 1
        raise ConnectionError(f"Name or service not known: {url}")


def test_a_hub_task_with_the_hub_unreachable_fails_at_once_in_one_line(no_data_folder, monkeypatch):
    import datasets
    import huggingface_hub.utils

    hub, downloads = _UnreachableHub(), []
    monkeypatch.setattr(huggingface_hub.utils, "get_session", lambda: hub)
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: downloads.append(args))
    started = time.monotonic()
    with refuse_model_loads():
        result = CliRunner().invoke(cli, ["run", "--model", "minilm-l6", "--task", "mtop_domain", "--dry-run"])
    assert time.monotonic() - started < 5
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: task 'mtop_domain' loads 'mteb/mtop_domain'"), lines
    assert "cannot be reached (ConnectionError: Name or service not known" in lines[0]
    assert "--data-dir" in lines[0]
    assert hub.requests == 1 and downloads == []  # one attempt, and no download tried behind it
