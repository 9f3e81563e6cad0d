"""Cayley against a baseline, with intervals: over tasks (bootstrap) and per task over the seeds (t interval).

The committed storages hold each final evaluation's per-seed test scores, not per-example predictions, so a
task's verdict comes from the paired per-seed differences (the same final seeds, in the same order) and a
model's mean difference gets a bootstrap interval over its tasks (:mod:`ilge_search.study.statistics`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..study.statistics import VERDICTS, problems_interval, seeds_interval
from .document import plural

__all__ = ["seed_verdict", "difference_sentence"]


def _scores(value: Any) -> list[float]:
    if isinstance(value, str):
        return [float(v) for v in json.loads(value)]
    return [] if value is None else [float(v) for v in value]


def seed_verdict(first: Any, second: Any) -> str | None:
    """``win``/``tie``/``loss`` of first minus second from their per-seed scores paired by position (the same
    final seeds); ``None`` when they do not pair (different counts, or a single seed)."""
    a, b = _scores(first), _scores(second)
    if len(a) != len(b) or len(a) < 2:
        return None
    return seeds_interval([x - y for x, y in zip(a, b, strict=True)]).verdict


def difference_sentence(label: str, diffs: Sequence[float], verdicts: Sequence[str | None], decimals: int) -> str:
    """Cayley's mean difference against ``label`` over tasks with its bootstrap interval, and the per-task
    win/tie/loss counts over the seeds."""
    interval = problems_interval(diffs)
    spread = f"range {min(diffs):+.{decimals}f} to {max(diffs):+.{decimals}f}; " if len(diffs) > 1 else ""
    counts = {verdict: sum(v == verdict for v in verdicts) for verdict in VERDICTS}
    unpaired = sum(v is None for v in verdicts)
    paired = f"; {plural(unpaired, 'task')} without paired seeds" if unpaired else ""
    return (
        f"against {label}, Cayley's difference is {interval.estimate:+.{decimals}f} points on average "
        f"[{interval.low:+.{decimals}f}, {interval.high:+.{decimals}f}] ({spread}95% bootstrap over "
        f"{plural(len(diffs), 'task')}: a {interval.verdict}); per task over the seeds (95% t interval): "
        f"{counts['win']} win, {counts['tie']} tie and {counts['loss']} loss{paired}"
    )
