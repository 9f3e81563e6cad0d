"""The final evaluation as a stage: the selected trial (or a multi-objective study's final front) retrained
with the final seeds and scored on test once (:mod:`ilge_search.study.final` does the work)."""

from __future__ import annotations

import logging

from ...record import study_record
from ..budget import SAFETY, STAGE_OVERHEAD_SECONDS, TrialCosts
from ..final import FinalSettings, final_evaluation, final_is_current
from .base import Stage, StageContext, StudyFacts, StudyView

__all__ = ["FinalStage", "has_final_scores_to_make", "is_unchanged_and_current"]

logger = logging.getLogger(__name__)


def has_final_scores_to_make(context: StudyView) -> bool:
    """Whether the run asks for final seeds and the study has a complete trial to retrain: every stage that
    builds on the final evaluation needs both."""
    return context.options.final.seeds > 0 and context.complete > 0


def is_unchanged_and_current(context: StudyFacts) -> bool:
    """Whether the dry run adds no trial to a study whose final evaluation is current (the stages built on it
    are then taken as current too)."""
    options = context.options
    study = context.unchanged
    return study is not None and final_is_current(
        study, options.final_seed_list(), options.search.max_epochs, options.final.select, options.final.front
    )


class FinalStage(Stage):
    """The final evaluation (with a Pareto front's final front for a multi-objective study)."""

    name = "final"

    def applies(self, context: StudyView) -> bool:
        return has_final_scores_to_make(context)

    def reserve_seconds(self, context: StudyFacts, trials: TrialCosts) -> float:
        """The selected trial (a multi-objective study: up to ``--final-front`` trials besides the start) and
        the start, each with every final seed."""
        if is_unchanged_and_current(context):
            return 0.0
        options = context.options
        selected = trials.ranked[:1]
        if options.search.multi_objective:
            selected = [number for number in trials.ranked if number != trials.start][: options.final.front]
        seconds = trials.retrain([*selected, trials.start], options.final.seeds)
        return seconds * SAFETY + STAGE_OVERHEAD_SECONDS

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
