"""Confidence intervals and tests for "A beats B": the one place the platform's comparisons are judged.

Three kinds of comparison, each returning an :class:`Interval` whose :attr:`~Interval.verdict` is
``win`` (the whole interval above 0), ``loss`` (below 0) or ``tie`` (it contains 0):

- :func:`paired_bootstrap`: two models scored on the *same* test examples with the *same* seeds. Each
  resample draws test examples with replacement, the same indices for both models and every seed; its
  statistic is the seed mean of the metric difference on those examples. The interval covers the
  sampling of the test set with the trained models held fixed (seed noise enters only through the
  seeds averaged; with 3 seeds it cannot be resampled usefully).
- :func:`problems_interval` and :func:`compare_problems`: a mean difference over problems (one
  difference per model and task), bootstrap over problems, with a sign test and a Wilcoxon
  signed-rank test beside it.
- :func:`seeds_interval`: a mean of per-seed paired differences when only per-seed scores are stored
  (a Student t interval: with 3 seeds a bootstrap has only 10 distinct resamples).

The bootstraps are percentile intervals drawn with :func:`numpy.random.default_rng` from a recorded
seed, so they match ``scipy.stats.bootstrap(..., paired=True, method="percentile")`` given the same
seed; the number of resamples and the seed travel with the result.

Power (:func:`detectable_difference`, :func:`needed_test_texts`, :func:`needed_seeds`) uses a normal
approximation of a paired accuracy difference: on ``N`` test texts the per-text difference of two
models is -1, 0 or +1, nonzero on a fraction ``q`` of texts (their disagreement rate), so its mean has
variance about ``q / N``; each model's seed mean adds ``seed_std**2 / S`` (training noise measured
over seeds on a fixed test set), twice for a difference of two models.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats

__all__ = [
    "METRICS",
    "VERDICTS",
    "BootstrapSettings",
    "Interval",
    "ProblemsComparison",
    "paired_bootstrap",
    "problems_interval",
    "compare_problems",
    "seeds_interval",
    "sign_test",
    "signed_rank_test",
    "verdict_counts",
    "PowerAssumptions",
    "detectable_difference",
    "needed_test_texts",
    "needed_seeds",
]

METRICS = ("accuracy", "macro_f1", "spearman")
VERDICTS = ("win", "tie", "loss")
_CHUNK_VALUES = 4_000_000  # resampled values held at once; bounds memory on large test sets


@dataclass(frozen=True)
class BootstrapSettings:
    """How many resamples, at which confidence, from which seed."""

    resamples: int = 2000
    confidence: float = 0.95
    seed: int = 0

    def __post_init__(self) -> None:
        if self.resamples < 1:
            raise ValueError(f"resamples must be at least 1, got {self.resamples}")
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence must be between 0 and 1, got {self.confidence}")


@dataclass(frozen=True)
class Interval:
    """An estimate of a difference (first minus second) with its two-sided confidence interval.

    ``resamples`` and ``seed`` are those of the bootstrap that made it (``None`` for an interval that
    draws nothing, such as the t interval over seeds); ``method`` names how it was made.
    """

    estimate: float
    low: float
    high: float
    confidence: float
    resamples: int | None
    seed: int | None
    method: str

    @property
    def verdict(self) -> str:
        """``win`` when the whole interval lies above 0, ``loss`` below 0, else ``tie``."""
        if self.low > 0:
            return "win"
        if self.high < 0:
            return "loss"
        return "tie"

    def scaled(self, factor: float) -> Interval:
        """The same interval in other units (e.g. x 100 for points of accuracy)."""
        return replace(self, estimate=self.estimate * factor, low=self.low * factor, high=self.high * factor)

    def text(self, digits: int = 2) -> str:
        """``+1.23 [-0.40, +2.80]``: the estimate and its interval, signed."""
        return f"{self.estimate:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"


@dataclass(frozen=True)
class ProblemsComparison:
    """A mean difference over problems: its bootstrap interval, the two tests' p-values and the counts
    of problems ahead (``wins``), level (``ties``: a difference of exactly 0) and behind (``losses``)."""

    interval: Interval
    sign_p: float
    wilcoxon_p: float
    wins: int
    ties: int
    losses: int


# ----------------------------------------------------------------------------- metrics on resamples


def _accuracy_rows(truth: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    return (truth == predicted).mean(axis=-1)


def _macro_f1_rows(truth: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    """Macro-F1 of each row, over the classes present in that row's truth or predictions (as
    :func:`ilge_search.engine.metrics.macro_f1` and scikit-learn count them)."""
    rows = truth.shape[0]
    classes = int(max(truth.max(), predicted.max())) + 1
    offsets = np.arange(rows)[:, None] * classes
    true_count = np.bincount((offsets + truth).ravel(), minlength=rows * classes).reshape(rows, classes)
    pred_count = np.bincount((offsets + predicted).ravel(), minlength=rows * classes).reshape(rows, classes)
    hits = np.where(truth == predicted, offsets + truth, -1).ravel()
    tp = np.bincount(hits[hits >= 0], minlength=rows * classes).reshape(rows, classes)
    denominator = true_count + pred_count  # 2tp + fp + fn
    present = denominator > 0
    f1 = np.divide(2.0 * tp, denominator, out=np.zeros(tp.shape), where=present)
    return f1.sum(axis=1) / present.sum(axis=1)


def _spearman_rows(truth: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    """Spearman correlation of each row (ties averaged); 0.0 for a row where either side is constant."""
    x = stats.rankdata(truth, axis=-1)
    y = stats.rankdata(predicted, axis=-1)
    x = x - x.mean(axis=-1, keepdims=True)
    y = y - y.mean(axis=-1, keepdims=True)
    denominator = np.sqrt((x * x).sum(axis=-1) * (y * y).sum(axis=-1))
    return np.divide((x * y).sum(axis=-1), denominator, out=np.zeros(denominator.shape), where=denominator > 0)


_ROW_METRICS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "accuracy": _accuracy_rows,
    "macro_f1": _macro_f1_rows,
    "spearman": _spearman_rows,
}


def _as_seeds(predictions: np.ndarray | Sequence, size: int, name: str) -> np.ndarray:
    array = np.asarray(predictions)
    array = array[None, :] if array.ndim == 1 else array
    if array.ndim != 2 or array.shape[1] != size:
        raise ValueError(f"{name} must hold {size} predictions per seed (shape (seeds, {size})), got {array.shape}")
    return array


def _mean_difference(truth: np.ndarray, first: np.ndarray, second: np.ndarray, metric: str) -> Callable:
    """The statistic of :func:`paired_bootstrap`: for index rows ``(B, N)``, the seed mean of
    metric(first) minus metric(second) on those examples, one value per row."""
    rows = _ROW_METRICS[metric]

    def statistic(indices: np.ndarray) -> np.ndarray:
        picked = truth[indices]
        total = np.zeros(indices.shape[0])
        for seed_first, seed_second in zip(first, second, strict=True):
            total += rows(picked, seed_first[indices]) - rows(picked, seed_second[indices])
        return total / len(first)

    return statistic


def _percentile_interval(
    estimate: float, distribution: np.ndarray, settings: BootstrapSettings, method: str
) -> Interval:
    alpha = (1.0 - settings.confidence) / 2.0
    low, high = np.quantile(distribution, [alpha, 1.0 - alpha])
    return Interval(
        float(estimate), float(low), float(high), settings.confidence, settings.resamples, settings.seed, method
    )


def _bootstrap_distribution(size: int, statistic: Callable, settings: BootstrapSettings, width: int) -> np.ndarray:
    """``settings.resamples`` values of ``statistic`` on index rows drawn with replacement from ``size``
    items; drawn row by row in chunks, so the indices are those of one ``rng.integers(0, size, (B, size))``."""
    rng = np.random.default_rng(settings.seed)
    chunk = max(1, _CHUNK_VALUES // max(1, size * width))
    values = []
    for start in range(0, settings.resamples, chunk):
        rows = min(chunk, settings.resamples - start)
        values.append(statistic(rng.integers(0, size, (rows, size))))
    return np.concatenate(values)


def paired_bootstrap(
    truth: np.ndarray | Sequence,
    first: np.ndarray | Sequence,
    second: np.ndarray | Sequence,
    metric: str = "accuracy",
    settings: BootstrapSettings | None = None,
) -> Interval:
    """Paired bootstrap interval of ``metric(first) - metric(second)`` on the same test examples.

    Args:
        truth: ``(N,)`` true labels (``accuracy``, ``macro_f1``: class ids) or scores (``spearman``).
        first, second: each model's predictions, ``(N,)`` or ``(seeds, N)`` with the same seeds in
            the same order; a resample draws the same examples for both models and every seed.
        metric: ``accuracy``, ``macro_f1`` or ``spearman``.
        settings: resamples, confidence and seed (default 2000, 0.95, seed 0).
    """
    if metric not in _ROW_METRICS:
        raise ValueError(f"metric must be one of {list(METRICS)}, got {metric!r}")
    settings = settings or BootstrapSettings()
    truth = np.asarray(truth)
    if truth.ndim != 1 or truth.size < 2:
        raise ValueError(f"truth must be one value per test example (at least 2), got shape {truth.shape}")
    first_seeds = _as_seeds(first, truth.size, "first")
    second_seeds = _as_seeds(second, truth.size, "second")
    if first_seeds.shape != second_seeds.shape:
        raise ValueError(f"both models need the same seeds: {first_seeds.shape[0]} vs {second_seeds.shape[0]}")
    statistic = _mean_difference(truth, first_seeds, second_seeds, metric)
    estimate = float(statistic(np.arange(truth.size)[None, :])[0])
    distribution = _bootstrap_distribution(truth.size, statistic, settings, 2 * len(first_seeds) + 1)
    return _percentile_interval(estimate, distribution, settings, f"paired bootstrap over test examples ({metric})")


# ----------------------------------------------------------------------------- over problems and seeds


def _differences(values: Iterable[float], name: str) -> np.ndarray:
    array = np.asarray(list(values), dtype=np.float64)
    if array.ndim != 1 or array.size == 0 or not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be a non-empty list of finite numbers")
    return array


def problems_interval(differences: Iterable[float], settings: BootstrapSettings | None = None) -> Interval:
    """Bootstrap interval of the mean of per-problem differences (problems drawn with replacement)."""
    settings = settings or BootstrapSettings()
    values = _differences(differences, "differences")

    def statistic(indices: np.ndarray) -> np.ndarray:
        return values[indices].mean(axis=-1)

    distribution = _bootstrap_distribution(values.size, statistic, settings, 1)
    return _percentile_interval(float(values.mean()), distribution, settings, "bootstrap over problems")


def sign_test(differences: Iterable[float]) -> float:
    """Two-sided sign test p-value: positives among the nonzero differences against a fair coin
    (1.0 when every difference is 0)."""
    values = _differences(differences, "differences")
    nonzero = values[values != 0]
    if nonzero.size == 0:
        return 1.0
    return float(stats.binomtest(int((nonzero > 0).sum()), int(nonzero.size), 0.5).pvalue)


def signed_rank_test(differences: Iterable[float]) -> float:
    """Two-sided Wilcoxon signed-rank p-value (zeros dropped; 1.0 when every difference is 0)."""
    values = _differences(differences, "differences")
    if not np.any(values != 0):
        return 1.0
    return float(stats.wilcoxon(values).pvalue)


def compare_problems(differences: Iterable[float], settings: BootstrapSettings | None = None) -> ProblemsComparison:
    """The mean difference over problems with its interval, both tests and the counts ahead/level/behind."""
    values = _differences(differences, "differences")
    return ProblemsComparison(
        interval=problems_interval(values, settings),
        sign_p=sign_test(values),
        wilcoxon_p=signed_rank_test(values),
        wins=int((values > 0).sum()),
        ties=int((values == 0).sum()),
        losses=int((values < 0).sum()),
    )


def seeds_interval(differences: Iterable[float], confidence: float = 0.95) -> Interval:
    """Student t interval of the mean of per-seed paired differences (first minus second, same seed).

    Assumes the seed-to-seed noise is roughly normal. One seed gives an unbounded interval (a tie).
    """
    values = _differences(differences, "differences")
    method = f"t interval over {values.size} seeds"
    mean = float(values.mean())
    if values.size < 2:
        return Interval(mean, -math.inf, math.inf, confidence, None, None, method)
    half = float(stats.t.ppf(0.5 + confidence / 2.0, values.size - 1) * values.std(ddof=1) / math.sqrt(values.size))
    return Interval(mean, mean - half, mean + half, confidence, None, None, method)


def verdict_counts(intervals: Iterable[Interval]) -> dict[str, int]:
    """``{"win": w, "tie": t, "loss": l}`` over the intervals."""
    counts = dict.fromkeys(VERDICTS, 0)
    for interval in intervals:
        counts[interval.verdict] += 1
    return counts


# ----------------------------------------------------------------------------- power


@dataclass(frozen=True)
class PowerAssumptions:
    """What :func:`detectable_difference` assumes: the two models' disagreement rate on test texts (the
    fraction where exactly one is right), one model's per-seed standard deviation of the score
    (fraction units), and the test's confidence and power."""

    disagreement: float = 0.1
    seed_std: float = 0.0
    confidence: float = 0.95
    power: float = 0.8

    def __post_init__(self) -> None:
        if not 0.0 <= self.disagreement <= 1.0 or self.seed_std < 0:
            raise ValueError("disagreement must be in [0, 1] and seed_std non-negative")
        if not (0.0 < self.confidence < 1.0 and 0.0 < self.power < 1.0):
            raise ValueError("confidence and power must be between 0 and 1")

    @property
    def z(self) -> float:
        """z of a two-sided test at ``confidence`` plus z of ``power``."""
        return float(stats.norm.ppf(0.5 + self.confidence / 2.0) + stats.norm.ppf(self.power))


def detectable_difference(seeds: int, test_texts: int, assumptions: PowerAssumptions | None = None) -> float:
    """The smallest true accuracy difference (fraction) a paired comparison of ``seeds`` seeds on
    ``test_texts`` texts detects with the assumed power: ``z * sqrt(q / N + 2 seed_std**2 / S)``."""
    if seeds < 1 or test_texts < 1:
        raise ValueError(f"seeds and test_texts must be at least 1, got {seeds} and {test_texts}")
    a = assumptions or PowerAssumptions()
    return a.z * math.sqrt(a.disagreement / test_texts + 2.0 * a.seed_std**2 / seeds)


def needed_test_texts(difference: float, seeds: int, assumptions: PowerAssumptions | None = None) -> int | None:
    """Test texts needed to detect ``difference`` (fraction) with ``seeds`` seeds; ``None`` when seed
    noise alone is too large for any number of texts."""
    a = assumptions or PowerAssumptions()
    room = (difference / a.z) ** 2 - 2.0 * a.seed_std**2 / seeds
    if difference <= 0 or room <= 0:
        return None
    return max(1, math.ceil(a.disagreement / room))


def needed_seeds(difference: float, test_texts: int, assumptions: PowerAssumptions | None = None) -> int | None:
    """Seeds needed to detect ``difference`` (fraction) on ``test_texts`` texts; ``None`` when the test
    set's own sampling noise is too large for any number of seeds."""
    a = assumptions or PowerAssumptions()
    room = (difference / a.z) ** 2 - a.disagreement / test_texts
    if difference <= 0 or room <= 0:
        return None
    return max(1, math.ceil(2.0 * a.seed_std**2 / room))
