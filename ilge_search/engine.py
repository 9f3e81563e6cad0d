"""The one training engine.

Every model in the project (``ILGEClassifier``, each study trial, each layer
baseline, each final evaluation) is trained by :func:`train_encoder`:

- data are in-memory tensors of per-layer embeddings, ``(N, L, D)`` for
  classification and ``(N, 2, L, D)`` for sentence pairs, usually float16 from
  the embedding cache. A batch is an index slice of a seeded permutation and is
  upcast to float32 on its own; the whole set is never copied or upcast.
- Adam (or AdamW) with the config's weight decay, ReduceLROnPlateau on the
  validation metric, early stopping, and the best epoch's weights restored.
- ``epoch_callback(epoch, val_metric)`` runs after every epoch; the study
  runner raises ``optuna.TrialPruned`` from it and the exception propagates.
- Seeded and deterministic on CPU: the same seed and data give the same
  metrics and weights, and the caller's global RNG state is left untouched.

Task kinds:

- ``"classification"``: aggregator -> linear head -> cross-entropy; metrics
  ``accuracy`` and ``macro_f1``.
- ``"similarity"``: one shared aggregator and a linear projection embed both
  sentences, their cosine is regressed (MSE) on the gold score min-max
  normalised to ``[0, 1]``; metrics ``spearman`` and ``pearson``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from .configs import BestLayerConfig, EncoderConfig
from .models import resolve_device
from .validation import check_int

if TYPE_CHECKING:  # pragma: no cover - the aggregator pulls in PyTorch Geometric, imported lazily
    from .aggregator import Aggregator

__all__ = [
    "FeatureStandardizer",
    "ILGEModel",
    "TrainResult",
    "train_encoder",
    "TrainingRecipe",
    "evaluate",
    "predict_logits",
    "select_best_layer",
    "spearman",
    "pearson",
    "macro_f1",
    "TASK_KINDS",
    "METRICS",
]

TASK_KINDS = ("classification", "similarity")
# metrics per task kind; the first one is the default selection metric. "loss" is minimised, the rest maximised.
METRICS = {
    "classification": ("accuracy", "macro_f1", "loss"),
    "similarity": ("spearman", "pearson", "loss"),
}
EVAL_BATCH_SIZE = 1024

ArrayLike = Union[torch.Tensor, np.ndarray]
Dataset = Tuple[ArrayLike, ArrayLike]  # (features, labels)


# --------------------------------------------------------------------------- model


class FeatureStandardizer(nn.Module):
    """Per-(layer, dimension) z-scoring with statistics of the training set.

    LLM hidden states carry a few "massive activation" dimensions (SmolLM2's
    early layers reach values in the thousands) that swamp every other
    feature; without standardisation the encoders barely train on them. The
    statistics are buffers, so a saved model applies the same transform.
    Before :meth:`fit` it is the identity.

    Shapes:
        - input: ``(..., num_layers, hidden_in)``
        - output: same shape, float32
    """

    mean: torch.Tensor
    inv_std: torch.Tensor

    def __init__(self, num_layers: int, hidden_in: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.num_layers = num_layers
        self.hidden_in = hidden_in
        self.eps = eps
        self.register_buffer("mean", torch.zeros(num_layers, hidden_in))
        self.register_buffer("inv_std", torch.ones(num_layers, hidden_in))

    @torch.no_grad()
    def fit(self, features: torch.Tensor, chunk_size: int = 4096) -> "FeatureStandardizer":
        """Set the statistics from ``features`` ``(..., L, D)``, reading it in float64 chunks."""
        flat = features.reshape(-1, self.num_layers, self.hidden_in)  # pairs: both sentences count
        total = torch.zeros(self.num_layers, self.hidden_in, dtype=torch.float64)
        total_sq = torch.zeros_like(total)
        for start in range(0, flat.shape[0], chunk_size):
            chunk = flat[start : start + chunk_size].to(torch.float64).cpu()
            total += chunk.sum(0)
            total_sq += chunk.square().sum(0)
        n = flat.shape[0]
        mean = total / n
        var = (total_sq / n - mean.square()).clamp_min(0.0)
        self.mean.copy_(mean.to(self.mean))
        self.inv_std.copy_((var.sqrt() + self.eps).reciprocal().to(self.inv_std))
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-2:] != self.mean.shape:
            return x  # let the aggregator report the shape error
        return (x.float() - self.mean) * self.inv_std

    def extra_repr(self) -> str:
        return f"num_layers={self.num_layers}, hidden_in={self.hidden_in}"


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
        score_range: Optional[Tuple[float, float]] = None,
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
    num_classes: Optional[int] = None,
    score_range: Optional[Tuple[float, float]] = None,
) -> ILGEModel:
    """Build an untrained :class:`ILGEModel` (uses the global torch RNG for init)."""
    from .aggregator import build_aggregator  # lazy: pulls in PyTorch Geometric

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


# --------------------------------------------------------------------------- results


@dataclass
class TrainResult:
    """What one training run produced.

    Attributes:
        model: the trained :class:`ILGEModel` with the best epoch's weights, in eval mode.
        best_epoch: epoch (counted from 1) whose weights were kept.
        epochs_run: epochs actually run (early stopping may end before ``config.epochs``).
        best_val_metric: the selection metric at ``best_epoch``.
        selection_metric: its name (``"accuracy"``, ``"spearman"``, ``"loss"``...).
        history: one dict per epoch: ``epoch``, ``train_loss``, ``val_loss``,
            ``val_<metric>`` for each metric of the task, ``lr``.
        num_trainable_params: trainable parameters of aggregator plus head.
        seconds: wall time of the run.
    """

    model: ILGEModel
    best_epoch: int
    epochs_run: int
    best_val_metric: float
    selection_metric: str
    history: List[Dict[str, float]] = field(default_factory=list)
    num_trainable_params: int = 0
    seconds: float = 0.0


# --------------------------------------------------------------------------- metrics


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties get the mean of the ranks they span."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    last_rank = np.cumsum(counts)
    average_rank = last_rank - (counts - 1) / 2.0
    return average_rank[inverse.reshape(-1)]


def pearson(x: ArrayLike, y: ArrayLike) -> float:
    """Pearson correlation; 0.0 when either vector is constant (undefined)."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if x.shape != y.shape:
        raise ValueError(f"pearson: vectors differ in length ({x.size} vs {y.size})")
    x = x - x.mean()
    y = y - y.mean()
    denom = math.sqrt(float((x * x).sum()) * float((y * y).sum()))
    return float((x * y).sum() / denom) if denom > 0 else 0.0


def spearman(x: ArrayLike, y: ArrayLike) -> float:
    """Spearman rank correlation (ties averaged); 0.0 when either vector is constant."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    return pearson(_average_ranks(x), _average_ranks(y))


def macro_f1(y_true: ArrayLike, y_pred: ArrayLike) -> float:
    """Unweighted mean of per-class F1 over the classes present in ``y_true`` or ``y_pred``."""
    y_true = torch.as_tensor(y_true).long().reshape(-1)
    y_pred = torch.as_tensor(y_pred).long().reshape(-1)
    num_classes = int(max(y_true.max(), y_pred.max())) + 1
    tp = torch.bincount(y_true[y_true == y_pred], minlength=num_classes).double()
    true_count = torch.bincount(y_true, minlength=num_classes).double()
    pred_count = torch.bincount(y_pred, minlength=num_classes).double()
    present = (true_count + pred_count) > 0
    f1 = 2 * tp[present] / (true_count[present] + pred_count[present])  # 2tp / (2tp + fp + fn)
    return float(f1.mean())


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
    _check_finite(features, name)
    return features


def _check_finite(features: torch.Tensor, name: str, chunk: int = 4096) -> None:
    # chunked so that a large float16 cache never needs a full-size boolean copy
    for start in range(0, features.shape[0], chunk):
        if not torch.isfinite(features[start : start + chunk]).all():
            raise ValueError(
                f"{name} features contain NaN or inf (first bad block starts at row {start}); "
                "the embedding cache may be corrupt: clear it and extract again"
            )


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


def _batches(num_rows: int, batch_size: int, order: Optional[torch.Tensor] = None):
    for start in range(0, num_rows, batch_size):
        if order is None:
            yield slice(start, start + batch_size)
        else:
            yield order[start : start + batch_size]


@torch.no_grad()
def predict_logits(
    model: ILGEModel,
    features: ArrayLike,
    device: Union[str, torch.device, None] = None,
    batch_size: int = EVAL_BATCH_SIZE,
) -> torch.Tensor:
    """Model outputs on CPU, float32: logits ``(N, C)`` or cosine similarities ``(N,)``.

    Runs in eval mode and restores the model's previous mode afterwards.
    """
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


def _metrics(model: ILGEModel, outputs: torch.Tensor, labels: torch.Tensor) -> Dict[str, float]:
    if model.task_kind == "classification":
        predicted = outputs.argmax(dim=1)
        loss = nn.functional.cross_entropy(outputs, labels.long())
        return {
            "loss": float(loss),
            "accuracy": float((predicted == labels).double().mean()),
            "macro_f1": macro_f1(labels, predicted),
        }
    out = {"spearman": spearman(outputs, labels), "pearson": pearson(outputs, labels)}
    if model.score_range is not None:
        out["loss"] = float(nn.functional.mse_loss(outputs, model.normalise_scores(labels.float())))
    return out


def evaluate(
    model: ILGEModel,
    features: ArrayLike,
    labels: ArrayLike,
    task_kind: Optional[str] = None,
    device: Union[str, torch.device, None] = None,
    batch_size: int = EVAL_BATCH_SIZE,
) -> Dict[str, float]:
    """Metrics of ``model`` on a labelled set.

    Returns ``{"accuracy", "macro_f1", "loss"}`` for classification and
    ``{"spearman", "pearson", "loss"}`` for similarity (``loss`` only when the
    model knows its score range).
    """
    task_kind = task_kind or model.task_kind
    if task_kind != model.task_kind:
        raise ValueError(f"model was trained for {model.task_kind!r}, not {task_kind!r}")
    features = _as_features(features, task_kind, "evaluation")
    labels = _as_labels(labels, features.shape[0], task_kind, "evaluation")
    if task_kind == "classification":
        num_classes = int(model.head.out_features)
        _check_label_range(labels, num_classes, "evaluation")
    outputs = predict_logits(model, features, device=device, batch_size=batch_size)
    return _metrics(model, outputs, labels)


def _check_label_range(labels: torch.Tensor, num_classes: int, name: str) -> None:
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= num_classes:
        raise ValueError(f"{name} labels must be class ids in [0, {num_classes}), found values in [{low}, {high}]")


# --------------------------------------------------------------------------- training


@dataclass(frozen=True)
class TrainingRecipe:
    """How the engine trains beyond what an encoder config says (its ``lr``, ``weight_decay``,
    ``batch_size`` and ``epochs``).

    Attributes:
        patience: stop after this many epochs without a better validation metric (``None``: never early).
        lr_patience, lr_factor: ReduceLROnPlateau on the validation metric.
        selection_metric: metric for early stopping, the LR schedule and the best epoch; default
            ``"accuracy"`` / ``"spearman"``; ``"loss"`` is minimised.
        optimizer: ``"adam"`` (L2 weight decay) or ``"adamw"`` (decoupled).
        standardize: z-score every (layer, dimension) with training-set statistics (stored in the model)
            before the aggregator.
    """

    patience: Optional[int] = 10
    lr_patience: int = 3
    lr_factor: float = 0.5
    selection_metric: Optional[str] = None
    optimizer: str = "adam"
    standardize: bool = True

    def resolved(self, task_kind: str) -> "TrainingRecipe":
        """The recipe checked for ``task_kind``, with its selection metric filled in."""
        metric = _check_options(task_kind, self.selection_metric, self.optimizer, self.patience)
        return dataclasses.replace(self, selection_metric=metric)


DEFAULT_RECIPE = TrainingRecipe()


def train_encoder(
    config: EncoderConfig,
    train: Dataset,
    val: Dataset,
    *,
    task_kind: str = "classification",
    num_classes: Optional[int] = None,
    score_range: Optional[Tuple[float, float]] = None,
    seed: int = 0,
    device: Union[str, torch.device] = "cpu",
    recipe: TrainingRecipe = DEFAULT_RECIPE,
    epoch_callback: Optional[Callable[[int, float], Any]] = None,
    progress: bool = False,
) -> TrainResult:
    """Train an aggregator from ``config`` plus its head; return the best epoch's model.

    Args:
        config: any encoder family or baseline config. Its ``lr``,
            ``weight_decay``, ``batch_size`` and ``epochs`` are the recipe.
        train, val: ``(features, labels)``. Features are ``(N, L, D)``
            (classification) or ``(N, 2, L, D)`` (similarity), any float dtype;
            labels are class ids or gold similarity scores.
        task_kind: ``"classification"`` or ``"similarity"``.
        num_classes: number of classes (default: largest label in train/val + 1).
        score_range: ``(low, high)`` of the similarity scale, e.g. ``(0, 5)`` for
            STS-B (default: min and max of the training scores).
        seed: seeds model init, dropout and batch order.
        device: ``"cpu"``, ``"cuda"``, ``"auto"``...
        recipe: early stopping, LR schedule, selection metric, optimizer and
            standardisation (:class:`TrainingRecipe`).
        epoch_callback: ``f(epoch, val_metric)`` after each epoch (epochs count
            from 1); exceptions such as ``optuna.TrialPruned`` propagate.
        progress: show a tqdm bar over epochs.
    """
    recipe = recipe.resolved(task_kind)
    prepared = _prepare_data(train, val, task_kind, num_classes, score_range)
    return _train_prepared(
        config,
        prepared,
        _Run(seed=seed, device=device, recipe=recipe, epoch_callback=epoch_callback, progress=progress),
    )


def _check_options(task_kind: str, selection_metric: Optional[str], optimizer: str, patience: Optional[int]) -> str:
    """Validate the training options; return the resolved selection metric."""
    _check_task_kind(task_kind)
    selection_metric = selection_metric or METRICS[task_kind][0]
    if selection_metric not in METRICS[task_kind]:
        raise ValueError(
            f"selection_metric for {task_kind!r} must be one of {list(METRICS[task_kind])}, got {selection_metric!r}"
        )
    if optimizer not in ("adam", "adamw"):
        raise ValueError(f"optimizer must be 'adam' or 'adamw', got {optimizer!r}")
    check_int("patience", patience, allow_none=True)
    return selection_metric


@dataclass
class _PreparedData:
    task_kind: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    num_classes: Optional[int]
    score_range: Optional[Tuple[float, float]]


def _prepare_data(
    train: Dataset, val: Dataset, task_kind: str, num_classes: Optional[int], score_range: Optional[Tuple[float, float]]
) -> _PreparedData:
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
        _check_label_range(train_y, num_classes, "train")
        _check_label_range(val_y, num_classes, "validation")
    else:
        if score_range is None:
            score_range = (float(train_y.min()), float(train_y.max()))
        if not score_range[1] > score_range[0]:
            raise ValueError(f"score_range must be (low, high) with high > low, got {score_range!r}")

    return _PreparedData(task_kind, train_x, train_y, val_x, val_y, num_classes, score_range)


def _loss(model: ILGEModel, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
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
        loss = _loss(model, model(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss_sum += loss.detach() * len(yb)
    return float(loss_sum) / len(order)


@dataclass(frozen=True)
class _Run:
    """One training run's settings besides the config and the data."""

    seed: int
    device: Union[str, torch.device]
    recipe: TrainingRecipe  # resolved: its selection metric is set
    epoch_callback: Optional[Callable[[int, float], Any]] = None
    progress: bool = False
    fitted_standardizer: Optional["FeatureStandardizer"] = None


def _train_prepared(config: EncoderConfig, data: _PreparedData, run: _Run) -> TrainResult:
    """Train on prepared data. ``run.fitted_standardizer`` (statistics already computed on
    ``data.train_x``) saves callers that train many models on one set from refitting it."""
    recipe, seed, epoch_callback = run.recipe, run.seed, run.epoch_callback
    selection_metric, optimizer, standardize = recipe.selection_metric, recipe.optimizer, recipe.standardize
    patience, fitted_standardizer = recipe.patience, run.fitted_standardizer
    task_kind, num_classes, score_range = data.task_kind, data.num_classes, data.score_range
    train_x, train_y, val_x, val_y = data.train_x, data.train_y, data.val_x, data.val_y
    num_layers, hidden_in = train_x.shape[-2], train_x.shape[-1]
    device = resolve_device(run.device)
    maximise = selection_metric != "loss"
    started = time.perf_counter()
    rng_devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=rng_devices):
        torch.manual_seed(seed)
        model = build_model(config, num_layers, hidden_in, task_kind, num_classes, score_range)
        if standardize and fitted_standardizer is not None:
            model.standardizer.load_state_dict(fitted_standardizer.state_dict())
        elif standardize:
            model.standardizer.fit(train_x)
        model = model.to(device)
        generator = torch.Generator().manual_seed(seed)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer_cls = torch.optim.AdamW if optimizer == "adamw" else torch.optim.Adam
        opt = optimizer_cls(params, lr=config.lr, weight_decay=config.weight_decay)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
            opt, mode="max" if maximise else "min", factor=recipe.lr_factor, patience=recipe.lr_patience
        )
        if device.type != "cpu":
            train_x, val_x = train_x.to(device), val_x.to(device)  # stays float16 if cached as float16
            train_y = train_y.to(device)

        history: List[Dict[str, float]] = []
        best_metric, best_epoch, best_state = -math.inf if maximise else math.inf, 0, None
        epochs = tqdm(range(1, config.epochs + 1), desc=f"train {config.family}", disable=not run.progress, leave=False)
        for epoch in epochs:
            order = torch.randperm(train_x.shape[0], generator=generator).to(train_x.device)
            train_loss = _train_one_epoch(model, opt, train_x, train_y, order, config.batch_size, device)

            val_metrics = _metrics(model, predict_logits(model, val_x, device=device), val_y)
            metric = val_metrics[str(selection_metric)]
            record = {"epoch": epoch, "train_loss": train_loss}
            record.update({f"val_{name}": value for name, value in val_metrics.items()})
            record["lr"] = opt.param_groups[0]["lr"]
            history.append(record)
            scheduler.step(metric)

            improved = metric > best_metric if maximise else metric < best_metric
            if improved or best_state is None:
                best_metric, best_epoch = metric, epoch
                best_state = copy.deepcopy(model.state_dict())
            epochs.set_postfix(
                {"train_loss": f"{record['train_loss']:.4f}", f"val_{selection_metric}": f"{metric:.4f}"}
            )
            if epoch_callback is not None:
                epoch_callback(epoch, metric)
            if patience is not None and epoch - best_epoch >= patience:
                break

    assert best_state is not None  # the first epoch always sets it
    model.load_state_dict(best_state)
    model.eval()
    return TrainResult(
        model=model,
        best_epoch=best_epoch,
        epochs_run=len(history),
        best_val_metric=float(best_metric),
        selection_metric=str(selection_metric),
        history=history,
        num_trainable_params=sum(p.numel() for p in model.parameters() if p.requires_grad),
        seconds=time.perf_counter() - started,
    )


def select_best_layer(
    config: BestLayerConfig,
    train: Dataset,
    val: Dataset,
    *,
    layers: Optional[Sequence[int]] = None,
    task_kind: str = "classification",
    num_classes: Optional[int] = None,
    score_range: Optional[Tuple[float, float]] = None,
    seed: int = 0,
    device: Union[str, torch.device] = "cpu",
    recipe: TrainingRecipe = DEFAULT_RECIPE,
    progress: bool = False,
) -> Tuple[int, TrainResult, List[float]]:
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
    recipe = recipe.resolved(task_kind)
    data = _prepare_data(train, val, task_kind, num_classes, score_range)
    num_layers = data.train_x.shape[-2]
    candidates = list(range(num_layers)) if layers is None else [int(layer) for layer in layers]
    if not candidates:
        raise ValueError("layers is empty; pass at least one layer index")
    for layer in candidates:
        if not -num_layers <= layer < num_layers:
            raise ValueError(f"layer {layer} is out of range for {num_layers} layers")
    maximise = recipe.selection_metric != "loss"
    standardizer = FeatureStandardizer(num_layers, data.train_x.shape[-1]).fit(data.train_x)  # once, not per probe
    best: Optional[Tuple[int, TrainResult]] = None
    scores: List[float] = []
    for layer in tqdm(candidates, desc="best-layer probes", disable=not progress, leave=False):
        layer = layer % num_layers
        run = _Run(seed=seed, device=device, recipe=recipe, fitted_standardizer=standardizer)
        result = _train_prepared(config.replace(layer=layer), data, run)
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
