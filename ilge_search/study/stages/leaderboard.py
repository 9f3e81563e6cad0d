"""The leaderboard as a stage, after the ensemble, for an auto study: :mod:`ilge_search.study.leaderboard` does
the work; models the final evaluation trained are not trained again."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ...record import leaderboard_record, save_leaderboard, study_record
from ..auto import is_auto
from ..budget import SAFETY, STAGE_OVERHEAD_SECONDS, TrialCosts
from ..leaderboard import (
    LeaderboardRun,
    format_rows,
    format_table,
    leaderboard_evaluation,
    leaderboard_is_current,
    never_made,
    row_cells,
)
from .base import Stage, StageContext, StagePart, StoredStudy, StudyFacts, StudyView
from .final import has_final_scores_to_make

__all__ = ["LeaderboardStage", "REPORT_TITLE", "leaderboard_run"]

logger = logging.getLogger(__name__)

REPORT_TITLE = "Auto studies: leaderboards"  # the report section of every auto study's leaderboard

# per-example predictions the paired intervals compare: texts, pairs, or a tagger's words
_KINDS = ("classification", "similarity", "tagging")


def leaderboard_run(context: StageContext) -> LeaderboardRun:
    options = context.options
    return LeaderboardRun(
        seeds=options.final_seed_list(),
        max_epochs=options.search.max_epochs,
        select=options.final.select,
        device=context.spec.device,
        artifact_store=context.storage.artifact_store(),
        progress=options.runtime.progress,
        reuse=context.trained,
    )


def _is_auto_study(study: StoredStudy) -> bool:
    identity = study_record(study).identity
    return identity is not None and is_auto(identity.encoder)


class LeaderboardStage(Stage):
    """One row per method, the selected trial and the ensembles, against the best single-layer probe."""

    name = "leaderboard"

    def applies(self, context: StudyView) -> bool:
        identity = context.record.identity
        return (
            identity is not None
            and is_auto(identity.encoder)
            and has_final_scores_to_make(context)
            and not identity.multi_objective
            and identity.protocol == "matched"
            and context.task_kind in _KINDS
        )

    def reserve_seconds(self, context: StudyFacts, trials: TrialCosts) -> float:
        """Each method's best trial (those earlier stages trained reused) and its own best-layer probe, each
        with every final seed."""
        seconds = trials.retrain(trials.method_bests, context.options.final.seeds, probe=True)
        return seconds * SAFETY + STAGE_OVERHEAD_SECONDS

    def skipped(self, context: StageContext) -> None:
        reason = never_made(study_record(context.study).identity)
        if _is_auto_study(context.study) and has_final_scores_to_make(context) and reason is not None:
            logger.warning(
                "%s: no leaderboard is made: %s; `ilge-search studies --storage %s` shows its final scores",
                context.name,
                reason,
                context.storage.shown_url,
            )

    def is_current(self, context: StageContext) -> bool:
        return leaderboard_is_current(context.study, leaderboard_run(context))

    def current_note(self, context: StageContext) -> str:
        return "the leaderboard is up to date"

    def run(self, context: StageContext) -> None:
        model = context.planned.identity.model
        save_leaderboard(
            context.study, leaderboard_evaluation(context.study, context.data, leaderboard_run(context), model)
        )

    def note_lines(self, study: StoredStudy, metric: str) -> list[str]:
        stored = leaderboard_record(study)
        if stored is None:
            return []
        return ["", "### Leaderboard", "", "```", format_table(stored), "```"]

    def report_part(self, studies: Sequence[StoredStudy]) -> StagePart | None:
        """One table over every auto study with a leaderboard: a row per study and leaderboard row."""
        rows: list[tuple[str, ...]] = []
        for study in studies:
            stored = leaderboard_record(study) if _is_auto_study(study) else None
            if stored is None:
                continue
            name = str(getattr(study, "study_name", ""))
            rows.extend((name, *row_cells(row)) for row in format_rows(stored))
        if not rows:
            return None
        return StagePart(
            title=REPORT_TITLE,
            paragraph="Each auto study's methods (their best trial), the selected trial and the ensembles (a "
            "tagging study has none), trained with the final seeds; differences are test minus the best "
            "single-layer probe with a 95 % paired bootstrap interval over the same test texts (a tagging "
            "study's: words) and seeds ('tie': the interval contains 0).",
            header=("study", "model", "val", "test mean ± std", "vs best layer [95% CI]", "train s", "ms/1k", "params"),
            rows=tuple(rows),
        )
