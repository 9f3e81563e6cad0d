"""Ensembles of a study's trials, as the report shows them: a table per study and size, and test vs K.

Reads the :class:`~ilge_search.record.EnsembleRecord` each study stored; trains nothing. Scores are test means over the
ensemble evaluation's final seeds, in points; the validation-to-test gap is the score the choice was made on minus the
test mean. :func:`write_ensemble_page` (``reports/ensembles.sh``) writes ``OUT_STEM.md`` and ``OUT_STEM-vs-k.png``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from ..files import check_output_path, write_output_text
from ..record import EnsembleRecord, ensemble_record, study_record
from ..storage import open_storage
from ..study.statistics import Interval, problems_interval, seeds_interval, verdict_counts
from ..tasks.scores import score_unit
from .figures import figure_style, new_figure, save_figure

if TYPE_CHECKING:
    import optuna
    import pandas as pd

__all__ = [
    "ENSEMBLE_NOTE",
    "ensemble_frame",
    "ensemble_rows",
    "ensemble_sentences",
    "draw_ensemble_figure",
    "write_ensemble_page",
]

ENSEMBLE_NOTE = (
    "Ensembles of each search's complete trials: greedy forward selection with replacement (Caruana et al., "
    "2004) on the trials' validation predictions, K picks (the ensemble of K is the first K picks; K = 1 is "
    "the trial with the best validation score on its predictions). Classification averages the members' "
    "class probabilities, similarity their predicted cosine similarities. The members are retrained with the "
    "final seeds and scored once per seed on test, beside the trial the selection rule picked, the starting "
    "configuration (no search) and the best single layer (a linear probe per layer, chosen on validation), "
    "with the same seeds. Gap: validation score the choice was made on minus the test mean."
)


def _mean(values: Sequence[float] | None) -> float:
    return statistics.fmean(values) if values else math.nan


def _study_rows(name: str, stored: EnsembleRecord, attrs: optuna.Study) -> list[dict[str, object]]:
    record = study_record(attrs)
    identity, data, final = record.identity, record.data, record.by_rule.get(stored.select)
    if identity is None or data is None:
        return []
    scale = score_unit(data.metric or "")[0]
    selected = _mean(stored.selected_test_scores)
    base = {
        "study": name,
        "model": identity.model,
        "task": identity.task,
        "train": identity.max_train,
        "metric": data.metric,
        "selected": selected * scale,
        "selected_gap": math.nan if final is None or final.val_test_gap is None else final.val_test_gap * scale,
        "start": _mean(stored.start_test_scores) * scale,
        "best_layer": _mean(stored.best_layer_test_scores) * scale,
        "member_seconds": stored.member_seconds,
        "latency_ms": stored.latency_ms,
        "single_latency_ms": stored.single_latency_ms,
        "asked": stored.size,
        "seeds": len(stored.seeds),
        "selected_scores": [v * scale for v in stored.selected_test_scores],
    }
    return [
        {
            **base,
            "k": size.size,
            "members": size.n_members,
            "ensemble": size.test_mean * scale,
            "ensemble_std": size.test_std * scale,
            "ensemble_val": size.val_score * scale,
            "ensemble_gap": math.nan if size.val_test_gap is None else size.val_test_gap * scale,
            "ensemble_scores": [v * scale for v in size.test_scores],
        }
        for size in sorted(stored.sizes.values(), key=lambda s: s.size)
    ]


def ensemble_frame(studies: Iterable[optuna.Study]) -> pd.DataFrame:
    """One row per (study with an ensemble evaluation, ensemble size) as a ``pandas.DataFrame``, scores in
    points; ``studies`` are Optuna studies or summaries (anything with ``study_name`` and ``user_attrs``)."""

    rows: list[dict[str, object]] = []
    for study in studies:
        stored = ensemble_record(study)
        if stored is not None:
            rows += _study_rows(str(study.study_name), stored, study)
    frame = pd.DataFrame(rows)
    if not frame.empty:
        frame = frame.sort_values(["train", "model", "task", "k"]).reset_index(drop=True)
    return frame


def _fmt(value: float | None, digits: int = 2, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def _paired(first: Sequence[float], second: Sequence[float]) -> Interval:
    """The t interval of first minus second over the seeds they share by position (the same final seeds)."""
    if len(first) != len(second) or not first:
        return Interval(math.nan, -math.inf, math.inf, 0.95, None, None, "unpaired")
    return seeds_interval([a - b for a, b in zip(first, second, strict=True)])


def _seed_interval(first: Sequence[float], second: Sequence[float]) -> str:
    interval = _paired(first, second)
    if not math.isfinite(interval.low):
        return "-"
    return f"[{interval.low:+.2f}, {interval.high:+.2f}] {interval.verdict}"


def ensemble_rows(frame: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the table: per study and K the ensemble's test mean +- std beside the selected
    trial, the start and the best single layer, both gaps, and the cost."""
    header = [
        "model",
        "task",
        "train",
        "K",
        "trials",
        "ensemble",
        "selected",
        "start",
        "best layer",
        "ens. - sel.",
        "95% CI (seeds)",
        "gap ens.",
        "gap sel.",
        "members s/seed",
        "ms/1k ens. (single)",
    ]
    rows = []
    for row in frame.itertuples(index=False):
        rows.append(
            [
                str(row.model),
                str(row.task),
                str(row.train),
                str(row.k),
                str(row.members),
                f"{_fmt(row.ensemble)} ± {_fmt(row.ensemble_std)}",
                _fmt(row.selected),
                _fmt(row.start),
                _fmt(row.best_layer),
                _fmt(row.ensemble - row.selected, signed=True),
                _seed_interval(row.ensemble_scores, row.selected_scores),
                _fmt(row.ensemble_gap, signed=True),
                _fmt(row.selected_gap, signed=True),
                _fmt(row.member_seconds, 1) if row.k == row.asked else "",
                f"{_fmt(row.latency_ms)} ({_fmt(row.single_latency_ms)})" if row.k == row.asked else "",
            ]
        )
    return header, rows


def ensemble_sentences(frame: pd.DataFrame) -> list[str]:
    """Per K: the mean difference to the selected trial, wins / ties / losses, and the mean gaps."""
    if frame.empty:
        return []
    out = []
    studies = frame["study"].nunique()
    for k, group in frame.groupby("k"):
        diff = group["ensemble"] - group["selected"]
        over = problems_interval(list(diff))
        counts = verdict_counts(
            _paired(e, s) for e, s in zip(group["ensemble_scores"], group["selected_scores"], strict=True)
        )
        out.append(
            f"K = {k}: ensemble minus selected trial {diff.mean():+.2f} points on average "
            f"[{over.low:+.2f}, {over.high:+.2f}] over {len(group)} of {studies} studies (95% bootstrap over "
            f"studies: a {over.verdict}; per study over the seeds, 95% t interval: {counts['win']} win, "
            f"{counts['tie']} tie, {counts['loss']} loss); minus start "
            f"{(group['ensemble'] - group['start']).mean():+.2f}; minus best single layer "
            f"{(group['ensemble'] - group['best_layer']).mean():+.2f}; mean validation-to-test gap "
            f"{group['ensemble_gap'].mean():+.2f} (selected trial: {group['selected_gap'].mean():+.2f})."
        )
    return out


def draw_ensemble_figure(frame: pd.DataFrame, path: Path) -> bool:
    """Test score of the ensemble minus that of the selected trial against K, one line per study and their
    mean; whether anything was drawn."""

    if frame.empty:
        return False
    with figure_style():
        figure = new_figure(6.4, 4.2)
        axes = figure.add_subplot(1, 1, 1)
        for _, group in frame.groupby("study"):
            axes.plot(group["k"], group["ensemble"] - group["selected"], color="0.7", linewidth=1, marker="o")
        mean = (frame.assign(diff=frame["ensemble"] - frame["selected"])).groupby("k")["diff"].mean()
        axes.plot(mean.index, mean.values, color="C0", linewidth=2.5, marker="o", label="mean over studies")
        start = (frame["start"] - frame["selected"]).groupby(frame["study"]).first().mean()
        layer = (frame["best_layer"] - frame["selected"]).groupby(frame["study"]).first().mean()
        axes.axhline(0.0, color="black", linewidth=1, label="selected trial")
        axes.axhline(start, color="C1", linestyle="--", label="start (mean)")
        axes.axhline(layer, color="C2", linestyle=":", label="best single layer (mean)")
        axes.set_xlabel("ensemble size K (greedy picks)")
        axes.set_ylabel("test minus selected trial (points)")
        axes.set_xticks(sorted(frame["k"].unique()))
        axes.legend(fontsize="small")
        path.parent.mkdir(parents=True, exist_ok=True)
        save_figure(figure, path)
    return True


def write_ensemble_page(storage_url: str, stem: Path, *, force: bool = False) -> Path:
    """``STEM.md`` (table and sentences) and ``STEM-vs-k.png`` from the ensemble evaluations in a storage.

    Both paths obey the output rule (:func:`~ilge_search.files.check_output_path`) before the storage is read:
    an existing or git-tracked file is replaced only with ``force``."""

    stem = Path(stem).expanduser()
    out = check_output_path(stem.parent / f"{stem.name}.md", force=force, option="stem")
    figure = check_output_path(stem.parent / f"{stem.name}-vs-k.png", force=force, option="stem")
    frame = ensemble_frame(open_storage(storage_url, must_exist=True).study_summaries())
    drawn = draw_ensemble_figure(frame, figure)
    header, rows = ensemble_rows(frame)
    lines = ["# Ensembles of a study's trials (measured)", "", ENSEMBLE_NOTE, ""]
    lines += [
        f"Storage: `{storage_url}`. Test scores in points (accuracy %, Spearman x 100 for similarity), mean over the "
        "final seeds. The selected "
        "trial's and the start's scores are those the study's final evaluation stored; the ensemble's members "
        "are retrained by `ilge-search ensemble`. Where K = 1 picks the selected trial, their difference is "
        "retraining noise alone (e.g. another torch thread count): the yardstick for the other rows.",
        "",
    ]
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows] + [""]
    lines += [f"- {sentence}" for sentence in ensemble_sentences(frame)] + [""]
    if drawn:
        lines += [f"![test minus selected trial against K]({figure.name})", ""]
    return write_output_text(out, "\n".join(lines))
