"""The report's figures (matplotlib, imported only when drawing) and fANOVA importances.

Per (model, task): a probe's validation score on each layer against the aggregators, the optimisation
histories and every study's hyperparameter importances; validation scores only. Figures are bare
``Figure`` objects on an Agg canvas (the caller's pyplot backend is never changed), drawn at the size the
page shows them (:data:`DISPLAY_DPI`, :func:`display_width`) and saved at :data:`SAVE_DPI`.
"""

from __future__ import annotations

import math
import textwrap
import warnings
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, cast

import optuna
from optuna.trial import TrialState

from ..progress import BarSpec, steps
from ..tasks.scores import score_unit
from .data import ReportStudy, method_labels, methods
from .document import slug

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from matplotlib.axes import Axes
    from matplotlib.backend_bases import RendererBase
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.text import Text
    from matplotlib.typing import ColorType, RcKeyType

__all__ = [
    "DISPLAY_DPI",
    "SAVE_DPI",
    "draw_figures",
    "trial_counts",
    "display_width",
    "new_figure",
    "save_figure",
    "fit_titles",
    "figure_style",
    "encoder_colors",
]

DISPLAY_DPI = 100  # pixels per inch of figure at which the page shows it (index.html sets the width)
SAVE_DPI = 150  # the PNG's own resolution: sharper text than the displayed size needs
MIN_FONT = 9.0  # points; tick labels, legends and panel titles never go below this
_RC: dict[RcKeyType, object] = {
    "font.size": 10.5,
    "axes.titlesize": 11,
    "axes.labelsize": 10.5,
    "xtick.labelsize": MIN_FONT + 0.5,
    "ytick.labelsize": MIN_FONT + 0.5,
    "legend.fontsize": MIN_FONT + 0.5,
    "figure.titlesize": 12.5,
}


def trial_counts(record: ReportStudy) -> str:
    """``"8 complete, 8 pruned"`` (failed trials only when there are any): what a panel title says."""
    parts = [f"{record.n_complete} complete", f"{record.n_pruned} pruned"]
    if record.n_failed:
        parts.append(f"{record.n_failed} failed")
    return ", ".join(parts)


def display_width(path: Path) -> int | None:
    """The width in pixels at which the page shows the PNG at ``path`` (its size at :data:`DISPLAY_DPI`)."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(24)
    except OSError:
        return None
    if len(header) < 24 or header[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    return round(int.from_bytes(header[16:20], "big") * DISPLAY_DPI / SAVE_DPI)


def new_figure(width: float, height: float) -> Figure:
    """A Figure of ``width`` x ``height`` inches at :data:`DISPLAY_DPI` on its own Agg canvas.

    No pyplot: the caller's backend is never changed.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # heavy: matplotlib only for figures
    from matplotlib.figure import Figure  # heavy: matplotlib only for figures

    figure = Figure(figsize=(width, height), dpi=DISPLAY_DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def save_figure(figure: Figure, path: Path) -> None:
    """Save at :data:`SAVE_DPI`; pages show it at :func:`display_width`, its size at :data:`DISPLAY_DPI`.

    Titles are first fitted to the width they have (:func:`fit_titles`), so none is cut at the figure's edges.
    """
    fit_titles(figure)
    figure.savefig(path, dpi=SAVE_DPI)


def fit_titles(figure: Figure) -> None:
    """Wrap each too-wide title (the figure's texts, every visible panel's title) at word boundaries, and shrink
    its font towards :data:`MIN_FONT` when wrapping alone cannot make it fit: the figure's title gets the figure's
    width, a panel's title its panel's width (its neighbours' titles sit beside it)."""
    figure.draw_without_rendering()  # the constrained layout places the panels, which gives their widths
    renderer = cast("FigureCanvasAgg", figure.canvas).get_renderer()
    room = figure.bbox.width * _TITLE_ROOM
    titles = [(text, room) for text in figure.texts]  # the figure's title is one of its texts
    titles += [(ax.title, min(room, ax.bbox.width * 1.1)) for ax in figure.axes if ax.get_visible()]
    for text, width in titles:
        if text.get_text():
            _fit_text(text, width, renderer)


_TITLE_ROOM = 0.96  # of the figure's width: a margin so that anti-aliased glyphs stay inside


def _fit_text(text: Text, width: float, renderer: RendererBase) -> None:
    """Rewrap ``text`` to fewer characters per line, else shrink it, until it is at most ``width`` pixels wide."""

    for _ in range(12):  # each round narrows by the measured overshoot; a few rounds reach the width
        extent = text.get_window_extent(renderer).width
        if extent <= width:
            return
        lines = text.get_text().split("\n")
        chars = max(1, int(max(map(len, lines)) * width / extent))
        wrapped = "\n".join(textwrap.fill(line, chars, break_long_words=False) for line in lines)
        if wrapped != text.get_text():
            text.set_text(wrapped)
        elif float(text.get_fontsize()) > MIN_FONT:  # a word too long for a line: smaller letters
            text.set_fontsize(max(MIN_FONT, float(text.get_fontsize()) * 0.9))
        else:  # already at the smallest legible size: split the word
            text.set_text("\n".join(textwrap.fill(line, chars) for line in lines))


def figure_style() -> AbstractContextManager[None]:
    """Larger fonts inside the block (only while drawing; the caller's rcParams are restored)."""
    from matplotlib import rc_context  # heavy: matplotlib only for figures

    return rc_context(_RC)


def encoder_colors() -> dict[str, ColorType]:
    """One colour per encoder of :func:`~ilge_search.report.data.methods`, the same in every figure."""
    from matplotlib import colormaps  # heavy: matplotlib only for figures

    cmap = colormaps["tab10"]
    return {m: cmap(i) for i, m in enumerate(methods())}


def _best_trial_lines(ax: Axes, by_encoder: dict[str, ReportStudy], colors: dict[str, ColorType], scale: float) -> None:
    """A dashed line per aggregator at its best trial's validation score."""
    for encoder in methods():
        record = by_encoder.get(encoder)
        if encoder == "best-layer" or record is None or record.best_value is None:
            continue
        ax.axhline(
            record.best_value * scale,
            color=colors[encoder],
            linestyle="--",
            linewidth=1.4,
            label=f"{method_labels()[encoder]} (best trial)",
        )


def _layer_figure(records: Sequence[ReportStudy], path: Path) -> bool:
    by_encoder = {r.encoder: r for r in records}
    probe = by_encoder.get("best-layer")
    if probe is None or not probe.layer_scores:
        return False
    scale, unit = score_unit(probe.metric)
    colors = encoder_colors()
    figure = new_figure(9.0, 4.2)
    ax = figure.add_subplot(1, 1, 1)
    layers = list(range(len(probe.layer_scores)))
    scores = [s * scale for s in probe.layer_scores]
    ax.plot(
        layers,
        scores,
        marker="o",
        markersize=4,
        linewidth=2,
        color=colors["best-layer"],
        label="linear probe on layer l",
        zorder=3,
    )
    if probe.chosen_layer is not None and 0 <= probe.chosen_layer < len(scores):
        ax.scatter(
            [probe.chosen_layer],
            [scores[probe.chosen_layer]],
            s=110,
            facecolors="none",
            edgecolors="black",
            linewidths=1.5,
            zorder=4,
            label=f"chosen layer ({probe.chosen_layer})",
        )
    _best_trial_lines(ax, by_encoder, colors, scale)
    from matplotlib.ticker import MaxNLocator  # heavy: matplotlib only for figures

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("layer (0 = embedding output)")
    ax.set_ylabel(f"best validation {unit}")
    ax.set_title(f"{probe.model} · {probe.task}: probe per layer vs aggregators (validation)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)
    save_figure(figure, path)
    return True


def _history_figure(records: Sequence[ReportStudy], path: Path) -> bool:
    """One panel per encoder (shared y axis): complete trials as dots, the best so far as a line."""
    from matplotlib.ticker import MaxNLocator  # heavy: matplotlib only for figures

    shown = [
        r
        for r in sorted(records, key=lambda r: methods().index(r.encoder))
        if not r.trials.empty and ((r.trials["state"] == "COMPLETE") & r.trials["value"].notna()).any()
    ]
    if not shown:
        return False
    colors = encoder_colors()
    columns = min(4, len(shown))
    rows = math.ceil(len(shown) / columns)
    figure = new_figure(2.9 * columns, 2.6 * rows + 0.5)
    axes = figure.subplots(rows, columns, sharey=True, squeeze=False)
    unit = ""
    for index, ax in enumerate(axes.flat):
        if index >= len(shown):
            ax.set_visible(False)
            continue
        record = shown[index]
        frame = record.trials
        complete = frame[(frame["state"] == "COMPLETE") & frame["value"].notna()].sort_values("number")
        scale, unit = score_unit(record.metric)
        values = complete["value"].astype(float) * scale
        best = values.cummax() if record.maximize else values.cummin()
        color = colors[record.encoder]
        ax.scatter(complete["number"], values, s=16, alpha=0.5, color=color)
        ax.plot(complete["number"], best, drawstyle="steps-post", linewidth=1.8, color=color)
        ax.set_title(f"{method_labels()[record.encoder]}\n{trial_counts(record)}", fontsize=MIN_FONT + 1)
        last = max(0, int(frame["number"].max()))
        ax.set_xlim(-0.5, last + 0.5)
        if last < 4:  # too few for the locator's integer ticks (it would fall back to fractions)
            ax.set_xticks(range(last + 1))
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=5))
        ax.grid(alpha=0.3)
        if index % columns == 0:
            ax.set_ylabel(f"validation {unit}")
        if index >= len(shown) - columns:
            ax.set_xlabel("trial")
    first = records[0]
    figure.suptitle(
        f"{first.model} · {first.task}: optimisation history per encoder (dots: complete trials; line: best so far)"
    )
    save_figure(figure, path)
    return True


def _importances(record: ReportStudy) -> tuple[dict[str, float], str | None]:
    """fANOVA importances over the parameters that vary among complete trials."""

    complete = record.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(complete) < 2:
        return {}, f"{len(complete)} complete trial(s)"
    common = set.intersection(*(set(t.params) for t in complete))
    varying = sorted(p for p in common if len({repr(t.params[p]) for t in complete}) > 1)
    if not varying:
        return {}, "no parameter varies among the complete trials"
    if len({t.values[0] for t in complete}) < 2:
        return {}, "every complete trial has the same value"
    # a multi-objective study: the importances for its score
    target = (lambda t: t.values[0]) if record.multi_objective else None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importances = optuna.importance.get_param_importances(
                record.study,
                evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0),
                params=varying,
                target=target,
            )
    except (RuntimeError, ValueError, ZeroDivisionError) as exc:
        return {}, f"importance evaluation failed: {exc}"
    values = {name: float(v) for name, v in importances.items() if math.isfinite(float(v))}
    return (values, None) if values else ({}, "importances are undefined (no variance explained)")


def _importance_figure(items: Sequence[tuple[ReportStudy, dict[str, float]]], path: Path) -> bool:
    items = [(r, imp) for r, imp in items if imp]
    if not items:
        return False
    colors = encoder_colors()
    columns = min(3, len(items))
    rows = math.ceil(len(items) / columns)
    tallest = max(len(imp) for _, imp in items)
    figure = new_figure(3.8 * columns, (0.32 * tallest + 1.0) * rows + 0.5)
    for index, (record, importances) in enumerate(items):
        ax = figure.add_subplot(rows, columns, index + 1)
        names = sorted(importances, key=lambda name: importances[name])
        ax.barh(names, [importances[n] for n in names], height=0.6, color=colors[record.encoder])
        ax.set_xlim(0, 1)
        ax.set_title(f"{method_labels()[record.encoder]} ({trial_counts(record)})", fontsize=MIN_FONT + 1)
        ax.grid(axis="x", alpha=0.3)
    first = items[0][0]
    figure.suptitle(f"{first.model} · {first.task}: hyperparameter importance (fANOVA over complete trials)")
    save_figure(figure, path)
    return True


def draw_figures(
    records: Sequence[ReportStudy], pairs: Sequence[tuple[str, str]], fig_dir: Path, progress: bool
) -> tuple[dict[tuple[str, str], dict[str, str]], dict[tuple[str, str], list[str]], list[dict[str, object]]]:
    """Per (model, task): the PNGs drawn (kind -> path relative to the report folder), notes on
    what could not be drawn, and one importance row per (study, parameter)."""

    paths: dict[tuple[str, str], dict[str, str]] = {}
    notes: dict[tuple[str, str], list[str]] = {}
    importance_rows: list[dict[str, object]] = []
    for model, task in steps(pairs, BarSpec("report figures", unit="task", enabled=progress)):
        group = sorted(
            (r for r in records if r.model == model and r.task == task), key=lambda r: methods().index(r.encoder)
        )
        here: dict[str, str] = {}
        missing: list[str] = []
        items = []
        for record in group:
            importances, reason = _importances(record)
            if reason:
                missing.append(f"{method_labels()[record.encoder]}: no importances ({reason})")
            items.append((record, importances))
            importance_rows += [
                {
                    "model": model,
                    "task": task,
                    "method": record.encoder,
                    "study": record.name,
                    "param": param,
                    "importance": value,
                }
                for param, value in importances.items()
            ]
        for kind, draw in (
            ("layers", partial(_layer_figure, group)),
            ("history", partial(_history_figure, group)),
            ("importance", partial(_importance_figure, items)),
        ):
            name = f"{slug(model, task)}-{kind}.png"
            with figure_style():
                drawn = draw(fig_dir / name)
            if drawn:
                here[kind] = f"figures/{name}"
        if "layers" not in here:
            missing.append("no per-layer figure: no best-layer study with per-layer scores")
        paths[(model, task)], notes[(model, task)] = here, missing
    return paths, notes, importance_rows
