"""``--time-limit``: the whole run (the search and the stages after it) ends within a wall-clock budget.

As AutoGluon's ``fit(time_limit=...)``, the limit covers everything a run does. The search stops starting
trials once the time left is what the stages after it need: each registered stage that applies says how much
(:meth:`~ilge_search.study.stages.Stage.reserve_seconds`), from the study's own measured trials
(:class:`TrialCosts`), so the reserve grows with what the search found slow: from each trial's CPU time, since
the stages run in one process once the search's workers have stopped, at the share of a core the machine's
other load leaves it. Each study of a run gets an equal share of the time still left when it starts
(:func:`study_deadline`).
"""

from __future__ import annotations

import math
import os
import re
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..record import trial_record
from ..validation import usable_cpus

__all__ = [
    "parse_duration",
    "StageCost",
    "TimeBudget",
    "TimeSplit",
    "TrialCosts",
    "study_deadline",
    "SAFETY",
    "STAGE_OVERHEAD_SECONDS",
    "machine_load",
]

SAFETY = 1.1  # a stage's retrainings are scaled by this: on a busy machine one may run slower than its trial
STAGE_OVERHEAD_SECONDS = 1.0  # scoring and storing around a stage's trainings
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(s|m|min|h)?\s*$")


def parse_duration(value: str | float | int | None) -> float | None:
    """Seconds of ``"10m"``, ``"90s"``, ``"1.5h"``, ``"600"`` or a number; ``None`` stays ``None``.

    Raises:
        ValueError: anything else, or a duration that is not above 0.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"time_limit must be a duration such as 10m, 90s or 600, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        found = _DURATION.match(str(value))
        if found is None:
            raise ValueError(f"time_limit must be a duration such as 10m, 90s, 1.5h or 600 (seconds), got {value!r}")
        seconds = float(found.group(1)) * _UNITS[found.group(2) or ""]
    if not seconds > 0 or math.isinf(seconds):
        raise ValueError(f"time_limit must be above 0 seconds, got {value!r}")
    return seconds


def study_deadline(run_deadline: float, now: float, studies_left: int) -> float:
    """The deadline of the next of ``studies_left`` studies: an equal share of the time left until the run's."""
    return now + max(0.0, run_deadline - now) / max(1, studies_left)


@dataclass
class TrialCosts:
    """The trials the stages may retrain (measured, or planned by the dry run), each with one retraining's
    seconds: ``ranked`` best first, the ``start``, one best-layer ``probe``, each method's best trial. Stages
    cost themselves in order through :meth:`retrain`, which counts a trial once (a later stage reuses the
    models an earlier one trained); ``trainings`` counts the retrainings so far, a seed each."""

    seconds: dict[int, float]
    ranked: list[int]
    start: int
    probe: float
    method_bests: list[int] = field(default_factory=list)
    retrained: set[int] = field(default_factory=set)
    trainings: int = 0

    def retrain(self, numbers: Iterable[int], seeds: int, *, probe: bool = False) -> float:
        """Seconds of retraining ``numbers`` (but those an earlier stage retrained) and, with ``probe``, one
        best-layer probe, each with ``seeds`` seeds."""
        new = [number for number in dict.fromkeys(numbers) if number not in self.retrained]
        self.retrained.update(new)
        self.trainings += seeds * (len(new) + int(probe))
        return seeds * (sum(self.seconds[number] for number in new) + (self.probe if probe else 0.0))


@dataclass(frozen=True)
class StageCost:
    """What one stage that applies keeps for itself: ``seconds``, the retrainings it counted (``trainings``)
    and whether an earlier stage's came first (``reuses``: it counts at most that many, reusing some)."""

    name: str
    seconds: float
    trainings: int = 0
    reuses: bool = False


@dataclass(frozen=True)
class TimeSplit:
    """How a time limit is spent, in seconds: the search, then each stage after it, by name in order."""

    limit: float
    search: float
    stages: dict[str, float]

    def line(self) -> str:
        parts = "".join(f", {name} ~{seconds:.0f} s" for name, seconds in self.stages.items() if seconds)
        return f"time limit {self.limit:.0f} s: search ~{self.search:.0f} s{parts}"

    @classmethod
    def of(cls, limit: float, costs: Sequence[StageCost]) -> TimeSplit:
        """The stages' ``costs`` out of ``limit``, the rest of it the search."""
        search = max(0.0, limit - sum(cost.seconds for cost in costs))
        return cls(limit, search, {cost.name: min(cost.seconds, limit) for cost in costs})


def _trial_seconds(trial: Any) -> float | None:
    value = trial_record(trial).seconds
    return float(value) if value is not None and value > 0 else None


def _retraining_seconds(trial: Any, share: float) -> float:
    """What a retraining of ``trial`` alone is expected to take: its CPU time at ``share`` of a core, but never
    more than its own wall time (trials on a busy machine, or waiting for the storage, took longer than the
    CPU they used); its wall time when no CPU time was recorded."""
    wall = _trial_seconds(trial) or 0.0
    cpu = trial_record(trial).cpu_seconds
    if cpu is None or not cpu > 0 or share <= 0:
        return wall
    return min(wall, float(cpu) / share)


def machine_load() -> float:
    """Processes wanting a core, averaged over the last minute (0 where the system does not say)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def _method_bests(complete: Sequence[Any]) -> list[int]:
    """The number of each method's best complete trial."""
    best: dict[str, Any] = {}
    for trial in complete:
        family = (trial_record(trial).config or {}).get("family", "")
        if family not in best or (trial.value or 0.0) > (best[family].value or 0.0):
            best[family] = trial
    return [trial.number for trial in best.values()]


def _costs(complete: Sequence[Any], workers: int = 1, share: float = 0.0) -> dict[int, float]:
    """Trial number -> the training seconds a retraining of it is expected to take (:func:`_retraining_seconds`
    at ``share`` of a core; 0: its wall time), except that the earliest ``workers`` trials, which also paid the
    one-time set-up of their process (imports, the first reads of the cached arrays), count at most the median
    of the later ones."""
    cost = {t.number: _retraining_seconds(t, share) for t in complete}
    numbers = sorted(cost)
    first, later = numbers[: max(1, workers)], numbers[max(1, workers) :]
    if later:
        typical = statistics.median(cost[n] for n in later)
        for number in first:
            cost[number] = min(cost[number], typical)
    return cost


def _is_probe(trial: Any) -> bool:
    return bool(trial_record(trial).layer_scores)


def _wall_seconds(trial: Any) -> float | None:
    if trial.datetime_start is None or trial.datetime_complete is None:
        return None
    return max(0.0, (trial.datetime_complete - trial.datetime_start).total_seconds())


@dataclass(frozen=True)
class TimeBudget:
    """A study's deadline and what must fit after its search; as an Optuna callback, it stops the search.

    Attributes:
        deadline: the wall-clock time (``clock()``'s) by which the study's stages must have ended.
        stages: what each stage after the search needs, given the study's complete trials and what retraining
            each is expected to take (:class:`~ilge_search.study.stages.StageCosting`).
        workers: processes searching at once (each one's first trial paid its set-up); threads: torch threads of
            each.
        clock: the time now (``time.time``); load and cores: the machine's load average and cores
            (:func:`machine_load`, :func:`~ilge_search.validation.usable_cpus`). Tests pass fake ones.
    """

    deadline: float
    stages: Callable[[int, TrialCosts], list[StageCost]]
    workers: int = 1
    threads: int = 1
    clock: Callable[[], float] = field(default=time.time, compare=False)
    load: Callable[[], float] = field(default=machine_load, compare=False)
    cores: Callable[[], int] = field(default=usable_cpus, compare=False)

    def remaining(self) -> float:
        return self.deadline - self.clock()

    def stage_share(self) -> float:
        """The share of a core the stages' one process can expect once the search's workers have stopped: all of
        one unless other work keeps the machine's cores busy (0 with several threads, whose CPU time does not
        tell the wall time)."""
        if self.threads != 1:
            return 0.0
        others = max(0.0, self.load() - self.workers * self.threads)  # the load beside this run's own search
        return min(1.0, self.cores() / (others + 1.0))

    def costs(self, trials: Sequence[Any]) -> list[StageCost]:
        """What each stage that applies needs, from the trials' measured training times (:func:`_costs`);
        nothing before a trial is measured."""
        complete = [t for t in trials if t.state.name == "COMPLETE" and _trial_seconds(t) is not None]
        if not complete:
            return []
        cost = _costs(complete, self.workers, self.stage_share())
        ranked = sorted(complete, key=lambda t: -(t.value if t.value is not None else -math.inf))
        probes = [cost[t.number] for t in complete if _is_probe(t)]
        probe = statistics.fmean(probes) if probes else statistics.median(cost.values())
        measured = TrialCosts(cost, [t.number for t in ranked], min(cost), probe, _method_bests(complete))
        return self.stages(sum(t.state.name == "COMPLETE" for t in trials), measured)

    def reserve(self, trials: Sequence[Any]) -> float:
        """Seconds the stages after the search need (:meth:`costs`)."""
        return sum(cost.seconds for cost in self.costs(trials))

    def next_trial(self, trials: Sequence[Any]) -> float:
        """Seconds a next trial is expected to take: the median wall time of the ended trials but the first (which
        also paid the process's one-time imports and set-up); of a lone trial, its training time."""
        ended = sorted((t for t in trials if _wall_seconds(t) is not None), key=lambda t: t.number)
        if len(ended) == 1:
            return _trial_seconds(ended[0]) or _wall_seconds(ended[0]) or 0.0
        return statistics.median(_wall_seconds(t) or 0.0 for t in ended[1:]) if ended else 0.0

    def should_stop(self, trials: Sequence[Any]) -> bool:
        """Whether a next trial would leave less than the stages need."""
        return self.remaining() < self.next_trial(trials) + self.reserve(trials)

    def search_timeout(self) -> float:
        """The longest the search may run (Optuna's ``timeout``): never past the deadline."""
        return max(1e-3, self.remaining())

    def __call__(self, study: Any, trial: Any) -> None:
        if self.should_stop(study.get_trials(deepcopy=False)):
            study.stop()
