"""``ilge-search export`` as one library call: a finished study's model written as an estimator folder.

:func:`export_study` checks the output folder before any work, picks the estimator the study's task
needs (``ILGETagger`` for a tagging study, else ``ILGEClassifier``, or its stored ensemble), saves it
with its model card, and returns the lines that say what was written and which seed was taken.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..embeddings.models import canonical_model_name
from ..files import check_output_folder, write_output_text
from ..record.fields import Attrs
from ..study.card import CARD_FILE, ExportedModel, is_model_card, model_card
from ..study.export import StudyExport, study_task_kind
from ..study.leaderboard import study_export_choice
from .classifier import ILGEClassifier, check_save_folder
from .tagger import ILGETagger, check_tagger_folder

if TYPE_CHECKING:
    from ..storage import Storage

__all__ = ["ExportOptionsError", "ExportRequest", "ExportResult", "check_card_path", "export_study", "seed_line"]

PathLike = str | os.PathLike


class ExportOptionsError(ValueError):
    """Options that do not go together for this study (the command line reports it as a usage error)."""


@dataclass(frozen=True)
class ExportRequest:
    """What to export and where; ``data_dir``/``cache_dir``/``device`` as the command line's settings give them."""

    study_name: str
    out_dir: str
    seed: int = 0
    retrain: bool = False
    trial_number: int | None = None  # any complete trial instead of the selected one
    artifact_dir: PathLike | None = None
    ensemble: bool = False
    force: bool = False
    task_path: PathLike | None = None
    data_dir: PathLike | None = None
    cache_dir: PathLike | None = None
    device: str = "auto"


@dataclass(frozen=True)
class ExportResult:
    """The saved estimator and what to tell: ``lines`` for the output, ``notes`` for the error stream."""

    estimator: ILGEClassifier | ILGETagger
    lines: list[str]
    notes: list[str] = field(default_factory=list)


def check_card_path(out_dir: str, *, force: bool) -> None:
    """Refuse, before any work, a README.md in ``out_dir`` that no export wrote (a card is replaced; a README
    someone wrote only with --force)."""

    card = Path(out_dir).expanduser() / CARD_FILE
    if force or not card.is_file():
        return
    try:
        ours = is_model_card(card.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        ours = False
    if not ours:
        raise ValueError(
            f"{card} exists and is not a model card an export wrote; pass another --out, or --force to replace it"
        )


def write_card(out_dir: str, estimator: ILGEClassifier | ILGETagger) -> None:
    """Write the export's model card (README.md with the Hugging Face metadata block) beside the weights."""

    tagging = isinstance(estimator, ILGETagger)
    model = ExportedModel(
        task_kind="tagging" if tagging else getattr(estimator, "task_kind_", "classification"),
        base_model=canonical_model_name(estimator.base_model or "") or str(estimator.base_model),
        labels=[str(label) for label in getattr(estimator, "classes_", [])],
        loader=type(estimator).__name__,
        provenance=estimator.provenance_,
    )
    write_output_text(Path(out_dir).expanduser() / CARD_FILE, model_card(model))


def seed_line(p: Attrs) -> str:
    """Which seed the export took and why, beside the test mean over the final seeds that the tables show."""
    line = f"seed {p['seed']}: {p.get('seed_rule') or 'as stored'}"
    if p.get("final_seeds"):
        line += f" among the final seeds {p['final_seeds']}"
    if p.get("test_mean") is not None:
        line += f"; the study's tables show the test mean over them, {p['test_mean']:.4f}"
    return line


def _estimator(storage: str | Storage | None, request: ExportRequest, tagging: bool) -> ILGEClassifier | ILGETagger:
    """The study's model as the estimator its task needs (the output folder already checked)."""
    export = StudyExport(
        seed=request.seed,
        retrain=request.retrain,
        artifact_dir=request.artifact_dir,
        data_dir=request.data_dir,
        device=request.device,
        cache_dir=request.cache_dir,
        trial=request.trial_number,
        task_path=request.task_path,
    )
    if request.ensemble:
        return ILGEClassifier.from_study_ensemble(
            storage,
            request.study_name,
            artifact_dir=request.artifact_dir,
            device=request.device,
            cache_dir=request.cache_dir,
        )
    model_class: type[ILGEClassifier] | type[ILGETagger] = ILGETagger if tagging else ILGEClassifier
    return model_class.from_study(storage, request.study_name, export=export)


def _summary(request: ExportRequest, estimator: ILGEClassifier | ILGETagger) -> ExportResult:
    """What an export says: the model written, its seed, and a note when the study's selection moved on."""
    p, out_dir = estimator.provenance_, request.out_dir
    if request.ensemble:
        members = ", ".join(f"trial {n} x{c}" for n, c in p["members"].items())
        test = "" if p.get("test_score") is None else f" (test {p['metric']} {p['test_score']:.4f})"
        head = (
            f"exported the ensemble of study {p['study']} to {out_dir}: {p.get('picks') or 'members'}: {members}, "
            f"seed {p['seed']}{test}"
        )
        return ExportResult(estimator, [head, seed_line(p)])
    test = "" if p.get("test_score") is None else f", test {p['test_score']:.4f}"
    head = (
        f"exported study {p['study']} to {out_dir}: {p['source']} model of trial {p['trial']}, seed {p['seed']} "
        f"(validation {p['metric']} {p['val_score']:.4f}{test}); base model {estimator.base_model}"
    )
    notes = []
    if p.get("selected_trial_now", p["trial"]) != p["trial"]:
        notes.append(
            f"note: the study's selected trial is now {p['selected_trial_now']}; rerun its final evaluation "
            "(`ilge-search run ... --n-trials 0`) or pass --retrain to export that one"
        )
    return ExportResult(estimator, [head, seed_line(p)], notes)


def _check_ensemble_request(request: ExportRequest, tagging: bool) -> None:
    """``--ensemble`` refused with the one cause that applies: a tagging study has no ensemble, and the
    stored ensemble is no retrained or chosen trial."""
    if not request.ensemble:
        return
    if tagging:
        raise ExportOptionsError(
            f"study {request.study_name!r} is a tagging study, and tagging studies have no ensemble; drop "
            "--ensemble to export its selected trial"
        )
    given = [flag for flag, on in (("--retrain", request.retrain), ("--trial", request.trial_number is not None)) if on]
    if given:
        raise ExportOptionsError(f"--ensemble exports the stored ensemble as it is; drop {' and '.join(given)}")


def export_study(storage: str | Storage | None, request: ExportRequest) -> ExportResult:
    """Write the study's model into ``request.out_dir`` with its model card; what to tell about it. An auto
    study with a leaderboard, asked for no particular model, gives the one its validation chose
    (:data:`~ilge_search.study.leaderboard.EXPORT_RULE`).

    Raises:
        ExportOptionsError: ``ensemble`` with a tagging study, ``retrain`` or ``trial``.
        ValueError: an output folder or card that may not be written (before the study is read).
    """

    check_output_folder(request.out_dir, force=request.force)  # before the study is read: a refused --out costs nothing
    check_card_path(request.out_dir, force=request.force)
    tagging = study_task_kind(storage, request.study_name) == "tagging"
    _check_ensemble_request(request, tagging)
    if tagging:
        check_tagger_folder(request.out_dir)
    else:
        check_save_folder(request.out_dir, overwrite=request.force)  # before any work: a refused --out costs nothing
    choice = (
        None
        if request.ensemble or request.retrain or request.trial_number is not None
        else (study_export_choice(storage, request.study_name))
    )
    if choice is not None and choice[0]:
        request = dataclasses.replace(request, ensemble=True)
    estimator = _estimator(storage, request, tagging)
    if isinstance(estimator, ILGETagger):
        estimator.save(request.out_dir)  # an ILGETagger replaces only its own earlier save
    else:
        estimator.save(request.out_dir, overwrite=request.force)
    write_card(request.out_dir, estimator)
    summary = _summary(request, estimator)
    return summary if choice is None else dataclasses.replace(summary, lines=[*summary.lines, choice[1]])
