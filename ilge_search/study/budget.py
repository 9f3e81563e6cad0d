"""``--time-limit``: the whole run (search, final evaluation, ensemble) ends within a wall-clock budget.

As AutoGluon's ``fit(time_limit=...)``, the limit covers everything a run does. The search stops starting
trials once the time left is what the stages after it need: those retrain the selected trial, the starting
configuration and the ensemble's members with every final seed, and the ensemble stage probes the best
single layer. Their cost is estimated from the study's own measured trials (:meth:`TimeBudget.reserve`), so it
grows with what the search found slow: from each trial's CPU time, since the stages run in one process once
the search's workers have stopped, at the share of a core the machine's other load leaves it. Each study of a
run gets an equal share of the time still left when it starts (:func:`study_deadline`).
"""

from __future__ import annotations

import math
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..validation import usable_cpus

__all__ = [
    "parse_duration",
    "TimeBudget",
    "TimeSplit",
    "study_deadline",
    "SAFETY",
    "STAGE_OVERHEAD_SECONDS",
    "machine_load",
]

SAFETY = 1.1  # the stages' estimate is scaled by this: a retraining on a busy machine may run slower than its trial
STAGE_OVERHEAD_SECONDS = 1.0  # scoring and storing around the stages' trainings
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


@dataclass(frozen=True)
class TimeSplit:
    """How a time limit is spent, in seconds: the search, then the final evaluation and the ensemble."""

    limit: float
    search: float
    final: float
    ensemble: float
    leaderboard: float = 0.0

    def line(self) -> str:
        board = f", leaderboard ~{self.leaderboard:.0f} s" if self.leaderboard else ""
        return (
            f"time limit {self.limit:.0f} s: search ~{self.search:.0f} s, final evaluation ~{self.final:.0f} s, "
            f"ensemble ~{self.ensemble:.0f} s{board}"
        )

    @classmethod
    def planned(cls, limit: float, trial_seconds: float, runs: tuple[int, int, int]) -> TimeSplit:
        """The split a dry run prints: the stages' trainings (``runs``: the final evaluation's, the ensemble's and
        the leaderboard's) at ``trial_seconds`` each, the rest of ``limit`` the search."""
        final, ensemble, board = (
            count * trial_seconds * SAFETY + (STAGE_OVERHEAD_SECONDS if count else 0.0) for count in runs
        )
        search = max(0.0, limit - final - ensemble - board)
        return cls(limit, search, min(final, limit), min(ensemble, limit), min(board, limit))


def _trial_seconds(trial: Any) -> float | None:
    from ..record import trial_record

    value = trial_record(trial).seconds
    return float(value) if value is not None and value > 0 else None


def _retraining_seconds(trial: Any, share: float) -> float:
    """What a retraining of ``trial`` alone is expected to take: its CPU time at ``share`` of a core, but never
    more than its own wall time (trials on a busy machine, or waiting for the storage, took longer than the
    CPU they used); its wall time when no CPU time was recorded."""
    from ..record import trial_record

    wall = _trial_seconds(trial) or 0.0
    cpu = trial_record(trial).cpu_seconds
    if cpu is None or not cpu > 0 or share <= 0:
        return wall
    return min(wall, float(cpu) / share)


def machine_load() -> float:
    """Processes wanting a core, averaged over the last minute (0 where the system does not say)."""
    import os

    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def _method_bests(complete: Sequence[Any]) -> list[int]:
    """The number of each method's best complete trial (what a leaderboard retrains)."""
    from ..record import trial_record

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
    from ..record import trial_record

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
        seeds: the final seeds; ensemble_size: the ensemble's K (0: no ensemble stage).
        workers: processes searching at once (each one's first trial paid its set-up); threads: torch threads of
            each.
        leaderboard: an auto study's leaderboard follows (it trains each method's best trial and the probe with
            every seed, reusing the models the final evaluation and the ensemble trained).
        clock: the time now (``time.time``); load and cores: the machine's load average and cores
            (:func:`machine_load`, :func:`~ilge_search.study.options.usable_cpus`). Tests pass fake ones.
    """

    deadline: float
    seeds: int
    ensemble_size: int
    leaderboard: bool = False
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

    def reserve(self, trials: Sequence[Any]) -> float:
        """Seconds the stages after the search need, from the trials' measured training times (:func:`_costs`):
        the final evaluation retrains the best trial and the start; the ensemble up to K - 1 other trials and
        the probe; a leaderboard each method's best trial neither of them trained and its own probe -- each with
        every final seed."""
        complete = [t for t in trials if t.state.name == "COMPLETE" and _trial_seconds(t) is not None]
        if not self.seeds or not complete:
            return 0.0
        cost = _costs(complete, self.workers, self.stage_share())
        ranked = sorted(complete, key=lambda t: -(t.value if t.value is not None else -math.inf))
        start = min(complete, key=lambda t: t.number)
        trained = {ranked[0].number, start.number}
        members = [t.number for t in ranked[: self.ensemble_size] if t.number not in trained]
        others = [cost[n] for n in members]
        probes = [cost[t.number] for t in complete if _is_probe(t)]
        probe = statistics.fmean(probes) if probes else statistics.median(cost.values())
        final = self.seeds * sum(cost[n] for n in trained)
        ensemble = self.seeds * (sum(others) + probe) if self.ensemble_size else 0.0
        bests = [n for n in _method_bests(complete) if n not in trained and n not in members]
        board = self.seeds * (sum(cost[n] for n in bests) + probe) if self.leaderboard else 0.0
        overhead = STAGE_OVERHEAD_SECONDS * (2 if self.leaderboard else 1)
        return (final + ensemble + board) * SAFETY + overhead

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
