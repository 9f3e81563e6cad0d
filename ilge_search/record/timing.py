"""The timing part of the study record: where each run's wall-clock time went on a study.

A run (``ilge-search run``, one group of a sweep) appends one :class:`RunTimes` per study it worked on to the
study attr :data:`RunTimes.ATTR`, a list, oldest first (the last :data:`KEPT_RUNS` are kept): the seconds before
the study's search began (the run's checks, data loading and extraction, the study's creation, and earlier
studies of the same run), the search's, each stage's that ran (``final``, ``ensemble``, ``leaderboard``, or a
registered stage's name), and the run's time limit with this study's share of it. All durations are wall-clock
seconds measured by the process that ran the run; a stage that was current (its stored result kept) or did not
apply took no time and is named in ``current`` or absent.

Studies stored before this record have no entry: their stage durations were not measured. Their search's wall
time can still be read from the trials' start and end stamps, which Optuna keeps for every trial.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from .fields import Attrs, attrs_of, known_fields, read_stored

if TYPE_CHECKING:
    import optuna

__all__ = ["KEPT_RUNS", "RunTimes", "run_times", "save_run_times"]

KEPT_RUNS = 20  # entries a study keeps, the newest: a study resumed many times keeps a bounded list


@dataclass(frozen=True)
class RunTimes:
    """One run's time on one study.

    Attributes:
        started: when the run began (seconds since the epoch): the moment a time limit counts from.
        before_search: seconds from ``started`` to this study's search (checks, data loading and extraction,
            creating or loading the study, and the earlier studies of the same run).
        search: seconds the search took (adding no trial: about 0).
        stages: stage name -> seconds, for every stage that ran, in the order they ran.
        current: the stages whose stored result was current, so they did not run.
        elapsed: seconds from ``started`` to the end of this study's stages and notes.
        time_limit: the run's ``--time-limit`` in seconds (``None``: none).
        limit: this study's share of it, as seconds from ``started`` to its deadline (``None``: no limit).
        trials_before, trials_after: the study's finished trials when its search began and ended.
        trial_cap: the most finished trials the run allowed the study (``None``: no count and no cap).
        workers, threads: the processes that searched and each one's torch threads (``None``: torch's default).
    """

    VERSION: ClassVar[int] = 1
    ATTR: ClassVar[str] = "run_times"

    started: float
    before_search: float
    search: float
    elapsed: float
    stages: dict[str, float] = field(default_factory=dict)
    current: list[str] = field(default_factory=list)
    time_limit: float | None = None
    limit: float | None = None
    trials_before: int = 0
    trials_after: int = 0
    trial_cap: int | None = None
    workers: int = 1
    threads: int | None = None
    version: int = 1

    @classmethod
    def from_value(cls, stored: object) -> RunTimes | None:
        """A stored entry; ``None`` when it is not one (a hand-edited or foreign value)."""

        def build(values: Attrs) -> RunTimes:
            values["stages"] = {str(k): float(v) for k, v in dict(values.get("stages") or {}).items()}
            values["current"] = [str(name) for name in values.get("current") or []]
            return cls(**known_fields(cls, values))

        return read_stored(stored, build, (KeyError, TypeError, ValueError))

    def to_value(self) -> Attrs:
        return dataclasses.asdict(self)

    def stage(self, name: str) -> float | None:
        """Seconds of the stage ``name`` in this run, 0 when it was current, ``None`` when it did not run."""
        if name in self.stages:
            return self.stages[name]
        return 0.0 if name in self.current else None

    @property
    def trials_added(self) -> int:
        return max(0, self.trials_after - self.trials_before)

    @property
    def used(self) -> float | None:
        """``elapsed`` over this study's share of the time limit (``None``: the run had none)."""
        return None if not self.limit else self.elapsed / self.limit

    @property
    def cap_reached(self) -> bool:
        """Whether the search stopped because the study held the trials the run allowed."""
        return self.trial_cap is not None and self.trials_after >= self.trial_cap


def run_times(study: optuna.Study | Any) -> list[RunTimes]:
    """The study's recorded runs, oldest first (empty for a study stored before they were recorded)."""
    stored = attrs_of(study).get(RunTimes.ATTR)
    if not isinstance(stored, list):
        return []
    entries = (RunTimes.from_value(value) for value in stored if isinstance(value, Mapping))
    return [entry for entry in entries if entry is not None]


def save_run_times(study: optuna.Study, entry: RunTimes) -> None:
    """Append ``entry`` to the study's runs (keeping the newest :data:`KEPT_RUNS`)."""
    kept = [value.to_value() for value in run_times(study)][-(KEPT_RUNS - 1) :]
    study.set_user_attr(RunTimes.ATTR, [*kept, entry.to_value()])
