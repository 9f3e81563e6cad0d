"""How scores are shown: accuracy and correlations x 100, other metrics as they are.

The report's tables, the leave-one-task-out rows of :mod:`ilge_search.defaults.loto`
and the figures all show a metric in the unit :func:`score_unit` gives it, so one
table never mixes 0.91 and 91.0.
"""

from __future__ import annotations

__all__ = ["score_unit"]

_PERCENT_METRICS = {
    "accuracy": "acc. %",
    "spearman": "Spearman ×100",
    "pearson": "Pearson ×100",
    "f1": "F1 %",
    "macro_f1": "macro-F1 %",
}


def score_unit(metric: str) -> tuple[float, str]:
    """(scale, unit label) of a metric: accuracy and correlations are shown x 100."""
    if metric in _PERCENT_METRICS:
        return 100.0, _PERCENT_METRICS[metric]
    return 1.0, metric
