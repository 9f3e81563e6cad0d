"""Stored artifacts are checked when read: a damaged or missing predictions file is treated as missing, with one
warning naming the file and the interval that replaces it; listings and reports of the storage go on."""

from __future__ import annotations

import logging
import shutil

import optuna
import pytest
from click.testing import CliRunner

from ilge_search.cli import cli
from ilge_search.record import study_record
from ilge_search.study import StudyOptions, list_studies, run_study
from ilge_search.study.predictions import interval_kind
from ilge_search.study.results import format_results, study_result
from ilge_search.testing import refuse_model_loads

DATA = dict(max_train=240, max_eval=100, max_epochs=6)


def _options(synthetic, **flat) -> StudyOptions:
    return StudyOptions.from_flat(
        data_dir=synthetic.data_dir,
        cache_dir=synthetic.cache_dir,
        device="cpu",
        progress=False,
        threads=1,
        ensemble=0,
        **flat,
    )


@pytest.fixture(scope="module")
def two_studies(tmp_path_factory, synthetic):
    """A storage folder with a cayley and a last-layer study on the synthetic trec subset, each with stored
    final test predictions over two seeds (copy it before damaging anything)."""
    synthetic.cache("trec", max_train=240, max_eval=100)
    folder = tmp_path_factory.mktemp("stored-artifacts")
    url = f"sqlite:///{folder / 'studies.db'}"
    with refuse_model_loads():
        names = [
            run_study(
                synthetic.model,
                "trec",
                encoder,
                storage=url,
                options=_options(synthetic, n_trials=trials, final_seeds=2, seed=0, **DATA),
            )[0].study_name
            for encoder, trials in (("cayley", 2), ("last-layer", 1))
        ]
    return folder, names


def _copy(two_studies, tmp_path):
    """A copy of the storage folder, its URL and the cayley study's predictions file in it."""
    folder, names = two_studies
    copy = tmp_path / "storage"
    shutil.copytree(folder, copy)
    url = f"sqlite:///{copy / 'studies.db'}"
    final = study_record(optuna.load_study(study_name=names[0], storage=url)).final
    assert final is not None and final.predictions
    return url, names, copy / "artifacts" / final.predictions


def _warnings(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and text in r.getMessage()]


def test_a_truncated_predictions_file_is_treated_as_missing_with_one_warning(two_studies, tmp_path, caplog):
    url, names, predictions = _copy(two_studies, tmp_path)
    predictions.write_bytes(predictions.read_bytes()[:300])  # as a copy cut short (before: zipfile.BadZipFile)
    with caplog.at_level(logging.WARNING):
        listing = list_studies(url).set_index("study")
        list_studies(url)
    assert set(names) <= set(listing.index)
    assert listing.loc[names[0], "search_gain_interval"] == "t interval"
    result = study_result(optuna.load_study(study_name=names[0], storage=url), url)  # the table `run` prints
    assert interval_kind(result.gain_interval) == "t interval" and "(paired bootstrap)" not in format_results([result])
    [warning] = _warnings(caplog, str(predictions))
    assert "cannot be read (BadZipFile)" in warning and "the t interval over the seeds is used" in warning


def test_studies_and_report_list_every_study_beside_a_damaged_predictions_file(two_studies, tmp_path):
    from ilge_search.report import build_report

    url, names, predictions = _copy(two_studies, tmp_path)
    predictions.write_bytes(b"")
    result = CliRunner().invoke(cli, ["studies", "--storage", url])
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    assert all(name in result.output for name in names)
    report = build_report(url, tmp_path / "report", figures=False, progress=False)
    note = next(note for note in report.notes if "the last layer" in note)
    assert "paired bootstrap" not in note  # the damaged side is judged by the t interval over the seeds


def test_a_deleted_predictions_file_or_artifact_folder_falls_back_with_a_warning(two_studies, tmp_path, caplog):
    url, names, predictions = _copy(two_studies, tmp_path)
    predictions.unlink()
    with caplog.at_level(logging.WARNING):
        assert list_studies(url).set_index("study").loc[names[0], "search_gain_interval"] == "t interval"
    [warning] = _warnings(caplog, str(predictions))
    assert "the stored test predictions are missing" in warning
    shutil.rmtree(predictions.parent)  # before: the t interval without a word
    with caplog.at_level(logging.WARNING):
        assert list_studies(url).set_index("study").loc[names[0], "search_gain_interval"] == "t interval"
    [warning] = _warnings(caplog, f"{predictions.parent}: the artifact folder is missing")
    assert "the t interval over the seeds is used" in warning


def test_an_emptied_validation_predictions_file_is_retrained_not_a_traceback(tmp_path, caplog):
    from optuna.artifacts import FileSystemArtifactStore

    from ilge_search.record.artifacts import download_predictions

    store = FileSystemArtifactStore(str(tmp_path))
    (tmp_path / "emptied").write_bytes(b"")  # before: EOFError ended the ensemble stage of `run`
    with caplog.at_level(logging.WARNING):
        assert download_predictions(store, "emptied") is None
        assert download_predictions(store, "deleted") is None  # missing: the backfill's own line says so
    [warning] = _warnings(caplog, "validation predictions")
    assert warning.startswith("validation predictions emptied: EOFError(") and warning.endswith("trial is retrained")
