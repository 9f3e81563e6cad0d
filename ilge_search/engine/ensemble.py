"""A weighted ensemble of trained models that predicts like one :class:`~ilge_search.engine.ILGEModel`.

Members are models trained by the one engine on the same layer embeddings; the
mix weights are how often ensemble selection picked each member, normalised to
sum to one. The ensemble's outputs have the member's shape, so every caller of
:func:`~ilge_search.engine.predict_logits` and :func:`~ilge_search.engine.evaluate`
uses it unchanged:

- classification: the weighted mean of the members' class probabilities,
  returned as its logarithm, so that a softmax gives that mean back;
- similarity: the weighted mean of the members' cosine similarities.

An ensemble of one member returns that member's outputs untouched (the
ensemble of one *is* the single model).

Members are chosen by :func:`greedy_selection` (Caruana et al., "Ensemble Selection from Libraries of
Models", ICML 2004) on their validation predictions (:func:`predictions_of`), mixed as the model mixes
them (:func:`mixed`) and scored with the study metric (:func:`prediction_score`): plain numpy, no study.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from ..encoders import config_from_dict
from .core import ILGEModel, build_model, predict_logits
from .metrics import class_metrics, pearson, spearman
from .tokens import TaggerModel

__all__ = [
    "MIX_RULE",
    "EnsembleModel",
    "build_ensemble",
    "prediction_score",
    "greedy_selection",
    "mixed",
    "predictions_of",
]

MIX_RULE = {
    "classification": "mean of the members' class probabilities",
    "similarity": "mean of the members' predicted cosine similarities",
}


class EnsembleModel(nn.Module):
    """Members trained on the same embeddings, mixed with fixed weights.

    Args:
        members: trained :class:`~ilge_search.engine.ILGEModel` s of one task kind
            (and, for classification, one number of classes).
        weights: one non-negative weight per member (normalised to sum to 1).
        description: per member, what a saved ensemble records of it (its trial, count and config).

    Shapes:
        - classification: ``(N, L, D)`` -> log of the mixed probabilities ``(N, num_classes)``
        - similarity: ``(N, 2, L, D)`` -> mixed cosine similarity ``(N,)``
    """

    def __init__(
        self, members: Sequence[ILGEModel], weights: Sequence[float], description: Sequence[Mapping[str, Any]] = ()
    ) -> None:
        super().__init__()
        if not members or len(members) != len(weights):
            raise ValueError(f"an ensemble needs one weight per member, got {len(members)} members, {len(weights)}")
        kinds = {member.task_kind for member in members}
        if len(kinds) != 1:
            raise ValueError(f"ensemble members must share one task kind, got {sorted(kinds)}")
        total = float(sum(weights))
        if any(float(w) < 0 for w in weights) or total <= 0:
            raise ValueError(f"ensemble weights must be non-negative with a positive sum, got {list(weights)}")
        self.members = nn.ModuleList(members)
        self.mix: torch.Tensor
        self.register_buffer("mix", torch.tensor([float(w) / total for w in weights], dtype=torch.float64))
        self.task_kind = members[0].task_kind
        self.score_range: tuple[float, float] | None = members[0].score_range
        self.description = [dict(entry) for entry in description]

    @property
    def n_members(self) -> int:
        return len(self.members)

    @property
    def head(self) -> nn.Linear:
        """The first member's head (its ``out_features`` is the ensemble's number of classes)."""
        first = self.members[0]
        assert isinstance(first, ILGEModel)
        return first.head

    def reset_parameters(self) -> None:
        for member in self.members:
            for module in member.modules():
                reset = getattr(module, "reset_parameters", None)
                if module is not member and callable(reset):
                    reset()

    def normalise_scores(self, scores: torch.Tensor) -> torch.Tensor:
        first = self.members[0]
        assert isinstance(first, ILGEModel)
        return first.normalise_scores(scores)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.members) == 1:
            return self.members[0](x)
        mix = self.mix.to(x.device)
        total: torch.Tensor | None = None
        for index, member in enumerate(self.members):
            out = member(x).double()
            if self.task_kind == "classification":
                out = torch.softmax(out, dim=-1)
            total = mix[index] * out if total is None else total + mix[index] * out
        assert total is not None
        if self.task_kind == "classification":  # the log of the mixed probabilities: a softmax gives them back
            return torch.log(total.clamp_min(1e-300)).to(x.dtype)
        return total.to(x.dtype)

    def extra_repr(self) -> str:
        weights = ", ".join(f"{float(w):.3f}" for w in self.mix)
        return f"task_kind={self.task_kind!r}, n_members={self.n_members}, mix=[{weights}]"


def build_ensemble(meta: Mapping[str, Any]) -> Any:
    """An untrained :class:`~ilge_search.engine.ensemble.EnsembleModel` of the members ``meta`` names
    (``meta["ensemble"]``: each member's config and count, with the task's shapes), for loading weights into."""
    score_range = meta.get("score_range")
    members = [
        build_model(
            config_from_dict(member["config"]),
            int(meta["num_layers"]),
            int(meta["hidden_size"]),
            str(meta["task_kind"]),
            num_classes=meta.get("num_classes"),
            score_range=None if score_range is None else (float(score_range[0]), float(score_range[1])),
        )
        for member in meta["ensemble"]
    ]
    return EnsembleModel(members, [float(member["count"]) for member in meta["ensemble"]], meta["ensemble"])


def prediction_score(predictions: np.ndarray, targets: np.ndarray, task_kind: str, metric: str) -> float:
    """The study metric of ``predictions`` (class probabilities ``(N, C)`` or scores ``(N,)``)."""
    predictions = np.asarray(predictions, dtype=np.float64)
    if task_kind == "similarity":
        return (pearson if metric == "pearson" else spearman)(predictions, targets)
    targets = np.asarray(targets)
    if metric == "accuracy":
        return float((predictions.argmax(axis=1) == targets).mean())
    logits = torch.as_tensor(np.log(np.clip(predictions, 1e-12, None)))
    return class_metrics(logits, torch.as_tensor(targets))[metric]


def greedy_selection(
    predictions: Sequence[np.ndarray], score: Callable[[np.ndarray], float], size: int, *, maximize: bool = True
) -> list[int]:
    """Greedy forward selection with replacement: ``size`` indices into ``predictions``, in the order picked.

    At each step the candidate whose addition gives the best ``score`` of the
    ensemble's mean prediction is added; ties go to the lowest index.
    """
    if size < 1 or not predictions:
        raise ValueError(f"greedy selection needs a size >= 1 and candidates, got size {size}, {len(predictions)}")
    total = np.zeros_like(np.asarray(predictions[0], dtype=np.float64))
    picks: list[int] = []
    for step in range(size):
        values = [score((total + candidate) / (step + 1)) for candidate in predictions]
        # the first best index: ties go to the earlier candidate
        best = max(range(len(values)), key=lambda i: values[i] if maximize else -values[i])
        picks.append(best)
        total = total + predictions[best]
    return picks


def mixed(predictions: Mapping[int, np.ndarray], members: Mapping[int, int]) -> np.ndarray:
    """The weighted mean of ``predictions`` (key -> array) with ``members`` (key -> times picked)."""
    total = float(sum(members.values()))
    stacked = [np.asarray(predictions[key], dtype=np.float64) * count for key, count in members.items()]
    return np.sum(stacked, axis=0) / total


def predictions_of(model: ILGEModel | TaggerModel, features: Any) -> np.ndarray:
    """A trained model's predictions: class probabilities ``(N, C)`` (a tagger's: one row per word) or
    similarity scores ``(N,)``."""
    outputs = predict_logits(model, features).double()
    if model.task_kind in ("classification", "tagging"):
        outputs = torch.softmax(outputs, dim=1)
    return outputs.numpy()
