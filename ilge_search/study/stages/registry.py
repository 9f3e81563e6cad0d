"""The ordered list of study stages the runner goes through after the search."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field

from ..budget import StageCost, TrialCosts
from .base import Stage, StageContext, StudyFacts

__all__ = ["StageCosting", "StageTimes", "register_stage", "registered_stages", "run_stages", "unregister_stage"]

logger = logging.getLogger(__name__)

_STAGES: list[Stage] = []


def register_stage(stage: Stage, *, after: str | None = None) -> Stage:
    """Add ``stage`` to the pipeline: right after the stage named ``after``, else at the end.

    A stage whose name is taken is refused: two stages would store over each other's results.
    Returns ``stage``, so that a module can register it where it defines it.
    """
    if not stage.name:
        raise ValueError(f"a stage needs a name: {type(stage).__name__}.name is empty")
    names = [known.name for known in _STAGES]
    if stage.name in names:
        raise ValueError(f"a stage named {stage.name!r} is registered already")
    if after is None:
        _STAGES.append(stage)
    elif after in names:
        _STAGES.insert(names.index(after) + 1, stage)
    else:
        raise ValueError(f"no stage named {after!r} to register {stage.name!r} after; registered: {names}")
    return stage


def unregister_stage(name: str) -> Stage:
    """Remove the stage named ``name`` (a test's toy stage, when the test ends) and return it."""
    for index, stage in enumerate(_STAGES):
        if stage.name == name:
            return _STAGES.pop(index)
    raise ValueError(f"no stage named {name!r} is registered")


def registered_stages() -> list[Stage]:
    """The stages in the order the runner goes through them (a copy)."""
    return list(_STAGES)


@dataclass(frozen=True)
class StageTimes:
    """What :func:`run_stages` did on one study: the wall-clock seconds of each stage that ran, in order, and
    the stages whose stored result was current."""

    ran: dict[str, float] = field(default_factory=dict)
    current: list[str] = field(default_factory=list)


def run_stages(context: StageContext) -> StageTimes:
    """Go through every registered stage on one study: skip those that do not apply or are current, run the
    others, in order; how long each took."""
    times = StageTimes()
    for stage in registered_stages():
        if not stage.applies(context):
            stage.skipped(context)
        elif stage.is_current(context):
            logger.info("%s: %s", context.name, stage.current_note(context))
            times.current.append(stage.name)
        else:
            started = time.perf_counter()
            stage.run(context)
            times.ran[stage.name] = time.perf_counter() - started
    return times


@dataclass(frozen=True)
class StageCosting:
    """The stages after the search (by default the registered ones) costed on one study, as the time budget
    and the dry run ask (picklable: the budget goes to every worker process)."""

    facts: StudyFacts
    stages: tuple[Stage, ...] = field(default_factory=lambda: tuple(_STAGES))

    def __call__(self, complete: int, trials: TrialCosts) -> list[StageCost]:
        """Each stage that applies to the study with ``complete`` trials: its :meth:`Stage.reserve_seconds`, in
        order, with the retrainings it counted."""
        facts = dataclasses.replace(self.facts, complete=complete)
        costs = []
        for stage in self.stages:
            if stage.applies(facts):
                before, reuses = trials.trainings, bool(trials.retrained)
                seconds = stage.reserve_seconds(facts, trials)
                costs.append(StageCost(stage.name, seconds, trials.trainings - before, reuses))
        return costs
