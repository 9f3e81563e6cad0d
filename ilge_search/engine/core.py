"""Training and evaluation on texts and sentence pairs, and the engine's entry points for every kind.

:func:`train_encoder` trains a standardiser, an aggregator and a head from a config:

- data are in-memory tensors of per-layer embeddings, ``(N, L, D)`` for
  classification and ``(N, 2, L, D)`` for sentence pairs, usually float16 from
  the embedding cache. A batch is an index slice of a seeded permutation and is
  upcast to float32 on its own; the whole set is never copied or upcast.
- the loop (optimizer, plateau schedule, early stopping, best epoch, seeding,
  ``epoch_callback``) is :func:`~ilge_search.engine.loop.run_epochs`.

Task kinds:

- ``"classification"``: aggregator -> linear head -> cross-entropy; metrics
  ``accuracy`` and ``macro_f1``.
- ``"similarity"``: one shared aggregator and a linear projection embed both
  sentences, their cosine is regressed (MSE) on the gold score min-max
  normalised to ``[0, 1]``; metrics ``spearman`` and ``pearson``.
- ``"tagging"``: handed to :mod:`ilge_search.engine.tokens` by the same entry points
  (:func:`train_encoder`, :func:`select_best_layer`, :func:`evaluate`, :func:`predict_logits`),
  whose features are then sentences of word vectors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypedDict, cast

import numpy as np
import torch
from torch import nn
from typing_extensions import Unpack

from ..embeddings.models import resolve_device
from ..encoders.aggregator import build_aggregator
from ..encoders.configs import BestLayerConfig, EncoderConfig
from ..progress import BarSpec, steps
from . import tokens
from .loop import DEFAULT_RECIPE, TAGGING, TASK_KINDS, RunSettings, TrainingRecipe, TrainResult, run_epochs
from .metrics import ArrayLike, check_finite, check_label_range, class_metrics, pearson, spearman
from .standardizer import FeatureStandardizer

if TYPE_CHECKING:  # pragma: no cover - the aggregator pulls in PyTorch Geometric, imported lazily
    from ..encoders.aggregator import Aggregator

__all__ = [
    "ILGEModel",
    "build_model",
    "train_encoder",
    "TrainOptions",
    "evaluate",
    "predict_logits",
    "select_best_layer",
    "EVAL_BATCH_SIZE",
]

EVAL_BATCH_SIZE = 1024

Dataset = tuple[Any, ArrayLike]  # (features, labels); tagging features are (word features, sentence offsets)


# --------------------------------------------------------------------------- model


class ILGEModel(nn.Module):
    """A feature standardiser, an aggregator and its task head; what :func:`train_encoder` returns.

    Args:
        aggregator: maps ``(N, L, D)`` to ``(N, out_dim)`` and exposes ``out_dim``.
        head: ``nn.Linear(out_dim, num_classes)`` for classification, a linear
            projection ``nn.Linear(out_dim, out_dim)`` for similarity.
        task_kind: ``"classification"`` or ``"similarity"``.
        score_range: ``(low, high)`` of the gold scores (similarity only), used to
            normalise targets to ``[0, 1]``.

    Shapes:
        - classification: ``(N, L, D)`` -> logits ``(N, num_classes)``
        - similarity: ``(N, 2, L, D)`` -> cosine similarity ``(N,)``
    """

    def __init__(
        self,
        aggregator: Aggregator,
        head: nn.Linear,
        task_kind: str = "classification",
        score_range: tuple[float, float] | None = None,
    ) -> None:
        super().__init__()
        _check_task_kind(task_kind)
        self.standardizer = FeatureStandardizer(int(aggregator.num_layers), int(aggregator.hidden_in))
        self.aggregator = aggregator
        self.head = head
        self.task_kind = task_kind
        self.score_range = None if score_range is None else (float(score_range[0]), float(score_range[1]))

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, L, D)`` -> ``(N, out_dim)``: the aggregator's representation."""
        return self.aggregator(self.standardizer(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.task_kind == "classification":
            return self.head(self.embed(x))  # (N, C)
        n = x.shape[0]
        z = self.head(self.embed(x.flatten(0, 1)))  # (N*2, L, D) -> (N*2, E)
        z = z.view(n, 2, -1)  # (N, 2, E)
        return nn.functional.cosine_similarity(z[:, 0], z[:, 1], dim=-1)  # (N,)

    def normalise_scores(self, scores: torch.Tensor) -> torch.Tensor:
        """Gold similarity scores -> ``[0, 1]`` targets (min-max of ``score_range``)."""
        if self.score_range is None:
            raise ValueError("this similarity model has no score range to normalise gold scores with")
        low, high = self.score_range
        return (scores - low) / (high - low)

    def extra_repr(self) -> str:
        return f"task_kind={self.task_kind!r}"


def build_model(
    config: EncoderConfig,
    num_layers: int,
    hidden_in: int,
    task_kind: str = "classification",
    num_classes: int | None = None,
    score_range: tuple[float, float] | None = None,
) -> ILGEModel:
    """Build an untrained :class:`ILGEModel` (uses the global torch RNG for init)."""

    _check_task_kind(task_kind)
    aggregator = build_aggregator(config, num_layers=num_layers, hidden_in=hidden_in)
    if task_kind == "classification":
        if num_classes is None or num_classes < 2:
            raise ValueError(f"classification needs num_classes >= 2, got {num_classes!r}")
        head = nn.Linear(aggregator.out_dim, num_classes)
    else:
        head = nn.Linear(aggregator.out_dim, aggregator.out_dim)
        # start from the identity, i.e. from the plain cosine of the aggregator outputs
        with torch.no_grad():
            head.weight.copy_(torch.eye(aggregator.out_dim))
            head.bias.zero_()
    return ILGEModel(aggregator, head, task_kind=task_kind, score_range=score_range)


# --------------------------------------------------------------------------- input checks


def _check_task_kind(task_kind: str) -> None:
    if task_kind not in TASK_KINDS:
        raise ValueError(f"task_kind must be one of {list(TASK_KINDS)}, got {task_kind!r}")


def _as_features(features: ArrayLike, task_kind: str, name: str) -> torch.Tensor:
    features = torch.as_tensor(features)
    if not features.is_floating_point():
        raise ValueError(f"{name} features must be a floating tensor, got dtype {features.dtype}")
    expected_rank, shape_text = (3, "(N, L, D)") if task_kind == "classification" else (4, "(N, 2, L, D)")
    if features.dim() != expected_rank or (task_kind == "similarity" and features.shape[1] != 2):
        raise ValueError(
            f"{name} features for task_kind={task_kind!r} must have shape {shape_text}, got {tuple(features.shape)}"
        )
    if features.shape[0] == 0:
        raise ValueError(f"{name} set is empty")
    check_finite(features, name)
    return features


def _as_labels(labels: ArrayLike, num_rows: int, task_kind: str, name: str) -> torch.Tensor:
    labels = torch.as_tensor(np.asarray(labels) if not isinstance(labels, torch.Tensor) else labels)
    if labels.dim() != 1:
        raise ValueError(f"{name} labels must be one-dimensional, got shape {tuple(labels.shape)}")
    if labels.shape[0] != num_rows:
        raise ValueError(f"{name} has {num_rows} feature rows but {labels.shape[0]} labels")
    if task_kind == "classification":
        if labels.is_floating_point():
            if not torch.equal(labels, labels.round()):
                raise ValueError(f"{name} labels must be integer class ids for classification")
        elif labels.dtype == torch.bool:
            raise ValueError(f"{name} labels must be integer class ids, got booleans")
        return labels.long()
    labels = labels.double()
    if not torch.isfinite(labels).all():
        raise ValueError(f"{name} similarity scores contain NaN or inf")
    return labels.float()


# --------------------------------------------------------------------------- evaluation


def _batches(num_rows: int, batch_size: int, order: torch.Tensor | None = None) -> Iterator[torch.Tensor | slice]:
    for start in range(0, num_rows, batch_size):
        if order is None:
            yield slice(start, start + batch_size)
        else:
            yield order[start : start + batch_size]


@torch.no_grad()
def predict_logits(
    model: ILGEModel | tokens.TaggerModel,
    features: ArrayLike,
    device: str | torch.device | None = None,
    batch_size: int = EVAL_BATCH_SIZE,
) -> torch.Tensor:
    """Model outputs on CPU, float32: logits ``(N, C)`` or cosine similarities ``(N,)``; for a tagger,
    ``features`` are ``(word features, sentence offsets)`` (or a word cache entry) and the logits
    ``(num_words, C)``.

    Runs in eval mode and restores the model's previous mode afterwards.
    """
    if isinstance(model, tokens.TaggerModel):
        return tokens.predict_word_logits(model, features, device)
    features = torch.as_tensor(features)
    if device is None:
        device = next(model.parameters()).device
    device = resolve_device(device)
    was_training = model.training
    model.eval()
    outputs = []
    try:
        for rows in _batches(features.shape[0], batch_size):
            xb = features[rows].to(device=device, dtype=torch.float32)
            outputs.append(model(xb).float().cpu())
    finally:
        model.train(was_training)
    return torch.cat(outputs) if outputs else torch.empty(0)


def task_metrics(model: ILGEModel, outputs: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    if model.task_kind == "classification":
        return class_metrics(outputs, labels)
    out = {"spearman": spearman(outputs, labels), "pearson": pearson(outputs, labels)}
    if model.score_range is not None:
        out["loss"] = float(nn.functional.mse_loss(outputs, model.normalise_scores(labels.float())))
    return out


def evaluate(
    model: ILGEModel | tokens.TaggerModel,
    features: ArrayLike,
    labels: ArrayLike,
    task_kind: str | None = None,
    device: str | torch.device | None = None,
    batch_size: int = EVAL_BATCH_SIZE,
) -> dict[str, float]:
    """Metrics of ``model`` on a labelled set.

    Returns ``{"accuracy", "macro_f1", "loss"}`` for classification and, over words, for tagging
    (``features``: ``(word features, sentence offsets)``, ``labels``: one per word), and
    ``{"spearman", "pearson", "loss"}`` for similarity (``loss`` only when the model knows its score range).
    """
    task_kind = task_kind or model.task_kind
    if task_kind != model.task_kind:
        raise ValueError(f"model was trained for {model.task_kind!r}, not {task_kind!r}")
    if isinstance(model, tokens.TaggerModel):
        return tokens.evaluate_words(model, features, labels, device)
    features = _as_features(features, task_kind, "evaluation")
    labels = _as_labels(labels, features.shape[0], task_kind, "evaluation")
    if task_kind == "classification":
        num_classes = int(model.head.out_features)
        check_label_range(labels, num_classes, "evaluation")
    outputs = predict_logits(model, features, device=device, batch_size=batch_size)
    return task_metrics(model, outputs, labels)


# --------------------------------------------------------------------------- training


def train_encoder(
    config: EncoderConfig,
    train: Dataset,
    val: Dataset,
    *,
    epoch_callback: Callable[[int, float], Any] | None = None,
    **options: Unpack[TrainOptions],
) -> TrainResult:
    """Train an aggregator from ``config`` plus its head; return the best epoch's model.

    Args:
        config: any encoder family or baseline config. Its ``lr``,
            ``weight_decay``, ``batch_size`` and ``epochs`` are the recipe.
        train, val: ``(features, labels)``. Features are ``(N, L, D)``
            (classification) or ``(N, 2, L, D)`` (similarity), any float dtype;
            labels are class ids or gold similarity scores. For tagging, features
            are ``(word features (W, L, D), sentence offsets (S + 1,))`` or a word
            cache entry, and labels one class id per word.
        task_kind: ``"classification"``, ``"similarity"`` or ``"tagging"`` (a
            :class:`~ilge_search.engine.TaggerModel`, :mod:`ilge_search.engine.tokens`).
        num_classes: number of classes (default: largest label in train/val + 1).
        score_range: ``(low, high)`` of the similarity scale, e.g. ``(0, 5)`` for
            STS-B (default: min and max of the training scores).
        seed: seeds model init, dropout and batch order (default 0).
        device: ``"cpu"`` (default), ``"cuda"``, ``"auto"``...
        recipe: early stopping, LR schedule, selection metric, optimizer and
            standardisation (:class:`TrainingRecipe`).
        progress: show a progress bar over epochs (:mod:`ilge_search.progress`).
        epoch_callback: ``f(epoch, val_metric)`` after each epoch (epochs count
            from 1); exceptions such as ``optuna.TrialPruned`` propagate.

    The keywords besides ``epoch_callback`` are a :class:`TrainOptions`; any other is refused.
    """
    task_kind, num_classes, score_range, run = _labels_and_run("train_encoder", options, epoch_callback)
    if task_kind == TAGGING:
        return tokens.train_prepared_words(config, tokens.prepare_words(train, val, num_classes), run)
    return train_prepared(config, prepare_data(train, val, task_kind, num_classes, score_range), run)


@dataclass
class PreparedData:
    task_kind: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    num_classes: int | None
    score_range: tuple[float, float] | None


def prepare_data(
    train: Dataset, val: Dataset, task_kind: str, num_classes: int | None, score_range: tuple[float, float] | None
) -> PreparedData:
    """Validate once (shapes, NaN/inf, label ranges) and resolve num_classes / score_range."""
    _check_task_kind(task_kind)
    for name, pair in (("train", train), ("validation", val)):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"{name} must be a (features, labels) pair")
    train_x = _as_features(train[0], task_kind, "train")
    val_x = _as_features(val[0], task_kind, "validation")
    if train_x.shape[1:] != val_x.shape[1:]:
        raise ValueError(
            f"train and validation features differ in shape: {tuple(train_x.shape[1:])} vs {tuple(val_x.shape[1:])}"
        )
    train_y = _as_labels(train[1], train_x.shape[0], task_kind, "train")
    val_y = _as_labels(val[1], val_x.shape[0], task_kind, "validation")

    if task_kind == "classification":
        if num_classes is None:
            num_classes = int(max(train_y.max(), val_y.max())) + 1
        check_label_range(train_y, num_classes, "train")
        check_label_range(val_y, num_classes, "validation")
    else:
        if score_range is None:
            score_range = (float(train_y.min()), float(train_y.max()))
        if not score_range[1] > score_range[0]:
            raise ValueError(f"score_range must be (low, high) with high > low, got {score_range!r}")

    return PreparedData(task_kind, train_x, train_y, val_x, val_y, num_classes, score_range)


def task_loss(model: ILGEModel, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if model.task_kind == "classification":
        return nn.functional.cross_entropy(out, target)
    return nn.functional.mse_loss(out, model.normalise_scores(target))


def _train_one_epoch(
    model: ILGEModel,
    opt: torch.optim.Optimizer,
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    order: torch.Tensor,
    batch_size: int,
    device: torch.device,
) -> float:
    """One pass over ``order``; returns the mean training loss."""
    model.train()
    loss_sum = torch.zeros((), device=device)
    for rows in _batches(len(order), batch_size, order):
        xb = train_x[rows].to(device=device, dtype=torch.float32)  # (B, L, D) or (B, 2, L, D): one batch upcast
        yb = train_y[rows].to(device)
        loss = task_loss(model, model(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss_sum += loss.detach() * len(yb)
    return float(loss_sum) / len(order)


class SequenceTask:
    """Texts or sentence pairs for :func:`~ilge_search.engine.loop.run_epochs`: index batches of a seeded
    permutation, each upcast to float32 on its own."""

    def __init__(self, config: EncoderConfig, data: PreparedData, run: RunSettings) -> None:
        self.config, self.data, self.run = config, data, run
        self.device = resolve_device(run.device)

    def build(self) -> ILGEModel:
        data, recipe, fitted = self.data, self.run.recipe, self.run.fitted_standardizer
        num_layers, hidden_in = data.train_x.shape[-2], data.train_x.shape[-1]
        model = build_model(self.config, num_layers, hidden_in, data.task_kind, data.num_classes, data.score_range)
        if recipe.standardize and fitted is not None:
            model.standardizer.load_state_dict(fitted.state_dict())
        elif recipe.standardize:
            model.standardizer.fit(data.train_x)
        model = model.to(self.device)
        if self.device.type != "cpu":  # stays float16 if cached as float16
            data.train_x, data.val_x = data.train_x.to(self.device), data.val_x.to(self.device)
            data.train_y = data.train_y.to(self.device)
        return model

    def train_epoch(self, model: nn.Module, optimizer: torch.optim.Optimizer, generator: torch.Generator) -> float:
        train_x = self.data.train_x
        order = torch.randperm(train_x.shape[0], generator=generator).to(train_x.device)
        return _train_one_epoch(
            cast(ILGEModel, model), optimizer, train_x, self.data.train_y, order, self.config.batch_size, self.device
        )

    def validate(self, model: nn.Module) -> dict[str, float]:
        model = cast(ILGEModel, model)
        return task_metrics(model, predict_logits(model, self.data.val_x, device=self.device), self.data.val_y)


def train_prepared(config: EncoderConfig, data: PreparedData, run: RunSettings) -> TrainResult:
    """Train on data checked by :func:`prepare_data`."""
    return run_epochs(config, SequenceTask(config, data, run), run)


class TrainOptions(TypedDict, total=False):
    """How :func:`train_encoder` and :func:`select_best_layer` train, each key absent for its default: what the
    labels are (``task_kind``, ``num_classes``, ``score_range``) and the run (``seed``, ``device``, ``recipe``,
    ``progress``), as :func:`train_encoder` describes them."""

    task_kind: str
    num_classes: int | None
    score_range: tuple[float, float] | None
    seed: int
    device: str | torch.device
    recipe: TrainingRecipe
    progress: bool


def _labels_and_run(
    caller: str, options: TrainOptions, epoch_callback: Callable[[int, float], Any] | None = None
) -> tuple[str, int | None, tuple[float, float] | None, RunSettings]:
    """``options`` as the task kind, class count and score range, and the run's settings (its recipe resolved);
    a key that is not a :class:`TrainOptions` key is refused, never ignored."""
    unknown = sorted(set(options) - set(TrainOptions.__annotations__))
    if unknown:
        raise TypeError(f"{caller}() got unexpected keyword arguments: {', '.join(unknown)}")
    task_kind = options.get("task_kind", "classification")
    seed, device, progress = options.get("seed", 0), options.get("device", "cpu"), options.get("progress", False)
    recipe = options.get("recipe", DEFAULT_RECIPE).resolved(task_kind)
    run = RunSettings(seed=seed, device=device, recipe=recipe, epoch_callback=epoch_callback, progress=progress)
    return task_kind, options.get("num_classes"), options.get("score_range"), run


def select_best_layer(
    config: BestLayerConfig,
    train: Dataset,
    val: Dataset,
    *,
    layers: Sequence[int] | None = None,
    **options: Unpack[TrainOptions],
) -> tuple[int, TrainResult, list[float]]:
    """Train one linear probe per layer with the engine; keep the best on validation.

    The choice uses only the validation set (never test); ties go to the lower
    layer index. The data are validated once, not once per layer. Arguments
    are those of :func:`train_encoder`, plus ``layers``, the candidate indices
    (default: every layer); ``config.layer`` is ignored.

    Returns:
        ``(layer, result, scores)``: the chosen layer (in ``[0, L)``), its
        :class:`TrainResult`, and the best validation metric of every candidate
        layer in ``layers`` order (for plots of score against depth).
    """
    if not isinstance(config, BestLayerConfig):
        raise ValueError(f"select_best_layer needs a BestLayerConfig, got {type(config).__name__}")
    task_kind, num_classes, score_range, run = _labels_and_run("select_best_layer", options)
    features, train_probe = _probe_trainer(train, val, task_kind, num_classes, score_range)
    num_layers = features.shape[-2]
    candidates = _candidate_layers(layers, num_layers)
    maximise = run.recipe.selection_metric != "loss"
    standardizer = FeatureStandardizer(num_layers, features.shape[-1]).fit(features)  # once, not per probe
    best: tuple[int, TrainResult] | None = None
    scores: list[float] = []
    probe_run = replace(run, progress=False, fitted_standardizer=standardizer)  # the bar counts probes, not epochs
    for layer in steps(candidates, BarSpec("best-layer probes", unit="probe", enabled=run.progress, transient=True)):
        layer = layer % num_layers
        result = train_probe(config.replace(layer=layer), probe_run)
        scores.append(result.best_val_metric)
        better = (
            (
                result.best_val_metric > best[1].best_val_metric
                if maximise
                else result.best_val_metric < best[1].best_val_metric
            )
            if best is not None
            else True
        )
        if better:
            best = (layer, result)
    assert best is not None  # candidates is not empty
    return best[0], best[1], scores


_ProbeTrainer = Callable[[EncoderConfig, RunSettings], TrainResult]


def _probe_trainer(
    train: Dataset,
    val: Dataset,
    task_kind: str,
    num_classes: int | None,
    score_range: tuple[float, float] | None,
) -> tuple[torch.Tensor, _ProbeTrainer]:
    """The training features and a function training one probe on the data, checked once for every probe."""
    if task_kind == TAGGING:
        words = tokens.prepare_words(train, val, num_classes)

        def train_words(probe: EncoderConfig, run: RunSettings) -> TrainResult:
            return tokens.train_prepared_words(probe, words, run)

        return words.train.features, train_words
    data = prepare_data(train, val, task_kind, num_classes, score_range)

    def train_sequences(probe: EncoderConfig, run: RunSettings) -> TrainResult:
        return train_prepared(probe, data, run)

    return data.train_x, train_sequences


def _candidate_layers(layers: Sequence[int] | None, num_layers: int) -> list[int]:
    """The layer indices to probe (default: every layer), each checked to be in range (negative ones count back)."""
    candidates = list(range(num_layers)) if layers is None else [int(layer) for layer in layers]
    if not candidates:
        raise ValueError("layers is empty; pass at least one layer index")
    for layer in candidates:
        if not -num_layers <= layer < num_layers:
            raise ValueError(f"layer {layer} is out of range for {num_layers} layers")
    return candidates
