"""The leave-one-task-out evaluation stored by :mod:`ilge_search.defaults.loto`, as tables and sentences.

The results report, ``defaults.md`` and ``ilge-search loto`` show the same rows: per (model, left-out task, family), the
built-in and the regenerated defaults' test scores and their difference; per family and size bucket, the mean difference
with its bootstrap interval over the left-out rows, and whether the regenerated defaults win (the interval above
0, in the setting they ship in).
"""

from __future__ import annotations

import math

from ..defaults.loto import LotoResult, LotoVerdict
from .document import MISSING, Cell, plural

__all__ = ["loto_rows", "loto_verdict_rows", "loto_sentences"]


def _mean_std(mean: float, std: float, seeds: int) -> str:
    if math.isnan(mean):
        return MISSING
    return f"{mean:.2f} ± {std:.2f}" if seeds > 1 else f"{mean:.2f}"


def loto_rows(result: LotoResult) -> tuple[list[str], list[list[Cell]]]:
    """(header, rows): per (model, left-out task, family), built-in and regenerated defaults' test scores
    (mean ± std over seeds), their difference, and how many other studies the regenerated ones came from."""
    header = [
        "model",
        "left-out task",
        "family",
        "unit",
        "seeds",
        "built-in",
        "regenerated without it",
        "difference",
        "from studies",
    ]
    rows = []
    for r in result.rows.itertuples():
        shown = round(r.difference, 2)  # the better of the two in bold, at the shown precision
        rows.append(
            [
                Cell(r.model),
                Cell(r.task),
                Cell(r.family),
                Cell(r.unit),
                Cell(str(len(r.seeds))),
                Cell(_mean_std(r.builtin_mean, r.builtin_std, len(r.seeds)), bold=shown < 0),
                Cell(
                    _mean_std(r.regenerated_mean, r.regenerated_std, len(r.seeds))
                    + (" (same config)" if r.same_config else ""),
                    bold=shown > 0,
                ),
                Cell(f"{r.difference:+.2f}"),
                Cell(str(r.regenerated_from)),
            ]
        )
    return header, rows


def _interval(verdict: LotoVerdict) -> str:
    if verdict.evidence is None:
        return MISSING
    interval = verdict.evidence.comparison.interval
    return f"[{interval.low:+.2f}, {interval.high:+.2f}]"


def loto_verdict_rows(result: LotoResult) -> tuple[list[str], list[list[Cell]]]:
    """(header, rows): per family and size bucket, the mean difference with its bootstrap interval over the
    left-out rows and its verdict, and whether the regenerated defaults win (what shipping needs)."""
    header = ["family", "size", "rows", "mean difference", "95% interval", "verdict", "regenerated ahead", "behind"]
    header.append("regenerated win")
    rows = [
        [
            Cell(v.family),
            Cell(v.bucket),
            Cell(str(v.rows)),
            Cell(f"{v.mean_difference:+.2f}"),
            Cell(_interval(v)),
            Cell(v.evidence.comparison.interval.verdict if v.evidence else MISSING),
            Cell(str(v.wins)),
            Cell(str(v.losses)),
            Cell("yes" if v.regenerated_win else "no", bold=v.regenerated_win),
        ]
        for v in result.verdicts.values()
    ]
    return header, rows


def loto_sentences(result: LotoResult) -> list[str]:
    """One sentence per family and bucket saying whether the regenerated defaults won, and what is missing."""
    out = []
    for v in result.verdicts.values():
        seeds = sorted(
            {
                len(s)
                for s in result.rows.loc[
                    (result.rows["family"] == v.family) & (result.rows["bucket"] == v.bucket), "seeds"
                ]
            }
        )
        verb = "beat" if v.regenerated_win else "do not beat"
        interval = f" {_interval(v)}, a {v.evidence.comparison.interval.verdict}" if v.evidence else ""
        setting = f"; {v.setting}" if v.setting else ""
        out.append(
            f"{v.family} ({v.bucket} models): defaults regenerated without the task {verb} the built-in "
            f"defaults over {plural(v.rows, 'left-out (model, task) row')}: "
            f"{v.mean_difference:+.2f} points{interval} (ahead on {v.wins}, behind on {v.losses}; "
            f"{'/'.join(map(str, seeds))} seeds per configuration{setting})."
        )
    if result.missing:
        out.append(f"Not evaluated yet (or stale): {', '.join(result.missing)}.")
    out += result.notes
    return out
