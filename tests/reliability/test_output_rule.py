"""One rule for every output path (``ilge_search.files.check_output_path`` / ``check_output_folder``).

Every command that writes a path the user names is listed in :data:`WRITERS` and driven through the same hostile
cases: an existing file (or a folder of files) it did not write, a file git tracks, a parent folder that cannot be
made, and a read-only folder. Each must end in one ``Error:`` line, change and create nothing, and stop before its
expensive step (a spy that fails the test if reached: reading the studies, training, loading a model). No model
loads and nothing trains here.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from reliability_helpers import one_line_error, remount_read_only, sqlite_url, tmpfs

from ilge_search.cli import cli


class ExpensiveWork(Exception):
    """Raised by a spy: the command got past its checks into the work they must come before."""


@dataclass(frozen=True)
class Writer:
    """A command taking an output path: its name, whether the path is a file or a folder, the arguments for a
    target, and the expensive step (``module``, ``attribute``) its checks must come before."""

    name: str
    kind: str  # "file" or "folder"
    args: Callable[[Path, Setup], list[str]]
    spies: tuple[tuple[str, str], ...]
    suffix: str = ""


@dataclass(frozen=True)
class Setup:
    url: str  # a storage holding one finished ilge-search study
    study: str
    scratch: Path  # where the files a writer needs besides its target live (model folder, input file)


WRITERS = [
    Writer(
        "report --out",
        "folder",
        lambda out, s: ["report", "--storage", s.url, "--out", str(out), "--no-figures", "--quiet"],
        (("ilge_search.report.build", "collect_records"),),
    ),
    Writer(
        "recommend --out",
        "file",
        lambda out, s: ["recommend", "--storage", s.url, "--out", str(out)],
        (("ilge_search.report.defaults_page", "regenerate_defaults"),),
        ".json",
    ),
    Writer(
        "recommend --report",
        "file",
        lambda out, s: [
            "recommend",
            "--storage",
            s.url,
            "--out",
            str(s.scratch / "defaults.json"),
            "--report",
            str(out),
        ],
        (("ilge_search.report.defaults_page", "regenerate_defaults"),),
        ".md",
    ),
    Writer(
        "portfolio --plot",
        "file",
        lambda out, s: ["portfolio", "--storage", s.url, "--plot", str(out), "--quiet"],
        (("ilge_search.report.portfolio", "portfolio"),),
        ".png",
    ),
    Writer(
        "explain --out",
        "file",
        lambda out, s: ["explain", "--storage", s.url, "--study", s.study, "--out", str(out), "--quiet"],
        (("ilge_search.use.explain", "explain_study"),),
        ".csv",
    ),
    Writer(
        "export --out",
        "folder",
        lambda out, s: ["export", "--storage", s.url, "--study", s.study, "--out", str(out)],
        (
            ("ilge_search.use.classifier.ILGEClassifier", "from_study"),
            ("ilge_search.use.tagger.ILGETagger", "from_study"),
        ),
    ),
    Writer(
        "predict --out",
        "file",
        lambda out, s: ["predict", str(s.scratch / "model"), "--input", str(s.scratch / "in.txt"), "--out", str(out)],
        (("ilge_search.use.classifier.ILGEClassifier", "load"), ("ilge_search.use.tagger.ILGETagger", "load")),
        ".csv",
    ),
]
IDS = [writer.name for writer in WRITERS]


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> tuple[str, str]:
    from ilge_search.record import Identity
    from ilge_search.testing import FakeTrial, add_study, final_record

    url = sqlite_url(tmp_path_factory.mktemp("storage") / "studies.db")
    study = add_study(
        url, Identity("minilm-l6", "trec", "cayley"), trials=[FakeTrial(0.8)], final=final_record([0.8, 0.82])
    )
    return url, study.study_name


@pytest.fixture()
def setup(stored, tmp_path) -> Setup:
    scratch = tmp_path / "scratch"
    (scratch / "model").mkdir(parents=True)
    (scratch / "in.txt").write_text("Who wrote Hamlet ?\n")
    return Setup(stored[0], stored[1], scratch)


@pytest.fixture()
def spied(monkeypatch):
    """Every writer's expensive step fails the command with :class:`ExpensiveWork`; returns the calls."""
    calls: list[str] = []
    for writer in WRITERS:
        for where, name in writer.spies:

            def spy(*args, _name=f"{where}.{name}", **kwargs):
                calls.append(_name)
                raise ExpensiveWork(_name)

            monkeypatch.setattr(_resolve(where), name, spy)
    return calls


def _resolve(where: str):
    """The module, or the class inside a module, named by the dotted ``where``."""
    import importlib

    try:
        return importlib.import_module(where)
    except ModuleNotFoundError:
        module, _, attribute = where.rpartition(".")
        return getattr(importlib.import_module(module), attribute)


def tree(folder: Path) -> dict[str, str]:
    """Every path under ``folder``: a file's sha256, ``dir`` for a folder."""
    seen = {}
    for path in sorted(folder.rglob("*")):
        seen[str(path.relative_to(folder))] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return seen


def git_repo(folder: Path, *files: str) -> None:
    """``folder`` as a git work tree with ``files`` committed."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in files:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(f"committed {name}\n")
    git = ["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "files"], check=True)


def target_in(folder: Path, writer: Writer) -> Path:
    return folder / ("out" if writer.kind == "folder" else f"out{writer.suffix}")


def refused(writer: Writer, target: Path, setup: Setup, spied: list[str], watched: Path) -> str:
    """Run ``writer`` on ``target``; it must refuse in one line, before its expensive step, leaving ``watched``
    as it was. Returns the error line."""
    before = tree(watched)
    result = CliRunner().invoke(cli, writer.args(target, setup))
    line = one_line_error(result)
    assert spied == [], f"{writer.name}: the expensive step ran before the refusal"
    assert tree(watched) == before, f"{writer.name}: the refusal changed or created files"
    return line


# ----------------------------------------------------------------------------- the hostile cases, every writer


@pytest.mark.parametrize("writer", WRITERS, ids=IDS)
def test_an_existing_file_the_command_did_not_write_is_refused(writer, setup, spied, tmp_path, no_model_loads):
    """Before: `portfolio --plot` and `recommend --out` replaced any existing file."""
    target = target_in(tmp_path / "work", writer)
    if writer.kind == "folder":
        target.mkdir(parents=True)
        (target / "notes.txt").write_text("mine")
    else:
        target.parent.mkdir(parents=True)
        target.write_text("mine")
    line = refused(writer, target, setup, spied, tmp_path / "work")
    assert str(target) in line and ("exists" in line or "not empty" in line)


@pytest.mark.parametrize("writer", WRITERS, ids=IDS)
def test_a_git_tracked_file_is_refused_without_force(writer, setup, spied, tmp_path, no_model_loads):
    repo = tmp_path / "repo"
    target = target_in(repo, writer)
    git_repo(repo, "out/README.md" if writer.kind == "folder" else target.name)
    line = refused(writer, target, setup, spied, repo)
    assert "git tracks" in line and "--force" in line


@pytest.mark.parametrize("writer", WRITERS, ids=IDS)
def test_a_parent_folder_that_cannot_be_made_is_refused(writer, setup, spied, tmp_path, no_model_loads):
    """Before: `explain --out` into a missing folder failed with FileNotFoundError after its retraining."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "blocker").write_text("a file where a folder would have to be")
    target = target_in(work / "blocker" / "sub", writer)
    line = refused(writer, target, setup, spied, work)
    assert "cannot be made" in line and f"{work / 'blocker'} is a file" in line


@pytest.mark.parametrize("writer", WRITERS, ids=IDS)
def test_a_missing_parent_folder_is_accepted_and_made_only_when_written(writer, setup, spied, tmp_path):
    target = target_in(tmp_path / "new" / "deeper", writer)
    result = CliRunner().invoke(cli, writer.args(target, setup))
    assert isinstance(result.exception, ExpensiveWork), result.output  # the checks let it through ...
    assert not (tmp_path / "new").exists()  # ... and made nothing before the work


@pytest.mark.parametrize("writer", WRITERS, ids=IDS)
def test_a_read_only_folder_is_refused_before_any_work(writer, setup, spied, tmp_path, no_model_loads):
    """Before: `report --out` on a folder it could not write was a PermissionError traceback."""
    with tmpfs(tmp_path / "ro", "1m") as folder:
        remount_read_only(folder)  # a real read-only mount: root ignores file modes
        line = refused(writer, target_in(folder, writer), setup, spied, folder)
    assert "not writable" in line and "Read-only file system" in line


# ----------------------------------------------------------------------------- the other cases


def test_recommend_refuses_the_page_it_would_write_beside_the_defaults_file(setup, spied, tmp_path):
    """Before: `recommend --out README.json` replaced a committed README.md beside it."""
    repo = tmp_path / "repo"
    git_repo(repo, "README.md")
    line = refused(WRITERS[1], repo / "README.json", setup, spied, repo)
    assert f"--report {repo / 'README.md'} is a file git tracks" in line


def test_a_report_of_a_storage_in_a_read_only_folder_is_one_line(stored, tmp_path, spied):
    """Before: a PermissionError traceback (the default folder sits beside the storage)."""
    with tmpfs(tmp_path / "ro", "1m") as folder:
        db = folder / "studies.db"
        import optuna

        storage = optuna.storages.RDBStorage(sqlite_url(db))
        optuna.create_study(study_name="kept", storage=storage)
        storage.engine.dispose()
        remount_read_only(folder)
        before = tree(folder)
        line = one_line_error(CliRunner().invoke(cli, ["report", "--storage", sqlite_url(db), "--quiet"]))
        assert tree(folder) == before and spied == []
    report = folder / "studies-report"
    assert f"cannot write --out {report}: {report} cannot be made, {folder} is not writable (Read-only" in line


@pytest.mark.parametrize("command", ["report", "recommend", "loto", "portfolio"])
def test_a_command_that_needs_a_storage_says_so_in_one_line(command, tmp_path, monkeypatch):
    """Before: `report` without --storage was an AttributeError in storage.py, though --help said required."""
    monkeypatch.chdir(tmp_path)
    line = one_line_error(CliRunner().invoke(cli, [command]))
    assert line.startswith(f"Error: `ilge-search {command}` needs --storage")
    assert "[required]" in CliRunner().invoke(cli, [command, "--help"]).output
    assert list(tmp_path.iterdir()) == []


def test_a_report_without_figures_makes_no_figures_folder(stored, tmp_path):
    out = tmp_path / "report"
    result = CliRunner().invoke(cli, ["report", "--storage", stored[0], "--out", str(out), "--no-figures", "--quiet"])
    assert result.exit_code == 0, result.output
    assert (out / "report.md").is_file() and not (out / "figures").exists()


def test_explain_writes_into_a_missing_folder_and_force_replaces(setup, tmp_path, monkeypatch):
    """The output is written after the work, into the folders the check found makeable; --force replaces an
    existing file, a git-tracked one included."""
    import ilge_search.use.explain as explain

    monkeypatch.setattr(explain, "explain_study", lambda *a, **k: SimpleNamespace(num_layers=3, study=setup.study))
    monkeypatch.setattr(explain, "format_explanation", lambda result, fmt: "layer,score\n0,1\n")
    out = tmp_path / "new" / "layers.csv"
    args = ["explain", "--storage", setup.url, "--study", setup.study, "--out", str(out), "--quiet"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert out.read_text() == "layer,score\n0,1\n" and sorted(p.name for p in out.parent.iterdir()) == ["layers.csv"]
    out.write_text("mine")
    assert "--force" in one_line_error(CliRunner().invoke(cli, args)) and out.read_text() == "mine"
    assert CliRunner().invoke(cli, [*args, "--force"]).exit_code == 0 and out.read_text().startswith("layer")
    repo = tmp_path / "repo"
    git_repo(repo, "layers.csv")
    args[args.index(str(out))] = str(repo / "layers.csv")
    assert "git tracks" in one_line_error(CliRunner().invoke(cli, args))
    assert CliRunner().invoke(cli, [*args, "--force"]).exit_code == 0  # a committed file, replaced on purpose
    assert (repo / "layers.csv").read_text() == "layer,score\n0,1\n"


# ----------------------------------------------------------------------------- the page writers of reports/*.sh


@dataclass(frozen=True)
class PageWriter:
    """A library function writing a page the scripts in reports/ commit: how to call it on a target ``.md`` (with
    ``force``), and the step that reads the storage, which its check must come before."""

    name: str
    write: Callable[[Path, Setup, bool], Path]
    spy: tuple[str, str]


def _ensemble_page(target: Path, setup: Setup, force: bool) -> Path:
    from ilge_search.report.ensembles import write_ensemble_page

    return write_ensemble_page(setup.url, target.with_suffix(""), force=force)  # writes STEM.md and STEM-vs-k.png


def _warmstart_page(target: Path, setup: Setup, force: bool) -> Path:
    from ilge_search.report.warmstart import write_warmstart_page

    return write_warmstart_page(setup.url, target, force=force)


PAGE_WRITERS = [
    PageWriter("write_ensemble_page", _ensemble_page, ("ilge_search.report.ensembles", "open_storage")),
    PageWriter("write_warmstart_page", _warmstart_page, ("ilge_search.report.warmstart", "warmstart_rows")),
]
PAGE_IDS = [writer.name for writer in PAGE_WRITERS]


@pytest.fixture()
def pages_spied(monkeypatch):
    """Each page writer's storage read fails with :class:`ExpensiveWork`; returns the calls."""
    calls: list[str] = []
    for writer in PAGE_WRITERS:

        def spy(*args, _name=writer.name, **kwargs):
            calls.append(_name)
            raise ExpensiveWork(_name)

        monkeypatch.setattr(_resolve(writer.spy[0]), writer.spy[1], spy)
    return calls


def page_refused(writer: PageWriter, target: Path, setup: Setup, spied: list[str], watched: Path) -> str:
    """Call ``writer`` on ``target``; it must refuse with a one-line ``ValueError`` before reading the storage,
    leaving ``watched`` as it was. Returns the message."""
    before = tree(watched)
    with pytest.raises(ValueError) as caught:
        writer.write(target, setup, False)
    assert spied == [], f"{writer.name}: the storage was read before the refusal"
    assert tree(watched) == before, f"{writer.name}: the refusal changed or created files"
    assert "\n" not in str(caught.value)
    return str(caught.value)


@pytest.mark.parametrize("writer", PAGE_WRITERS, ids=PAGE_IDS)
def test_a_page_writer_refuses_an_existing_file(writer, setup, pages_spied, tmp_path):
    """Before: both replaced any file at their path."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "out.md").write_text("mine")
    line = page_refused(writer, work / "out.md", setup, pages_spied, work)
    assert f"{work / 'out.md'} exists" in line and "force" in line


def test_the_ensemble_page_refuses_an_existing_figure_beside_it(setup, pages_spied, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "out-vs-k.png").write_bytes(b"someone's figure")
    line = page_refused(PAGE_WRITERS[0], work / "out.md", setup, pages_spied, work)
    assert f"{work / 'out-vs-k.png'} exists" in line


@pytest.mark.parametrize("writer", PAGE_WRITERS, ids=PAGE_IDS)
def test_a_page_writer_refuses_a_git_tracked_file_without_force(writer, setup, pages_spied, tmp_path):
    repo = tmp_path / "repo"
    git_repo(repo, "out.md")
    line = page_refused(writer, repo / "out.md", setup, pages_spied, repo)
    assert "git tracks" in line and "--force" in line


@pytest.mark.parametrize("writer", PAGE_WRITERS, ids=PAGE_IDS)
def test_a_page_writer_refuses_a_folder_that_cannot_be_made_or_written(writer, setup, pages_spied, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "blocker").write_text("a file where a folder would have to be")
    line = page_refused(writer, work / "blocker" / "sub" / "out.md", setup, pages_spied, work)
    assert "cannot be made" in line and f"{work / 'blocker'} is a file" in line
    with tmpfs(tmp_path / "ro", "1m") as folder:
        remount_read_only(folder)
        line = page_refused(writer, folder / "out.md", setup, pages_spied, folder)
    assert "not writable" in line and "Read-only file system" in line


@pytest.mark.parametrize("writer", PAGE_WRITERS, ids=PAGE_IDS)
def test_a_page_writer_makes_a_missing_folder_only_when_it_writes(writer, setup, pages_spied, tmp_path):
    with pytest.raises(ExpensiveWork):
        writer.write(tmp_path / "new" / "deeper" / "out.md", setup, False)
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("writer", PAGE_WRITERS, ids=PAGE_IDS)
def test_a_page_writer_writes_a_new_page_and_force_replaces_a_committed_one(writer, setup, tmp_path):
    written = writer.write(tmp_path / "new" / "out.md", setup, False)
    assert written == tmp_path / "new" / "out.md" and written.read_text().startswith("# ")
    repo = tmp_path / "repo"
    git_repo(repo, "out.md")
    assert writer.write(repo / "out.md", setup, True).read_text().startswith("# ")  # replaced on purpose
