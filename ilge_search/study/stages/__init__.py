"""Study stages: the pipeline after the search, as an ordered list of plug-ins.

Each stage (:class:`Stage`) says whether it applies to a study, what it costs (the time budget and the dry
run add it up, :class:`StageCosting`), whether its stored result is current and how it runs;
:func:`run_stages` goes through the registered ones in order, so the runner has no branch for any of them.
The built-in stages are the final evaluation (with a multi-objective study's final front), the ensemble
evaluation and an auto study's leaderboard; :func:`register_stage` adds one after any of them.
"""

from __future__ import annotations

from .base import Stage, StageContext, StagePart, StoredStudy, StudyFacts, StudyView
from .ensemble import EnsembleStage
from .final import FinalStage, has_final_scores_to_make
from .leaderboard import LeaderboardStage
from .registry import StageCosting, StageTimes, register_stage, registered_stages, run_stages, unregister_stage

__all__ = [
    "EnsembleStage",
    "FinalStage",
    "LeaderboardStage",
    "Stage",
    "StageContext",
    "StageCosting",
    "StagePart",
    "StageTimes",
    "StoredStudy",
    "StudyFacts",
    "StudyView",
    "has_final_scores_to_make",
    "register_stage",
    "registered_stages",
    "run_stages",
    "unregister_stage",
]

# the built-in stages, in the order the runner has always run them
register_stage(FinalStage())
register_stage(EnsembleStage(), after="final")
register_stage(LeaderboardStage(), after="ensemble")  # auto studies only
