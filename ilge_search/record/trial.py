"""The trial record: what each trial of a study stores about its configuration and its training."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from ..encoders import config_from_dict
from .fields import Attrs, attrs_of, fields_from

if TYPE_CHECKING:
    import optuna

    from ..encoders.configs import EncoderConfig

__all__ = ["TrialRecord", "trial_record", "trial_config", "save_trial", "enqueue_start_trial"]


@dataclass(frozen=True)
class TrialRecord:
    """What a trial recorded: its configuration and how its training went.

    ``val_metric`` is its objective score (the mean over folds with ``--cv``, with
    ``fold_scores``/``fold_best_epochs``); ``params`` its trainable parameters; ``latency_ms`` its forward time per
    1,000 validation samples; ``layer``/``layer_scores`` the best-layer baseline's choice; ``pruned_fold`` the fold a
    cross-validated trial was pruned in; ``recommended`` marks the starting configuration;
    ``seconds`` and ``cpu_seconds`` the training's wall and CPU time (a best-layer trial's: every layer's probe).
    """

    VERSION: ClassVar[int] = 1
    # field -> user attr, where they differ
    ATTRS: ClassVar[dict[str, str]] = {"params": "num_trainable_params"}

    config: Attrs | None = None
    val_metric: float | None = None
    params: int | None = None
    latency_ms: float | None = None
    epochs_run: int | None = None
    best_epoch: int | None = None
    seconds: float | None = None
    cpu_seconds: float | None = None
    layer: int | None = None
    layer_scores: list[float] = field(default_factory=list)
    fold_scores: list[float] = field(default_factory=list)
    fold_best_epochs: list[int] = field(default_factory=list)
    pruned_fold: int | None = None
    recommended: bool = False
    val_macro_f1: float | None = None  # tagging: macro-F1 over the validation words at the best epoch

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, object]) -> TrialRecord:
        return fields_from(cls, {k: v for k, v in attrs.items() if v is not None}, cls.ATTRS)

    @classmethod
    def attr_name(cls, name: str) -> str:
        """The user attr a field is stored as."""
        if name not in {f.name for f in dataclasses.fields(cls)}:
            raise KeyError(f"a trial record has no field {name!r}")
        return cls.ATTRS.get(name, name)


def trial_record(trial: optuna.Trial | optuna.trial.FrozenTrial) -> TrialRecord:
    """The :class:`TrialRecord` of an ``optuna.Trial`` or ``FrozenTrial``."""
    return TrialRecord.from_attrs(attrs_of(trial))


def trial_config(trial: optuna.Trial | optuna.trial.FrozenTrial) -> EncoderConfig:
    """The encoder configuration a trial recorded, rebuilt.

    Raises:
        ValueError: the trial recorded none (it failed before its configuration was drawn).
    """

    config = trial_record(trial).config
    if not config:
        raise ValueError(
            f"trial {trial.number} recorded no configuration (it failed before one was drawn); choose another trial"
        )
    return config_from_dict(config)


def save_trial(trial: optuna.Trial | optuna.trial.FrozenTrial, **values: object) -> None:
    """Record fields of :class:`TrialRecord` on a running trial (each as it becomes known)."""
    for name, value in values.items():
        trial.set_user_attr(TrialRecord.attr_name(name), value)


def enqueue_start_trial(study: optuna.Study, params: Mapping[str, object]) -> None:
    """Enqueue the starting configuration (Optuna ``params``) as the study's next trial, marked ``recommended``."""
    study.enqueue_trial(dict(params), user_attrs={"recommended": True})
