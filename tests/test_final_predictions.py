"""The final evaluation's stored per-example test predictions, and the paired intervals computed from them:
a study on synthetic embeddings stores them, `studies`, `run` and the report use the paired bootstrap where
both sides have them, and a study stored without them reports the t interval over the seeds as before."""

from __future__ import annotations

import numpy as np
import optuna
import pytest

from ilge_search.record import FinalRecord, study_record
from ilge_search.storage import open_storage
from ilge_search.study import StudyOptions, list_studies, run_study
from ilge_search.study.predictions import (
    StoredPredictions,
    compact,
    interval_kind,
    paired_interval,
    read_test_predictions,
    stored_final_predictions,
)
from ilge_search.study.results import format_results, gain_interval, study_result
from ilge_search.study.statistics import BootstrapSettings, paired_bootstrap
from ilge_search.testing import refuse_model_loads

DATA = dict(max_train=240, max_eval=100, max_epochs=6)


def sqlite_url(path) -> str:
    return f"sqlite:///{path}"


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
def stored_studies(tmp_path_factory, synthetic):
    """A cayley and a last-layer study on the synthetic trec subset, with the same final seeds."""
    synthetic.cache("trec", max_train=240, max_eval=100)
    url = sqlite_url(tmp_path_factory.mktemp("predictions") / "studies.db")
    with refuse_model_loads():
        results = {
            encoder: run_study(
                synthetic.model,
                "trec",
                encoder,
                storage=url,
                options=_options(synthetic, n_trials=trials, final_seeds=2, seed=0, **DATA),
            )[0]
            for encoder, trials in (("cayley", 4), ("last-layer", 2))
        }
    return url, results


def _final(url: str, name: str) -> tuple[optuna.Study, FinalRecord]:
    study = optuna.load_study(study_name=name, storage=url)
    final = study_record(study).final
    assert final is not None
    return study, final


def test_a_study_stores_each_seeds_test_predictions_of_the_selected_trial_and_the_start(stored_studies):
    url, results = stored_studies
    _, final = _final(url, results["cayley"].study_name)
    assert final.predictions is not None
    store = open_storage(url).artifact_store()
    arrays = read_test_predictions(store, final.predictions)
    assert arrays is not None and set(arrays) == {"truth", "selected", "start"}
    truth = arrays["truth"]
    assert truth.shape == (100,) and arrays["selected"].shape == arrays["start"].shape == (2, 100)
    # each seed's stored predictions score what the record says it scored
    assert [float((seed == truth).mean()) for seed in arrays["selected"]] == pytest.approx(final.test_scores)
    assert [float((seed == truth).mean()) for seed in arrays["start"]] == pytest.approx(final.start_test_scores)
    kept = stored_final_predictions(store, final)
    assert kept["selected"].seeds == tuple(final.seeds) == (1000, 1001)


def test_the_search_gain_uses_the_paired_bootstrap_from_the_stored_predictions(stored_studies):
    url, results = stored_studies
    study, final = _final(url, results["cayley"].study_name)
    stored = stored_final_predictions(open_storage(url).artifact_store(), final)
    expected = paired_bootstrap(stored["selected"].truth, stored["selected"].predictions, stored["start"].predictions)
    interval = gain_interval(study_record(study), open_storage(url).artifact_dir)
    assert interval is not None and interval_kind(interval) == "paired bootstrap"
    assert (interval.estimate, interval.low, interval.high) == pytest.approx(
        (expected.estimate, expected.low, expected.high)
    )
    assert interval.estimate == pytest.approx(final.search_gain)
    listing = list_studies(url).set_index("study")
    row = listing.loc[results["cayley"].study_name]
    assert row["search_gain_interval"] == "paired bootstrap" and row["search_gain_verdict"] == interval.verdict
    result = study_result(study, open_storage(url))
    assert interval_kind(result.gain_interval) == "paired bootstrap"
    assert "(paired bootstrap)" in format_results([result])


def test_the_report_judges_cayley_against_a_baseline_by_the_paired_bootstrap(stored_studies, tmp_path):
    from ilge_search.report import build_report

    url, _ = stored_studies
    report = build_report(url, tmp_path / "report", figures=False, progress=False)
    note = next(note for note in report.notes if "the last layer" in note)
    assert "1 task by a paired bootstrap over the test examples and seeds" in note
    assert "95% t interval" not in note


def test_a_study_stored_without_predictions_keeps_the_t_interval(stored_studies):
    url, results = stored_studies
    study, final = _final(url, results["cayley"].study_name)
    study.set_user_attr("final_predictions", None)  # as an evaluation stored before predictions were kept
    record = study_record(study)
    assert record.final is not None and record.final.predictions is None
    interval = gain_interval(record, open_storage(url).artifact_dir)
    assert interval is not None and interval_kind(interval) == "t interval"
    result = study_result(study, open_storage(url))
    assert "(paired bootstrap)" not in format_results([result])
    study.set_user_attr("final_predictions", final.predictions)


def test_an_older_record_reads_without_predictions():
    attrs = {"final_test_mean": 0.8, "final_test_scores": [0.8, 0.8], "final_seeds": [1, 2], "final_trial": 0}
    final = FinalRecord.from_attrs(attrs)
    assert final is not None and final.predictions is None
    assert final.to_attrs()["final_predictions"] is None
    assert stored_final_predictions("/nonexistent/artifacts", final) == {}


def test_the_paired_interval_covers_a_known_difference():
    rng = np.random.default_rng(1)
    size, seeds = 4000, 3
    truth = rng.integers(0, 4, size)
    wrong = (truth + 1) % 4
    # the first model is right on 85% of the texts, the second on 75%: a known difference of 0.10
    first = np.where(rng.random((seeds, size)) < 0.85, truth, wrong)
    second = np.where(rng.random((seeds, size)) < 0.75, truth, wrong)
    a = StoredPredictions(truth, compact(first), (1, 2, 3))
    b = StoredPredictions(truth, compact(second), (1, 2, 3))
    interval = paired_interval(a, b, "accuracy", BootstrapSettings(resamples=500))
    assert interval is not None and interval.low < 0.10 < interval.high and interval.verdict == "win"
    assert compact(first).dtype == np.uint8 and compact(first.astype(float)).dtype == np.float32
    # other seeds, other test texts, or an unscored metric: no paired interval
    assert paired_interval(a, StoredPredictions(truth, second, (1, 2, 4)), "accuracy") is None
    assert paired_interval(a, StoredPredictions(wrong, second, (1, 2, 3)), "accuracy") is None
    assert paired_interval(a, b, "pearson") is None and paired_interval(a, None, "accuracy") is None
