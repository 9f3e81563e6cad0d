"""Paper-style reports from every study in a storage (the user's view: ``docs/guide.md``, "Reports and defaults").

:func:`build_report` reads the studies through :mod:`.data`, lays the report out as the sections of
:mod:`.sections` and writes into its folder (:mod:`.folder`, manifest :data:`MANIFEST_NAME`):
``report.md``, ``report.tex`` (needs ``\\usepackage{booktabs}``), ``index.html`` with the figures in
``figures/``, and the CSVs (``results.csv``, ``summary.csv``, ``importances.csv``, ``tokens.csv`` and
``protocol_effect.csv`` when there is something to put in them).

Conventions: scores are final test means ± std over the final seeds in score units (accuracy in %, Spearman x 100); a
missing cell is ``—`` and never filled; few-shot and paper-protocol studies are rows of their own; bold marks the best
mean of a row at the shown precision (ties: all); gain = encoder mean minus last-layer mean, in points. Figures use
validation scores only, except the Pareto section's panel of final fronts.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from ..defaults.loto import stored_loto
from ..defaults.shipping_check import attach_shipping_checks
from ..defaults.transfer import stored_portfolios
from ..files import write_output_text
from ..storage import hide_password
from .attributions import attribution_notes
from .comparisons import stored_predictions
from .data import ReportStudy, collect_records
from .document import Document
from .fewshot import fewshot_frame
from .folder import MANIFEST_NAME, check_out_dir, default_report_dir, finish_out_dir
from .notes import closing_notes, intro, no_published_note, published_note
from .protocol_effect import protocol_effect_frame, protocol_effect_notes
from .sections import FigureFolder, Figures, ReportData, Section, auto_studies, outside_the_tables, report_sections
from .tables import model_order, pivot, results_frame, selection_frame, summary_frame
from .tokens import split_tagging, tokens_frame

if TYPE_CHECKING:
    import pandas as pd

    from ..defaults.loto import LotoResult

__all__ = ["ReportResult", "build_report", "MANIFEST_NAME"]

logger = logging.getLogger(__name__)


@dataclass
class ReportResult:
    """What :func:`build_report` computed and wrote.

    Attributes:
        out_dir: the report folder.
        results: one row per (model, task, encoder) with a study (``mean``/``std``
            in score units, NaN when no final test score is stored).
        tables: per model, tasks x :func:`~ilge_search.report.data.methods` of mean scores (NaN = missing).
        gains: per model, tasks x encoders of gains over the last layer.
        summary: one row per (model, protocol, encoder): tasks, mean score, mean gain, wins, mean rank.
        protocol_effect: one row per (model, task) scored under both protocols: the last layer and
            Cayley under each, their differences, and the published numbers.
        importances: one row per (study, parameter) with its fANOVA importance.
        files: written files by kind (``markdown``, ``latex``, ``html``, ``csv``, ...).
        figures: written PNGs, relative to ``out_dir``.
        notes: the closing sentences (also in the report).
        skipped: studies not reported, with the reason.
        fewshot: one row per point of the few-shot curves (empty without few-shot studies).
        loto: the stored leave-one-task-out evaluation (``loto.rows`` empty when there is none).
    """

    out_dir: Path
    results: pd.DataFrame
    tables: dict[str, pd.DataFrame]
    gains: dict[str, pd.DataFrame]
    summary: pd.DataFrame
    importances: Any
    protocol_effect: pd.DataFrame | None = None
    files: dict[str, Path] = field(default_factory=dict)
    figures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    fewshot: pd.DataFrame | None = None
    loto: LotoResult | None = None


def _read_report_data(storage_url: str) -> ReportData:
    """Everything the report shows, computed from the storage without writing anything.

    Raises:
        ValueError: the storage cannot be opened, or it holds no ilge-search study.
    """
    records, duplicates, skipped = collect_records(storage_url)
    records, tagging = split_tagging(records)  # token accuracy never enters the sequence tables or ranks
    duplicates, _ = split_tagging(duplicates)
    every = records + duplicates  # the selection, Pareto and few-shot sections compare studies of every setting
    outside = outside_the_tables(storage_url, every)  # the auto studies among them have a stage's section
    if not records and not tagging and not auto_studies(outside):
        raise ValueError(
            f"no ilge-search studies in {hide_password(storage_url)}"
            + (f" ({len(skipped)} other studies skipped)" if skipped else "")
            + "; run `ilge-search run` or `ilge-search sweep` first"
        )
    skipped += _not_shown(duplicates)
    frame = results_frame(records)
    summary = summary_frame(frame) if records else frame
    effect = protocol_effect_frame(frame) if records else frame
    fewshot, fewshot_skipped = fewshot_frame(every)
    portfolios, portfolio_notes = stored_portfolios(storage_url)  # what `ilge-search portfolio` stored
    attach_shipping_checks(storage_url, portfolios)  # and `ilge-search shipping-check`
    return ReportData(
        storage_url=storage_url,
        records=records,
        every=every,
        frame=frame,
        models=model_order(frame["model"]) if records else [],
        summary=summary,
        effect=effect,
        notes=closing_notes(frame, summary, stored_predictions(storage_url, records)) + protocol_effect_notes(effect)
        if records
        else [],
        selection=selection_frame(every),
        fewshot=fewshot,
        fewshot_skipped=fewshot_skipped,
        layer_notes=attribution_notes(records),  # from the attributions `ilge-search explain` stored
        loto=stored_loto(storage_url),
        skipped=skipped,
        tokens=tokens_frame(tagging),
        tagging=tagging,
        portfolios=portfolios,
        portfolio_notes=portfolio_notes,
        outside=outside,
    )


def _not_shown(duplicates: list[ReportStudy]) -> list[str]:
    """Why each study that another study's numbers stand for is left out of the tables."""
    return [
        f"{r.name}: not in the tables, {r.model}/{r.task}/{r.encoder} is reported from a single-objective "
        "study; its Pareto front is under 'Pareto fronts'"
        if r.multi_objective
        else f"{r.name}: not shown, {r.model}/{r.task}/{r.encoder} is reported from another study "
        "(with final scores, more seeds or more trials)"
        for r in duplicates
    ]


def _write_texts(out: Path, doc: Document, data: ReportData, importances: Any) -> dict[str, Path]:
    """Write the report's text files (Markdown, LaTeX, HTML, the CSVs); their paths by kind."""
    texts = {
        "markdown": ("report.md", doc.markdown()),
        "latex": ("report.tex", doc.latex()),
        "html": ("index.html", doc.html_page("ILGE results")),
        "csv": ("results.csv", data.frame.to_csv(index=False)),
        "summary_csv": ("summary.csv", data.summary.to_csv(index=False)),
        "importances_csv": ("importances.csv", importances.to_csv(index=False)),
    }
    if data.tokens is not None and not data.tokens.empty:
        texts["tokens_csv"] = ("tokens.csv", data.tokens.to_csv(index=False))
    if not data.effect.empty:
        texts["protocol_effect_csv"] = ("protocol_effect.csv", data.effect.to_csv(index=False))
    files = {}
    for kind, (name, text) in texts.items():
        files[kind] = out / name
        write_output_text(files[kind], text)
    return files


def build_report(
    storage_url: str,
    out_dir: str | os.PathLike | None = None,
    *,
    figures: bool = True,
    progress: bool = True,
    force: bool = False,
) -> ReportResult:
    """Write the paper-style report of every ilge-search study in ``storage_url`` to ``out_dir``.

    Args:
        storage_url: an Optuna RDB URL (``sqlite:///studies/offline.db``, PostgreSQL, MySQL).
        out_dir: the report folder (created; ``None``: :func:`~.folder.default_report_dir`, beside a
            SQLite storage). A folder with git-tracked files, files no report wrote or another storage's
            report is refused unless ``force``.
        figures: draw the PNG figures (per-layer, history, importance) and compute importances.
        progress: a progress bar over (model, task) pairs while drawing.
        force: write into a folder that would be refused (files of the same names are replaced; other files are kept).

    Returns:
        A :class:`ReportResult` with the tables as data frames and the written paths.

    Raises:
        ValueError: ``out_dir`` is a file, cannot be made or written, or is a refused folder (without
            ``force``), the storage cannot be opened, or it holds no ilge-search study.
    """

    out = Path(out_dir) if out_dir is not None else default_report_dir(storage_url)
    previous = check_out_dir(out, storage_url, force)  # before reading: a refusal costs nothing, creates nothing
    data = _read_report_data(storage_url)
    folder = FigureFolder(out, draw=figures, progress=progress)
    sections = _drawn_sections(data, folder)
    doc = _document(storage_url, data, sections, folder)
    drawn = next((s for s in sections if isinstance(s, Figures)), Figures())
    importances = pd.DataFrame(
        drawn.importance_rows, columns=["model", "task", "method", "study", "param", "importance"]
    )
    files = _write_texts(out, doc, data, importances)
    figure_files = sorted(path for section in sections for path in section.figures)
    finish_out_dir(
        out, storage_url, {path.relative_to(out).as_posix() for path in files.values()} | set(figure_files), previous
    )
    logger.info("report of %d studies written to %s", data.n_studies, out)
    return _report_result(out, data, importances, files, figure_files)


def _report_result(
    out: Path, data: ReportData, importances: pd.DataFrame, files: dict[str, Path], figure_files: list[str]
) -> ReportResult:
    return ReportResult(
        out_dir=out,
        results=data.frame,
        tables={m: pivot(data.frame, m, "mean") for m in data.models},
        gains={m: pivot(data.frame, m, "gain").drop(columns=["last-layer"]) for m in data.models},
        summary=data.summary,
        importances=importances,
        protocol_effect=data.effect,
        files=files,
        figures=figure_files,
        notes=data.notes,
        skipped=data.skipped,
        fewshot=data.fewshot,
        loto=data.loto,
    )


def _drawn_sections(data: ReportData, folder: FigureFolder) -> list[Section]:
    """The report's sections that apply to ``data``, each having drawn its figures (when ``folder`` draws)."""
    folder.out.mkdir(parents=True, exist_ok=True)
    if folder.draw:  # a report without figures leaves no empty figures/ behind
        folder.path.mkdir(exist_ok=True)
    sections = [section for section in report_sections() if section.applies(data, folder)]
    if folder.draw:
        for section in sections:
            section.draw(data, folder)
    return sections


def _document(storage_url: str, data: ReportData, sections: list[Section], folder: FigureFolder) -> Document:
    """The report's text: the title, the introduction, the contents, then every section in order."""
    doc = Document()
    doc.heading(1, "ILGE results")
    doc.paragraph(intro(storage_url, data.n_studies), tex=True)
    doc.paragraph(published_note() if data.frame["published"].notna().any() else no_published_note())
    doc.contents([entry for section in sections for entry in section.contents(data)])
    for section in sections:
        section.render(doc, data, folder)
    return doc
