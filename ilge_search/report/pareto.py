"""How small an encoder can be for a given score: the Pareto fronts of multi-objective studies.

Drawn only when the storage holds multi-objective studies (:mod:`ilge_search.study.objectives`). Per
(model, task), two panels on a log axis of trainable parameters: *search (validation)*, every complete
trial with its score-vs-parameters front and the retrained trials ringed; *final (test)*, each retrained
front trial's test score with the single-layer baselines of the same storage as reference points.
Validation and test are never mixed in one panel; the front is on score and parameters even when a study
also minimised latency. A table of every final front and one sentence per study go with the figures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..record import FrontMember, trial_record
from ..study.objectives import complete_trials, pareto_front
from ..tasks.scores import score_unit
from .data import ReportStudy, method_labels, methods
from .document import MISSING, Cell, plural, slug
from .figures import encoder_colors, figure_style, new_figure, save_figure

if TYPE_CHECKING:
    import optuna
    from matplotlib.axes import Axes
    from matplotlib.typing import ColorType

__all__ = ["PARETO_BASELINES", "PARETO_NOTE", "pareto_pairs", "pareto_rows", "pareto_notes", "draw_pareto_figures"]

PARETO_BASELINES = ("last-layer", "best-layer", "mean-layers")  # reference points: no search over layers needed
PARETO_NOTE = (
    "Multi-objective studies maximise the validation score and minimise the trainable parameters (and, where "
    "named, the forward latency per 1,000 samples). Their final evaluation retrains up to K trials of the "
    "Pareto front, spread from the best score to the smallest model, with the final seeds, and scores each on "
    "test once per seed. Left panels: the search on validation (front as a step line, retrained trials "
    "ringed); right panels: the retrained front on test (mean ± std over seeds) with the final test scores "
    "of the layer baselines (a linear probe on the last or the best layer, or on the mean of the layers: no "
    "encoder of their own) as reference points. Parameters include the classification head."
)
_BASELINE_MARKERS = {"last-layer": "s", "best-layer": "D", "mean-layers": "^"}


def pareto_pairs(records: Sequence[ReportStudy]) -> list[tuple[str, str]]:
    """(model, task) pairs with at least one multi-objective study, in report order."""
    pairs = {(r.model, r.task) for r in records if r.multi_objective}
    return sorted(pairs)


def _studies(records: Sequence[ReportStudy], model: str, task: str) -> list[ReportStudy]:
    return sorted(
        (r for r in records if r.multi_objective and r.model == model and r.task == task),
        key=lambda r: (methods().index(r.encoder), r.name),
    )


@dataclass(frozen=True)
class _Baseline:
    """A reference point: a single-objective layer-baseline study with a final test score."""

    record: ReportStudy
    params: int | None  # its final trial's trainable parameters (unknown: not drawn)
    test_mean: float
    test_std: float


def _baselines(records: Sequence[ReportStudy], model: str, task: str) -> list[_Baseline]:
    """The single-objective baseline studies of the pair with final scores, and their final trial's parameters."""
    found = []
    for encoder in PARETO_BASELINES:
        candidates = [
            (r, mean)
            for r in records
            if r.model == model
            and r.task == task
            and r.encoder == encoder
            and not r.multi_objective
            and (mean := r.test_mean) is not None
        ]
        if not candidates:
            continue
        record, mean = max(candidates, key=lambda pair: (len(pair[0].test_scores), pair[0].n_complete, pair[0].name))
        found.append(_Baseline(record, _final_params(record), mean, record.test_std or 0.0))
    return found


def _final_params(record: ReportStudy) -> int | None:
    trial = None if record.final_trial is None else record.trial_records.get(record.final_trial)
    return None if trial is None or trial.params is None else int(trial.params)


def _front_records(record: ReportStudy) -> list[tuple[FrontMember, int]]:
    """The retrained trials of the study's final front that know their size, with it."""
    members = record.final.front if record.final else []
    return [(member, member.params) for member in members if member.params is not None]


def _search_front(record: ReportStudy) -> list[tuple[optuna.trial.FrozenTrial, int]]:
    """The complete trials' front on (score, parameters), with each trial's parameters, fewest first."""

    directions = ["maximize" if record.maximize else "minimize", "minimize"]
    front = pareto_front(complete_trials(record.study), directions, ("score", "params"))
    sized = [(trial, params) for trial in front if (params := trial_record(trial).params) is not None]
    return sorted(sized, key=lambda pair: pair[1])


@dataclass(frozen=True)
class _Series:
    """How one study's points are drawn: its colour, its legend label and the score's display scale."""

    color: ColorType
    label: str
    scale: float


def _pareto_figure(studies: Sequence[ReportStudy], baselines: Sequence[_Baseline], path: Path) -> bool:

    if not any(complete_trials(r.study) for r in studies):
        return False
    colors = encoder_colors()
    scale, unit = score_unit(studies[0].metric)
    figure = new_figure(11.0, 4.4)
    search, final = figure.subplots(1, 2, sharex=True)
    for record in studies:
        series = _Series(colors[record.encoder], method_labels()[record.encoder], scale)
        _plot_search(search, record, series)
        _plot_retrained(search, final, record, series)
    _plot_baselines(final, baselines, colors, scale)
    if any(_front_records(r) for r in studies):
        search.scatter([], [], s=120, facecolors="none", edgecolors="black", label="retrained (final front)")
    _style_axes(search, final, unit)
    first = studies[0]
    figure.suptitle(
        f"{first.model} · {first.task}: score vs trainable parameters (multi-objective search, "
        f"objectives {', '.join(first.identity.objectives)})"
    )
    save_figure(figure, path)
    return True


def _plot_search(search: Axes, record: ReportStudy, series: _Series) -> None:
    """Every sized complete trial of the search, and the search's front as a step line."""

    complete = complete_trials(record.study)
    sizes = {t.number: size for t in complete if (size := trial_record(t).params)}
    trials = [t for t in complete if t.number in sizes]
    search.scatter(
        [sizes[t.number] for t in trials],
        [t.values[0] * series.scale for t in trials],
        s=14,
        alpha=0.35,
        color=series.color,
        label=f"{series.label}: trials ({len(trials)})",
    )
    front = _search_front(record)
    search.plot(
        [params for _, params in front],
        [t.values[0] * series.scale for t, _ in front],
        drawstyle="steps-post",
        marker="o",
        markersize=5,
        linewidth=1.8,
        color=series.color,
        label=f"{series.label}: front ({len(front)})",
    )


def _plot_retrained(search: Axes, final: Axes, record: ReportStudy, series: _Series) -> None:
    """The retrained final front: ringed on the search panel, its test scores on the final panel."""
    retrained = _front_records(record)
    if not retrained:
        return
    search.scatter(
        [params for _, params in retrained],
        [r.val_score * series.scale for r, _ in retrained],
        s=120,
        facecolors="none",
        edgecolors="black",
        linewidths=1.2,
        zorder=4,
    )
    ordered = sorted(retrained, key=lambda pair: pair[1])
    final.errorbar(
        [params for _, params in ordered],
        [r.test_mean * series.scale for r, _ in ordered],
        yerr=[r.test_std * series.scale for r, _ in ordered],
        marker="o",
        markersize=5,
        capsize=3,
        linewidth=1.6,
        color=series.color,
        label=f"{series.label}: final front ({len(ordered)})",
    )


def _plot_baselines(final: Axes, baselines: Sequence[_Baseline], colors: dict[str, ColorType], scale: float) -> None:
    """The single-objective baselines of the same (model, task) as lone markers on the final panel."""
    for baseline in baselines:
        if baseline.params is None:
            continue
        encoder = baseline.record.encoder
        final.errorbar(
            [baseline.params],
            [baseline.test_mean * scale],
            yerr=[baseline.test_std * scale],
            marker=_BASELINE_MARKERS[encoder],
            markersize=8,
            capsize=3,
            linestyle="none",
            color=colors[encoder],
            label=f"{method_labels()[encoder]} (baseline)",
        )


def _style_axes(search: Axes, final: Axes, unit: str) -> None:
    for ax, title, kind in (
        (search, "search: every trial (validation)", "validation"),
        (final, "final front retrained (test, mean ± std)", "test"),
    ):
        ax.set_xscale("log")
        ax.set_xlabel("trainable parameters (log scale)")
        ax.set_ylabel(f"{kind} {unit}")
        ax.set_title(title)
        ax.grid(alpha=0.3, which="both")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower right", frameon=False)


def draw_pareto_figures(records: Sequence[ReportStudy], fig_dir: Path) -> dict[tuple[str, str], dict[str, str]]:
    """Per (model, task) with a multi-objective study: ``{"pareto": path relative to the report folder}``."""
    drawn: dict[tuple[str, str], dict[str, str]] = {}
    for model, task in pareto_pairs(records):
        name = f"{slug(model, task)}-pareto.png"
        with figure_style():
            done = _pareto_figure(_studies(records, model, task), _baselines(records, model, task), fig_dir / name)
        if done:
            drawn[(model, task)] = {"pareto": f"{fig_dir.name}/{name}"}
    return drawn


def _count(value: float | None) -> str:
    return MISSING if value is None else f"{int(value):,}"


def _mean_std(mean: float | None, std: float | None, scale: float) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return MISSING
    return f"{mean * scale:.2f} ± {(std or 0.0) * scale:.2f}"


def pareto_rows(records: Sequence[ReportStudy]) -> tuple[list[str], list[list[Cell]]]:
    """(header, rows): every retrained front trial, then the pair's reference baselines in italics."""
    header = ["model", "task", "encoder", "trial", "params", "latency ms/1k", "validation", "test (mean ± std)"]
    rows: list[list[Cell]] = []
    for model, task in pareto_pairs(records):
        for record in _studies(records, model, task):
            scale = score_unit(record.metric)[0]
            for front, params in _front_records(record):
                latency = front.latency_ms
                rows.append(
                    [
                        Cell(model),
                        Cell(task),
                        Cell(method_labels()[record.encoder]),
                        Cell(str(front.trial)),
                        Cell(_count(params)),
                        Cell(MISSING if latency is None else f"{latency:.1f}"),
                        Cell(f"{front.val_score * scale:.2f}"),
                        Cell(_mean_std(front.test_mean, front.test_std, scale)),
                    ]
                )
        for baseline in _baselines(records, model, task):
            record, scale = baseline.record, score_unit(baseline.record.metric)[0]
            rows.append(
                [
                    Cell(model, italic=True),
                    Cell(task, italic=True),
                    Cell(f"{method_labels()[record.encoder]} (baseline)", italic=True),
                    Cell(str(record.final_trial), italic=True),
                    Cell(_count(baseline.params), italic=True),
                    Cell(MISSING, italic=True),
                    Cell(MISSING if record.best_value is None else f"{record.best_value * scale:.2f}", italic=True),
                    Cell(_mean_std(record.test_mean, record.test_std, scale), italic=True),
                ]
            )
    return header, rows


def _study_sentence(record: ReportStudy, baselines: Sequence[_Baseline]) -> str:
    scale, unit = score_unit(record.metric)
    front = _search_front(record)
    head = (
        f"{record.model} · {record.task} · {method_labels()[record.encoder]}: {len(front)} of "
        f"{plural(record.n_complete, 'complete trial')} on the score-vs-parameters front"
    )
    retrained = _front_records(record)
    if not retrained:
        return head + "; no final front yet."
    best, best_params = max(retrained, key=lambda pair: pair[0].val_score if record.maximize else -pair[0].val_score)
    small, small_params = min(retrained, key=lambda pair: pair[1])
    text = head + f"; {len(retrained)} retrained ({len(record.test_scores)} seeds)"
    if small is best:
        text += (
            f": one trial, {_count(best_params)} parameters at "
            f"{_mean_std(best.test_mean, best.test_std, scale)} test {unit}"
        )
    else:
        ratio = best_params / max(1, small_params)
        delta = (best.test_mean - small.test_mean) * scale * (1 if record.maximize else -1)
        versus = f"{abs(delta):.2f} points {'lower' if delta >= 0 else 'higher'}"
        text += (
            f": the best-validation trial {best.trial} has {_count(best_params)} parameters and "
            f"{_mean_std(best.test_mean, best.test_std, scale)} test {unit}; the smallest, trial "
            f"{small.trial}, {_count(small_params)} ({ratio:.0f}x fewer) and "
            f"{_mean_std(small.test_mean, small.test_std, scale)} ({versus})"
        )
    references = [
        f"{method_labels()[b.record.encoder].lower()} {_mean_std(b.test_mean, b.test_std, scale)} "
        f"with {_count(b.params)} parameters"
        for b in baselines
    ]
    if references:
        text += "; for reference, " + ", ".join(references)
    return text + "."


def pareto_notes(records: Sequence[ReportStudy]) -> list[str]:
    """One sentence per multi-objective study: its front, what the smallest retrained trial costs in score."""
    notes = []
    for model, task in pareto_pairs(records):
        baselines = _baselines(records, model, task)
        notes += [_study_sentence(record, baselines) for record in _studies(records, model, task)]
    return notes
