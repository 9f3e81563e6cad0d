"""The ensemble part of the study record: trials' validation predictions and a study's ensemble evaluation.

Validation predictions (class probabilities ``(N, C)`` or similarity scores ``(N,)``, float16 ``.npy``) live in the
study's artifact store; the record keeps their artifact ids. A trial stores its own while it runs (the trial attr
:data:`PREDICTIONS_ATTR`); predictions made later for a finished trial (Optuna cannot change a finished trial's attrs)
go into the study attr :data:`BACKFILL_ATTR`, trial number -> artifact id, with the seed they were trained with.
:func:`trial_predictions` reads both as one map.

:class:`EnsembleRecord` (study attr :data:`EnsembleRecord.ATTR`) is the last ensemble evaluation: the greedy selection's
picks, and per ensemble size the ensemble's test scores over the final seeds beside the selected trial's and the
starting configuration's with the same seeds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from .fields import Attrs, attrs_of, known_fields, read_stored

if TYPE_CHECKING:
    import optuna

__all__ = [
    "PREDICTIONS_ATTR",
    "BACKFILL_ATTR",
    "EnsembleSize",
    "EnsembleRecord",
    "trial_predictions",
    "save_trial_predictions",
    "save_backfilled_predictions",
    "ensemble_record",
    "save_ensemble",
]


PREDICTIONS_ATTR = "val_predictions"  # on a trial: the artifact id of its validation predictions
BACKFILL_ATTR = "ensemble_val_predictions"  # on a study: {trial number: {"artifact": id, "seed": seed}}


@dataclass(frozen=True)
class EnsembleSize:
    """An ensemble of ``size`` greedy picks: its ``members`` (trial number -> times picked), its validation
    score on the trials' predictions (``val_score``), and per final seed its test and validation scores
    with every member retrained with that seed; ``val_test_gap`` is ``val_score`` minus the test mean."""

    size: int
    members: dict[str, int]
    val_score: float
    test_scores: list[float]
    test_mean: float
    test_std: float
    val_scores: list[float] = field(default_factory=list)
    val_test_gap: float | None = None

    @classmethod
    def from_value(cls, stored: Mapping[str, object]) -> EnsembleSize:
        values: Attrs = {"val_scores": [], "val_test_gap": None, **stored}
        values["members"] = {str(k): int(v) for k, v in dict(values.get("members") or {}).items()}
        return cls(**known_fields(cls, values))

    @property
    def n_members(self) -> int:
        """Distinct trials in the ensemble."""
        return len(self.members)

    def describe(self) -> str:
        """What the ensemble is, in words: ``5 picks (4 distinct trials, trial 3 twice)``."""
        repeated = [(n, c) for n, c in self.members.items() if c > 1]
        times = ", ".join(f"trial {n} " + ("twice" if c == 2 else f"{c} times") for n, c in repeated)
        distinct = f"{self.n_members} distinct trial{'s' if self.n_members != 1 else ''}"
        picks = f"{self.size} pick{'s' if self.size != 1 else ''}"
        return f"{picks} ({distinct}{', ' + times if times else ''})"


@dataclass(frozen=True)
class EnsembleRecord:
    """A study's ensemble evaluation (``ilge-search ensemble`` or ``run --ensemble K``).

    ``size`` is the K asked for (the study's ensemble); ``picks`` the trial numbers greedy forward selection with
    replacement took, in order (the ensemble of k is the first k picks); ``sizes`` the evaluated sizes; ``seeds`` and
    ``max_epochs`` the final retraining's; ``selected_*`` and ``start_*`` the single selected trial's and the starting
    configuration's test scores with the same seeds (from the final evaluation, rule ``select``); ``best_layer_*`` the
    best single layer's (a probe per layer chosen on validation) with the same seeds; ``member_seconds`` the training
    time of the members for one seed; ``latency_ms`` the forward time per 1,000 validation samples of the ensemble and
    of one selected model (``single_latency_ms``); ``artifacts`` the best seed's ensemble weights by validation
    (``artifact_seed``); ``prediction_seed`` the training seed of the trials' validation predictions; ``mix`` says how
    members are combined; ``candidates`` the complete trials the selection chose from (``None`` in evaluations stored
    before it was recorded); ``left_out`` those of them kept out of the selection for their cost (trial -> the seconds
    its search trial took); ``reused`` the members whose models came from the final evaluation run just before (not
    trained again).
    """

    VERSION: ClassVar[int] = 1
    ATTR: ClassVar[str] = "ensemble"

    size: int
    picks: list[int]
    sizes: dict[str, EnsembleSize]
    seeds: list[int]
    max_epochs: int | None
    select: str
    selected_trial: int
    selected_test_scores: list[float]
    start_trial: int | None = None
    start_test_scores: list[float] | None = None
    best_layer_test_scores: list[float] | None = None
    member_seconds: float | None = None
    latency_ms: float | None = None
    single_latency_ms: float | None = None
    artifacts: dict[str, str] = field(default_factory=dict)
    artifact_seed: int | None = None
    prediction_seed: int = 0
    mix: str = ""
    candidates: list[int] | None = None
    left_out: dict[str, float] = field(default_factory=dict)
    reused: list[int] = field(default_factory=list)
    version: int = 1

    @classmethod
    def from_value(cls, stored: object) -> EnsembleRecord | None:
        def build(values: Attrs) -> EnsembleRecord:
            sizes = {str(k): EnsembleSize.from_value(v) for k, v in dict(values["sizes"]).items()}
            return cls(**known_fields(cls, {**values, "sizes": sizes}))

        return read_stored(stored, build, (KeyError, TypeError, ValueError))

    def to_value(self) -> Attrs:
        return dataclasses.asdict(self)

    @property
    def ensemble(self) -> EnsembleSize | None:
        """The evaluation of the asked-for size (the study's ensemble)."""
        return self.sizes.get(str(self.size))

    def matches(self, size: int, seeds: list[int], max_epochs: int | None, select: str) -> bool:
        """Whether this evaluation holds an ensemble of ``size`` retrained with ``seeds`` under ``max_epochs``
        beside the selection of rule ``select``."""
        return (
            str(size) in self.sizes
            and list(self.seeds) == list(seeds)
            and self.max_epochs == max_epochs
            and self.select == select
        )


def trial_predictions(study: optuna.Study, trials: Any) -> dict[int, tuple[str, int | None]]:
    """Trial number -> (artifact id of its validation predictions, training seed: ``None`` when the trial
    stored them itself) for those of ``trials`` that have them; backfilled ones win (they replace missing ones)."""
    backfilled = dict(attrs_of(study).get(BACKFILL_ATTR) or {})
    out: dict[int, tuple[str, int | None]] = {}
    for trial in trials:
        own = attrs_of(trial).get(PREDICTIONS_ATTR)
        if str(trial.number) in backfilled:  # made later, because the trial's own were missing or unreadable
            entry = backfilled[str(trial.number)]
            out[trial.number] = (str(entry["artifact"]), int(entry["seed"]))
        elif own:
            out[trial.number] = (str(own), None)
    return out


def save_trial_predictions(trial: optuna.Trial | optuna.trial.FrozenTrial, artifact_id: str) -> None:
    """Record a running trial's validation predictions (an artifact id)."""
    trial.set_user_attr(PREDICTIONS_ATTR, artifact_id)


def save_backfilled_predictions(study: optuna.Study, predictions: Mapping[int, str], seed: int) -> None:
    """Record validation predictions made for finished trials (trial number -> artifact id), trained with
    ``seed``; earlier entries of other trials stay."""
    stored = dict(attrs_of(study).get(BACKFILL_ATTR) or {})
    for number, artifact in predictions.items():
        stored[str(number)] = {"artifact": artifact, "seed": int(seed)}
    study.set_user_attr(BACKFILL_ATTR, stored)


def ensemble_record(study: optuna.Study) -> EnsembleRecord | None:
    """The ensemble evaluation stored on ``study`` (an ``optuna.Study``, frozen study or summary), or ``None``."""
    return EnsembleRecord.from_value(attrs_of(study).get(EnsembleRecord.ATTR))


def save_ensemble(study: optuna.Study, record: EnsembleRecord) -> None:
    study.set_user_attr(EnsembleRecord.ATTR, record.to_value())
