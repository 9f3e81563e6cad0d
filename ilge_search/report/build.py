"""Paper-style reports from every study in a storage.

:func:`build_report` reads the studies the runner (:mod:`ilge_search.study`)
stored, starting from ``optuna.get_all_study_summaries`` and each study's
``trials_dataframe()``, and writes into ``out_dir``:

- ``report.md``: one table per model (rows: tasks; columns: the encoders in
  :data:`~ilge_search.report.data.METHODS`) of final test scores as mean +- std
  over the final seeds, the best of each row in bold, a table of each encoder's
  gain over the last layer, a cross-model summary, notes on where Cayley
  stands, the published numbers where the paper has the same cell, and a list
  of the studies used;
- ``report.tex``: the same tables for LaTeX (needs ``\\usepackage{booktabs}``);
- ``results.csv`` (one row per model, task and encoder, in column ``method``),
  ``summary.csv`` and ``importances.csv``;
- ``index.html``: one static page with the tables and the figures in
  ``figures/``: validation score of a probe on each layer against the
  aggregators, optimisation histories and hyperparameter importances.

Conventions:

- Scores are the study user attr ``final_test_mean``/``final_test_std`` times
  100: accuracy in %, Spearman correlation x 100. A cell whose study is
  missing, or has no final test score yet, is shown as ``—`` and never filled.
- Few-shot studies are their own rows (``trec (8-shot)``). When several
  studies share a model, task and encoder (e.g. different ``max_train``), the
  one with final scores, the most seeds, then the most finished trials is
  used; the others are listed as not shown.
- Bold marks the best mean of the row at the shown precision (ties: all).
- Gain = encoder mean - last-layer mean, in points; ``—`` when either is missing.
- Figures use validation scores only (the per-layer scores are those of the
  best-layer study's best trial); test scores appear in the tables only.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Union

from ..storage import hide_password
from .data import METHOD_LABELS, METHODS, collect_records
from .document import Document, slug, write_atomic
from .figures import FIGURE_KINDS, draw_figures
from .notes import SUMMARY_NOTE, closing_notes, intro, no_published_note, published_note
from .tables import (
    model_order,
    model_tables,
    pivot,
    results_frame,
    seed_note,
    studies_rows,
    summary_frame,
    summary_rows,
)

__all__ = ["ReportResult", "build_report"]

logger = logging.getLogger(__name__)


@dataclass
class ReportResult:
    """What :func:`build_report` computed and wrote.

    Attributes:
        out_dir: the report folder.
        results: one row per (model, task, encoder) with a study (``mean``/``std``
            in score units, NaN when no final test score is stored).
        tables: per model, tasks x :data:`~ilge_search.report.data.METHODS` of mean scores (NaN = missing).
        gains: per model, tasks x encoders of gains over the last layer.
        summary: one row per (model, encoder): tasks, mean score, mean gain, wins, mean rank.
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

    records, duplicates, skipped = collect_records(storage_url)
    if not records:
        raise ValueError(f"no ilge-search studies in {hide_password(storage_url)}"
                         + (f" ({len(skipped)} other studies skipped)" if skipped else "")
                         + "; run `ilge-search run` or `ilge-search sweep` first")
    skipped += [f"{r.name}: not shown, {r.model}/{r.task}/{r.encoder} is reported from another study "
                "(with final scores, more seeds or more trials)" for r in duplicates]
    out, fig_dir = Path(out_dir), Path(out_dir) / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    for kind in FIGURE_KINDS:  # figures of an earlier report that this one may not redraw
        for stale in fig_dir.glob(f"*-{kind}.png"):
            stale.unlink()

    frame = results_frame(records)
    models = model_order(frame["model"])
    summary = summary_frame(frame)
    notes = closing_notes(frame, summary)
    pairs = [(m, t) for m in models for t in sorted({r.task for r in records if r.model == m})]
    figure_paths, figure_notes, importance_rows = (
        draw_figures(records, pairs, fig_dir, show_progress) if figures else ({}, {}, []))

    doc = Document()
    doc.heading(1, "ILGE results")
    doc.paragraph(intro(storage_url, len(records)), tex=True)
    doc.paragraph(published_note() if frame["published"].notna().any() else no_published_note())
    for model in models:
        header, score_rows, gain_rows = model_tables(frame, model)
        doc.heading(2, model)
        doc.table(header, score_rows, label=f"tab:{slug(model)}", text_columns=2,
                  caption=f"{model}: test score, mean ± std over seeds (best of each row in bold).")
        doc.paragraph(seed_note(frame, model))
        doc.table(["task"] + [METHOD_LABELS[m] for m in METHODS[1:]], gain_rows, label=f"tab:{slug(model)}-gain",
                  caption=f"{model}: gain over the last layer (points).")
    doc.heading(2, "Across models")
    doc.table(*summary_rows(summary), label="tab:summary", text_columns=2,
              caption="Across models: mean score, mean gain over the last layer, wins and mean rank.")
    doc.paragraph(SUMMARY_NOTE)
    doc.heading(2, "Notes")
    doc.bullets(notes)
    if figures:
        doc.heading(2, "Figures")
        for model, task in pairs:
            doc.heading(3, f"{model} · {task}")
            doc.images(figure_paths[(model, task)])
            doc.bullets(figure_notes[(model, task)])
    doc.heading(2, "Studies")
    doc.table(*studies_rows(records))
    if skipped:
        doc.paragraph("Not reported:")
        doc.bullets(skipped)

    importances = pd.DataFrame(importance_rows, columns=["model", "task", "method", "study", "param", "importance"])
    files = {"markdown": out / "report.md", "latex": out / "report.tex", "html": out / "index.html",
             "csv": out / "results.csv", "summary_csv": out / "summary.csv", "importances_csv": out / "importances.csv"}
    for kind, text in (("markdown", doc.markdown()), ("latex", doc.latex()),
                       ("html", doc.html_page("ILGE results")), ("csv", frame.to_csv(index=False)),
                       ("summary_csv", summary.to_csv(index=False)),
                       ("importances_csv", importances.to_csv(index=False))):
        write_atomic(files[kind], text)
    logger.info("report of %d studies written to %s", len(records), out)
    return ReportResult(out_dir=out, results=frame, tables={m: pivot(frame, m, "mean") for m in models},
                        gains={m: pivot(frame, m, "gain").drop(columns=["last-layer"]) for m in models},
                        summary=summary, importances=importances, files=files,
                        figures=sorted(p for paths in figure_paths.values() for p in paths.values()), notes=notes,
                        skipped=skipped)
