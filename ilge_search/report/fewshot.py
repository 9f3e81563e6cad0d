"""Few-shot curves: test score against training examples per label, per model and task.

A *curve* is the studies of one model, task and data setting that differ only in ``shots``, with at least one few-shot
study; the study of the same setting without ``shots`` is its *full* point. Each point is a final test mean ± std over
the final seeds (one few-shot draw, so the spread is over training seeds only). When a model and task have several such
settings, the one with the most studies is drawn and the others are named in a note.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from ..tasks.scores import score_unit
from .data import ReportStudy, method_labels, methods
from .document import MISSING, Cell, model_sentence, plural, slug
from .figures import encoder_colors, figure_style, new_figure, save_figure
from .tables import CAYLEY_REFERENCES, cayley_minus

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.typing import ColorType

__all__ = ["FEWSHOT_COLUMNS", "fewshot_frame", "fewshot_rows", "fewshot_notes", "draw_fewshot_figures"]

FEWSHOT_COLUMNS = [
    "model",
    "task",
    "encoder",
    "shots",
    "train_size",
    "metric",
    "unit",
    "mean",
    "std",
    "n_seeds",
    "study",
    "maximize",
]
_SETTING = ("max_train", "max_eval", "max_epochs", "cv", "data_seed")


def _setting(record: ReportStudy) -> tuple:
    # the protocol too: a paper-protocol study of the same data is another curve's full point, never this one's
    return (record.model, record.base_task, record.protocol, *tuple(getattr(record.identity, key) for key in _SETTING))


def _chosen_settings(curves: dict[tuple, list[ReportStudy]]) -> tuple[dict[tuple[str, str], tuple], list[str]]:
    """Per (model, task), the setting of most studies whose curve is drawn; and notes on the others."""
    chosen: dict[tuple[str, str], tuple] = {}
    notes: list[str] = []
    for key in sorted(curves, key=lambda k: (-len(curves[k]), repr(k))):
        pair = key[:2]
        if pair in chosen:
            notes.append(
                f"{pair[0]} · {pair[1]}: few-shot studies of another setting not drawn "
                f"({', '.join(sorted(r.name for r in curves[key]))})"
            )
        else:
            chosen[pair] = key
    return chosen, notes


def fewshot_frame(records: Sequence[ReportStudy]) -> tuple[pd.DataFrame, list[str]]:
    """One row per (model, task, encoder, shots) of every few-shot curve (``shots`` NaN: the full point), in
    score units; and notes on the curves not drawn."""

    settings: dict[tuple, list[ReportStudy]] = {}
    for record in records:
        if record.test_mean is not None:
            settings.setdefault(_setting(record), []).append(record)
    curves = {key: group for key, group in settings.items() if any(r.identity.shots for r in group)}
    chosen, notes = _chosen_settings(curves)
    rows = []
    for key in chosen.values():
        with_shots = {r.encoder for r in curves[key] if r.identity.shots}
        seen = set()
        # several studies of one encoder and shots (e.g. with and without a final evaluation): the most seeds
        for r in sorted(curves[key], key=lambda r: (len(r.test_scores), r.name), reverse=True):
            shots, mean = r.identity.shots or None, r.test_mean
            # a full point alone is no curve
            if mean is None or r.encoder not in with_shots or (r.encoder, shots) in seen:
                continue
            seen.add((r.encoder, shots))
            scale, unit = score_unit(r.metric)
            rows.append(
                {
                    "model": r.model,
                    "task": r.base_task,
                    "encoder": r.encoder,
                    "shots": math.nan if shots is None else float(shots),
                    "train_size": r.stored.data.split_sizes.get("train") if r.stored.data else None,
                    "metric": r.metric,
                    "unit": unit,
                    "mean": mean * scale,
                    "std": (r.test_std or 0.0) * scale,
                    "n_seeds": len(r.test_scores),
                    "study": r.name,
                    "maximize": r.maximize,
                }
            )
    frame = pd.DataFrame(rows, columns=FEWSHOT_COLUMNS)
    if not frame.empty:
        frame = frame.assign(_e=frame["encoder"].map(methods().index), _s=frame["shots"].fillna(math.inf))
        frame = frame.sort_values(["model", "task", "_e", "_s"]).drop(columns=["_e", "_s"]).reset_index(drop=True)
    return frame, notes


def _shots_columns(frame: pd.DataFrame) -> list[int]:
    return sorted(int(s) for s in frame["shots"].dropna().unique())


def _cell(row: pd.Series) -> str:
    if row is None:
        return MISSING
    return f"{row['mean']:.2f} ± {row['std']:.2f}" if row["n_seeds"] > 1 else f"{row['mean']:.2f}"


def fewshot_rows(frame: pd.DataFrame) -> tuple[list[str], list[list[Cell]]]:
    """(header, rows): per (model, task, encoder), the test score at each shots per label and on the full
    subset (its training size in the cell); the best encoder of each column of a (model, task) in bold."""
    shots = _shots_columns(frame)
    header = ["model", "task", "unit", "encoder"] + [f"{s} per label" for s in shots] + ["full subset"]
    rows: list[list[Cell]] = []
    for (model, task), part in frame.groupby(["model", "task"], sort=False):
        best: dict[int | None, float] = {}
        for column in [*shots, None]:
            here = part[part["shots"].isna()] if column is None else part[part["shots"] == column]
            if len(here):
                signed = here["mean"].round(2) * (1 if here["maximize"].iloc[0] else -1)
                best[column] = float(signed.max())
        for encoder, rows_here in part.groupby("encoder", sort=False):
            by_shots = {None if math.isnan(r["shots"]) else int(r["shots"]): r for _, r in rows_here.iterrows()}
            cells = [Cell(model), Cell(task), Cell(rows_here["unit"].iloc[0]), Cell(method_labels()[encoder])]
            for column in [*shots, None]:
                row = by_shots.get(column)
                text = _cell(row)
                if row is not None and column is None and row["train_size"]:
                    text += f" (n={int(row['train_size'])})"
                sign = 1 if row is None or row["maximize"] else -1
                bold = row is not None and round(row["mean"], 2) * sign == best.get(column)
                cells.append(Cell(text, bold=bold))
            rows.append(cells)
    return header, rows


def fewshot_notes(frame: pd.DataFrame) -> list[str]:
    """Per model: where Cayley stands against the last and the best single layer at the fewest shots and on
    the full subset, over the tasks with both."""
    notes = []
    for model, part in frame.groupby("model", sort=False):
        fewest = part["shots"].min()
        parts = []
        for label, column in ((f"{int(fewest)} examples per label", fewest), ("the full subset", None)):
            here = part[part["shots"].isna()] if column is None else part[part["shots"] == column]
            table = here.pivot(index="task", columns="encoder", values="mean")
            for other, name in CAYLEY_REFERENCES:
                diff = cayley_minus(table, other)
                if diff is None:
                    continue
                diff = diff.round(2)
                parts.append(
                    f"with {label}, Cayley minus {name}: {diff.mean():+.2f} points on average (ahead on "
                    f"{int((diff > 0).sum())} of {plural(len(diff), 'task')})"
                )
        notes += model_sentence(model, parts)
    return notes


def _figure(part: pd.DataFrame, path: Path) -> None:
    colors = encoder_colors()
    shots = _shots_columns(part)
    full_x = shots[-1] * 2 if shots else 1
    figure = new_figure(7.5, 4.0)
    ax = figure.add_subplot(1, 1, 1)
    for encoder, rows in part.groupby("encoder", sort=False):
        _plot_curve(ax, rows, full_x, colors[encoder], method_labels()[encoder])
    _label_shots_axis(ax, part, shots, full_x)
    ax.set_ylabel(f"test {part['unit'].iloc[0]}")
    seeds = sorted(set(part["n_seeds"]))
    first = part.iloc[0]
    ax.set_title(
        f"{first['model']} · {first['task']}: test score vs examples per label\n"
        f"(mean ± std over {'/'.join(map(str, seeds))} training seeds; one few-shot draw per count)"
    )
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)
    save_figure(figure, path)


def _plot_curve(ax: Axes, rows: pd.DataFrame, full_x: int, color: ColorType, label: str) -> None:
    """One encoder's few-shot curve, its full-data score at ``full_x`` and a dotted line joining the two."""
    few = rows[rows["shots"].notna()].sort_values("shots")
    full = rows[rows["shots"].isna()]
    ax.errorbar(
        few["shots"],
        few["mean"],
        yerr=few["std"],
        marker="o",
        markersize=5,
        capsize=3,
        linewidth=1.8,
        color=color,
        label=label,
    )
    if not len(full):
        return
    ax.errorbar(
        [full_x], full["mean"], yerr=full["std"], marker="s", markersize=6, capsize=3, color=color, linestyle="none"
    )
    if len(few):
        ax.plot(
            [few["shots"].iloc[-1], full_x],
            [few["mean"].iloc[-1], full["mean"].iloc[0]],
            linestyle=":",
            linewidth=1.2,
            color=color,
        )


def _label_shots_axis(ax: Axes, part: pd.DataFrame, shots: list[int], full_x: int) -> None:
    """A log-2 axis ticked at each shot count, plus a "full" tick (with the training size) where there is one."""
    from matplotlib.ticker import FixedLocator, NullLocator  # heavy: matplotlib only for figures

    ax.set_xscale("log", base=2)
    full_rows = part[part["shots"].isna()]
    train = full_rows["train_size"].dropna()
    full_label = f"full\n(n={int(train.iloc[0])})" if len(train) else "full"
    ticks = shots + ([full_x] if len(full_rows) else [])
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(s) for s in shots] + ([full_label] if len(full_rows) else []))
    ax.set_xlabel("training examples per label (log scale)")


def draw_fewshot_figures(frame: pd.DataFrame, fig_dir: Path) -> dict[tuple[str, str], str]:
    """One PNG per (model, task) curve: ``{(model, task): path relative to the report folder}``."""

    drawn: dict[tuple[str, str], str] = {}
    for (model, task), part in frame.groupby(["model", "task"], sort=False):
        name = f"{slug(model, task)}-fewshot.png"
        with figure_style():
            _figure(part, fig_dir / name)
        drawn[(model, task)] = f"{fig_dir.name}/{name}"
    return drawn
