"""The ensemble evaluation as a stage (``--ensemble K``, by default where the study can have one):
:mod:`ilge_search.study.ensemble` does the work; members an earlier stage trained are not trained again, and
the models it trains join the context's for the stages after it."""

from __future__ import annotations

import logging

from ...record import ensemble_record
from ..ensemble import EnsembleRun, ensemble_evaluation, ensemble_is_current, ensemble_size
from ..notes import ensemble_note_lines
from .base import Stage, StageContext, StoredStudy
from .final import has_final_scores_to_make

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


class EnsembleStage(Stage):
    """The ensemble evaluation, after the final one."""

    name = "ensemble"

    def applies(self, context: StageContext) -> bool:
        if not has_final_scores_to_make(context):
            return False
        size, note = ensemble_size(context.study, context.options.final.ensemble)
        if note:
            logger.warning("%s: %s", context.name, note)
        return bool(size)

    def _size(self, context: StageContext) -> int:
        return ensemble_size(context.study, context.options.final.ensemble)[0]

    def is_current(self, context: StageContext) -> bool:
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
