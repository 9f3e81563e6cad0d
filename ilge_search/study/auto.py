"""``--encoder auto``: one study whose first parameter is the method, each method's own space conditional on it.

As Auto-sklearn searches the algorithm and its hyperparameters in one space, an auto study's trials first pick
a ``method`` (an encoder family: the ILGE encoders and the layer baselines; for a tagging task the families
that tag words) and then that family's space (:func:`ilge_search.tuning.suggest_config`'s, through a
:class:`~ilge_search.encoders.Picker`). Every parameter of a method is named ``<method>:<field>``: Optuna
refuses one name with different choices in one study, and a trial's config is rebuilt from its stored
parameters by the same function that sampled it (:func:`suggest_auto` on a ``FrozenTrial``). A trial also
records its full config, so the final evaluation, ensembles and export read its family from there.

The sampler of an auto study is TPE with ``multivariate=True, group=True``: each method's parameters are
modelled jointly, and only over the trials that sampled them (:func:`ilge_search.tuning.make_sampler`).
Each method's starting configuration is enqueued when the study is created (the first method's is trial 0,
the study's ``recommended`` start; by default the baselines come first, cheapest), so every method has at least
one trial.

This module is the one place that knows what ``auto`` means: :func:`is_auto`, the methods a study searches
(:func:`auto_methods`, part of its identity), the configs (:func:`suggest_auto`, :func:`suggest_study_config`)
and the starts' names (:func:`method_params`; :func:`~ilge_search.study.trial.starting_params` enqueues them).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from optuna.trial import TrialState

from ..encoders import config_classes, encoder_specs
from ..record import trial_record
from ..tuning import suggest_config

if TYPE_CHECKING:
    import optuna
    from optuna.distributions import CategoricalChoiceType

logger = logging.getLogger(__name__)

__all__ = [
    "AUTO",
    "METHOD_PARAM",
    "is_auto",
    "auto_methods",
    "parse_methods",
    "suggest_auto",
    "suggest_study_config",
    "method_params",
    "announce_waiting_starts",
]

AUTO = "auto"
METHOD_PARAM = "method"  # the first parameter of an auto study's trials
_SEPARATOR = ":"


def is_auto(encoder: str | None) -> bool:
    """Whether ``encoder`` is the auto search over methods."""
    return encoder == AUTO


def _kind(tagging: bool) -> str:
    return "token" if tagging else "sentence"


def _serving(tagging: bool) -> list[str]:
    """The registered families serving the task's kind: the layer baselines first (their starts are the cheapest
    trials, so under a time limit every baseline has one before the first ILGE encoder trains), then the ILGE
    encoders, each group in registration order."""
    kind = _kind(tagging)
    serving = [spec for spec in encoder_specs() if kind in spec.kinds]
    return [spec.name for spec in serving if spec.role != "ilge"] + [
        spec.name for spec in serving if spec.role == "ilge"
    ]


def parse_methods(value: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """``--methods a,b`` (or a sequence of names) as a tuple without duplicates; ``None`` stays ``None``."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else [str(item) for item in value]
    names: list[str] = []
    for item in (part.strip() for part in items):
        if item and item not in names:
            names.append(item)
    if not names:
        raise ValueError("methods: give at least one method, e.g. --methods cayley,last-layer")
    return tuple(names)


def auto_methods(methods: Sequence[str] | None, *, tagging: bool | None, key: str = "--methods") -> tuple[str, ...]:
    """The methods an auto study searches: ``methods`` checked against the task's kind (``None``: not known
    yet, so only the names are), else every family that serves it. ``key`` is where the names were given.

    Raises:
        ValueError: a name that is no family, or one that cannot run on this kind of task.
    """
    serving = _serving(bool(tagging))
    if methods is None:
        return tuple(serving)
    for name in methods:
        if name == AUTO or name not in config_classes():
            known = serving if tagging is not None else [n for n in config_classes() if n != AUTO]
            raise ValueError(f"unknown method {name!r} in {key}; expected some of {', '.join(known)}")
        if tagging is not None and name not in serving:
            what = "a tagging task" if tagging else "a sentence task"
            raise ValueError(f"method {name!r} cannot run on {what}; expected some of {', '.join(serving)}")
    return tuple(methods)


class _Prefixed:
    """A trial whose parameter names carry the method: ``cayley:hidden_dim`` and ``deepset:hidden_dim`` are two
    parameters, so each may have its own choices and the sampler models each method's values apart."""

    def __init__(self, trial: Any, method: str) -> None:
        self.trial = trial
        self.prefix = method + _SEPARATOR

    def suggest_categorical(self, name: str, choices: Sequence[CategoricalChoiceType]) -> CategoricalChoiceType:
        return self.trial.suggest_categorical(self.prefix + name, choices)

    def suggest_int(self, name: str, low: int, high: int) -> int:
        return int(self.trial.suggest_int(self.prefix + name, low, high))

    def suggest_float(self, name: str, low: float, high: float, *, log: bool = False) -> float:
        return float(self.trial.suggest_float(self.prefix + name, low, high, log=log))


def suggest_auto(trial: Any, methods: Sequence[str]) -> Any:
    """Sample (or, from a finished trial, rebuild) an auto study's config: the method, then its own space."""

    method = trial.suggest_categorical(METHOD_PARAM, list(methods))
    return suggest_config(_Prefixed(trial, method), method)


def suggest_study_config(trial: Any, encoder: str, methods: Sequence[str] | None) -> Any:
    """The config a trial of ``encoder``'s study runs: the family's own space, or for ``auto`` the method first."""

    if is_auto(encoder):
        if not methods:
            raise ValueError("an auto study records the methods it searches; this one has none")
        return suggest_auto(trial, methods)
    return suggest_config(trial, encoder)


def method_params(method: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """One method's Optuna params (as :func:`~ilge_search.study.trial.config_params` gives them) as an auto
    study names them."""
    return {METHOD_PARAM: method, **{f"{method}{_SEPARATOR}{key}": value for key, value in params.items()}}


def announce_waiting_starts(study: optuna.Study, room: int | None) -> None:
    """One warning when a run of ``room`` trials leaves method starts of an auto study waiting: they stay
    queued for a later run, as the warm start says of the members it drops, since each method's start is what
    the study promises to try first."""
    waiting = [
        trial
        for trial in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if trial_record(trial).recommended
    ]
    if room is None or len(waiting) <= room:
        return
    left = [str(trial.system_attrs.get("fixed_params", {}).get(METHOD_PARAM, "?")) for trial in waiting[room:]]
    logger.warning(
        "%s: %d method start(s) (%s) wait for a later run: this run adds %d trial(s) and an auto study runs "
        "every method's start first; pass --n-trials %d (or --total-trials) to try every method",
        study.study_name,
        len(left),
        ", ".join(left),
        room,
        len(waiting),
    )
