"""The report's figures (matplotlib, imported only when drawing) and fANOVA importances.

Per (model, task): the validation score of a probe on each layer against the
aggregators (from the best-layer study's best trial), the optimisation
histories, and the hyperparameter importances of every study. Validation
scores only. Figures are bare ``Figure`` objects on an Agg canvas, so the
caller's pyplot backend is never changed.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .data import METHOD_LABELS, METHODS, StudyRecord, score_unit
from .document import slug

__all__ = ["FIGURE_KINDS", "draw_figures"]

FIGURE_KINDS = ("layers", "history", "importance")


def _new_figure(width: float, height: float) -> Any:
    # a bare Figure with an Agg canvas: no pyplot, so the caller's backend is never changed
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(figure)
    return figure


def _encoder_colors() -> Dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {m: cmap(i) for i, m in enumerate(METHODS)}


def _layer_figure(records: Sequence[StudyRecord], path: Path) -> bool:
    by_encoder = {r.encoder: r for r in records}
    probe = by_encoder.get("best-layer")
    if probe is None or not probe.layer_scores:
        return False
    scale, unit = score_unit(probe.metric)
    colors = _encoder_colors()
    figure = _new_figure(7.0, 4.0)
    ax = figure.add_subplot(1, 1, 1)
    layers = list(range(len(probe.layer_scores)))
    scores = [s * scale for s in probe.layer_scores]
    ax.plot(layers, scores, marker="o", markersize=3, color=colors["best-layer"], label="linear probe on layer l")
    if probe.chosen_layer is not None and 0 <= probe.chosen_layer < len(scores):
        ax.scatter([probe.chosen_layer], [scores[probe.chosen_layer]], s=80, facecolors="none",
                   edgecolors="black", zorder=3, label=f"chosen layer ({probe.chosen_layer})")
    for encoder in METHODS:
        record = by_encoder.get(encoder)
        if encoder == "best-layer" or record is None or record.best_value is None:
            continue
        ax.axhline(record.best_value * scale, color=colors[encoder], linestyle="--", linewidth=1.2,
                   label=METHOD_LABELS[encoder])
    ax.set_xlabel("layer (0 = embedding output)")
    ax.set_ylabel(f"best validation {unit}")
    ax.set_title(f"{probe.model} · {probe.task}: probe per layer vs aggregators (validation)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right", ncol=2)
    figure.tight_layout()
    figure.savefig(path)
    return True


def _history_figure(records: Sequence[StudyRecord], path: Path) -> bool:
    colors = _encoder_colors()
    figure = _new_figure(7.0, 4.0)
    ax = figure.add_subplot(1, 1, 1)
    drawn = False
    unit = ""
    for record in sorted(records, key=lambda r: METHODS.index(r.encoder)):
        frame = record.trials
        if frame.empty:
            continue
        complete = frame[(frame["state"] == "COMPLETE") & frame["value"].notna()].sort_values("number")
        if complete.empty:
            continue
        scale, unit = score_unit(record.metric)
        values = complete["value"].astype(float) * scale
        best = values.cummax() if record.maximize else values.cummin()
        color = colors[record.encoder]
        ax.scatter(complete["number"], values, s=10, alpha=0.4, color=color)
        ax.plot(complete["number"], best, drawstyle="steps-post", marker="o", markersize=2.5, color=color,
                label=METHOD_LABELS[record.encoder])
        drawn = True
    if not drawn:
        return False
    first = records[0]
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trial")
    ax.set_ylabel(f"validation {unit}")
    ax.set_title(f"{first.model} · {first.task}: optimisation history (dots: complete trials; lines: best so far)",
                 fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right", ncol=2)
    figure.tight_layout()
    figure.savefig(path)
    return True


def _importances(record: StudyRecord) -> Tuple[Dict[str, float], Optional[str]]:
    """fANOVA importances over the parameters that vary among complete trials."""
    import optuna
    from optuna.trial import TrialState

    complete = record.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(complete) < 2:
        return {}, f"{len(complete)} complete trial(s)"
    common = set.intersection(*(set(t.params) for t in complete))
    varying = sorted(p for p in common if len({repr(t.params[p]) for t in complete}) > 1)
    if not varying:
        return {}, "no parameter varies among the complete trials"
    if len({t.value for t in complete}) < 2:
        return {}, "every complete trial has the same value"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importances = optuna.importance.get_param_importances(
                record.study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0), params=varying)
    except (RuntimeError, ValueError, ZeroDivisionError) as exc:
        return {}, f"importance evaluation failed: {exc}"
    values = {name: float(v) for name, v in importances.items() if math.isfinite(float(v))}
    return (values, None) if values else ({}, "importances are undefined (no variance explained)")


def _importance_figure(items: Sequence[Tuple[StudyRecord, Dict[str, float]]], path: Path) -> bool:
    items = [(r, imp) for r, imp in items if imp]
    if not items:
        return False
    colors = _encoder_colors()
    columns = min(4, len(items))
    rows = math.ceil(len(items) / columns)
    figure = _new_figure(3.2 * columns, 2.4 * rows + 0.4)
    for index, (record, importances) in enumerate(items):
        ax = figure.add_subplot(rows, columns, index + 1)
        names = sorted(importances, key=importances.get)
        ax.barh(names, [importances[n] for n in names], color=colors[record.encoder])
        ax.set_xlim(0, 1)
        ax.set_title(f"{METHOD_LABELS[record.encoder]} ({record.n_complete} trials)", fontsize=9)
        ax.tick_params(labelsize=7)
    first = items[0][0]
    figure.suptitle(f"{first.model} · {first.task}: hyperparameter importance (fANOVA)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path)
    return True


def draw_figures(records: Sequence[StudyRecord], pairs: Sequence[Tuple[str, str]], fig_dir: Path,
                 show_progress: bool) -> Tuple[Dict[Tuple[str, str], Dict[str, str]], Dict[Tuple[str, str], List[str]],
                                               List[Dict[str, Any]]]:
    """Per (model, task): the PNGs drawn (kind -> path relative to the report folder), notes on
    what could not be drawn, and one importance row per (study, parameter)."""
    from tqdm.auto import tqdm

    paths: Dict[Tuple[str, str], Dict[str, str]] = {}
    notes: Dict[Tuple[str, str], List[str]] = {}
    importance_rows: List[Dict[str, Any]] = []
    for model, task in tqdm(pairs, desc="report figures", unit="task", disable=not show_progress):
        group = sorted((r for r in records if r.model == model and r.task == task),
                       key=lambda r: METHODS.index(r.encoder))
        here: Dict[str, str] = {}
        missing: List[str] = []
        items = []
        for record in group:
            importances, reason = _importances(record)
            if reason:
                missing.append(f"{METHOD_LABELS[record.encoder]}: no importances ({reason})")
            items.append((record, importances))
            importance_rows += [{"model": model, "task": task, "method": record.encoder, "study": record.name,
                                 "param": param, "importance": value} for param, value in importances.items()]
        for kind, draw, arg in (("layers", _layer_figure, group), ("history", _history_figure, group),
                                ("importance", _importance_figure, items)):
            name = f"{slug(model, task)}-{kind}.png"
            if draw(arg, fig_dir / name):
                here[kind] = f"figures/{name}"
        if "layers" not in here:
            missing.append("no per-layer figure: no best-layer study with per-layer scores")
        paths[(model, task)], notes[(model, task)] = here, missing
    return paths, notes, importance_rows
