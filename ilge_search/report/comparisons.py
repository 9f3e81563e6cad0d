"""Cayley against a baseline, with intervals: over tasks (bootstrap) and per task (paired bootstrap or t interval).

A task's verdict is the paired bootstrap over its test examples and seeds where both studies' final evaluations
stored their per-example test predictions on the same test texts and seeds (:mod:`ilge_search.study.predictions`);
otherwise (the committed storages hold per-seed test scores only) the t interval of the paired per-seed
differences (the same final seeds, in the same order). A model's mean difference gets a bootstrap interval over
its tasks (:mod:`ilge_search.study.statistics`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..storage import artifact_dir_for
from ..study.limits import MIN_TEST_ROWS
from ..study.predictions import StoredPredictions, interval_kind, paired_interval, stored_final_predictions
from ..study.statistics import VERDICTS, problems_interval, seeds_interval
from .document import plural

if TYPE_CHECKING:
    from .data import ReportStudy

__all__ = ["seed_verdict", "task_verdict", "stored_predictions", "difference_sentence"]


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


def stored_predictions(storage_url: str, records: Sequence[ReportStudy]) -> dict[str, StoredPredictions]:
    """Study name -> its selected trial's stored test predictions, for the studies whose final evaluation
    stored them (read from the storage's artifact folder; none when it is absent)."""
    artifacts = artifact_dir_for(storage_url)
    out = {}
    for record in records:
        if record.final is not None and record.final.predictions:
            selected = stored_final_predictions(artifacts, record.final).get("selected")
            if selected is not None:
                out[record.name] = selected
    return out


def task_verdict(
    scores: tuple[Any, Any], predictions: tuple[StoredPredictions | None, StoredPredictions | None], metric: str
) -> tuple[str | None, str | None]:
    """(verdict, which interval) of first minus second on one task: the paired bootstrap over the test examples
    and seeds where both have stored predictions that pair, else the t interval of the per-seed ``scores``
    (``(None, None)``: they do not pair either, or the task has too few test examples for any interval)."""
    if any(side is not None and side.truth.size < MIN_TEST_ROWS for side in predictions):
        return None, None
    paired = paired_interval(*predictions, metric)
    if paired is not None:
        return paired.verdict, interval_kind(paired)
    verdict = seed_verdict(*scores)
    return verdict, None if verdict is None else "t interval"


def _per_task_how(kinds: Sequence[str | None]) -> str:
    """How the per-task verdicts were judged: the t interval alone (as before predictions were stored), or
    how many tasks each interval judged."""
    paired = sum(kind == "paired bootstrap" for kind in kinds)
    if not paired:
        return "per task over the seeds (95% t interval)"
    seeds = sum(kind == "t interval" for kind in kinds)
    how = f"{plural(paired, 'task')} by a paired bootstrap over the test examples and seeds"
    if seeds:
        how += f", {plural(seeds, 'task')} by the t interval over the seeds"
    return f"per task (95%: {how})"


def difference_sentence(
    label: str,
    diffs: Sequence[float],
    verdicts: Sequence[str | None],
    decimals: int,
    kinds: Sequence[str | None] = (),
) -> str:
    """Cayley's mean difference against ``label`` over tasks with its bootstrap interval, and the per-task
    win/tie/loss counts; ``kinds`` says which interval judged each task (none given: the t interval)."""
    interval = problems_interval(diffs)
    spread = f"range {min(diffs):+.{decimals}f} to {max(diffs):+.{decimals}f}; " if len(diffs) > 1 else ""
    counts = {verdict: sum(v == verdict for v in verdicts) for verdict in VERDICTS}
    unpaired = sum(v is None for v in verdicts)
    paired = f"; {plural(unpaired, 'task')} without paired seeds" if unpaired else ""
    return (
        f"against {label}, Cayley's difference is {interval.estimate:+.{decimals}f} points on average "
        f"[{interval.low:+.{decimals}f}, {interval.high:+.{decimals}f}] ({spread}95% bootstrap over "
        f"{plural(len(diffs), 'task')}: a {interval.verdict}); {_per_task_how(kinds)}: "
        f"{counts['win']} win, {counts['tie']} tie and {counts['loss']} loss{paired}"
    )
