"""The leaderboard part of the study record: an auto study's methods, its selected trial and its ensembles side by
side on the same final seeds, each against the best single-layer probe.

:class:`LeaderboardRecord` (study attr :data:`LeaderboardRecord.ATTR`) holds one :class:`LeaderboardRow` per
entry and the artifact id of the per-example test predictions of every row and seed (a ``.npz`` in the
study's artifact store: ``truth`` and one ``(seeds, N)`` array per row, in row order), from which the paired
intervals were computed and can be computed again.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import optuna

__all__ = ["LeaderboardRow", "LeaderboardRecord", "ROW_KINDS", "leaderboard_record", "save_leaderboard"]

# what a row is: a method's best trial, the trial the final evaluation selected, the ensemble, the ensemble
# without its ILGE members, and the reference every difference is taken to (the best single-layer probe)
ROW_KINDS = ("method", "selected", "ensemble", "ensemble-baselines", "reference")


@dataclass(frozen=True)
class LeaderboardRow:
    """One entry of the leaderboard.

    Attributes:
        name: what the row shows (a method, ``selected``, ``ensemble`` ...); kind: one of :data:`ROW_KINDS`.
        members: trial number -> weight (one trial for a single model; the probe has none).
        val_scores, test_scores: the study metric on validation and on test, one per final seed.
        train_seconds: training time per seed (an ensemble: its members' together).
        predict_ms: forward milliseconds per 1,000 test texts, or words for a tagger (an ensemble: its members'
            together).
        params: trainable parameters (an ensemble: its distinct members' together).
        difference: ``(estimate, low, high)`` of test minus the reference's, paired over the same test texts
            (words) and seeds (``None`` for the reference itself); verdict: ``win``, ``tie`` or ``loss``. Over a
            test split under ``MIN_TEST_ROWS`` (:attr:`LeaderboardRecord.test_rows`) ``low`` and ``high`` are NaN
            and ``verdict`` is ``None``: no interval is drawn from so few examples.
    """

    name: str
    kind: str
    members: dict[str, int] = field(default_factory=dict)
    val_scores: list[float] = field(default_factory=list)
    test_scores: list[float] = field(default_factory=list)
    train_seconds: float = 0.0
    predict_ms: float = 0.0
    params: int = 0
    difference: tuple[float, float, float] | None = None
    verdict: str | None = None

    @property
    def val_mean(self) -> float:
        return statistics.fmean(self.val_scores) if self.val_scores else float("nan")

    @property
    def test_mean(self) -> float:
        return statistics.fmean(self.test_scores) if self.test_scores else float("nan")

    @property
    def test_std(self) -> float:
        return statistics.stdev(self.test_scores) if len(self.test_scores) > 1 else 0.0

    @classmethod
    def from_value(cls, stored: Mapping[str, Any]) -> LeaderboardRow:
        names = {f.name for f in dataclasses.fields(cls)}
        values = {key: value for key, value in stored.items() if key in names}
        if values.get("difference") is not None:
            values["difference"] = tuple(float(v) for v in values["difference"])
        return cls(**values)

    def to_value(self) -> dict[str, Any]:
        value = dataclasses.asdict(self)
        value["difference"] = None if self.difference is None else list(self.difference)
        return value


@dataclass(frozen=True)
class LeaderboardRecord:
    """A study's leaderboard: its rows, the seeds and metric they were scored with, how the intervals were
    drawn, and the artifact of the per-example test predictions behind them."""

    ATTR: ClassVar[str] = "leaderboard"
    VERSION: ClassVar[int] = 1

    metric: str
    seeds: list[int]
    rows: list[LeaderboardRow]
    max_epochs: int | None = None
    select: str | None = None
    confidence: float = 0.95
    resamples: int = 2000
    predictions: str | None = None  # artifact id of the .npz of per-example test predictions
    unit: str = "texts"  # the test examples, resampled and timed per 1,000: "texts", or a tagging study's "words"
    # how many test examples (``unit``) the bootstrap resamples; None: stored before it was recorded (unknown),
    # the intervals are shown as stored. Under MIN_TEST_ROWS the rows carry no interval (docs/statistics.md).
    test_rows: int | None = None

    @classmethod
    def from_value(cls, stored: Any) -> LeaderboardRecord | None:
        if not isinstance(stored, Mapping) or not isinstance(stored.get("rows"), list):
            return None
        names = {f.name for f in dataclasses.fields(cls)}
        values = {key: value for key, value in stored.items() if key in names and key != "rows"}
        return cls(rows=[LeaderboardRow.from_value(row) for row in stored["rows"]], **values)

    def to_value(self) -> dict[str, Any]:
        value = dataclasses.asdict(self)
        value["rows"] = [row.to_value() for row in self.rows]
        value["version"] = self.VERSION
        return value

    def matches(self, seeds: list[int], max_epochs: int | None, select: str) -> bool:
        """Whether this leaderboard was made with these final seeds, epoch cap and selection rule."""
        return list(self.seeds) == list(seeds) and self.max_epochs == max_epochs and self.select == select

    def row(self, kind: str) -> LeaderboardRow | None:
        """The first row of ``kind``."""
        return next((row for row in self.rows if row.kind == kind), None)


def leaderboard_record(study: optuna.Study | Any) -> LeaderboardRecord | None:
    """The study's stored leaderboard, or ``None``."""
    attrs = getattr(study, "user_attrs", None) or {}
    return LeaderboardRecord.from_value(attrs.get(LeaderboardRecord.ATTR))


def save_leaderboard(study: optuna.Study, record: LeaderboardRecord) -> None:
    study.set_user_attr(LeaderboardRecord.ATTR, record.to_value())
