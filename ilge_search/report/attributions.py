"""Which layers carry each task: the layer attributions ``ilge-search explain`` stored, drawn and summarised.

Per model: a tasks x layers heatmap (the layer-ablation drop in points on one scale; the signed gradient
x input divided by its task's largest value; a dot on the best single-layer probe), and a sentence naming
the layer each measure puts first and the third of the layers where each falls. Only current
attributions (:func:`~ilge_search.use.explain.explanation_is_current`) are used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..tasks.scores import score_unit
from ..use.explain import LayerAttribution, stored_explanation
from .data import ReportStudy, method_labels, methods
from .document import plural, slug
from .figures import new_figure, save_figure

if TYPE_CHECKING:
    import numpy as np

__all__ = ["ExplainedTask", "explained_tasks", "attribution_notes", "draw_attribution_figures", "layer_thirds"]


@dataclass
class ExplainedTask:
    """One (model, task, encoder) with a current attribution, and the probe's best layer when known."""

    record: ReportStudy
    attribution: LayerAttribution
    probe_layer: int | None

    def mean_drop(self) -> np.ndarray:

        return np.asarray(self.attribution.ablation, dtype=float).mean(0)

    def mean_grad(self) -> np.ndarray:

        return np.asarray(self.attribution.gradient_input, dtype=float).mean(0)


def explained_tasks(records: Sequence[ReportStudy]) -> dict[str, list[ExplainedTask]]:
    """Per model, its studies with a current stored attribution, by task then encoder."""
    probes = {(r.model, r.task): r for r in records if r.encoder == "best-layer"}
    out: dict[str, list[ExplainedTask]] = {}
    for record in sorted(records, key=lambda r: (r.model, r.task, methods().index(r.encoder))):
        probe = probes.get((record.model, record.task))
        attribution = stored_explanation(
            record.stored, probe.layer_scores if probe else None, probe.name if probe else None
        )
        if attribution is None or not attribution.num_layers:
            continue
        layer = probe.chosen_layer if probe is not None else None
        out.setdefault(record.model, []).append(
            ExplainedTask(record, attribution, None if layer is None else int(layer))
        )
    return out


def layer_thirds(num_layers: int) -> list[list[int]]:
    """The layers split into a first, middle and last third (as equal as possible, earlier thirds larger)."""

    return [part.tolist() for part in np.array_split(np.arange(num_layers), 3)]


def _spread(item: ExplainedTask) -> np.ndarray:
    """Per layer, the standard deviation of the ablation drop over the seeds (zeros with one seed)."""

    drops = np.asarray(item.attribution.ablation, dtype=float)
    return drops.std(0, ddof=1) if len(drops) > 1 else np.zeros(drops.shape[1])


def _task_sentence(item: ExplainedTask) -> str:
    scale, _ = score_unit(item.attribution.metric)
    drop, grad, spread = item.mean_drop(), item.mean_grad(), _spread(item)
    top = int(drop.argmax())
    parts = []
    if drop[top] <= 0:
        parts.append("no single layer's ablation lowers the score")
    else:
        within = ", within the spread over seeds" if drop[top] <= spread[top] else ""
        parts.append(f"ablation layer {top} ({drop[top] * scale:.1f} ± {spread[top] * scale:.1f} points{within})")
    parts.append(f"gradient x input layer {int(grad.argmax())}")
    if item.probe_layer is not None:
        parts.append(f"best probe layer {item.probe_layer}")
    return f"{item.record.task}: " + ", ".join(parts)


def _thirds_shares(items: Sequence[ExplainedTask], values: str, num_layers: int) -> list[float] | None:
    """Mean over tasks of the share of the positive part of ``values`` ("drop" or "grad") per third, in %."""

    shares = []
    for item in items:
        row = np.clip(item.mean_drop() if values == "drop" else item.mean_grad(), 0.0, None)
        if row.sum() > 0:
            shares.append([row[part].sum() / row.sum() * 100 for part in layer_thirds(num_layers)])
    return list(np.mean(shares, axis=0)) if shares else None


def _model_note(model: str, items: Sequence[ExplainedTask]) -> str:
    encoders = sorted({item.record.encoder for item in items}, key=methods().index)
    seeds = sorted({len(item.attribution.seeds) for item in items})
    num_layers = items[0].attribution.num_layers
    items = [item for item in items if item.attribution.num_layers == num_layers]
    text = (
        f"{model}, {'/'.join(method_labels()[e] for e in encoders)} (validation, "
        f"{'/'.join(map(str, seeds))} seeds per task), the layer that matters most by each measure: "
        + "; ".join(_task_sentence(item) for item in items)
        + "."
    )
    thirds = layer_thirds(num_layers)
    bounds = "/".join(f"{third[0]}-{third[-1]}" for third in thirds)
    names = ("first", "middle", "last")
    for values, label in (("grad", "gradient x input"), ("drop", "ablation drop")):
        shares = _thirds_shares(items, values, num_layers)
        if shares is not None:
            most = names[shares.index(max(shares))]
            text += (
                f" Share of the {label} (positive part, mean over {plural(len(items), 'task')}) on the first, "
                f"middle and last third of the {num_layers} layers ({bounds}): "
                + "/".join(f"{share:.0f}%" for share in shares)
                + f", most on the {most} third."
            )
    if all(item.mean_drop().max() <= _spread(item)[int(item.mean_drop().argmax())] for item in items):
        text += (
            " No layer is indispensable on its own: on every task the largest single-layer drop is within "
            "the spread over seeds, so the other layers carry the same information."
        )
    return text


def attribution_notes(records: Sequence[ReportStudy]) -> dict[str, list[str]]:
    """Per model with stored attributions: the sentence saying which layers carry its tasks."""
    return {model: [_model_note(model, items)] for model, items in explained_tasks(records).items()}


def _normalised(rows: np.ndarray) -> np.ndarray:
    """Each row divided by its largest absolute value (rows of zeros stay zero)."""

    peak = np.abs(rows).max(axis=1, keepdims=True)
    return np.divide(rows, peak, out=np.zeros_like(rows), where=peak > 0)


def _heatmap(model: str, items: Sequence[ExplainedTask], path: Path) -> bool:

    num_layers = items[0].attribution.num_layers
    items = [item for item in items if item.attribution.num_layers == num_layers]
    encoders = {item.record.encoder for item in items}
    labels = [
        item.record.task if len(encoders) == 1 else f"{item.record.task} · {method_labels()[item.record.encoder]}"
        for item in items
    ]
    scale, _ = score_unit(items[0].attribution.metric)
    drops = np.stack([item.mean_drop() for item in items]) * scale
    # the drop in points on one scale for the model (at least +-1 point), so that a drop within the seeds' noise
    # stays pale instead of being stretched to full colour; gradient x input has no common unit: per task
    drop_range = max(1.0, float(np.abs(drops).max()))
    panels = (
        ("ablation drop (points)", drops, drop_range, "points"),
        (
            "gradient x input / largest of the task",
            _normalised(np.stack([i.mean_grad() for i in items])),
            1.0,
            "share of the task's largest",
        ),
    )
    # the two panels one above the other, each as wide as the page allows: 31 layers stay readable
    width = min(4.0 + 0.22 * num_layers, 11.0)
    figure = new_figure(width, 2 * (1.3 + 0.3 * len(items)) + 0.6)
    for index, (title, values, limit, unit) in enumerate(panels):
        ax = figure.add_subplot(2, 1, index + 1)
        image = ax.imshow(values, aspect="auto", cmap="RdBu_r", vmin=-limit, vmax=limit, interpolation="nearest")
        for row, item in enumerate(items):
            if item.probe_layer is not None and 0 <= item.probe_layer < num_layers:
                ax.plot(item.probe_layer, row, marker="o", color="black", markersize=4)
        ax.set_yticks(range(len(items)))
        ax.set_yticklabels(labels, fontsize=8)
        step = 1 if num_layers <= 16 else 2
        ax.set_xticks(range(0, num_layers, step))
        ax.tick_params(axis="x", labelsize=8)
        ax.set_xlabel("layer (0 = embedding output)", fontsize=8)
        ax.set_title(title, fontsize=9)
        bar = figure.colorbar(image, ax=ax, fraction=0.04, pad=0.01)
        bar.set_label(unit, fontsize=7)
        bar.ax.tick_params(labelsize=7)
    names = "/".join(method_labels()[e] for e in sorted(encoders, key=methods().index))
    figure.suptitle(f"{model} · {names}: which layers carry each task (validation; dot: best probe layer)", fontsize=10)
    save_figure(figure, path)
    return True


def draw_attribution_figures(records: Sequence[ReportStudy], fig_dir: Path) -> dict[str, dict[str, str]]:
    """Per model with stored attributions: ``{"attribution": path relative to the report folder}``."""
    drawn: dict[str, dict[str, str]] = {}
    for model, items in explained_tasks(records).items():
        name = f"{slug(model)}-layer-attribution.png"
        if _heatmap(model, items, fig_dir / name):
            drawn[model] = {"attribution": f"{fig_dir.name}/{name}"}
    return drawn
