"""Paper-style reports from every study in a storage.

:func:`build_report` reads the studies the runner (:mod:`ilge_search.study`)
stored, starting from ``optuna.get_all_study_summaries`` and each study's
``trials_dataframe()``, and writes into ``out_dir``:

- ``report.md``: one table per model (rows: tasks; columns: the methods in
  :data:`METHODS`) of final test scores as mean +- std over the final seeds,
  the best of each row in bold, a table of each method's gain over the last
  layer, a cross-model summary, notes on where Cayley stands, the published
  numbers where the paper has the same cell, and a list of the studies used;
- ``report.tex``: the same tables for LaTeX (needs ``\\usepackage{booktabs}``);
- ``results.csv`` (one row per model, task and method), ``summary.csv`` and
  ``importances.csv``;
- ``index.html``: one static page with the tables and the figures in
  ``figures/``: validation score of a probe on each layer against the
  aggregators, optimisation histories and hyperparameter importances.

Conventions:

- Scores are the study user attr ``final_test_mean``/``final_test_std`` times
  100: accuracy in %, Spearman correlation x 100. A cell whose study is
  missing, or has no final test score yet, is shown as ``—`` and never filled.
- Few-shot studies are their own rows (``trec (8-shot)``). When several
  studies share a model, task and method (e.g. different ``max_train``), the
  one with final scores, the most seeds, then the most finished trials is
  used; the others are listed as not shown.
- Bold marks the best mean of the row at the shown precision (ties: all).
- Gain = method mean - last-layer mean, in points; ``—`` when either is missing.
- Figures use validation scores only (the per-layer scores are those of the
  best-layer study's best trial); test scores appear in the tables only.
"""

from __future__ import annotations

import contextlib
import datetime
import html
import json
import logging
import math
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ._version import __version__

__all__ = ["METHODS", "METHOD_LABELS", "ReportResult", "build_report", "collect_results", "open_existing_storage"]

logger = logging.getLogger(__name__)

METHODS: Tuple[str, ...] = ("last-layer", "best-layer", "mean-layers", "scalar-mix", "mlp-last", "deepset", "fc",
                            "cayley")
METHOD_LABELS: Dict[str, str] = {
    "last-layer": "Last layer", "best-layer": "Best layer", "mean-layers": "Mean layers", "scalar-mix": "Scalar mix",
    "mlp-last": "MLP (last)", "deepset": "DeepSet", "fc": "FC", "cayley": "Cayley",
}
MISSING = "—"
_PERCENT_METRICS = {"accuracy": "acc. %", "spearman": "Spearman ×100", "pearson": "Pearson ×100",
                    "f1": "F1 %", "macro_f1": "macro-F1 %"}
_DECIMALS = 2
_FIGURE_KINDS = ("layers", "history", "importance")
_RESULT_COLUMNS = ["model", "task", "method", "metric", "unit", "mean", "std", "n_seeds", "scores", "gain",
                   "is_best", "published", "best_val", "n_complete", "n_pruned", "n_failed", "study", "base_task",
                   "shots", "maximize", "source_task"]


@dataclass
class ReportResult:
    """What :func:`build_report` computed and wrote.

    Attributes:
        out_dir: the report folder.
        results: one row per (model, task, method) with a study (``mean``/``std``
            in score units, NaN when no final test score is stored).
        tables: per model, tasks x :data:`METHODS` of mean scores (NaN = missing).
        gains: per model, tasks x methods of gains over the last layer.
        summary: one row per (model, method): tasks, mean score, mean gain, wins, mean rank.
        importances: one row per (study, parameter) with its fANOVA importance.
        files: written files by kind (``markdown``, ``latex``, ``html``, ``csv``, ...).
        figures: written PNGs, relative to ``out_dir``.
        notes: the closing sentences (also in the report).
        skipped: studies not reported, with the reason.
    """

    out_dir: Path
    results: Any
    tables: Dict[str, Any]
    gains: Dict[str, Any]
    summary: Any
    importances: Any
    files: Dict[str, Path] = field(default_factory=dict)
    figures: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    skipped: List[str] = field(default_factory=list)


@dataclass
class _StudyRecord:
    """One ilge-search study as the report needs it."""

    name: str
    model: str
    task: str  # row label: the task name, plus the shots of a few-shot study
    base_task: str
    method: str
    metric: str
    maximize: bool
    attrs: Dict[str, Any]
    trials: Any  # trials_dataframe()
    study: Any
    n_complete: int
    n_pruned: int
    n_failed: int
    best_value: Optional[float]
    best_number: Optional[int]
    test_mean: Optional[float]
    test_std: Optional[float]
    test_scores: List[float]
    layer_scores: List[float]
    chosen_layer: Optional[int]


# ----------------------------------------------------------------------------- reading the storage


def open_existing_storage(storage_url: str) -> Any:
    """An RDB storage for ``storage_url`` without heartbeats; a SQLite file that does
    not exist is an error (opening it would silently create an empty database)."""
    import sqlalchemy

    from .study import StorageError, make_storage

    if not storage_url:
        raise ValueError("give a storage URL, e.g. sqlite:///studies/offline.db")
    with contextlib.suppress(sqlalchemy.exc.ArgumentError):
        parsed = sqlalchemy.engine.make_url(storage_url)
        if (parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:"
                and not Path(parsed.database).expanduser().exists()):
            raise StorageError(f"no study storage at {parsed.database}; run `ilge-search run` or "
                               "`ilge-search sweep` first, or pass the right --storage")
    return make_storage(storage_url, heartbeat_interval=None)


def _unit(metric: str) -> Tuple[float, str]:
    if metric in _PERCENT_METRICS:
        return 100.0, _PERCENT_METRICS[metric]
    return 1.0, metric


def _row_label(task: str, attrs: Dict[str, Any]) -> str:
    shots = attrs.get("shots")
    return f"{task} ({shots}-shot)" if shots else task


def _finite(value: Any) -> Optional[float]:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _read_study(storage: Any, summary: Any) -> Tuple[Optional[_StudyRecord], Optional[str]]:
    import optuna
    from optuna.trial import TrialState

    attrs = dict(summary.user_attrs)
    name = summary.study_name
    if not all(attrs.get(key) for key in ("model", "task", "encoder")):
        return None, f"{name}: not an ilge-search study (no model/task/encoder user attrs)"
    if attrs["encoder"] not in METHODS:
        return None, f"{name}: unknown method {attrs['encoder']!r}"
    study = optuna.load_study(study_name=name, storage=storage)
    frame = study.trials_dataframe(attrs=("number", "value", "state", "datetime_start", "params", "user_attrs"))
    states = frame["state"].tolist() if not frame.empty else []
    count = {state: states.count(state.name) for state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)}
    maximize = study.direction != optuna.study.StudyDirection.MINIMIZE
    best_value = best_number = None
    layer_scores: List[float] = []
    chosen_layer = None
    if count[TrialState.COMPLETE]:
        best = study.best_trial
        best_value, best_number = _finite(best.value), best.number
        layer_scores = [float(s) for s in best.user_attrs.get("layer_scores", [])]
        chosen_layer = best.user_attrs.get("layer")
    scores = [float(s) for s in attrs.get("final_test_scores", []) or []]
    return _StudyRecord(
        name=name, model=str(attrs["model"]), task=_row_label(str(attrs["task"]), attrs),
        base_task=str(attrs["task"]), method=attrs["encoder"], metric=str(attrs.get("metric", "")),
        maximize=maximize, attrs=attrs, trials=frame, study=study, n_complete=count[TrialState.COMPLETE],
        n_pruned=count[TrialState.PRUNED], n_failed=count[TrialState.FAIL], best_value=best_value,
        best_number=best_number, test_mean=_finite(attrs.get("final_test_mean")),
        test_std=_finite(attrs.get("final_test_std")), test_scores=scores, layer_scores=layer_scores,
        chosen_layer=chosen_layer,
    ), None


def _collect(storage_url: str) -> Tuple[List[_StudyRecord], List[_StudyRecord], List[str]]:
    """(records used, duplicates not shown, skipped reasons)."""
    import optuna

    storage = open_existing_storage(storage_url)
    records: List[_StudyRecord] = []
    skipped: List[str] = []
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        record, reason = _read_study(storage, summary)
        if record is None:
            skipped.append(reason)
        else:
            records.append(record)
    chosen: Dict[Tuple[str, str, str], _StudyRecord] = {}
    duplicates: List[_StudyRecord] = []

    def preference(r: _StudyRecord) -> Tuple:
        return (r.test_mean is not None, len(r.test_scores), r.n_complete + r.n_pruned, r.name)

    for record in sorted(records, key=preference, reverse=True):
        key = (record.model, record.task, record.method)
        if key in chosen:
            duplicates.append(record)
        else:
            chosen[key] = record
    return list(chosen.values()), duplicates, skipped


def _model_order(models: Iterable[str]) -> List[str]:
    from .recommend import model_num_params

    def key(model: str) -> Tuple[float, str]:
        params = model_num_params(model)
        return (params if params is not None else math.inf, model)

    return sorted(set(models), key=key)


def _results_frame(records: Sequence[_StudyRecord]) -> Any:
    import pandas as pd

    from .paper_results import published_result

    rows = []
    for r in records:
        scale, unit = _unit(r.metric)
        published = None
        if not r.attrs.get("shots"):
            cell = published_result(r.model, r.base_task, r.method)
            published = None if cell is None else cell.value
        rows.append({
            "model": r.model, "task": r.task, "method": r.method, "metric": r.metric, "unit": unit,
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
            z_scale, z_unit = _unit("spearman")
            z_scores = [float(v) for v in zero.get("scores", [])]
            rows.append({
                "model": r.model, "task": f"{name} (zero-shot, {r.task} encoder)", "method": r.method,
                "metric": "spearman", "unit": z_unit, "mean": float(zero["mean"]) * z_scale,
                "std": float(zero.get("std", math.nan)) * z_scale, "n_seeds": len(z_scores),
                "scores": json.dumps([round(v * z_scale, 4) for v in z_scores]), "gain": math.nan,
                "is_best": False, "published": math.nan, "best_val": math.nan, "n_complete": r.n_complete,
                "n_pruned": r.n_pruned, "n_failed": r.n_failed, "study": r.name, "base_task": name,
                "shots": None, "maximize": True, "source_task": r.task,
            })
    frame = pd.DataFrame(rows, columns=_RESULT_COLUMNS)
    if frame.empty:
        return frame
    for (model, task), group in frame.groupby(["model", "task"], sort=False):
        shown = group["mean"].round(_DECIMALS)
        if shown.notna().any():
            target = shown.max() if group["maximize"].iloc[0] else shown.min()
            frame.loc[group.index, "is_best"] = (shown == target).to_numpy()
        last = group.loc[group["method"] == "last-layer", "mean"]
        if len(last) and not math.isnan(last.iloc[0]):
            frame.loc[group.index, "gain"] = group["mean"] - last.iloc[0]
    method_rank = {m: i for i, m in enumerate(METHODS)}
    model_rank = {m: i for i, m in enumerate(_model_order(frame["model"]))}
    # zero-shot rows follow the task their encoder was trained on
    frame = frame.assign(_m=frame["model"].map(model_rank), _k=frame["method"].map(method_rank),
                         _z=frame["task"] != frame["source_task"])
    order = ["_m", "source_task", "_z", "task", "_k"]
    return frame.sort_values(order).drop(columns=["_m", "_k", "_z"]).reset_index(drop=True)


def collect_results(storage_url: str) -> Any:
    """The report's long table (one row per model, task and method) without writing anything."""
    records, _, _ = _collect(storage_url)
    return _results_frame(records)


# ----------------------------------------------------------------------------- tables


def _pivot(frame: Any, model: str, column: str) -> Any:
    part = frame[frame["model"] == model]
    table = part.pivot(index="task", columns="method", values=column)
    return table.reindex(index=list(part["task"].unique()), columns=list(METHODS)).astype(float)


def _summary_frame(frame: Any) -> Any:
    """Per (model, method): tasks with a score, mean score, mean gain, wins and mean rank."""
    import pandas as pd

    rows = []
    for model in _model_order(frame["model"]):
        part = frame[(frame["model"] == model) & frame["mean"].notna()]
        # ranked at the shown precision, like the bold cells
        signed = part["mean"].round(_DECIMALS).where(part["maximize"].astype(bool), -part["mean"].round(_DECIMALS))
        ranks = part.assign(shown=signed).groupby("task")["shown"].rank(ascending=False, method="average")
        part = part.assign(rank=ranks)
        for method in METHODS:
            mine = part[part["method"] == method]
            if mine.empty:
                continue
            gains = mine["gain"].dropna()
            rows.append({"model": model, "method": method, "tasks": int(len(mine)),
                         "mean_score": float(mine["mean"].mean()),
                         "mean_gain": float(gains.mean()) if len(gains) else math.nan,
                         "gain_tasks": int(len(gains)),
                         "wins": int(mine["is_best"].sum()),
                         "mean_rank": float(mine["rank"].mean())})
    return pd.DataFrame(rows, columns=["model", "method", "tasks", "mean_score", "mean_gain", "gain_tasks", "wins",
                                       "mean_rank"])


def _plural(count: int, noun: str, plural: Optional[str] = None) -> str:
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def _fmt(value: float, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    return f"{value:+.{_DECIMALS}f}" if signed else f"{value:.{_DECIMALS}f}"


def _cell_text(row: Any) -> str:
    if row is None or math.isnan(row["mean"]):
        return MISSING
    if row["n_seeds"] >= 2:
        return f"{row['mean']:.{_DECIMALS}f} ± {row['std']:.{_DECIMALS}f}"
    return f"{row['mean']:.{_DECIMALS}f}"


@dataclass
class _Cell:
    text: str
    bold: bool = False
    italic: bool = False


def _model_tables(frame: Any, model: str) -> Tuple[List[str], List[List[_Cell]], List[List[_Cell]]]:
    """(header, score rows, gain rows) for one model, as cells every writer renders."""
    from .paper_results import published_result

    part = frame[frame["model"] == model]
    header = ["task", "metric"] + [METHOD_LABELS[m] for m in METHODS]
    score_rows: List[List[_Cell]] = []
    gain_rows: List[List[_Cell]] = []
    for task in part["task"].unique():  # the frame's row order
        rows = part[part["task"] == task]
        by_method = {row["method"]: row for _, row in rows.iterrows()}
        unit = rows["unit"].iloc[0]
        score_rows.append([_Cell(task), _Cell(unit)] + [
            _Cell(_cell_text(by_method.get(m)), bold=bool(by_method[m]["is_best"]) if m in by_method else False)
            for m in METHODS])
        published = {}
        if not rows["shots"].notna().any():  # few-shot rows are never compared with the full-data paper
            for method in METHODS:
                cell = published_result(model, rows["base_task"].iloc[0], method)
                if cell is not None:
                    published[method] = cell.value
        if published:
            score_rows.append([_Cell(f"{task}, published", italic=True), _Cell(unit, italic=True)] + [
                _Cell(f"{published[m]:.2f}" if m in published else MISSING, italic=True) for m in METHODS])
        gain_rows.append([_Cell(task)] + [
            _Cell(_fmt(by_method[m]["gain"], signed=True) if m in by_method else MISSING) for m in METHODS[1:]])
    return header, score_rows, gain_rows


def _seed_note(frame: Any, model: str) -> str:
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


def _closing_notes(frame: Any, summary: Any) -> List[str]:
    notes = []
    for model in _model_order(frame["model"]):
        part = frame[(frame["model"] == model) & frame["mean"].notna()]
        pivot = part.pivot(index="task", columns="method", values="mean") if not part.empty else None
        parts = []
        for other, label in (("last-layer", "the last layer"), ("best-layer", "the best single layer")):
            if pivot is None or "cayley" not in pivot or other not in pivot:
                parts.append(f"no tasks with both Cayley and {label}")
                continue
            both = pivot[["cayley", other]].dropna()
            if both.empty:
                parts.append(f"no tasks with both Cayley and {label}")
                continue
            diff = both["cayley"] - both[other]
            shown = diff.round(_DECIMALS)
            spread = (f" (range {diff.min():+.{_DECIMALS}f} to {diff.max():+.{_DECIMALS}f})" if len(diff) > 1
                      else "")
            parts.append(f"against {label}, Cayley's difference is {diff.mean():+.{_DECIMALS}f} points on average"
                         f"{spread}: ahead on {int((shown > 0).sum())}, level on {int((shown == 0).sum())} and "
                         f"behind on {int((shown < 0).sum())} of {_plural(len(diff), 'task')}")
        model_summary = summary[summary["model"] == model]
        lead = ""
        if not model_summary.empty:
            # only methods with the widest coverage: a mean rank over fewer tasks is not comparable
            widest = model_summary[model_summary["tasks"] == model_summary["tasks"].max()]
            top = widest.sort_values(["mean_rank", "wins"], ascending=[True, False]).iloc[0]
            lead = (f" Among the methods with scores on {_plural(int(top['tasks']), 'task')}, "
                    f"{METHOD_LABELS[top['method']]} has the best mean rank ({top['mean_rank']:.2f}; best of the "
                    f"row in {int(top['wins'])}).")
        notes.append(f"{model}: " + "; ".join(parts) + "." + lead)
    return notes


# ----------------------------------------------------------------------------- writers


_LATEX_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def _tex(text: str) -> str:
    out = "".join(_LATEX_ESCAPES.get(ch, ch) for ch in text)
    return out.replace("±", r"$\pm$").replace("×", r"$\times$").replace(MISSING, "---")


def _inline_html(text: str) -> str:
    """Escaped text with the Markdown the report's sentences use (`code`, *emphasis*) as HTML."""
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))
    return re.sub(r"\*([^*]+)\*", r"<em>\1</em>", text)


class _Document:
    """One report written three ways at once: Markdown, LaTeX (tables only) and HTML."""

    def __init__(self) -> None:
        self.md: List[str] = []
        self.tex: List[str] = ["% requires \\usepackage{booktabs,graphicx}", ""]
        self.html: List[str] = []

    def heading(self, level: int, text: str) -> None:
        self.md += ["#" * level + " " + text, ""]
        self.html.append(f"<h{level}>{html.escape(text)}</h{level}>")

    def paragraph(self, text: str, tex: bool = False) -> None:
        self.md += [text, ""]
        self.html.append(f"<p>{_inline_html(text)}</p>")
        if tex:
            self.tex += ["% " + line for line in text.splitlines()] + [""]

    def bullets(self, items: Sequence[str]) -> None:
        if items:
            self.md += [f"- {item}" for item in items] + [""]
            self.html.append("<ul>" + "".join(f"<li>{_inline_html(item)}</li>" for item in items) + "</ul>")

    def images(self, paths: Mapping[str, str]) -> None:
        if paths:
            self.md += [f"![{kind}]({path})" for kind, path in paths.items()] + [""]
            self.html += [f'<img src="{html.escape(path)}" alt="{html.escape(kind)}">' for kind, path in paths.items()]

    def table(self, header: Sequence[str], rows: Sequence[Sequence[_Cell]], *, caption: str = "",
              label: Optional[str] = None, text_columns: int = 1) -> None:
        """A table; with a ``label`` it is also written to the LaTeX file, with ``caption``."""
        if caption:
            self.paragraph(caption)
        self.md += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        self.md += ["| " + " | ".join(self._md_cell(c) for c in row) + " |" for row in rows] + [""]
        self.html += ["<table>", "<thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header)
                      + "</tr></thead>", "<tbody>"]
        self.html += ["<tr>" + "".join(f"<td>{self._html_cell(c)}</td>" for c in row) + "</tr>" for row in rows]
        self.html += ["</tbody>", "</table>"]
        if label is not None:
            spec = "l" * text_columns + "r" * (len(header) - text_columns)
            self.tex += [r"\begin{table}[t]", r"\centering", r"\small", rf"\caption{{{_tex(caption)}}}",
                         rf"\label{{{label}}}", r"\resizebox{\linewidth}{!}{%", rf"\begin{{tabular}}{{{spec}}}",
                         r"\toprule", " & ".join(_tex(h) for h in header) + r" \\", r"\midrule"]
            self.tex += [" & ".join(self._tex_cell(c) for c in row) + r" \\" for row in rows]
            self.tex += [r"\bottomrule", r"\end{tabular}}", r"\end{table}", ""]

    @staticmethod
    def _md_cell(cell: _Cell) -> str:
        text = cell.text.replace("|", "\\|")
        if cell.bold and cell.text != MISSING:
            return f"**{text}**"
        return f"*{text}*" if cell.italic else text

    @staticmethod
    def _tex_cell(cell: _Cell) -> str:
        text = _tex(cell.text)
        if cell.bold and cell.text != MISSING:
            return rf"\textbf{{{text}}}"
        return rf"\textit{{{text}}}" if cell.italic else text

    @staticmethod
    def _html_cell(cell: _Cell) -> str:
        text = html.escape(cell.text)
        if cell.bold and cell.text != MISSING:
            return f"<strong>{text}</strong>"
        return f"<em>{text}</em>" if cell.italic else text

    def html_page(self, title: str) -> str:
        style = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}"
                 "table{border-collapse:collapse;margin:1em 0;font-size:0.9em}"
                 "th,td{border-bottom:1px solid #ddd;padding:4px 8px;text-align:right}"
                 "th:first-child,td:first-child{text-align:left}thead th{border-bottom:2px solid #444}"
                 "img{max-width:100%;display:block;margin:1em 0}")
        return (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                f"<title>{html.escape(title)}</title>\n<style>{style}</style>\n</head>\n<body>\n"
                + "\n".join(self.html) + "\n</body>\n</html>\n")


def _summary_rows(summary: Any) -> Tuple[List[str], List[List[_Cell]]]:
    header = ["model", "method", "tasks", "mean score", "mean gain vs last layer", "wins", "mean rank"]
    rows = []
    for r in summary.itertuples():
        if r.method == "last-layer":
            gain = "(reference)"
        elif math.isnan(r.mean_gain):
            gain = MISSING
        else:
            gain = f"{r.mean_gain:+.{_DECIMALS}f} ({_plural(r.gain_tasks, 'task')})"
        rows.append([_Cell(r.model), _Cell(METHOD_LABELS[r.method]), _Cell(str(r.tasks)),
                     _Cell(_fmt(r.mean_score)), _Cell(gain), _Cell(str(r.wins)), _Cell(f"{r.mean_rank:.2f}")])
    return header, rows


def _setting(attrs: Dict[str, Any]) -> str:
    parts = [f"{key}={attrs[key]}" for key in ("shots", "max_train", "max_eval", "max_epochs") if attrs.get(key)]
    return ", ".join(parts) or "full data"


def _studies_rows(records: Sequence[_StudyRecord], scale_of: Dict[str, float]) -> Tuple[List[str], List[List[_Cell]]]:
    header = ["study", "setting", "complete", "pruned", "failed", "best val (trial)", "final seeds"]
    rows = []
    for r in sorted(records, key=lambda r: r.name):
        scale = scale_of.get(r.metric, 1.0)
        best = MISSING if r.best_value is None else f"{r.best_value * scale:.{_DECIMALS}f} ({r.best_number})"
        rows.append([_Cell(r.name), _Cell(_setting(r.attrs)), _Cell(str(r.n_complete)), _Cell(str(r.n_pruned)),
                     _Cell(str(r.n_failed)), _Cell(best), _Cell(str(len(r.test_scores)))])
    return header, rows


def _hide_password(url: str) -> str:
    from .study import _hide_password as hide

    return hide(url)


# ----------------------------------------------------------------------------- figures


def _slug(*parts: str) -> str:
    return "-".join(re.sub(r"[^A-Za-z0-9.\-]+", "_", p).strip("_") for p in parts)


def _new_figure(width: float, height: float) -> Any:
    # a bare Figure with an Agg canvas: no pyplot, so the caller's backend is never changed
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(figure)
    return figure


def _method_colors() -> Dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {m: cmap(i) for i, m in enumerate(METHODS)}


def _layer_figure(records: Sequence[_StudyRecord], path: Path) -> bool:
    by_method = {r.method: r for r in records}
    probe = by_method.get("best-layer")
    if probe is None or not probe.layer_scores:
        return False
    scale, unit = _unit(probe.metric)
    colors = _method_colors()
    figure = _new_figure(7.0, 4.0)
    ax = figure.add_subplot(1, 1, 1)
    layers = list(range(len(probe.layer_scores)))
    scores = [s * scale for s in probe.layer_scores]
    ax.plot(layers, scores, marker="o", markersize=3, color=colors["best-layer"], label="linear probe on layer l")
    if probe.chosen_layer is not None and 0 <= probe.chosen_layer < len(scores):
        ax.scatter([probe.chosen_layer], [scores[probe.chosen_layer]], s=80, facecolors="none",
                   edgecolors="black", zorder=3, label=f"chosen layer ({probe.chosen_layer})")
    for method in METHODS:
        record = by_method.get(method)
        if method == "best-layer" or record is None or record.best_value is None:
            continue
        ax.axhline(record.best_value * scale, color=colors[method], linestyle="--", linewidth=1.2,
                   label=METHOD_LABELS[method])
    ax.set_xlabel("layer (0 = embedding output)")
    ax.set_ylabel(f"best validation {unit}")
    ax.set_title(f"{probe.model} · {probe.task}: probe per layer vs aggregators (validation)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right", ncol=2)
    figure.tight_layout()
    figure.savefig(path)
    return True


def _history_figure(records: Sequence[_StudyRecord], path: Path) -> bool:
    colors = _method_colors()
    figure = _new_figure(7.0, 4.0)
    ax = figure.add_subplot(1, 1, 1)
    drawn = False
    unit = ""
    for record in sorted(records, key=lambda r: METHODS.index(r.method)):
        frame = record.trials
        if frame.empty:
            continue
        complete = frame[(frame["state"] == "COMPLETE") & frame["value"].notna()].sort_values("number")
        if complete.empty:
            continue
        scale, unit = _unit(record.metric)
        values = complete["value"].astype(float) * scale
        best = values.cummax() if record.maximize else values.cummin()
        color = colors[record.method]
        ax.scatter(complete["number"], values, s=10, alpha=0.4, color=color)
        ax.plot(complete["number"], best, drawstyle="steps-post", marker="o", markersize=2.5, color=color,
                label=METHOD_LABELS[record.method])
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


def _importances(record: _StudyRecord) -> Tuple[Dict[str, float], Optional[str]]:
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


def _importance_figure(items: Sequence[Tuple[_StudyRecord, Dict[str, float]]], path: Path) -> bool:
    items = [(r, imp) for r, imp in items if imp]
    if not items:
        return False
    colors = _method_colors()
    columns = min(4, len(items))
    rows = math.ceil(len(items) / columns)
    figure = _new_figure(3.2 * columns, 2.4 * rows + 0.4)
    for index, (record, importances) in enumerate(items):
        ax = figure.add_subplot(rows, columns, index + 1)
        names = sorted(importances, key=importances.get)
        ax.barh(names, [importances[n] for n in names], color=colors[record.method])
        ax.set_xlim(0, 1)
        ax.set_title(f"{METHOD_LABELS[record.method]} ({record.n_complete} trials)", fontsize=9)
        ax.tick_params(labelsize=7)
    first = items[0][0]
    figure.suptitle(f"{first.model} · {first.task}: hyperparameter importance (fANOVA)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path)
    return True


# ----------------------------------------------------------------------------- the report


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _figures(records: Sequence[_StudyRecord], pairs: Sequence[Tuple[str, str]], fig_dir: Path,
             show_progress: bool) -> Tuple[Dict[Tuple[str, str], Dict[str, str]], Dict[Tuple[str, str], List[str]],
                                           List[Dict[str, Any]]]:
    """Per (model, task): the PNGs drawn, notes on what could not be drawn, and importance rows."""
    from tqdm.auto import tqdm

    paths: Dict[Tuple[str, str], Dict[str, str]] = {}
    notes: Dict[Tuple[str, str], List[str]] = {}
    importance_rows: List[Dict[str, Any]] = []
    for model, task in tqdm(pairs, desc="report figures", unit="task", disable=not show_progress):
        group = sorted((r for r in records if r.model == model and r.task == task),
                       key=lambda r: METHODS.index(r.method))
        here: Dict[str, str] = {}
        missing: List[str] = []
        items = []
        for record in group:
            importances, reason = _importances(record)
            if reason:
                missing.append(f"{METHOD_LABELS[record.method]}: no importances ({reason})")
            items.append((record, importances))
            importance_rows += [{"model": model, "task": task, "method": record.method, "study": record.name,
                                 "param": param, "importance": value} for param, value in importances.items()]
        for kind, draw, arg in (("layers", _layer_figure, group), ("history", _history_figure, group),
                                ("importance", _importance_figure, items)):
            name = f"{_slug(model, task)}-{kind}.png"
            if draw(arg, fig_dir / name):
                here[kind] = f"figures/{name}"
        if "layers" not in here:
            missing.append("no per-layer figure: no best-layer study with per-layer scores")
        paths[(model, task)], notes[(model, task)] = here, missing
    return paths, notes, importance_rows


def _intro(storage_url: str, n_studies: int) -> str:
    generated = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"Generated {generated} by ilge-search {__version__} from `{_hide_password(storage_url)}` "
            f"({_plural(n_studies, 'study', 'studies')}). Cells: final test score, mean ± std over the final seeds "
            "(the best validation trial retrained with each seed); accuracy in %, Spearman correlation ×100. "
            f"Bold: best of the row. {MISSING}: no study or no final test score (never filled in).")


def _published_note() -> str:
    from .paper_results import paper_source

    source = paper_source()
    return (f"Rows marked *published* give the numbers of \"{source['paper']}\" (arXiv {source['arxiv']} "
            f"{source['version']}, {source['table']}), {source['transcription']}. Protocol: {source['protocol']}.")


def _no_published_note() -> str:
    from .paper_results import load_paper_results, paper_source

    source, cells = paper_source(), load_paper_results()
    models = sorted({cell.model.rsplit("/", 1)[-1] for cell in cells})
    tasks = sorted({cell.task for cell in cells})
    return (f"No (model, task, method) here has a published number in \"{source['paper']}\" (arXiv "
            f"{source['arxiv']}), so no published row is shown; the paper reports {', '.join(models)} "
            f"on {', '.join(tasks)}.")


_SUMMARY_NOTE = ("Mean score over the tasks the method has; mean gain over the tasks with both the method and the last "
                 "layer; wins: tasks where it is the best of the row (ties count for each); mean rank among the "
                 "methods of each row (1 = best).")


def build_report(storage_url: str, out_dir: Union[str, os.PathLike] = "reports", *, figures: bool = True,
                 show_progress: bool = True) -> ReportResult:
    """Write the paper-style report of every ilge-search study in ``storage_url`` to ``out_dir``.

    Args:
        storage_url: an Optuna RDB URL (``sqlite:///studies/offline.db``, PostgreSQL, MySQL).
        out_dir: the report folder (created; files of the same names are replaced).
        figures: draw the PNG figures (per-layer, history, importance) and compute importances.
        show_progress: a tqdm bar over (model, task) pairs while drawing.

    Returns:
        A :class:`ReportResult` with the tables as data frames and the written paths.

    Raises:
        ValueError: the storage cannot be opened, or it holds no ilge-search study.
    """
    import pandas as pd

    records, duplicates, skipped = _collect(storage_url)
    if not records:
        raise ValueError(f"no ilge-search studies in {_hide_password(storage_url)}"
                         + (f" ({len(skipped)} other studies skipped)" if skipped else "")
                         + "; run `ilge-search run` or `ilge-search sweep` first")
    skipped += [f"{r.name}: not shown, {r.model}/{r.task}/{r.method} is reported from another study "
                "(with final scores, more seeds or more trials)" for r in duplicates]
    out, fig_dir = Path(out_dir), Path(out_dir) / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    for kind in _FIGURE_KINDS:  # figures of an earlier report that this one may not redraw
        for stale in fig_dir.glob(f"*-{kind}.png"):
            stale.unlink()

    frame = _results_frame(records)
    models = _model_order(frame["model"])
    summary = _summary_frame(frame)
    notes = _closing_notes(frame, summary)
    pairs = [(m, t) for m in models for t in sorted({r.task for r in records if r.model == m})]
    figure_paths, figure_notes, importance_rows = (
        _figures(records, pairs, fig_dir, show_progress) if figures else ({}, {}, []))

    doc = _Document()
    doc.heading(1, "ILGE results")
    doc.paragraph(_intro(storage_url, len(records)), tex=True)
    doc.paragraph(_published_note() if frame["published"].notna().any() else _no_published_note())
    for model in models:
        header, score_rows, gain_rows = _model_tables(frame, model)
        doc.heading(2, model)
        doc.table(header, score_rows, label=f"tab:{_slug(model)}", text_columns=2,
                  caption=f"{model}: test score, mean ± std over seeds (best of each row in bold).")
        doc.paragraph(_seed_note(frame, model))
        doc.table(["task"] + [METHOD_LABELS[m] for m in METHODS[1:]], gain_rows, label=f"tab:{_slug(model)}-gain",
                  caption=f"{model}: gain over the last layer (points).")
    doc.heading(2, "Across models")
    doc.table(*_summary_rows(summary), label="tab:summary", text_columns=2,
              caption="Across models: mean score, mean gain over the last layer, wins and mean rank.")
    doc.paragraph(_SUMMARY_NOTE)
    doc.heading(2, "Notes")
    doc.bullets(notes)
    if figures:
        doc.heading(2, "Figures")
        for model, task in pairs:
            doc.heading(3, f"{model} · {task}")
            doc.images(figure_paths[(model, task)])
            doc.bullets(figure_notes[(model, task)])
    doc.heading(2, "Studies")
    doc.table(*_studies_rows(records, {r.metric: _unit(r.metric)[0] for r in records}))
    if skipped:
        doc.paragraph("Not reported:")
        doc.bullets(skipped)

    importances = pd.DataFrame(importance_rows, columns=["model", "task", "method", "study", "param", "importance"])
    files = {"markdown": out / "report.md", "latex": out / "report.tex", "html": out / "index.html",
             "csv": out / "results.csv", "summary_csv": out / "summary.csv", "importances_csv": out / "importances.csv"}
    for kind, text in (("markdown", "\n".join(doc.md)), ("latex", "\n".join(doc.tex)),
                       ("html", doc.html_page("ILGE results")), ("csv", frame.to_csv(index=False)),
                       ("summary_csv", summary.to_csv(index=False)),
                       ("importances_csv", importances.to_csv(index=False))):
        _write_atomic(files[kind], text)
    logger.info("report of %d studies written to %s", len(records), out)
    return ReportResult(out_dir=out, results=frame, tables={m: _pivot(frame, m, "mean") for m in models},
                        gains={m: _pivot(frame, m, "gain").drop(columns=["last-layer"]) for m in models},
                        summary=summary, importances=importances, files=files,
                        figures=sorted(p for paths in figure_paths.values() for p in paths.values()), notes=notes,
                        skipped=skipped)
