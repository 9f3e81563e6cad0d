"""The auto measurement: per problem, the model an auto study chose (its export) against the best single-layer
probe, paired over the same test texts (a tagging study's: words) and seeds (from its leaderboard), and against
the per-method studies of the same model, task and data setting in other storages: the last layer, Cayley (per
word for tagging) and Cayley's ensemble, and the best per-method study. One section per grid file the
measurement ran (``studies/auto*.toml``), then where each study's time went and how runs under a time limit
kept it (:mod:`.auto_times`). :func:`write_auto_page` (``reports/auto.sh``) writes ``OUT_STEM.md``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from ..encoders import encoder_specs
from ..files import check_output_path, write_output_text
from ..record import ensemble_record, leaderboard_record, study_record
from ..storage import open_storage
from ..study.auto import is_auto
from ..study.identity import identity_name
from ..study.leaderboard import export_choice, no_interval
from ..study.options import DEFAULT_ENSEMBLE
from ..study.statistics import compare_problems, seeds_interval
from ..tasks.scores import score_unit
from .auto_times import grid_description, time_section, timed_section
from .document import Cell, Document
from .tables import fmt

if TYPE_CHECKING:
    import optuna
    import pandas as pd

__all__ = ["AUTO_COLUMNS", "AutoPage", "auto_frame", "auto_sentences", "write_auto_page"]

AUTO_COLUMNS = (
    "study",
    "kind",
    "model",
    "task",
    "setting",
    "chosen",
    "auto",
    "best_layer",
    "vs_best_layer",
    "ci_low",
    "ci_high",
    "verdict",
    "last_layer",
    "last_layer_from_auto",
    "cayley",
    "cayley_word",
    "cayley_ensemble",
    "cayley_ensemble_k",
    "vs_cayley_ensemble",
    "cayley_ci_low",
    "cayley_ci_high",
    "cayley_verdict",
    "best_study",
    "best_study_encoder",
    "studied",
    "trials",
)


@dataclass(frozen=True)
class _Reference:
    """A per-method study's final test scores (one per seed) and its ensemble's of ``ensemble_k`` picks."""

    seeds: list[int]
    test_scores: list[float]
    ensemble_k: int | None = None
    ensemble_seeds: list[int] = dataclasses.field(default_factory=list)
    ensemble_scores: list[float] = dataclasses.field(default_factory=list)

    @property
    def test_mean(self) -> float:
        return sum(self.test_scores) / len(self.test_scores) if self.test_scores else math.nan

    @property
    def ensemble_mean(self) -> float:
        return sum(self.ensemble_scores) / len(self.ensemble_scores) if self.ensemble_scores else math.nan


def _reference_of(summary: Any) -> _Reference | None:
    """A study's final scores and its ensemble of the default size where evaluated (else of the size it asked
    for): the size an auto study's ensemble has, so the two ensembles compare like for like."""

    final = study_record(summary).final
    if final is None or not final.test_scores:
        return None
    stored = ensemble_record(summary)
    size = None
    if stored is not None:
        size = stored.sizes.get(str(DEFAULT_ENSEMBLE)) or stored.ensemble
    return _Reference(
        seeds=list(final.seeds),
        test_scores=list(final.test_scores),
        ensemble_k=None if size is None else size.size,
        ensemble_seeds=[] if stored is None else list(stored.seeds),
        ensemble_scores=[] if size is None else list(size.test_scores),
    )


def _references(urls: Sequence[str]) -> dict[str, _Reference]:
    """Per-method studies by the name their identity gives (``model:task:encoder:setting``, as a run names a
    study of a registered task; a custom task's study name also holds its content's hash, which the identity
    does not); the first storage holding a name with an ensemble wins its ensemble, the first with final
    scores its scores."""

    out: dict[str, _Reference] = {}
    for url in urls:
        for summary in open_storage(url, must_exist=True).study_summaries():
            found, identity = _reference_of(summary), study_record(summary).identity
            if found is None:
                continue
            name = summary.study_name if identity is None else identity_name(identity)
            known = out.get(name)
            if known is None:
                out[name] = found
            elif not known.ensemble_scores and found.ensemble_scores:
                out[name] = dataclasses.replace(
                    known,
                    ensemble_k=found.ensemble_k,
                    ensemble_seeds=found.ensemble_seeds,
                    ensemble_scores=found.ensemble_scores,
                )
    return out


def _versus_ensemble(chosen: Any, seeds: list[int], reference: _Reference | None, scale: float) -> dict[str, Any]:
    """The chosen model minus Cayley's ensemble, per seed paired (a t interval over the seeds both scored)."""
    empty = {"vs_cayley_ensemble": math.nan, "cayley_ci_low": math.nan, "cayley_ci_high": math.nan}
    if reference is None or not reference.ensemble_scores:
        return {**empty, "cayley_verdict": ""}
    theirs = dict(zip(reference.ensemble_seeds, reference.ensemble_scores, strict=False))
    pairs = [(mine, theirs[seed]) for seed, mine in zip(seeds, chosen.test_scores, strict=False) if seed in theirs]
    if not pairs:
        return {**empty, "cayley_verdict": ""}
    interval = seeds_interval([(a - b) * scale for a, b in pairs])
    return {
        "vs_cayley_ensemble": interval.estimate,
        "cayley_ci_low": interval.low,
        "cayley_ci_high": interval.high,
        "cayley_verdict": interval.verdict,
    }


def _methods(identity: Any, references: dict[str, _Reference]) -> dict[str, _Reference | None]:
    """Each method's per-method study of the same problem and data setting, by the name a run gives it."""

    return {
        method: references.get(identity_name(dataclasses.replace(identity, encoder=method, methods=None)))
        for method in (spec.name for spec in sorted(encoder_specs(), key=lambda spec: spec.role == "ilge"))
    }


def _chosen(study: optuna.Study) -> tuple[Any, Any, Any, bool] | None:
    """An auto study's identity, leaderboard, the row of the model it exports and whether that is the ensemble
    (``None``: not an auto study, or no leaderboard yet)."""

    identity, board = study_record(study).identity, leaderboard_record(study)
    choice = export_choice(study)
    if identity is None or not is_auto(identity.encoder) or board is None or choice is None:
        return None
    chosen = board.row("ensemble" if choice[0] else "selected")
    return None if chosen is None else (identity, board, chosen, choice[0])


def _auto_row(study: optuna.Study, references: dict[str, _Reference]) -> dict[str, object] | None:
    """One auto study's row (``None``: it has no leaderboard yet)."""

    found = _chosen(study)
    if found is None:
        return None
    identity, board, chosen, ensemble = found
    reference = board.row("best single layer") or next(r for r in board.rows if r.kind == "reference")
    scale = score_unit(board.metric)[0]
    methods = _methods(identity, references)
    means = {m: r.test_mean * scale for m, r in methods.items() if r is not None}
    best = max(means, key=means.__getitem__) if means else ""
    own_last = next((r for r in board.rows if r.kind == "method" and r.name == "last-layer"), None)
    last = means.get("last-layer", math.nan)
    low, high = (math.nan, math.nan) if chosen.difference is None else chosen.difference[1:]
    return {
        "study": study.study_name,
        "kind": "tagging" if identity.word_pooling is not None else "sentence",
        "model": identity.model,
        "task": identity.task,
        "setting": f"train{identity.max_train}",
        "chosen": "ensemble" if ensemble else chosen.name,
        "auto": chosen.test_mean * scale,
        "best_layer": reference.test_mean * scale,
        "vs_best_layer": (chosen.test_mean - reference.test_mean) * scale,
        "ci_low": low * scale,
        "ci_high": high * scale,
        "verdict": no_interval(board) or chosen.verdict or "tie",
        "last_layer": own_last.test_mean * scale if math.isnan(last) and own_last is not None else last,
        "last_layer_from_auto": math.isnan(last) and own_last is not None,
        "cayley": means.get("cayley", math.nan),
        "cayley_word": means.get("cayley-word", math.nan),
        "cayley_ensemble": methods["cayley"].ensemble_mean * scale if methods["cayley"] else math.nan,
        "cayley_ensemble_k": methods["cayley"].ensemble_k if methods["cayley"] else None,
        **_versus_ensemble(chosen, list(board.seeds), methods["cayley"], scale),
        "best_study": means.get(best, math.nan),
        "best_study_encoder": best,
        "studied": ",".join(sorted(means)),
        "trials": len(study.trials),
    }


def auto_frame(auto_url: str, reference_urls: Sequence[str]) -> pd.DataFrame:
    """One row per auto study of ``auto_url`` with a leaderboard (:data:`AUTO_COLUMNS`, scores in points)."""

    references = _references(reference_urls)
    storage = open_storage(auto_url, must_exist=True)
    rows = []
    for summary in storage.study_summaries():
        row = _auto_row(storage.existing_study(summary.study_name), references)
        if row is not None:
            rows.append(row)
    frame = pd.DataFrame(rows, columns=list(AUTO_COLUMNS))
    return frame.sort_values(["kind", "setting", "model", "task"], ignore_index=True)


def auto_sentences(frame: pd.DataFrame) -> list[str]:
    """The measurement's verdicts over ``frame``'s problems: auto against the best single layer, its wins per
    problem, against Cayley's ensemble where stored, and against the best per-method study."""
    if frame.empty:
        return []
    counts = frame["verdict"].value_counts().to_dict()
    unit = "words" if (frame["kind"] == "tagging").all() else "texts"
    lines = [
        f"Auto minus the best single-layer probe, {_over_problems(frame['vs_best_layer'].tolist())}; per problem, "
        f"paired over test {unit} and seeds: {counts.get('win', 0)} win, {counts.get('tie', 0)} tie, "
        f"{counts.get('loss', 0)} loss; "
        f"ahead on {int((frame['vs_best_layer'] > 0).sum())} of {len(frame)}.",
    ]
    versus = frame.dropna(subset=["vs_cayley_ensemble"])
    if not versus.empty:
        verdicts = versus["cayley_verdict"].value_counts().to_dict()
        sizes = sorted({int(k) for k in versus["cayley_ensemble_k"].dropna()})
        lines.append(
            f"Auto minus Cayley's ensemble (K = {', '.join(map(str, sizes))}, the Cayley-only search's trials), "
            f"{_over_problems(versus['vs_cayley_ensemble'].tolist())}; per problem, t interval over the paired "
            f"seeds: {verdicts.get('win', 0)} win, {verdicts.get('tie', 0)} tie, {verdicts.get('loss', 0)} loss."
        )
    lines += _best_study_sentences(frame)
    return lines


def _best_study_sentences(frame: pd.DataFrame) -> list[str]:
    behind = (frame["auto"] - frame["best_study"]).dropna()
    if behind.empty:
        return []
    worst = behind.idxmin()
    studied = sorted({name for names in frame.loc[behind.index, "studied"] for name in str(names).split(",")})
    return [
        f"Against the best per-method study of the same problem (among {', '.join(studied)}), "
        f"{_over_problems(behind.tolist())}, at worst "
        f"{behind.min():+.2f} ({frame.at[worst, 'model']} {frame.at[worst, 'task']}, "
        f"{frame.at[worst, 'best_study_encoder']}); more than 1 point behind on {int((behind < -1).sum())} of "
        f"{len(behind)}."
    ]


def _over_problems(differences: list[float]) -> str:
    """A mean difference over problems with its bootstrap interval; one problem has no interval over problems
    (its own, over test examples and seeds, is in its row)."""
    if len(differences) == 1:
        return f"on its one problem: {differences[0]:+.2f} points (no interval over problems; the row has its own)"
    over = compare_problems(differences)
    return f"mean over {len(differences)} problems: {over.interval.text()} points (bootstrap over problems)"


def _difference(value: float, low: float, high: float, verdict: str) -> str:
    if math.isnan(value):
        return fmt(None)
    if math.isnan(low):  # too few test examples for an interval: the verdict says so
        return f"{value:+.2f} ({verdict})"
    return f"{value:+.2f} [{low:+.2f}, {high:+.2f}] {verdict}"


def _cells(row: Any, tagging: bool) -> list[str]:
    last = fmt(row.last_layer) + ("†" if row.last_layer_from_auto else "")
    best = f"{fmt(row.best_study)} ({row.best_study_encoder})" if row.best_study_encoder else fmt(None)
    first = [row.model, row.task, row.setting, row.chosen, fmt(row.auto), fmt(row.best_layer)]
    first.append(_difference(row.vs_best_layer, row.ci_low, row.ci_high, row.verdict))
    if tagging:
        return [*first, last, fmt(row.cayley_word), best]
    versus = _difference(row.vs_cayley_ensemble, row.cayley_ci_low, row.cayley_ci_high, row.cayley_verdict)
    return [*first, last, fmt(row.cayley), fmt(row.cayley_ensemble), versus, best]


_HEADER = ["model", "task", "setting", "chosen", "auto", "best layer", "auto - best layer [95% CI]", "last layer"]
_SENTENCE_HEADER = [*_HEADER, "cayley", "cayley ens.", "auto - cayley ens. [95% CI, seeds]", "best study"]
_TAGGING_HEADER = [*_HEADER, "cayley-word", "best study"]


@dataclass(frozen=True)
class AutoPage:
    """What the page is made from: the auto storage, the per-method storages, the grid files whose studies make
    its sections (none: one section of every auto study) and the storage of the runs under a time limit."""

    auto_url: str
    reference_urls: Sequence[str]
    grids: Sequence[Path] = ()
    timed_url: str | None = None


def _sections(frame: pd.DataFrame, grids: Sequence[Path]) -> list[tuple[str, str, pd.DataFrame]]:
    """(title, paragraph, rows) per grid file, in order; rows no grid holds go last."""

    if not grids:
        return [("Problems", "", frame)]
    out, taken = [], set()
    for path in grids:
        title, paragraph, names = grid_description(path)
        rows = frame[frame["study"].isin(names)]
        taken |= set(names)
        out.append((title, paragraph, rows))
    rest = frame[~frame["study"].isin(taken)]
    if not rest.empty:
        out.append(("Other auto studies", "Auto studies of the storage that no grid above holds.", rest))
    return out


def _write_section(doc: Document, title: str, paragraph: str, rows: pd.DataFrame) -> None:
    doc.heading(2, title)
    if paragraph:
        doc.paragraph(paragraph)
    if rows.empty:
        doc.paragraph("Not measured yet: no study of this grid has a leaderboard in the storage (`reports/auto.sh`).")
        return
    tagging = bool((rows["kind"] == "tagging").all())
    header = _TAGGING_HEADER if tagging else _SENTENCE_HEADER
    doc.table(header, [[Cell(text) for text in _cells(row, tagging)] for row in rows.itertuples()])
    notes = auto_sentences(rows)
    if rows["last_layer_from_auto"].any():
        notes.append(
            "†: no per-method last-layer study of this problem is stored; the auto study's own best last-layer "
            "trial, retrained with the same seeds (its leaderboard row)."
        )
    doc.bullets(notes)


def write_auto_page(page: AutoPage, stem: Path, *, force: bool = False) -> Path:
    """Write ``stem.md``: per grid the measurement table and its sentences, then where the time went and the
    runs under a time limit, under the output rule."""

    path = check_output_path(stem.parent / f"{stem.name}.md", force=force, option="stem")
    frame = auto_frame(page.auto_url, page.reference_urls)
    doc = Document()
    doc.heading(1, "Auto against the single-method studies")
    doc.paragraph(
        f"Auto studies of `{page.auto_url}` (one search over every method, the model its validation chose), "
        "against the best single-layer probe retrained on the same seeds (paired bootstrap over test texts, or "
        "words, and seeds, 95 %), and the per-method studies of "
        f"{', '.join(f'`{u}`' for u in page.reference_urls)} at the same data setting (test mean over their final "
        "seeds; the first of these storages that holds a study gives its scores, and the first that holds its "
        "ensemble the ensemble, so a Cayley score and its ensemble may come from two searches of one problem). "
        "Cayley's ensemble: its search's trials, of the default size K = 5 where evaluated, compared per "
        "seed (t interval over the seeds both scored). Points: accuracy %, token accuracy % or Spearman x 100; "
        "matched protocol, test." + ("" if page.timed_url is None else f" Runs under a time limit: `{page.timed_url}`.")
    )
    for title, paragraph, rows in _sections(frame, page.grids):
        _write_section(doc, title, paragraph, rows)
    time_section(doc, page.auto_url)
    if page.timed_url is not None:
        timed_section(doc, page.timed_url)
    return write_output_text(path, doc.markdown())
