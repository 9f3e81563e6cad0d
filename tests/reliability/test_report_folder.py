"""`report` never replaces committed files or another storage's report, and its default folder cannot collide.

The issue's case: in a clone, `ilge-search report --storage sqlite:///some.db --no-figures --quiet` took the
committed `reports/` (which carries a manifest) for its own output and deleted 69 committed files.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from announced_skips import skipped_where
from click.testing import CliRunner

from ilge_search.cli import cli
from ilge_search.report import MANIFEST_NAME
from ilge_search.report.folder import default_report_dir

pytestmark = skipped_where(shutil.which("git") is None, "needs git on PATH (apt-get install -y git)")


def tree(folder: Path) -> dict:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


def make_storage(path: Path, score: float = 0.8) -> str:
    from ilge_search.record import Identity
    from ilge_search.testing import FakeTrial, add_study, final_record

    path.parent.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{path}"
    identity = Identity("minilm-l6", "trec", "cayley")
    add_study(url, identity, trials=[FakeTrial(score)], final=final_record([score, score + 0.01]))
    return url


def report(storage: str, *more: str):
    return CliRunner().invoke(cli, ["report", "--storage", storage, "--no-figures", "--quiet", *more])


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", *args], check=True, capture_output=True
    )


@pytest.fixture()
def clone(tmp_path):
    """A git work tree whose committed ``reports/`` was written by a report of ``reports/offline.db``."""
    repo = tmp_path / "clone"
    repo.mkdir()
    git(repo, "init", "-q")
    committed = make_storage(repo / "reports" / "offline.db", 0.7)
    assert report(committed, "--out", str(repo / "reports"), "--force").exit_code == 0  # beside its storage
    (repo / "reports" / "figures").mkdir(exist_ok=True)
    (repo / "reports" / "figures" / "trec.png").write_bytes(b"a committed figure")
    manifest = json.loads((repo / "reports" / MANIFEST_NAME).read_text())
    manifest["files"].append("figures/trec.png")
    del manifest["storage"]  # as committed by a version that did not record it
    (repo / "reports" / MANIFEST_NAME).write_text(json.dumps(manifest))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "report")
    return repo


def test_a_report_into_a_folder_of_committed_files_is_refused_and_changes_nothing(clone, tmp_path):
    other = make_storage(tmp_path / "some.db")
    before = tree(clone / "reports")
    result = report(other, "--out", str(clone / "reports"))
    assert result.exit_code == 1
    assert "file(s) git tracks" in result.output and "--force" in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert tree(clone / "reports") == before


def test_the_same_storage_also_needs_force_to_rewrite_a_committed_report(clone):
    committed = f"sqlite:///{clone / 'reports' / 'offline.db'}"
    assert report(committed, "--out", str(clone / "reports")).exit_code == 1
    forced = report(committed, "--out", str(clone / "reports"), "--force")
    assert forced.exit_code == 0, forced.output
    assert json.loads((clone / "reports" / MANIFEST_NAME).read_text())["storage"] == "sqlite:///offline.db"


def test_the_default_folder_sits_beside_the_storage_and_never_touches_reports(clone, monkeypatch):
    monkeypatch.chdir(clone)
    before = tree(clone / "reports")
    other = make_storage(clone / "some.db")
    result = report(other)
    assert result.exit_code == 0, result.output
    assert (clone / "some-report" / "report.md").is_file()
    assert tree(clone / "reports") == before
    assert report(other).exit_code == 0  # its own folder: a rerun needs no --force


def test_another_storages_report_is_refused(tmp_path):
    first = make_storage(tmp_path / "a.db")
    second = make_storage(tmp_path / "b.db", 0.6)
    out = tmp_path / "out"
    assert report(first, "--out", str(out)).exit_code == 0
    before = tree(out)
    refused = report(second, "--out", str(out))
    assert refused.exit_code == 1
    assert f"{out} holds the report of another storage (sqlite:///../a.db)" in " ".join(refused.output.split())
    assert tree(out) == before
    assert report(second, "--out", str(out), "--force").exit_code == 0


def test_a_moved_pair_of_storage_and_report_still_matches(tmp_path):
    first = make_storage(tmp_path / "a" / "s.db")
    assert report(first).exit_code == 0
    shutil.move(tmp_path / "a", tmp_path / "b")
    assert report(f"sqlite:///{tmp_path / 'b' / 's.db'}").exit_code == 0


@pytest.mark.parametrize(
    "url, name",
    [
        ("postgresql://me:secret@db.example.org:5432/ilge", "postgresql-db.example.org-ilge-report"),
        ("mysql+pymysql://me@localhost/studies", "mysql-localhost-studies-report"),
    ],
)
def test_server_storages_get_a_folder_named_from_host_and_database(url, name):
    assert default_report_dir(url) == Path(name)
    assert "secret" not in str(default_report_dir(url))
