"""Default outputs never overwrite shipped or committed files.

``recommend`` writes the user's defaults file unless told ``--update-shipped``; ``recommended_config`` reads
that file over the shipped one (run on a copy of the committed storage ``reports/offline.db``). ``report``
writes only into a folder it made (or with ``--force``) and removes only files it wrote before (run on a small
storage from the fake study store, into a copy of the committed ``reports/`` folder).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from ilge_search import tuning
from ilge_search.cli import cli
from ilge_search.report import MANIFEST_NAME
from ilge_search.tuning import load_recommended_defaults, recommended_config

ROOT = Path(__file__).resolve().parents[2]
REPORTS = ROOT / "reports"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree(folder: Path) -> dict:
    """Every file under ``folder`` with its sha256."""
    return {str(p.relative_to(folder)): digest(p) for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def storage_copy(tmp_path_factory):
    copy = tmp_path_factory.mktemp("committed") / "offline.db"
    shutil.copyfile(REPORTS / "offline.db", copy)
    return f"sqlite:///{copy}"


@pytest.fixture(scope="module")
def small_storage(tmp_path_factory):
    """Cayley and the last layer under both protocols, with final scores (the fake study store): every kind of
    file a report writes, from a storage that takes a moment to read."""
    from ilge_search.record import Identity
    from ilge_search.testing import FakeTrial, add_study, final_record

    url = f"sqlite:///{tmp_path_factory.mktemp('small') / 'studies.db'}"
    for encoder, score in (("last-layer", 0.70), ("cayley", 0.80)):
        for protocol, shift in (("matched", 0.0), ("paper", -0.05)):
            per_label = 8 if protocol == "paper" else None
            identity = Identity("minilm-l6", "trec", encoder, protocol=protocol, samples_per_label=per_label)
            trials = [FakeTrial(score + 0.01 * i, params={"lr": 10.0 ** -(3 + i)}) for i in range(3)]
            add_study(url, identity, trials=trials, final=final_record([score + shift, score + shift + 0.02]))
    return url


@pytest.fixture()
def user_config(tmp_path, monkeypatch):
    """A user config folder of this test's own (no $ILGE_SEARCH_DEFAULTS)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("ILGE_SEARCH_DEFAULTS", raising=False)
    return tmp_path / "config" / "ilge-search"


# ----------------------------------------------------------------------------- recommend


def test_recommend_writes_the_user_file_and_leaves_the_shipped_one(storage_copy, user_config, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # a default that pointed into the working folder would show up here
    shipped = digest(tuning.RECOMMENDED_DEFAULTS_PATH)
    result = CliRunner().invoke(cli, ["recommend", "--storage", storage_copy, "--family", "cayley"])
    assert result.exit_code == 0, result.output
    written = user_config / "recommended_defaults.json"
    assert result.output.strip().splitlines()[-1] == f"wrote {written} and {written.with_suffix('.md')}"
    assert list(json.loads(written.read_text())["families"]) == ["cayley"]
    assert written.with_suffix(".md").read_text().startswith("# Defaults by model size")
    assert digest(tuning.RECOMMENDED_DEFAULTS_PATH) == shipped  # the package's own file is untouched
    assert list(tmp_path.iterdir()) == [tmp_path / "config"]  # nothing in the working folder (no reports/)


def test_recommended_config_reads_the_user_file_over_the_shipped_one(user_config, monkeypatch, tmp_path):
    shipped = load_recommended_defaults()
    user_config.mkdir(parents=True)
    (user_config / "recommended_defaults.json").write_text(
        json.dumps({"format_version": 1, "metadata": {}, "families": {"cayley": {"small": {"lr": 0.0123}}}})
    )
    cayley = recommended_config("cayley", source="regenerated")
    assert cayley.lr == 0.0123
    assert cayley.hidden_dim == shipped["cayley"]["small"]["hidden_dim"]  # fields the user file lacks: shipped
    assert (
        recommended_config("fc", source="regenerated").lr == shipped["fc"]["small"]["lr"]
    )  # families it lacks: shipped, not dropped

    other = tmp_path / "other.json"
    other.write_text(json.dumps({"format_version": 1, "families": {"fc": {"small": {"lr": 0.0042}}}}))
    assert recommended_config("fc", source="regenerated", defaults_path=other).lr == 0.0042
    assert (
        recommended_config("cayley", source="regenerated", defaults_path=other).lr == shipped["cayley"]["small"]["lr"]
    )
    monkeypatch.setenv("ILGE_SEARCH_DEFAULTS", str(other))
    assert (
        recommended_config("fc", source="regenerated").lr == 0.0042
        and recommended_config("cayley", source="regenerated").lr != 0.0123
    )
    with pytest.raises(ValueError, match=r"recommended defaults file .*absent.json does not exist"):
        recommended_config("fc", source="regenerated", defaults_path=tmp_path / "absent.json")


@pytest.mark.slow  # derives the defaults and the leave-one-task-out verdicts from the committed storage
def test_updating_the_shipped_defaults_is_an_explicit_flag(storage_copy, user_config, monkeypatch, tmp_path):
    from ilge_search.defaults.loto import stored_loto

    stand_in = tmp_path / "package" / "recommended_defaults.json"  # never the real package file in a test
    stand_in.parent.mkdir()
    shutil.copyfile(tuning.RECOMMENDED_DEFAULTS_PATH, stand_in)
    before = digest(stand_in)
    monkeypatch.setattr(tuning, "RECOMMENDED_DEFAULTS_PATH", stand_in)
    page = tmp_path / "defaults.md"
    method = json.loads(stand_in.read_text())["metadata"].get("method", "marginal")  # as the results page says
    result = CliRunner().invoke(
        cli, ["recommend", "--storage", storage_copy, "--method", method, "--update-shipped", "--report", str(page)]
    )
    loto = stored_loto(storage_copy)
    if loto.missing or not loto.verdicts:
        # the shipping rule: without a complete leave-one-task-out evaluation in the storage nothing is shipped
        assert result.exit_code == 1 and "ilge-search loto --storage" in result.output
        assert digest(stand_in) == before and not page.exists()
    else:
        assert result.exit_code == 0, result.output
        assert result.output.strip().splitlines()[-1] == f"wrote {stand_in} and {page}"
        committed = json.loads((ROOT / "ilge_search" / "data" / "recommended_defaults.json").read_text())
        # the results page's command reproduces the shipped file
        assert json.loads(stand_in.read_text())["families"] == committed["families"]
    assert not user_config.exists()

    both = CliRunner().invoke(
        cli, ["recommend", "--storage", storage_copy, "--update-shipped", "--out", str(tmp_path / "x.json")]
    )
    assert both.exit_code == 1 and "either out_path (--out) or update_shipped (--update-shipped)" in both.output
    assert not (tmp_path / "x.json").exists()


def test_the_results_page_regenerates_with_explicit_flags():
    readme = (ROOT / "docs" / "results.md").read_text()
    assert "ilge-search report --storage sqlite:///reports/offline.db --out reports --force" in readme
    assert (
        "ilge-search recommend --storage sqlite:///reports/offline.db --method portfolio --update-shipped "
        "--report reports/defaults.md" in readme
    )


# ----------------------------------------------------------------------------- report


def report(storage: str, out: Path, *more: str):
    return CliRunner().invoke(
        cli, ["report", "--storage", storage, "--out", str(out), "--no-figures", "--quiet", *more]
    )


def test_report_refuses_a_folder_it_did_not_write_and_force_removes_nothing(small_storage, tmp_path):
    """The issue's case: `report` into the committed reports/ folder deleted its figures."""
    out = tmp_path / "reports"
    # the committed folder as a user might have it: figures and tables, but no manifest of ours
    shutil.copytree(REPORTS, out, ignore=shutil.ignore_patterns("*.db", "*.db.lock", MANIFEST_NAME))
    (out / "notes.txt").write_text("mine")
    before = tree(out)
    assert sum(name.startswith("figures/") for name in before) == len(list((REPORTS / "figures").glob("*.png"))) >= 36

    refused = report(small_storage, out)
    assert refused.exit_code == 1
    assert (
        f"{out} is not empty and was not written by `ilge-search report` (it has no {MANIFEST_NAME}); pass a new "
        "or empty --out, or --force" in " ".join(refused.output.split())
    )
    assert tree(out) == before  # nothing written, nothing removed

    forced = report(small_storage, out, "--force")
    assert forced.exit_code == 0, forced.output
    after = tree(out)
    assert set(before) <= set(after)  # every figure and the foreign file are still there
    assert after["notes.txt"] == before["notes.txt"]
    assert all(after[name] == before[name] for name in before if name.startswith("figures/"))
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert sorted(manifest["files"]) == [
        "importances.csv",
        "index.html",
        "protocol_effect.csv",
        "report.md",
        "report.tex",
        "results.csv",
        "summary.csv",
    ]  # both protocols are stored
    again = report(small_storage, out)  # a folder the report wrote into: no --force needed
    assert again.exit_code == 0, again.output


def test_a_rerun_removes_only_stale_files_the_report_itself_wrote(small_storage, tmp_path):
    out = tmp_path / "r"
    assert report(small_storage, out).exit_code == 0  # a new folder: created, no --force
    (out / "figures").mkdir()  # --no-figures made none
    (out / "figures" / "old-layers.png").write_bytes(b"drawn by an earlier report")
    (out / "figures" / "mine-layers.png").write_bytes(b"the user's own")
    (tmp_path / "outside.txt").write_text("not the report's")
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    manifest["files"] += ["figures/old-layers.png", "../outside.txt", "/etc/hostname"]
    (out / MANIFEST_NAME).write_text(json.dumps(manifest))

    assert report(small_storage, out).exit_code == 0
    assert not (out / "figures" / "old-layers.png").exists()  # its own, no longer drawn: removed
    assert (out / "figures" / "mine-layers.png").read_bytes() == b"the user's own"  # never listed: kept
    assert (tmp_path / "outside.txt").read_text() == "not the report's"  # outside the folder: never touched
    assert Path("/etc/hostname").exists()
    assert "figures/old-layers.png" not in json.loads((out / MANIFEST_NAME).read_text())["files"]


def test_report_out_that_is_a_file_is_a_clear_error(small_storage, tmp_path):
    target = tmp_path / "report.md"
    target.write_text("keep")
    result = report(small_storage, target)
    assert result.exit_code == 2 and "is a file" in result.output  # click's own check of --out
    from ilge_search.report import build_report

    with pytest.raises(ValueError, match="is a file, not a folder"):
        build_report(small_storage, target, figures=False, progress=False)
    assert target.read_text() == "keep"


def test_the_defaults_page_of_a_user_file_says_it_is_read_from_that_file(storage_copy, user_config, tmp_path):
    """Before: the page said its values were read from the package's file, also when written as a user file."""
    out = tmp_path / "mine.json"
    result = CliRunner().invoke(cli, ["recommend", "--storage", storage_copy, "--out", str(out)])
    assert result.exit_code == 0, result.output
    page = " ".join((tmp_path / "mine.md").read_text().split())
    assert f"reads these values from the user defaults file `{out}` over the shipped ones" in page
    assert "reads these values from `ilge_search/data/recommended_defaults.json`" not in page
