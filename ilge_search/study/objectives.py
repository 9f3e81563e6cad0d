"""What a study optimises: its objectives, their directions and names, and the Pareto front.

Every study maximises its **score** (the metric on validation, or the mean over folds with ``--cv``;
minimised for a loss) and may also minimise ``params`` (trainable parameters) and ``latency`` (forward
milliseconds per 1,000 samples, :func:`measure_latency`). ``flops`` is not offered (:data:`FLOPS_REFUSAL`).
A study of several objectives is an Optuna multi-objective study: one value per objective in
:data:`OBJECTIVES` order, no pruning, a final evaluation of its Pareto front (:func:`pareto_front`). The
objectives are part of the study's identity (none stored: :data:`DEFAULT_OBJECTIVES`).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from optuna.trial import TrialState

from ..engine.tokens import as_word_set, predict_word_logits
from ..record import DEFAULT_OBJECTIVES, TrialRecord, trial_record

if TYPE_CHECKING:
    import optuna
    import torch
    from optuna.trial import FrozenTrial
    from torch import nn

    from .shapes import Features

__all__ = [
    "OBJECTIVES",
    "DEFAULT_OBJECTIVES",
    "FLOPS_REFUSAL",
    "LATENCY_SAMPLES",
    "check_objectives",
    "objective_suffix",
    "objective_directions",
    "objective_metric_names",
    "is_multi_objective",
    "score_of",
    "objective_values",
    "best_score_trial",
    "complete_trials",
    "pareto_front",
    "measure_latency",
    "LATENCY_ATTR",
]

OBJECTIVES: tuple[str, ...] = ("score", "params", "latency")
LATENCY_ATTR = TrialRecord.attr_name("latency_ms")  # forward milliseconds per 1,000 samples
LATENCY_SAMPLES = 1000  # latency is stated per this many samples
LATENCY_REPEATS = 5  # timed passes; the median is kept
FLOPS_REFUSAL = (
    "the objective 'flops' is not available: torch's FLOP counter counts dense matrix products only, and the "
    "Cayley/FC encoders aggregate messages with sparse products and scatters it does not count, so the number "
    "would not be exact; use 'params' (exact) or 'latency' (measured)"
)
_METRIC_NAMES = {"params": "params", "latency": LATENCY_ATTR}


def check_objectives(objectives: Any) -> tuple[str, ...]:
    """The objectives as a tuple in :data:`OBJECTIVES` order, ``score`` first.

    Accepts a name or a sequence of names; duplicates are dropped.

    Raises:
        ValueError: an unknown name (``flops`` with the reason it is not offered), no ``score``, or none.
    """
    if objectives is None:
        return DEFAULT_OBJECTIVES
    if isinstance(objectives, str):
        objectives = [objectives]
    try:
        names = [str(name).strip().lower() for name in objectives]
    except TypeError:
        raise ValueError(f"objectives must be a list of names out of {list(OBJECTIVES)}, got {objectives!r}") from None
    for name in names:
        if name == "flops":
            raise ValueError(FLOPS_REFUSAL)
        if name not in OBJECTIVES:
            raise ValueError(f"unknown objective {name!r}; expected some of {list(OBJECTIVES)}")
    if "score" not in names:
        raise ValueError("the objectives must include 'score' (what the encoder is for); add --objective score")
    return tuple(name for name in OBJECTIVES if name in names)


def objective_suffix(objectives: Sequence[str]) -> str | None:
    """The part of a default study name that says its objectives (``obj-params``), ``None`` for score alone."""
    extra = [name for name in objectives if name != "score"]
    return "obj-" + "-".join(extra) if extra else None


def objective_directions(objectives: Sequence[str], metric: str) -> list[Literal["minimize", "maximize"]]:
    """Optuna directions: the score maximised (minimised for a loss), every other objective minimised."""
    return ["minimize" if name != "score" or metric == "loss" else "maximize" for name in objectives]


def objective_metric_names(objectives: Sequence[str], metric: str) -> list[str]:
    """Names for ``study.set_metric_names``: the task's metric for the score, then ``params``, ``latency_ms``."""
    return [metric if name == "score" else _METRIC_NAMES[name] for name in objectives]


def is_multi_objective(study: optuna.Study) -> bool:
    """Whether ``study`` (an ``optuna.Study``) has more than one objective."""
    return len(study.directions) > 1


def score_of(trial: FrozenTrial) -> float | None:
    """A complete trial's score (its first objective value) in single- and multi-objective studies alike."""
    values = getattr(trial, "values", None)
    return None if not values else float(values[0])


def objective_values(trial: FrozenTrial, objectives: Sequence[str]) -> tuple[float, ...] | None:
    """A trial's value per objective: its returned values, or (single-objective study) its score with the
    ``params`` and ``latency`` its record holds; ``None`` when one is missing."""
    values = getattr(trial, "values", None)
    if not values:
        return None
    if len(values) == len(objectives):
        return tuple(float(v) for v in values)
    record = trial_record(trial)
    out: list[float] = []
    for name in objectives:
        if name == "score":
            out.append(float(values[0]))
            continue
        stored = record.params if name == "params" else record.latency_ms
        if stored is None:
            return None
        out.append(float(stored))
    return tuple(out)


def complete_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The study's complete trials with finite values."""

    return [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.values and all(math.isfinite(v) for v in t.values)
    ]


def best_score_trial(study: optuna.Study) -> FrozenTrial:
    """The complete trial with the best score: ``study.best_trial`` for a single-objective study; with several
    objectives the best first objective, ties broken by the later objectives, then the earlier trial.

    Raises:
        ValueError: no complete trial.
    """
    if not is_multi_objective(study):
        return study.best_trial
    trials = complete_trials(study)
    if not trials:
        raise ValueError(f"study {study.study_name!r} has no complete trial")
    signs = [1.0 if d.name == "MINIMIZE" else -1.0 for d in study.directions]
    return min(trials, key=lambda t: (*(s * v for s, v in zip(signs, t.values, strict=True)), t.number))


def _dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """``a`` is no worse than ``b`` everywhere and better somewhere (both as values to minimise)."""
    return all(x <= y for x, y in zip(a, b, strict=True)) and any(x < y for x, y in zip(a, b, strict=True))


def pareto_front(
    trials: Iterable[FrozenTrial], directions: Sequence[str], objectives: Sequence[str]
) -> list[FrozenTrial]:
    """The non-dominated trials among ``trials``, best score first (ties: fewer by the later objectives, then
    the earlier trial). Trials with identical values appear once (the earliest).

    ``directions`` are ``"maximize"``/``"minimize"`` per objective; values come from
    :func:`objective_values`, so a single-objective study's trials can be placed on a score-vs-params front too.
    """
    signs = [-1.0 if d == "maximize" else 1.0 for d in directions]
    points = []
    for trial in trials:
        values = objective_values(trial, objectives)
        if values is not None and all(math.isfinite(v) for v in values):
            points.append((tuple(s * v for s, v in zip(signs, values, strict=True)), trial))
    points.sort(key=lambda item: (item[0], item[1].number))
    front: list[tuple[tuple[float, ...], FrozenTrial]] = []
    for key, trial in points:
        if any(_dominates(other, key) or other == key for other, _ in front):
            continue
        front.append((key, trial))
    return [trial for _, trial in front]


def measure_latency(
    model: nn.Module,
    features: Features,
    *,
    device: str | torch.device | None = None,
    batch_size: int = 256,
    repeats: int = LATENCY_REPEATS,
) -> float:
    """Forward time of ``model`` in milliseconds per :data:`LATENCY_SAMPLES` samples.

    The first :data:`LATENCY_SAMPLES` rows of ``features`` (e.g. the
    validation split, ``(N, L, D)``) are moved to the model's device once; one
    untimed pass warms up, then ``repeats`` timed passes over them in batches
    of ``batch_size`` (eval mode, no gradients, synchronised on CUDA) give the
    median, scaled to 1,000 samples.
    """

    if device is None:
        device = next(model.parameters()).device
    if getattr(model, "task_kind", None) == "tagging":
        return _tagging_latency(model, features, device, repeats)
    x = torch.as_tensor(features[:LATENCY_SAMPLES]).to(device=device, dtype=torch.float32)
    rows = int(x.shape[0])
    if rows == 0:
        raise ValueError("measuring latency needs at least one sample")
    was_training = model.training
    model.eval()
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)

    def one_pass() -> float:
        sync()
        start = time.perf_counter()
        for first in range(0, rows, batch_size):
            model(x[first : first + batch_size])
        sync()
        return time.perf_counter() - start

    try:
        with torch.no_grad():
            one_pass()
            times = [one_pass() for _ in range(max(1, repeats))]
    finally:
        model.train(was_training)
    return statistics.median(times) * 1000.0 * LATENCY_SAMPLES / rows


def _tagging_latency(model: Any, words: Features, device: str | torch.device, repeats: int) -> float:
    """A tagger's forward time in milliseconds per :data:`LATENCY_SAMPLES` words, timed on the first
    sentences of ``words`` (a word entry, or ``(word features, sentence offsets)``) holding that many words."""

    full = as_word_set(words, None, "latency")
    count = max(1, int(np.searchsorted(full.offsets, LATENCY_SAMPLES, side="right")) - 1)
    end = int(full.offsets[count])
    first = (full.features[:end].to(device=device, dtype=torch.float32), full.offsets[: count + 1])
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)

    def one_pass() -> float:
        sync()
        start = time.perf_counter()
        predict_word_logits(model, first, device)
        sync()
        return time.perf_counter() - start

    one_pass()
    times = [one_pass() for _ in range(max(1, repeats))]
    return statistics.median(times) * 1000.0 * LATENCY_SAMPLES / end
