"""The results report's sections, each a small object :func:`~ilge_search.report.build.build_report` iterates.

A :class:`Section` has a ``title`` and an ``anchor``, says whether the storage holds what it shows
(:meth:`Section.applies`), draws its figures (:meth:`Section.draw`) and renders its part of the document
(:meth:`Section.render`) from a :class:`ReportData` computed once before any section runs.
:func:`report_sections` lists them in the report's order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from ..defaults.problems import open_existing_storage
from ..record import study_record
from ..study.auto import is_auto
from ..study.stages import registered_stages
from .attributions import draw_attribution_figures
from .data import ReportStudy, method_labels, methods
from .document import Cell, Document, slug
from .ensembles import ENSEMBLE_NOTE, draw_ensemble_figure, ensemble_frame, ensemble_rows, ensemble_sentences
from .fewshot import draw_fewshot_figures, fewshot_notes, fewshot_rows
from .figures import display_width, draw_figures
from .loto import loto_rows, loto_sentences, loto_verdict_rows
from .notes import SUMMARY_NOTE
from .pareto import PARETO_NOTE, draw_pareto_figures, pareto_notes, pareto_pairs, pareto_rows
from .portfolio import draw_matrix, portfolio_part
from .power import POWER_NOTE, power_lines
from .protocol_effect import PROTOCOL_EFFECT_NOTE, protocol_effect_rows
from .tables import (
    SELECTION_NOTE,
    model_order,
    model_protocols,
    model_tables,
    seed_note,
    selection_rows,
    selection_summary_rows,
    studies_rows,
    summary_rows,
)
from .tokens import TOKEN_NOTE, draw_token_figures, token_rows

if TYPE_CHECKING:
    import pandas as pd

    from ..defaults.loto import LotoResult
    from ..defaults.portfolio import PortfolioResult
    from ..study.stages import StagePart

__all__ = [
    "ContentsEntry",
    "ReportData",
    "FigureFolder",
    "Section",
    "auto_studies",
    "outside_the_tables",
    "report_sections",
]

ContentsEntry = tuple[str, str, list[tuple[str, str]]]  # (text, anchor, sub-links (text, anchor))

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
    "defaults are shipped only when the 95% bootstrap interval of their mean difference over the left-out rows "
    "lies above 0, measured in the setting that ships (the configuration's own epochs with early stopping)."
)


@dataclass
class ReportData:
    """What the report shows, computed once from the storage.

    ``records`` are the studies in the tables, ``every`` those and the duplicates not shown there (the
    selection, Pareto and few-shot sections compare studies that differ by data setting); the frames are
    those of :mod:`~ilge_search.report.tables`, :mod:`~ilge_search.report.protocol_effect` and
    :mod:`~ilge_search.report.fewshot`; ``layer_notes`` the sentences on the stored layer attributions, per
    model; ``loto`` the stored leave-one-task-out evaluation.
    """

    storage_url: str
    records: list[ReportStudy]
    every: list[ReportStudy]
    frame: pd.DataFrame
    models: list[str]
    summary: pd.DataFrame
    effect: pd.DataFrame
    notes: list[str]
    selection: pd.DataFrame
    fewshot: pd.DataFrame
    fewshot_skipped: list[str]
    layer_notes: dict[str, list[str]]
    loto: LotoResult
    skipped: list[str]
    tokens: pd.DataFrame | None = None  # the tagging studies' frame (report/tokens.py); never in ``frame``
    tagging: list[ReportStudy] = field(default_factory=list)  # the tagging studies, never in ``records``
    # the stored cross-task matrices (defaults/transfer.py)
    portfolios: list[PortfolioResult] = field(default_factory=list)
    portfolio_notes: list[str] = field(default_factory=list)  # matrices that could not be read back, and why
    # the storage's studies the tables leave out, as summaries (an auto study's method is no table column):
    # a registered stage's section may still show them
    outside: list[Any] = field(default_factory=list)

    @property
    def n_studies(self) -> int:
        """How many ilge-search studies the report covers: those of the tables, the tagging and the auto ones."""
        return len(self.records) + len(self.tagging) + len(auto_studies(self.outside))


@dataclass
class FigureFolder:
    """Where figures go and whether they are drawn (``draw``), with a progress bar or not."""

    out: Path
    draw: bool
    progress: bool

    @property
    def path(self) -> Path:
        return self.out / "figures"

    def show(self, doc: Document, images: Mapping[str, str]) -> None:
        """Images (caption -> path relative to the report folder), each shown at the width it was drawn for."""
        doc.images(images, widths={caption: display_width(self.out / path) for caption, path in images.items()})


@dataclass
class Section:
    """One part of the report: its contents line, whether it applies, its figures and its body."""

    title: str = ""
    anchor: str = ""
    figures: list[str] = field(default_factory=list)  # drawn PNGs, relative to the report folder

    def applies(self, data: ReportData, folder: FigureFolder) -> bool:
        return True

    def contents(self, data: ReportData) -> list[ContentsEntry]:
        return [(self.title, self.anchor, [])]

    def draw(self, data: ReportData, folder: FigureFolder) -> None:
        """Draw the section's figures into ``folder`` (called only when the report draws figures)."""

    def render(self, doc: Document, data: ReportData, folder: FigureFolder) -> None:
        raise NotImplementedError

    def start(self, doc: Document, note: str = "") -> None:
        """The section's heading (its contents anchor), then its note when it has one."""
        doc.heading(2, self.title, anchor=self.anchor)
        if note:
            doc.paragraph(note)


class ModelTables(Section):
    """Per model and protocol: the score table and the gain over the last layer."""

    def applies(self, data: ReportData, folder: FigureFolder) -> bool:
        return bool(data.models)

    def contents(self, data: ReportData) -> list[ContentsEntry]:
        links = [(model, f"model-{slug(model)}") for model in data.models]
        return [("Tables", f"model-{slug(data.models[0])}", links)]

    def render(self, doc: Document, data: ReportData, folder: FigureFolder) -> None:
        for model in data.models:
            doc.heading(2, model, anchor=f"model-{slug(model)}")
            for protocol in model_protocols(data.frame, model):
                header, score_rows, gain_rows = model_tables(data.frame, model, protocol)
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
                    ["task"] + [method_labels()[m] for m in methods()[1:]],
                    gain_rows,
                    label=f"tab:{key}-gain",
                    caption=f"{model}, {protocol} protocol: gain over the last layer (points).",
                )
            doc.paragraph(seed_note(data.frame, model))


class AcrossModels(Section):
    def applies(self, data: ReportData, folder: FigureFolder) -> bool:
        return bool(data.models)

    def render(self, doc: Document, data: ReportData, folder: FigureFolder) -> None:
        self.start(doc)
        doc.table(
            *summary_rows(data.summary),
            label="tab:summary",
            text_columns=2,
            caption="Across models: mean score, mean gain over the last layer, wins and mean rank.",
        )
        doc.paragraph(SUMMARY_NOTE)


class ProtocolEffect(Section):
    def applies(self, data: ReportData, folder: FigureFolder) -> bool:
        return not data.effect.empty

    def render(self, doc: Document, data: ReportData, folder: FigureFolder) -> None:
        self.start(doc, PROTOCOL_EFFECT_NOTE)
        for model in model_order(data.effect["model"]):
            doc.heading(3, model)
            doc.table(
                *protocol_effect_rows(data.effect, model),
                label=f"tab:{slug(model)}-protocol",
                text_columns=2,
                caption=f"{model}: the last layer and Cayley under the matched and the paper protocol, and "
                "the differences (points).",
            )


class Notes(Section):
    def applies(self, data: ReportData, folder: FigureFolder) -> bool:
        return bool(data.notes)

    def render(self, doc: Document, data: ReportData, folder: FigureFolder) -> None:
        self.start(doc)
        doc.bullets(data.notes)


@dataclass
class LayerAttributions(Section):
    """The layer attributions ``ilge-search explain`` stored: a heatmap and a sentence per model."""

    drawn: dict[str, dict[str, str]] = field(default_factory=dict)

    def applies(self, data: ReportData, folder: FigureFolder) -> bool:
        return bool(data.layer_notes)

    def draw(self, data: ReportData, folder: FigureFolder) -> None:
        self.drawn = draw_attribution_figures(data.records, folder.path)
        self.figures = [path for paths in self.drawn.values() for path in paths.values()]

    def render(self, doc: Document, data: ReportData, folder: FigureFolder) -> None:
        self.start(doc)
        for model, sentences in data.layer_notes.items():
            doc.heading(3, model)
            folder.show(doc, self.drawn.get(model, {}))
            doc.bullets(sentences)


def _figure_anchor(model: str, task: str) -> str:
    return f"figures-{slug(model, task)}"


@dataclass
class Figures(Section):
    """Per (model, task) of whole-data studies: the per-layer, history and importance figures."""

    paths: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    notes: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    importance_rows: list[dict[str, Any]] = field(default_factory=list)

    @staticmethod
    def pairs(data: ReportData) -> list[tuple[str, str]]:
        # few-shot studies get their curves, not a set of figures each
        return [
            (m, t)
            for m in data.models
            for t in sorted({r.task for r in data.records if r.model == m and not r.identity.shots})
        ]

    def applies(self, data: ReportData, folder: FigureFolder) -> bool:
        return folder.draw and bool(data.models)

    def contents(self, data: ReportData) -> list[ContentsEntry]:
        pairs = self.pairs(data)
        return [
            (
                f"Figures: {model}",
                _figure_anchor(*next(p for p in pairs if p[0] == model)),
                [(task, _figure_anchor(m, task)) for m, task in pairs if m == model],
            )
            for model in data.models
            if any(m == model for m, _ in pairs)
        ]

    def draw(self, data: ReportData, folder: FigureFolder) -> None:
        self.paths, self.notes, self.importance_rows = draw_figures(
            data.records, self.pairs(data), folder.path, folder.progress
        )
        self.figures = [path for paths in self.paths.values() for path in paths.values()]

    def render(self, doc: Document, data: ReportData, folder: FigureFolder) -> None:
        self.start(doc)
        for model, task in self.pairs(data):
            doc.heading(3, f"{model} · {task}", anchor=_figure_anchor(model, task))
            folder.show(doc, self.paths[(model, task)])
            doc.bullets(self.notes[(model, task)])


class SelectionRules(Section):
    def applies(self, data: ReportData, folder: FigureFolder) -> bool:
        return not data.selection.empty

    def render(self, doc: Document, data: ReportData, folder: FigureFolder) -> None:
        self.start(doc, SELECTION_NOTE)
        header, rows = selection_rows(data.selection)
        doc.table(
            header,
            rows,
            label="tab:selection",
            text_columns=header.index("start"),
            caption="Test score of the trial each rule retrains (mean ± std over seeds; the better rule in "
            "bold), search gain and validation-to-test gap, in score units.",
        )
        doc.table(
            *selection_summary_rows(data.selection),
            label="tab:selection-summary",
            text_columns=3,
            caption="Selection rules per training size, with and without cross-validation, over the studies "
            "above that were evaluated under both rules.",
        )


@dataclass
class ParetoFronts(Section):
    """Only for storages with multi-objective studies: score against size, search and final fronts."""

    drawn: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)

    def applies(self, data: ReportData, folder: FigureFolder) -> bool:
        return bool(pareto_pairs(data.every))

    def draw(self, data: ReportData, folder: FigureFolder) -> None:
        self.drawn = draw_pareto_figures(data.every, folder.path)
        self.figures = [path for paths in self.drawn.values() for path in paths.values()]

    def render(self, doc: Document, data: ReportData, folder: FigureFolder) -> None:
        doc.heading(2, "Pareto fronts: score vs size", anchor=self.anchor)
        doc.paragraph(PARETO_NOTE)
        for pair in pareto_pairs(data.every):
            folder.show(doc, self.drawn.get(pair, {}))
        doc.table(
            *pareto_rows(data.every),
            label="tab:pareto",
            text_columns=4,
            caption="Final fronts: each retrained Pareto-front trial (validation score of the trial; test "
            "mean ± std over the final seeds, in score units), and the layer baselines of the same "
            "model and task (in italics) for reference.",
        )
        doc.bullets(pareto_notes(data.every))


@dataclass
class FewShotCurves(Section):
    drawn: dict[tuple[str, str], str] = field(default_factory=dict)

    def applies(self, data: ReportData, folder: FigureFolder) -> bool:
        return not data.fewshot.empty

    def draw(self, data: ReportData, folder: FigureFolder) -> None:
        self.drawn = draw_fewshot_figures(data.fewshot, folder.path)
        self.figures = list(self.drawn.values())

    def render(self, doc: Document, data: ReportData, folder: FigureFolder) -> None:
        self.start(doc, FEWSHOT_NOTE)
        doc.table(
            *fewshot_rows(data.fewshot),
            label="tab:few-shot",
            text_columns=4,
            caption="Test score by training examples per label, mean ± std over the final seeds (best encoder "
            "of each column in bold).",
        )
        doc.bullets(fewshot_notes(data.fewshot) + data.fewshot_skipped)
        for (model, task), path in self.drawn.items():
            folder.show(doc, {f"{model} · {task} few-shot": path})


class Ensembles(Section):
    """The ensemble evaluations the studies stored (:mod:`~ilge_search.report.ensembles`): table and test vs K."""

    def applies(self, data: ReportData, folder: FigureFolder) -> bool:
        return not ensemble_frame(r.study for r in data.every).empty

    def draw(self, data: ReportData, folder: FigureFolder) -> None:
        path = folder.path / "ensembles-vs-k.png"
        if draw_ensemble_figure(ensemble_frame(r.study for r in data.every), path):
            self.figures = [f"{folder.path.name}/{path.name}"]

    def render(self, doc: Document, data: ReportData, folder: FigureFolder) -> None:
        frame = ensemble_frame(r.study for r in data.every)
        self.start(doc, ENSEMBLE_NOTE)
        header, rows = ensemble_rows(frame)
        doc.table(header, [[Cell(text) for text in row] for row in rows], label="tab:ensembles", text_columns=4)
        doc.bullets(ensemble_sentences(frame))
        if self.figures:
            folder.show(doc, {"ensemble minus selected trial against K": self.figures[0]})


@dataclass
class LeaveOneTaskOut(Section):
    """The leave-one-task-out evaluation ``ilge-search loto`` stored, and each cross-task matrix ``ilge-search
    portfolio`` stored with its left-out checks and heatmap; only what the storage holds."""

    drawn: dict[tuple[str, str], str] = field(default_factory=dict)  # (family, bucket) -> heatmap

    def applies(self, data: ReportData, folder: FigureFolder) -> bool:
        return bool(data.loto.verdicts or data.portfolios or data.portfolio_notes)

    def contents(self, data: ReportData) -> list[ContentsEntry]:
        keys = [(r.request.family, r.request.bucket) for r in data.portfolios]
        return [(self.title, self.anchor, [(f"{f} ({b}) matrix", f"portfolio-{slug(f, b)}") for f, b in keys])]

    def draw(self, data: ReportData, folder: FigureFolder) -> None:
        for result in data.portfolios:
            key = (result.request.family, result.request.bucket)
            path = draw_matrix(result, folder.path / f"portfolio-{slug(*key)}.png")
            self.drawn[key] = path.relative_to(folder.out).as_posix()
        self.figures = list(self.drawn.values())

    def render(self, doc: Document, data: ReportData, folder: FigureFolder) -> None:
        self.start(doc)
        if data.loto.verdicts:
            self._render_loto(doc, data)
        for result in data.portfolios:
            key = (result.request.family, result.request.bucket)
            image = {f"{key[0]} ({key[1]}): cross-task matrix": self.drawn[key]} if key in self.drawn else {}
            portfolio_part(doc, result, image, widths={c: display_width(folder.out / p) for c, p in image.items()})
        doc.bullets(data.portfolio_notes)

    @staticmethod
    def _render_loto(doc: Document, data: ReportData) -> None:
        doc.paragraph(LOTO_NOTE)
        doc.table(
            *loto_verdict_rows(data.loto),
            label="tab:loto-verdict",
            text_columns=2,
            caption="Regenerated minus built-in defaults over the left-out tasks (points).",
        )
        doc.bullets(loto_sentences(data.loto))
        doc.table(
            *loto_rows(data.loto),
            label="tab:loto",
            text_columns=4,
            caption="Each task left out in turn: test score of the built-in defaults and of the defaults "
            "regenerated without the task, both with no search (mean ± std over seeds).",
        )


@dataclass
class TokenTables(Section):
    """Tagging studies: per model, every method's token accuracy and macro-F1 on test, and a bar chart."""

    drawn: dict[str, str] = field(default_factory=dict)

    def applies(self, data: ReportData, folder: FigureFolder) -> bool:
        return data.tokens is not None and not data.tokens.empty

    def draw(self, data: ReportData, folder: FigureFolder) -> None:
        paths = draw_token_figures(data.tokens, folder.path)
        self.drawn = {model: path.relative_to(folder.out).as_posix() for model, path in paths.items()}
        self.figures = list(self.drawn.values())

    def render(self, doc: Document, data: ReportData, folder: FigureFolder) -> None:
        self.start(doc, TOKEN_NOTE)
        assert data.tokens is not None  # applies() checked it
        for model in model_order(data.tokens["model"]):
            doc.heading(3, model)
            header, rows = token_rows(data.tokens, model)
            doc.table(
                header,
                rows,
                label=f"tab:{slug(model)}-tokens",
                text_columns=3,
                caption=f"{model}: token accuracy and macro-F1 on test (%), mean ± std (seeds).",
            )
            if model in self.drawn:
                folder.show(doc, {f"{model}: token accuracy": self.drawn[model]})


def auto_studies(summaries: Sequence[Any]) -> list[str]:
    """The names of the auto studies among ``summaries`` (the tables leave them out; their leaderboards are a
    stage's section)."""

    identities = ((s.study_name, study_record(s).identity) for s in summaries)
    return [name for name, identity in identities if identity is not None and is_auto(identity.encoder)]


def outside_the_tables(storage_url: str, shown: Sequence[ReportStudy]) -> list[Any]:
    """The storage's studies other than ``shown`` (an auto study's method is no table column), as summaries:
    a stage's section may still show them."""

    names = {r.name for r in shown}
    summaries = optuna.get_all_study_summaries(open_existing_storage(storage_url).rdb, include_best_trial=False)
    return [summary for summary in summaries if summary.study_name not in names]


class StageParts(Section):
    """The sections registered study stages give the report (:meth:`~ilge_search.study.stages.Stage.report_part`),
    in the stages' order; the built-in stages have their own sections above."""

    def _parts(self, data: ReportData) -> list[StagePart]:

        studies = [r.study for r in data.every] + data.outside
        parts = (stage.report_part(studies) for stage in registered_stages())
        return [part for part in parts if part is not None]

    def applies(self, data: ReportData, folder: FigureFolder) -> bool:
        return bool(self._parts(data))

    def contents(self, data: ReportData) -> list[ContentsEntry]:
        return [(part.title, slug(part.title), []) for part in self._parts(data)]

    def render(self, doc: Document, data: ReportData, folder: FigureFolder) -> None:
        for part in self._parts(data):
            doc.heading(2, part.title, anchor=slug(part.title))
            if part.paragraph:
                doc.paragraph(part.paragraph)
            if part.header:
                doc.table(list(part.header), [[Cell(text) for text in row] for row in part.rows])
            doc.bullets(list(part.bullets))


class DetectableDifferences(Section):
    """Per task: the smallest difference 3 seeds at 400 test texts detect (:mod:`~ilge_search.report.power`)."""

    def applies(self, data: ReportData, folder: FigureFolder) -> bool:
        return bool(power_lines(data.frame))

    def render(self, doc: Document, data: ReportData, folder: FigureFolder) -> None:
        doc.heading(2, self.title, anchor=self.anchor)
        doc.paragraph(POWER_NOTE)
        doc.bullets(power_lines(data.frame))


class Studies(Section):
    def render(self, doc: Document, data: ReportData, folder: FigureFolder) -> None:
        self.start(doc)
        if data.records or data.tagging:  # a storage of auto studies only has none: they are listed below
            doc.table(*studies_rows(data.records + data.tagging))
        if data.skipped:
            doc.paragraph("Not reported:")
            doc.bullets(data.skipped)


def report_sections() -> list[Section]:
    """Every section, in the order of the report (new objects: sections keep what they drew)."""
    return [
        ModelTables(),
        AcrossModels("Across models", "across-models"),
        TokenTables("Tagging tasks", "tagging"),
        ProtocolEffect("Protocol effect", "protocol-effect"),
        Notes("Notes", "notes"),
        DetectableDifferences("How small a difference the tables can see", "power"),
        LayerAttributions("Which layers carry the task", "layers"),
        Figures("Figures", "figures"),
        SelectionRules("Selection rules", "selection"),
        ParetoFronts("Pareto fronts", "pareto"),
        FewShotCurves("Few-shot curves", "few-shot"),
        Ensembles("Ensembles of a study's trials", "ensembles"),
        LeaveOneTaskOut("Defaults on tasks they never saw", "leave-one-task-out"),
        StageParts(),
        Studies("Studies", "studies"),
    ]
