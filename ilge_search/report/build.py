"""Paper-style reports from every study in a storage.

:func:`build_report` reads the studies the runner (:mod:`ilge_search.study`)
stored, starting from ``optuna.get_all_study_summaries`` and each study's
``trials_dataframe()``, and writes into ``out_dir``:

- ``report.md``: one table per model and protocol (rows: tasks; columns: the
  encoders in :data:`~ilge_search.report.data.METHODS`) of final test scores as
  mean +- std over the final seeds, the best of each row in bold, a table of
  each encoder's gain over the last layer, a cross-model summary, notes on where
  Cayley stands, the published numbers beside paper-protocol scores where the
  paper has the same cell, the protocol effect (the last layer and Cayley under
  both protocols, :mod:`.protocol_effect`) when the storage holds both, and a
  list of the studies used;
- ``report.tex``: the same tables for LaTeX (needs ``\\usepackage{booktabs}``);
- ``results.csv`` (one row per model, task and encoder, in column ``method``;
  column ``protocol``), ``summary.csv``, ``importances.csv`` and, with both
  protocols, ``protocol_effect.csv``;
- ``index.html``: one static page with the tables and the figures in
  ``figures/``: validation score of a probe on each layer against the
  aggregators, optimisation histories and hyperparameter importances;
- when the storage holds few-shot curves (studies differing only in
  ``shots``, :mod:`~ilge_search.report.fewshot`): a table and one figure per
  model and task of test score against examples per label;
- when it holds a current leave-one-task-out evaluation (``ilge-search loto``,
  :mod:`~ilge_search.report.loto`): the table of built-in against regenerated
  defaults on each left-out task, and whether the regenerated ones win.

Conventions:

- Scores are the study user attr ``final_test_mean``/``final_test_std`` times
  100: accuracy in %, Spearman correlation x 100. A cell whose study is
  missing, or has no final test score yet, is shown as ``—`` and never filled.
- Few-shot studies are their own rows (``trec (8-shot)``), and so are
  paper-protocol studies (``trec [paper protocol]``). When several
  studies share a model, task and encoder (e.g. different ``max_train``), the
  one with final scores, the most seeds, then the most finished trials is
  used; the others are listed as not shown.
- Bold marks the best mean of the row at the shown precision (ties: all).
- Gain = encoder mean - last-layer mean, in points; ``—`` when either is missing.
- Figures use validation scores only (the per-layer scores are those of the
  best-layer study's best trial); test scores appear in the tables only. The
  exception is a storage with multi-objective studies: its "Pareto fronts"
  section (:mod:`~ilge_search.report.pareto`) draws each final front's test
  scores in a panel of their own, next to the search on validation.

The report folder is the report's own: it records what it wrote in
``.ilge-report.json`` (:data:`MANIFEST_NAME`). A folder that is not empty and
has no such manifest is refused unless ``force=True`` (``--force``); a rerun
replaces the files it wrote before and removes those of them it no longer
writes (a figure that cannot be drawn any more). Files it did not write are
never removed.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple, Union

from .._version import __version__
from ..storage import hide_password
from .attributions import attribution_notes, draw_attribution_figures
from .data import METHOD_LABELS, METHODS, collect_records
from .document import Document, slug, write_atomic
from .fewshot import draw_fewshot_figures, fewshot_frame, fewshot_notes, fewshot_rows
from .figures import display_width, draw_figures
from .loto import loto_rows, loto_sentences, loto_verdict_rows, stored_loto
from .notes import SUMMARY_NOTE, closing_notes, intro, no_published_note, published_note
from .pareto import PARETO_NOTE, draw_pareto_figures, pareto_notes, pareto_pairs, pareto_rows
from .protocol_effect import PROTOCOL_EFFECT_NOTE, protocol_effect_frame, protocol_effect_notes, protocol_effect_rows
from .tables import (
    SELECTION_NOTE,
    model_order,
    model_protocols,
    model_tables,
    pivot,
    results_frame,
    seed_note,
    selection_frame,
    selection_rows,
    selection_summary_rows,
    studies_rows,
    summary_frame,
    summary_rows,
)

__all__ = ["ReportResult", "build_report", "MANIFEST_NAME"]

logger = logging.getLogger(__name__)

MANIFEST_NAME = ".ilge-report.json"  # the files a report wrote into its folder (relative paths)
_PROTOCOL_CAPTIONS = {
    "matched": "matched protocol (each method trained with its own head on the same data, scored by it)",
    "paper": (
        "paper protocol (MTEB's logistic readout of the vectors on a few examples per label, mean over 10 "
        "draws; cosine Spearman for similarity; the last layer, best layer and mean of layers untrained, the "
        "same score for every seed)"
    ),
}
FEWSHOT_NOTE = (
    "Studies that differ only in training examples per label (`shots`; `studies/fewshot.toml`), with the "
    "study of the same setting on the whole training subset as the last point. Each point is the "
    "selected trial retrained with the final seeds and scored once on test. One few-shot draw per "
    "count (the data seed): the spread is over training seeds, not over draws."
)
LOTO_NOTE = (
    "For each task, the defaults were regenerated (`recommend`'s rule) from every other task's studies and "
    "trained with no search on that task's study data, next to the built-in defaults of the published "
    "package, with the same seeds; both scored once on test per seed (`ilge-search loto`). Regenerated "
    "defaults are shipped only when they beat the built-in ones on average over the left-out tasks."
)


@dataclass
class ReportResult:
    """What :func:`build_report` computed and wrote.

    Attributes:
        out_dir: the report folder.
        results: one row per (model, task, encoder) with a study (``mean``/``std``
            in score units, NaN when no final test score is stored).
        tables: per model, tasks x :data:`~ilge_search.report.data.METHODS` of mean scores (NaN = missing).
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
    results: Any
    tables: Dict[str, Any]
    gains: Dict[str, Any]
    summary: Any
    importances: Any
    protocol_effect: Any = None
    files: Dict[str, Path] = field(default_factory=dict)
    figures: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    skipped: List[str] = field(default_factory=list)
    fewshot: Any = None
    loto: Any = None


def _read_manifest(out: Path) -> Optional[Set[str]]:
    """The files an earlier report wrote into ``out`` (``None``: no readable manifest)."""
    try:
        data = json.loads((out / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, list) or not all(isinstance(name, str) for name in files):
        return None
    return set(files)


def _inside(out: Path, relative: str) -> Optional[Path]:
    """``out / relative`` when it stays inside ``out`` (a manifest never names files elsewhere)."""
    path = (out / relative).resolve()
    root = out.resolve()
    return path if path != root and root in path.parents else None


def _check_out_dir(out: Path, force: bool) -> Set[str]:
    """Refuse a folder the report did not make (unless ``force``); the files it wrote there before."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder; pass a folder for the report")
    previous = _read_manifest(out) if out.is_dir() else None
    if previous is None and out.is_dir() and any(out.iterdir()) and not force:
        raise ValueError(
            f"{out} is not empty and was not written by `ilge-search report` (it has no "
            f"{MANIFEST_NAME}); pass a new or empty --out, or --force to write into it anyway "
            "(files of the same names are replaced, no other file is removed)"
        )
    return previous or set()


def _finish_out_dir(out: Path, written: Set[str], previous: Set[str]) -> None:
    """Remove what an earlier report wrote and this one did not; record what this one wrote."""
    for relative in sorted(previous - written):
        path = _inside(out, relative)
        if path is not None and path.is_file():
            path.unlink()
    write_atomic(
        out / MANIFEST_NAME,
        json.dumps({"written_by": f"ilge-search report {__version__}", "files": sorted(written)}, indent=1) + "\n",
    )


def _show_images(doc: Document, images: Mapping[str, str], out: Path) -> None:
    """Images (caption -> path relative to ``out``), each shown at the width it was drawn for."""
    doc.images(images, widths={caption: display_width(out / path) for caption, path in images.items()})


def _figure_anchor(model: str, task: str) -> str:
    return f"figures-{slug(model, task)}"


def _contents(
    models: List[str], pairs: List[Tuple[str, str]], effect: bool = False
) -> List[Tuple[str, str, List[Tuple[str, str]]]]:
    """The report's table of contents: each model's tables, the cross-model summary, the protocol effect,
    the notes, the figures of every (model, task), the studies."""
    entries: List[Tuple[str, str, List[Tuple[str, str]]]] = [
        ("Tables", f"model-{slug(models[0])}", [(model, f"model-{slug(model)}") for model in models]),
        ("Across models", "across-models", []),
    ]
    if effect:
        entries.append(("Protocol effect", "protocol-effect", []))
    entries.append(("Notes", "notes", []))
    if pairs:
        entries += [
            (
                f"Figures: {model}",
                _figure_anchor(*next(p for p in pairs if p[0] == model)),
                [(task, _figure_anchor(m, task)) for m, task in pairs if m == model],
            )
            for model in models
            if any(m == model for m, _ in pairs)
        ]
    return entries + [("Studies", "studies", [])]


def build_report(
    storage_url: str,
    out_dir: Union[str, os.PathLike] = "reports",
    *,
    figures: bool = True,
    show_progress: bool = True,
    force: bool = False,
) -> ReportResult:
    """Write the paper-style report of every ilge-search study in ``storage_url`` to ``out_dir``.

    Args:
        storage_url: an Optuna RDB URL (``sqlite:///studies/offline.db``, PostgreSQL, MySQL).
        out_dir: the report folder (created). A folder with files that no
            report wrote is refused unless ``force``.
        figures: draw the PNG figures (per-layer, history, importance) and compute importances.
        show_progress: a tqdm bar over (model, task) pairs while drawing.
        force: write into a non-empty folder that no report made (files of the
            same names are replaced; other files are kept).

    Returns:
        A :class:`ReportResult` with the tables as data frames and the written paths.

    Raises:
        ValueError: ``out_dir`` is a file or a foreign non-empty folder (without
            ``force``), the storage cannot be opened, or it holds no ilge-search study.
    """
    import pandas as pd

    records, duplicates, skipped = collect_records(storage_url)
    if not records:
        raise ValueError(
            f"no ilge-search studies in {hide_password(storage_url)}"
            + (f" ({len(skipped)} other studies skipped)" if skipped else "")
            + "; run `ilge-search run` or `ilge-search sweep` first"
        )
    skipped += [
        f"{r.name}: not in the tables, {r.model}/{r.task}/{r.encoder} is reported from a single-objective "
        "study; its Pareto front is under 'Pareto fronts'"
        if r.multi_objective
        else f"{r.name}: not shown, {r.model}/{r.task}/{r.encoder} is reported from another study "
        "(with final scores, more seeds or more trials)"
        for r in duplicates
    ]
    out, fig_dir = Path(out_dir), Path(out_dir) / "figures"
    previous = _check_out_dir(out, force)
    fig_dir.mkdir(parents=True, exist_ok=True)

    frame = results_frame(records)
    models = model_order(frame["model"])
    summary = summary_frame(frame)
    effect = protocol_effect_frame(frame)
    notes = closing_notes(frame, summary) + protocol_effect_notes(effect)
    # few-shot studies get their curves (below), not a set of figures each
    pairs = [
        (m, t) for m in models for t in sorted({r.task for r in records if r.model == m and not r.attrs.get("shots")})
    ]
    figure_paths, figure_notes, importance_rows = (
        draw_figures(records, pairs, fig_dir, show_progress) if figures else ({}, {}, [])
    )

    doc = Document()
    doc.heading(1, "ILGE results")
    doc.paragraph(intro(storage_url, len(records)), tex=True)
    doc.paragraph(published_note() if frame["published"].notna().any() else no_published_note())
    layer_notes = attribution_notes(records)  # from the attributions `ilge-search explain` stored
    layer_figures = draw_attribution_figures(records, fig_dir) if figures else {}
    contents = _contents(models, pairs if figures else [], effect=not effect.empty)
    if layer_notes:
        after_notes = next(i for i, entry in enumerate(contents) if entry[1] == "notes") + 1
        contents.insert(after_notes, ("Which layers carry the task", "layers", []))
    selection = selection_frame(records + duplicates)  # every study: they differ by training size and cv
    if not selection.empty:
        contents.insert(len(contents) - 1, ("Selection rules", "selection", []))
    every = records + duplicates
    fronts = pareto_pairs(every)  # only storages with multi-objective studies get this section
    front_figures = draw_pareto_figures(every, fig_dir) if figures and fronts else {}
    if fronts:
        contents.insert(len(contents) - 1, ("Pareto fronts", "pareto", []))
    fewshot, fewshot_skipped = fewshot_frame(every)  # curves differ by shots only
    if not fewshot.empty:
        contents.insert(len(contents) - 1, ("Few-shot curves", "few-shot", []))
    loto = stored_loto(storage_url)
    if loto.verdicts:
        contents.insert(len(contents) - 1, ("Defaults on tasks they never saw", "leave-one-task-out", []))
    doc.contents(contents)
    for model in models:
        doc.heading(2, model, anchor=f"model-{slug(model)}")
        for protocol in model_protocols(frame, model):
            header, score_rows, gain_rows = model_tables(frame, model, protocol)
            key = slug(model) + ("" if protocol == "matched" else "-paper")
            doc.table(
                header,
                score_rows,
                label=f"tab:{key}",
                text_columns=2,
                caption=f"{model}, {_PROTOCOL_CAPTIONS[protocol]}: test score, mean ± std over seeds (best "
                "of each row in bold).",
            )
            doc.table(
                ["task"] + [METHOD_LABELS[m] for m in METHODS[1:]],
                gain_rows,
                label=f"tab:{key}-gain",
                caption=f"{model}, {protocol} protocol: gain over the last layer (points).",
            )
        doc.paragraph(seed_note(frame, model))
    doc.heading(2, "Across models", anchor="across-models")
    doc.table(
        *summary_rows(summary),
        label="tab:summary",
        text_columns=2,
        caption="Across models: mean score, mean gain over the last layer, wins and mean rank.",
    )
    doc.paragraph(SUMMARY_NOTE)
    if not effect.empty:
        doc.heading(2, "Protocol effect", anchor="protocol-effect")
        doc.paragraph(PROTOCOL_EFFECT_NOTE)
        for model in model_order(effect["model"]):
            doc.heading(3, model)
            doc.table(
                *protocol_effect_rows(effect, model),
                label=f"tab:{slug(model)}-protocol",
                text_columns=2,
                caption=f"{model}: the last layer and Cayley under the matched and the paper protocol, and "
                "the differences (points).",
            )
    doc.heading(2, "Notes", anchor="notes")
    doc.bullets(notes)
    if layer_notes:
        doc.heading(2, "Which layers carry the task", anchor="layers")
        for model, sentences in layer_notes.items():
            doc.heading(3, model)
            shown = layer_figures.get(model, {})
            _show_images(doc, shown, out)
            doc.bullets(sentences)
    if figures:
        doc.heading(2, "Figures", anchor="figures")
        for model, task in pairs:
            doc.heading(3, f"{model} · {task}", anchor=_figure_anchor(model, task))
            shown = figure_paths[(model, task)]
            _show_images(doc, shown, out)
            doc.bullets(figure_notes[(model, task)])
    if not selection.empty:
        doc.heading(2, "Selection rules", anchor="selection")
        doc.paragraph(SELECTION_NOTE)
        header, rows = selection_rows(selection)
        doc.table(
            header,
            rows,
            label="tab:selection",
            text_columns=header.index("start"),
            caption="Test score of the trial each rule retrains (mean ± std over seeds; the better rule in "
            "bold), search gain and validation-to-test gap, in score units.",
        )
        doc.table(
            *selection_summary_rows(selection),
            label="tab:selection-summary",
            text_columns=3,
            caption="Selection rules per training size, with and without cross-validation, over the studies "
            "above that were evaluated under both rules.",
        )
    if fronts:
        doc.heading(2, "Pareto fronts: score vs size", anchor="pareto")
        doc.paragraph(PARETO_NOTE)
        for pair in fronts:
            shown = front_figures.get(pair, {})
            _show_images(doc, shown, out)
        doc.table(
            *pareto_rows(every),
            label="tab:pareto",
            text_columns=4,
            caption="Final fronts: each retrained Pareto-front trial (validation score of the trial; test "
            "mean ± std over the final seeds, in score units), and the layer baselines of the same "
            "model and task (in italics) for reference.",
        )
        doc.bullets(pareto_notes(every))
    fewshot_figures = draw_fewshot_figures(fewshot, fig_dir) if figures and not fewshot.empty else {}
    if not fewshot.empty:
        doc.heading(2, "Few-shot curves", anchor="few-shot")
        doc.paragraph(FEWSHOT_NOTE)
        doc.table(
            *fewshot_rows(fewshot),
            label="tab:few-shot",
            text_columns=4,
            caption="Test score by training examples per label, mean ± std over the final seeds (best encoder "
            "of each column in bold).",
        )
        doc.bullets(fewshot_notes(fewshot) + fewshot_skipped)
        for (model, task), path in fewshot_figures.items():
            _show_images(doc, {f"{model} · {task} few-shot": path}, out)
    if loto.verdicts:
        doc.heading(2, "Defaults on tasks they never saw", anchor="leave-one-task-out")
        doc.paragraph(LOTO_NOTE)
        doc.table(
            *loto_verdict_rows(loto),
            label="tab:loto-verdict",
            text_columns=2,
            caption="Regenerated minus built-in defaults over the left-out tasks (points).",
        )
        doc.bullets(loto_sentences(loto))
        doc.table(
            *loto_rows(loto),
            label="tab:loto",
            text_columns=4,
            caption="Each task left out in turn: test score of the built-in defaults and of the defaults "
            "regenerated without the task, both with no search (mean ± std over seeds).",
        )
    doc.heading(2, "Studies", anchor="studies")
    doc.table(*studies_rows(records))
    if skipped:
        doc.paragraph("Not reported:")
        doc.bullets(skipped)

    importances = pd.DataFrame(importance_rows, columns=["model", "task", "method", "study", "param", "importance"])
    files = {
        "markdown": out / "report.md",
        "latex": out / "report.tex",
        "html": out / "index.html",
        "csv": out / "results.csv",
        "summary_csv": out / "summary.csv",
        "importances_csv": out / "importances.csv",
    }
    texts = [
        ("markdown", doc.markdown()),
        ("latex", doc.latex()),
        ("html", doc.html_page("ILGE results")),
        ("csv", frame.to_csv(index=False)),
        ("summary_csv", summary.to_csv(index=False)),
        ("importances_csv", importances.to_csv(index=False)),
    ]
    if not effect.empty:
        files["protocol_effect_csv"] = out / "protocol_effect.csv"
        texts.append(("protocol_effect_csv", effect.to_csv(index=False)))
    for kind, text in texts:
        write_atomic(files[kind], text)
    figure_files = sorted(
        [
            p
            for paths in [*figure_paths.values(), *layer_figures.values(), *front_figures.values()]
            for p in paths.values()
        ]
        + list(fewshot_figures.values())
    )
    _finish_out_dir(out, {path.relative_to(out).as_posix() for path in files.values()} | set(figure_files), previous)
    logger.info("report of %d studies written to %s", len(records), out)
    return ReportResult(
        out_dir=out,
        results=frame,
        tables={m: pivot(frame, m, "mean") for m in models},
        gains={m: pivot(frame, m, "gain").drop(columns=["last-layer"]) for m in models},
        summary=summary,
        importances=importances,
        protocol_effect=effect,
        files=files,
        figures=figure_files,
        notes=notes,
        skipped=skipped,
        fewshot=fewshot,
        loto=loto,
    )
