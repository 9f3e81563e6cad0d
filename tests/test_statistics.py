"""The statistics module against known cases and against scipy / scikit-learn."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import f1_score

from ilge_search.engine.metrics import macro_f1, spearman
from ilge_search.study import statistics as st
from ilge_search.study.statistics import (
    BootstrapSettings,
    Interval,
    PowerAssumptions,
    compare_problems,
    detectable_difference,
    needed_seeds,
    needed_test_texts,
    paired_bootstrap,
    problems_interval,
    seeds_interval,
    sign_test,
    signed_rank_test,
    verdict_counts,
)

SETTINGS = BootstrapSettings(resamples=500, confidence=0.9, seed=7)


def _scipy_paired(truth, first, second, metric, settings):
    """scipy.stats.bootstrap on the same statistic: one sample of indices, as paired=True resamples."""
    statistic = st._mean_difference(np.asarray(truth), np.atleast_2d(first), np.atleast_2d(second), metric)
    result = stats.bootstrap(
        (np.arange(len(truth)),),
        lambda indices, axis=-1: statistic(np.atleast_2d(indices)),
        vectorized=True,
        n_resamples=settings.resamples,
        confidence_level=settings.confidence,
        method="percentile",
        rng=np.random.default_rng(settings.seed),
    )
    return result.confidence_interval


def _classes(seed, size=120, classes=5, seeds=3):
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, classes, size)
    good = np.where(rng.random((seeds, size)) < 0.8, truth, rng.integers(0, classes, (seeds, size)))
    bad = np.where(rng.random((seeds, size)) < 0.6, truth, rng.integers(0, classes, (seeds, size)))
    return truth, good, bad


@pytest.mark.parametrize("metric", ["accuracy", "macro_f1"])
def test_paired_bootstrap_matches_scipy(metric):
    truth, good, bad = _classes(0)
    ours = paired_bootstrap(truth, good, bad, metric, SETTINGS)
    theirs = _scipy_paired(truth, good, bad, metric, SETTINGS)
    assert (ours.low, ours.high) == pytest.approx((theirs.low, theirs.high), abs=1e-12)
    assert (ours.resamples, ours.seed, ours.confidence) == (500, 7, 0.9)
    assert metric in ours.method


def test_paired_bootstrap_spearman_matches_scipy_and_the_engine():
    rng = np.random.default_rng(1)
    truth = rng.normal(size=80)
    first = truth + rng.normal(scale=0.5, size=(2, 80))
    second = np.round(truth + rng.normal(scale=1.0, size=(2, 80)), 1)  # ties ranked as averages
    ours = paired_bootstrap(truth, first, second, "spearman", SETTINGS)
    theirs = _scipy_paired(truth, first, second, "spearman", SETTINGS)
    assert (ours.low, ours.high) == pytest.approx((theirs.low, theirs.high), abs=1e-12)
    expected = np.mean([spearman(truth, f) - spearman(truth, s) for f, s in zip(first, second, strict=True)])
    assert ours.estimate == pytest.approx(expected, abs=1e-12)


def test_row_metrics_agree_with_the_engine_and_scikit_learn():
    truth, good, _ = _classes(2, size=60, classes=7)
    rng = np.random.default_rng(3)
    indices = rng.integers(0, 60, (20, 60))
    rows = st._macro_f1_rows(truth[indices], good[0][indices])
    for row, picked in zip(rows, indices, strict=True):
        assert row == pytest.approx(macro_f1(truth[picked], good[0][picked]), abs=1e-12)
        assert row == pytest.approx(f1_score(truth[picked], good[0][picked], average="macro"), abs=1e-12)


def test_paired_bootstrap_known_cases():
    truth = np.arange(50) % 3
    same = paired_bootstrap(truth, truth, truth)
    assert (same.estimate, same.low, same.high, same.verdict) == (0.0, 0.0, 0.0, "tie")
    wrong = (truth + 1) % 3
    better = paired_bootstrap(truth, truth, wrong)  # right everywhere against wrong everywhere
    assert (better.estimate, better.low, better.high, better.verdict) == (1.0, 1.0, 1.0, "win")
    assert paired_bootstrap(truth, wrong, truth).verdict == "loss"
    defaults = paired_bootstrap(truth, truth, wrong)
    assert (defaults.resamples, defaults.seed, defaults.confidence) == (2000, 0, 0.95)


def test_paired_bootstrap_is_seeded_and_chunking_keeps_the_draws(monkeypatch):
    truth, good, bad = _classes(4)
    once = paired_bootstrap(truth, good, bad, settings=SETTINGS)
    assert paired_bootstrap(truth, good, bad, settings=SETTINGS) == once
    monkeypatch.setattr(st, "_CHUNK_VALUES", 1000)  # a few resamples per chunk
    assert paired_bootstrap(truth, good, bad, settings=SETTINGS) == once
    other = paired_bootstrap(truth, good, bad, settings=BootstrapSettings(500, 0.9, seed=8))
    assert (other.low, other.high) != (once.low, once.high)


def test_paired_bootstrap_refuses_mismatched_inputs():
    truth, good, bad = _classes(5)
    with pytest.raises(ValueError, match="same seeds"):
        paired_bootstrap(truth, good, bad[:2])
    with pytest.raises(ValueError, match="predictions per seed"):
        paired_bootstrap(truth, good[:, :10], bad)
    with pytest.raises(ValueError, match="metric must be one of"):
        paired_bootstrap(truth, good, bad, "recall")
    with pytest.raises(ValueError, match="resamples"):
        BootstrapSettings(resamples=0)


def test_problems_interval_matches_scipy():
    differences = np.array([0.5, -1.2, 2.0, 0.3, 1.1, -0.4, 0.9, 1.6, 0.2, -0.1, 0.7, 1.3])
    ours = problems_interval(differences, SETTINGS)
    theirs = stats.bootstrap(
        (differences,),
        np.mean,
        n_resamples=500,
        confidence_level=0.9,
        method="percentile",
        rng=np.random.default_rng(7),
    ).confidence_interval
    assert (ours.low, ours.high) == pytest.approx((theirs.low, theirs.high), abs=1e-12)
    assert ours.estimate == pytest.approx(differences.mean())
    assert ours.method == "bootstrap over problems"


def test_sign_and_signed_rank_tests():
    assert sign_test([1.0] * 10) == pytest.approx(2 / 2**10)  # all ten ahead: 2 x (1/2)^10
    assert sign_test([1, -1, 0, 0]) == 1.0 and sign_test([0, 0]) == 1.0
    assert signed_rank_test([1, 2, 3, 4, 5]) == pytest.approx(2 / 2**5)  # exact: the one most extreme sign pattern
    assert signed_rank_test([0.0, 0.0]) == 1.0
    values = [0.4, -0.2, 1.5, 0.8, -0.9, 2.2, 0.1, 0.6]
    assert signed_rank_test(values) == pytest.approx(stats.wilcoxon(values).pvalue)
    assert sign_test(values) == pytest.approx(stats.binomtest(6, 8).pvalue)


def test_compare_problems_counts():
    comparison = compare_problems([1.0, 2.0, 0.0, -0.5], SETTINGS)
    assert (comparison.wins, comparison.ties, comparison.losses) == (2, 1, 1)
    assert comparison.sign_p == pytest.approx(stats.binomtest(2, 3).pvalue)
    assert comparison.interval.resamples == 500


def test_seeds_interval_is_the_t_interval():
    differences = [0.012, 0.010, 0.014]
    ours = seeds_interval(differences, 0.95)
    theirs = stats.ttest_1samp(differences, 0.0).confidence_interval(0.95)
    assert (ours.low, ours.high) == pytest.approx((theirs.low, theirs.high), abs=1e-12)
    assert ours.verdict == "win" and ours.resamples is None and "3 seeds" in ours.method
    single = seeds_interval([0.5])
    assert single.verdict == "tie" and math.isinf(single.low)


def test_interval_verdicts_units_and_text():
    interval = Interval(0.012, -0.001, 0.025, 0.95, 2000, 0, "x")
    assert interval.verdict == "tie"
    points = interval.scaled(100)
    assert (points.estimate, points.low, points.high) == pytest.approx((1.2, -0.1, 2.5))
    assert points.text() == "+1.20 [-0.10, +2.50]"
    counts = verdict_counts(
        [interval, Interval(1, 0.5, 2, 0.95, None, None, "x"), Interval(-1, -2, -0.1, 0.95, 1, 0, "x")]
    )
    assert counts == {"win": 1, "tie": 1, "loss": 1}


def test_power_formula_and_its_inverses():
    a = PowerAssumptions(disagreement=0.1, seed_std=0.005, confidence=0.95, power=0.8)
    z = stats.norm.ppf(0.975) + stats.norm.ppf(0.8)
    assert a.z == pytest.approx(z)
    mde = detectable_difference(3, 400, a)
    assert mde == pytest.approx(z * math.sqrt(0.1 / 400 + 2 * 0.005**2 / 3))
    texts = needed_test_texts(mde, 3, a)
    assert texts is not None and abs(texts - 400) <= 1
    seeds = needed_seeds(mde, 400, a)
    assert seeds is not None and abs(seeds - 3) <= 1
    assert detectable_difference(3, 1600, a) < mde  # more texts, smaller detectable difference
    assert needed_seeds(0.001, 400, a) is None  # the test set alone is too noisy for 0.1 points
    assert needed_test_texts(0.001, 3, PowerAssumptions(0.1, seed_std=0.02)) is None


def test_the_results_table_gives_the_search_gain_its_interval_over_seeds():
    from ilge_search.study.results import StudyResult, format_results

    common = dict(storage="s", model="m", task="t", encoder="cayley", metric="accuracy", n_complete=4, n_pruned=0)
    result = StudyResult(
        study_name="a", n_failed=0, test_mean=0.8, test_std=0.01, test_scores=[0.79, 0.80, 0.81],
        search_gain=0.012, gain_scores=[0.012, 0.010, 0.014], **common,
    )  # fmt: skip
    interval = seeds_interval([0.012, 0.010, 0.014])
    assert f"+0.0120 [{interval.low:+.4f}, {interval.high:+.4f}] win" in format_results([result])
    single = StudyResult(study_name="b", n_failed=0, search_gain=0.5, gain_scores=[0.5], **common)
    assert "+0.5000" in format_results([single]) and "[" not in format_results([single])
