"""The final evaluation as a stage: the selected trial (or a multi-objective study's final front) retrained
with the final seeds and scored on test once (:mod:`ilge_search.study.final` does the work)."""

from __future__ import annotations

import logging

from ...record import study_record
from ...storage import count_trials
from ..final import FinalSettings, final_evaluation, final_is_current
from .base import Stage, StageContext

__all__ = ["FinalStage", "has_final_scores_to_make"]

logger = logging.getLogger(__name__)


def has_final_scores_to_make(context: StageContext) -> bool:
    """Whether the run asks for final seeds and the study has a complete trial to retrain: every stage that
    builds on the final evaluation needs both."""
    return context.options.final.seeds > 0 and bool(count_trials(context.study, ("COMPLETE",)))


class FinalStage(Stage):
    """The final evaluation (with a Pareto front's final front for a multi-objective study)."""

    name = "final"

    def applies(self, context: StageContext) -> bool:
        return has_final_scores_to_make(context)

    def skipped(self, context: StageContext) -> None:
        if context.options.final.seeds > 0:
            logger.warning("%s: no complete trial yet, so no final evaluation", context.name)

    def is_current(self, context: StageContext) -> bool:
        options = context.options
        return final_is_current(
            context.study,
            options.final_seed_list(),
            options.search.max_epochs,
            options.final.select,
            options.final.front,
        )

    def current_note(self, context: StageContext) -> str:
        final = study_record(context.study).final
        front = [] if final is None else final.front
        if front:
            trials = ", ".join(str(member.trial) for member in front)
            return f"final scores of the {len(front)} front trials ({trials}) are up to date"
        trial = -1 if final is None else final.trial
        return f"final scores of trial {trial} ({context.options.final.select}) are up to date"

    def run(self, context: StageContext) -> None:
        options = context.options
        settings = FinalSettings(
            encoder=context.planned.encoder,
            seeds=options.final_seed_list(),
            device=context.spec.device,
            max_epochs=options.search.max_epochs,
            select=options.final.select,
            front=options.final.front,
            progress=options.runtime.progress,
        )
        trained = final_evaluation(
            context.study,
            context.data,
            settings,
            artifact_store=context.storage.artifact_store(),
            zero_shot=context.zero_shot,
        )
        context.trained.update(trained)
