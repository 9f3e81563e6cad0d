"""The ensemble evaluation as a stage (``--ensemble K``, by default where the study can have one):
:mod:`.ensemble_work` does the work; members an earlier stage trained are not trained again, and
the models it trains join the context's for the stages after it."""

from __future__ import annotations

import logging

from ...record import ensemble_record
from ..budget import SAFETY, TrialCosts
from ..notes import ensemble_note_lines
from .base import Stage, StageContext, StoredStudy, StudyFacts, StudyView
from .ensemble_work import EnsembleRun, ensemble_evaluation, ensemble_is_current, sized_ensemble
from .final import has_final_scores_to_make, is_unchanged_and_current

__all__ = ["EnsembleStage"]

logger = logging.getLogger(__name__)


def ensemble_run(context: StageContext, size: int) -> EnsembleRun:
    """The ensemble evaluation of ``size`` this run makes on the context's study."""
    options = context.options
    return EnsembleRun(
        size=size,
        seeds=options.final_seed_list(),
        max_epochs=options.search.max_epochs,
        select=options.final.select,
        prediction_seed=options.search.seed or 0,
        device=context.spec.device,
        artifact_store=context.storage.artifact_store(),
        progress=options.runtime.progress,
        reuse=context.trained,
    )


def ensemble_size(context: StudyView) -> tuple[int, str | None]:
    """The ensemble size this run makes for the study, with the note the run logs (:func:`sized_ensemble`)."""
    return sized_ensemble(context.record, context.complete, context.options.final.ensemble)


class EnsembleStage(Stage):
    """The ensemble evaluation, after the final one."""

    name = "ensemble"

    def applies(self, context: StudyView) -> bool:
        return has_final_scores_to_make(context) and bool(ensemble_size(context)[0])

    def skipped(self, context: StageContext) -> None:
        note = ensemble_size(context)[1] if has_final_scores_to_make(context) else None
        if note:
            logger.warning("%s: %s", context.name, note)

    def reserve_seconds(self, context: StudyFacts, trials: TrialCosts) -> float:
        """Up to K members (those the final evaluation trained reused) and the best-layer probe, each with
        every final seed."""
        if is_unchanged_and_current(context):
            return 0.0
        members = trials.ranked[: ensemble_size(context)[0]]
        return trials.retrain(members, context.options.final.seeds, probe=True) * SAFETY

    def _size(self, context: StageContext) -> int:
        return ensemble_size(context)[0]

    def is_current(self, context: StageContext) -> bool:
        note = ensemble_size(context)[1]
        if note:  # logged here, once a run, as the stage runs or is found current
            logger.warning("%s: %s", context.name, note)
        return ensemble_is_current(context.study, ensemble_run(context, self._size(context)))

    def current_note(self, context: StageContext) -> str:
        return f"the ensemble of {self._size(context)} is up to date"

    def run(self, context: StageContext) -> None:
        run = ensemble_run(context, self._size(context))
        ensemble_evaluation(context.study, context.data, run, keep=context.trained)

    column_names = ("ensemble_k", "ensemble_test_mean")

    def columns(self, study: StoredStudy) -> dict[str, object]:
        """The size asked for and the ensemble's test mean (none: ``None``)."""
        stored = ensemble_record(study)
        ensemble = None if stored is None else stored.ensemble
        return {
            "ensemble_k": None if stored is None else stored.size,
            "ensemble_test_mean": None if ensemble is None else ensemble.test_mean,
        }

    def note_lines(self, study: StoredStudy, metric: str) -> list[str]:
        return ensemble_note_lines(ensemble_record(study), metric)
