"""The report's numbers as pandas frames, and the table rows every document format renders.

- :func:`results_frame`: one row per (model, task, encoder) with a study, in
  score units (accuracy in %, correlations x 100), the best of each row
  (``is_best``, at the shown precision, ties: all), the gain over the last
  layer and the published number where the paper has the cell; zero-shot STS
  rows follow the task their encoder was trained on.
- :func:`summary_frame`: per (model, encoder): tasks, mean score, mean gain, wins, mean rank.
- :func:`model_tables`, :func:`summary_rows`, :func:`studies_rows`: rows of
  :class:`~ilge_search.report.document.Cell` for :class:`~ilge_search.report.document.Document`.

Output column names (``method``, ...) are the report's file format and stay as they are.
"""

from __future__ import annotations

import json
import math
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ..models import model_num_params
from .data import METHOD_LABELS, METHODS, StudyRecord, collect_records, score_unit
from .document import MISSING, Cell, plural
from .paper_results import published_result

__all__ = ["DECIMALS", "RESULT_COLUMNS", "collect_results", "results_frame", "model_order", "pivot", "summary_frame",
           "model_tables", "seed_note", "summary_rows", "studies_rows", "fmt"]

DECIMALS = 2
RESULT_COLUMNS = ["model", "task", "method", "metric", "unit", "mean", "std", "n_seeds", "scores", "gain",
                  "is_best", "published", "best_val", "n_complete", "n_pruned", "n_failed", "study", "base_task",
                  "shots", "maximize", "source_task"]


def model_order(models: Iterable[str]) -> List[str]:
    """Models by parameter count (unknown ones last), then by name."""

    def key(model: str) -> Tuple[float, str]:
        params = model_num_params(model)
        return (params if params is not None else math.inf, model)

    return sorted(set(models), key=key)


def results_frame(records: Sequence[StudyRecord]) -> Any:
    """The long table: one row per (model, task, encoder), columns :data:`RESULT_COLUMNS`."""
    import pandas as pd

    rows = []
    for r in records:
        scale, unit = score_unit(r.metric)
        published = None
        if not r.attrs.get("shots"):
            cell = published_result(r.model, r.base_task, r.encoder)
            published = None if cell is None else cell.value
        rows.append({
            "model": r.model, "task": r.task, "method": r.encoder, "metric": r.metric, "unit": unit,
            "mean": math.nan if r.test_mean is None else r.test_mean * scale,
            "std": math.nan if r.test_std is None else r.test_std * scale,
            "n_seeds": len(r.test_scores),
            "scores": json.dumps([round(s * scale, 4) for s in r.test_scores]),
            "gain": math.nan, "is_best": False,
            "published": math.nan if published is None else published,
            "best_val": math.nan if r.best_value is None else r.best_value * scale,
            "n_complete": r.n_complete, "n_pruned": r.n_pruned, "n_failed": r.n_failed, "study": r.name,
            "base_task": r.base_task, "shots": r.attrs.get("shots"), "maximize": r.maximize, "source_task": r.task,
        })
        # similarity encoders evaluated on other STS tasks without training on them (the paper's zero-shot STS)
        for name, zero in sorted((r.attrs.get("final_zero_shot") or {}).items()):
            z_scale, z_unit = score_unit("spearman")
            z_scores = [float(v) for v in zero.get("scores", [])]
            rows.append({
                "model": r.model, "task": f"{name} (zero-shot, {r.task} encoder)", "method": r.encoder,
                "metric": "spearman", "unit": z_unit, "mean": float(zero["mean"]) * z_scale,
                "std": float(zero.get("std", math.nan)) * z_scale, "n_seeds": len(z_scores),
                "scores": json.dumps([round(v * z_scale, 4) for v in z_scores]), "gain": math.nan,
                "is_best": False, "published": math.nan, "best_val": math.nan, "n_complete": r.n_complete,
                "n_pruned": r.n_pruned, "n_failed": r.n_failed, "study": r.name, "base_task": name,
                "shots": None, "maximize": True, "source_task": r.task,
            })
    frame = pd.DataFrame(rows, columns=RESULT_COLUMNS)
    if frame.empty:
        return frame
    for _, group in frame.groupby(["model", "task"], sort=False):
        shown = group["mean"].round(DECIMALS)
        if shown.notna().any():
            target = shown.max() if group["maximize"].iloc[0] else shown.min()
            frame.loc[group.index, "is_best"] = (shown == target).to_numpy()
        last = group.loc[group["method"] == "last-layer", "mean"]
        if len(last) and not math.isnan(last.iloc[0]):
            frame.loc[group.index, "gain"] = group["mean"] - last.iloc[0]
    encoder_rank = {m: i for i, m in enumerate(METHODS)}
    model_rank = {m: i for i, m in enumerate(model_order(frame["model"]))}
    # zero-shot rows follow the task their encoder was trained on
    frame = frame.assign(_m=frame["model"].map(model_rank), _k=frame["method"].map(encoder_rank),
                         _z=frame["task"] != frame["source_task"])
    order = ["_m", "source_task", "_z", "task", "_k"]
    return frame.sort_values(order).drop(columns=["_m", "_k", "_z"]).reset_index(drop=True)


def collect_results(storage_url: str) -> Any:
    """The report's long table (one row per model, task and method) without writing anything."""
    records, _, _ = collect_records(storage_url)
    return results_frame(records)


def pivot(frame: Any, model: str, column: str) -> Any:
    """Tasks x :data:`METHODS` of ``column`` for one model (NaN = missing)."""
    part = frame[frame["model"] == model]
    table = part.pivot(index="task", columns="method", values=column)
    return table.reindex(index=list(part["task"].unique()), columns=list(METHODS)).astype(float)


def summary_frame(frame: Any) -> Any:
    """Per (model, encoder): tasks with a score, mean score, mean gain, wins and mean rank."""
    import pandas as pd

    rows = []
    for model in model_order(frame["model"]):
        part = frame[(frame["model"] == model) & frame["mean"].notna()]
        # ranked at the shown precision, like the bold cells
        signed = part["mean"].round(DECIMALS).where(part["maximize"].astype(bool), -part["mean"].round(DECIMALS))
        ranks = part.assign(shown=signed).groupby("task")["shown"].rank(ascending=False, method="average")
        part = part.assign(rank=ranks)
        for encoder in METHODS:
            mine = part[part["method"] == encoder]
            if mine.empty:
                continue
            gains = mine["gain"].dropna()
            rows.append({"model": model, "method": encoder, "tasks": int(len(mine)),
                         "mean_score": float(mine["mean"].mean()),
                         "mean_gain": float(gains.mean()) if len(gains) else math.nan,
                         "gain_tasks": int(len(gains)),
                         "wins": int(mine["is_best"].sum()),
                         "mean_rank": float(mine["rank"].mean())})
    return pd.DataFrame(rows, columns=["model", "method", "tasks", "mean_score", "mean_gain", "gain_tasks", "wins",
                                       "mean_rank"])


def fmt(value: Optional[float], signed: bool = False) -> str:
    """``value`` at the shown precision (``signed``: with its sign); :data:`MISSING` for None/NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    return f"{value:+.{DECIMALS}f}" if signed else f"{value:.{DECIMALS}f}"


def _cell_text(row: Any) -> str:
    if row is None or math.isnan(row["mean"]):
        return MISSING
    if row["n_seeds"] >= 2:
        return f"{row['mean']:.{DECIMALS}f} ± {row['std']:.{DECIMALS}f}"
    return f"{row['mean']:.{DECIMALS}f}"


def model_tables(frame: Any, model: str) -> Tuple[List[str], List[List[Cell]], List[List[Cell]]]:
    """(header, score rows, gain rows) for one model, as cells every writer renders."""
    part = frame[frame["model"] == model]
    header = ["task", "metric"] + [METHOD_LABELS[m] for m in METHODS]
    score_rows: List[List[Cell]] = []
    gain_rows: List[List[Cell]] = []
    for task in part["task"].unique():  # the frame's row order
        rows = part[part["task"] == task]
        by_encoder = {row["method"]: row for _, row in rows.iterrows()}
        unit = rows["unit"].iloc[0]
        score_rows.append([Cell(task), Cell(unit)] + [
            Cell(_cell_text(by_encoder.get(m)), bold=bool(by_encoder[m]["is_best"]) if m in by_encoder else False)
            for m in METHODS])
        published = {}
        if not rows["shots"].notna().any():  # few-shot rows are never compared with the full-data paper
            for encoder in METHODS:
                cell = published_result(model, rows["base_task"].iloc[0], encoder)
                if cell is not None:
                    published[encoder] = cell.value
        if published:
            score_rows.append([Cell(f"{task}, published", italic=True), Cell(unit, italic=True)] + [
                Cell(f"{published[m]:.2f}" if m in published else MISSING, italic=True) for m in METHODS])
        gain_rows.append([Cell(task)] + [
            Cell(fmt(by_encoder[m]["gain"], signed=True) if m in by_encoder else MISSING) for m in METHODS[1:]])
    return header, score_rows, gain_rows


def seed_note(frame: Any, model: str) -> str:
    """How many final seeds the model's cells have."""
    part = frame[(frame["model"] == model) & frame["mean"].notna()]
    if part.empty:
        return "No final test scores stored yet."
    counts = sorted(set(part["n_seeds"]))
    if len(counts) == 1:
        return f"Final seeds: {counts[0]} for every cell."
    most = max(counts)
    fewer = part[part["n_seeds"] < most]
    listed = ", ".join(f"{r.task}/{r.method} ({r.n_seeds})" for r in fewer.itertuples())
    return f"Final seeds: {most} for most cells; fewer for {listed}."


def summary_rows(summary: Any) -> Tuple[List[str], List[List[Cell]]]:
    """(header, rows) of the across-models table."""
    header = ["model", "method", "tasks", "mean score", "mean gain vs last layer", "wins", "mean rank"]
    rows = []
    for r in summary.itertuples():
        if r.method == "last-layer":
            gain = "(reference)"
        elif math.isnan(r.mean_gain):
            gain = MISSING
        else:
            gain = f"{r.mean_gain:+.{DECIMALS}f} ({plural(r.gain_tasks, 'task')})"
        rows.append([Cell(r.model), Cell(METHOD_LABELS[r.method]), Cell(str(r.tasks)),
                     Cell(fmt(r.mean_score)), Cell(gain), Cell(str(r.wins)), Cell(f"{r.mean_rank:.2f}")])
    return header, rows


def _setting(attrs: Dict[str, Any]) -> str:
    parts = [f"{key}={attrs[key]}" for key in ("shots", "max_train", "max_eval", "max_epochs") if attrs.get(key)]
    return ", ".join(parts) or "full data"


def studies_rows(records: Sequence[StudyRecord]) -> Tuple[List[str], List[List[Cell]]]:
    """(header, rows) of the list of studies: setting, trial counts, best validation value, final seeds."""
    scale_of = {r.metric: score_unit(r.metric)[0] for r in records}
    header = ["study", "setting", "complete", "pruned", "failed", "best val (trial)", "final seeds"]
    rows = []
    for r in sorted(records, key=lambda r: r.name):
        scale = scale_of.get(r.metric, 1.0)
        best = MISSING if r.best_value is None else f"{r.best_value * scale:.{DECIMALS}f} ({r.best_number})"
        rows.append([Cell(r.name), Cell(_setting(r.attrs)), Cell(str(r.n_complete)), Cell(str(r.n_pruned)),
                     Cell(str(r.n_failed)), Cell(best), Cell(str(len(r.test_scores)))])
    return header, rows
