"""Several models of one architecture trained together, in one pass over one problem's data.

:func:`train_many` takes a list of (config, seed) jobs on one training and validation set and returns
the :class:`~ilge_search.engine.TrainResult` each job's :func:`~ilge_search.engine.train_encoder` run
would return: the same model class with its best epoch's weights, in eval mode, its history and best
epoch. Jobs whose configs differ only in ``lr``, ``weight_decay``, ``dropout`` and ``epochs`` share a
pass: their parameters are stacked and one :func:`torch.func.vmap` over
:func:`torch.func.functional_call` runs every model's batch at once. Each model keeps what a run of its
own has: the initialisation its seed draws, its batch order (its own generator), its own optimizer and
plateau schedule, its own early stopping (a stopped model leaves the stack and no longer changes) and its
best epoch restored.

On CPU a pass reproduces the one-at-a-time runs, dropout included: every model's dropout masks are drawn
from a generator that holds the global RNG state its own run would have, with the kernel its own run
would use, in the same order (the masks are made before each step and replayed into the vmapped forward by
:class:`DropoutReplay`). What differs is the order of floating-point sums in the batched matrix products.
On a GPU the masks are drawn from one generator per model, so they equal a run of its own in distribution
only.

What a pass cannot batch trains one at a time, unchanged: tagging tasks, families outside
those whose spec says ``batched`` (a registered family may draw random numbers a pass would not replay), a
best-layer config whose layer is still to choose, and a job alone in its group.
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.overrides import TorchFunctionMode

from ..embeddings.models import resolve_device
from ..encoders import encoder_spec
from ..encoders.configs import BestLayerConfig, EncoderConfig
from .core import (
    EVAL_BATCH_SIZE,
    Dataset,
    ILGEModel,
    PreparedData,
    SequenceTask,
    prepare_data,
    task_loss,
    task_metrics,
    train_encoder,
    train_prepared,
)
from .loop import DEFAULT_RECIPE, TAGGING, TASK_KINDS, RunSettings, TrainingRecipe, TrainResult
from .stacked import AdamSettings, StackedAdam
from .standardizer import FeatureStandardizer

__all__ = [
    "TRAINING_FIELDS",
    "ModelJob",
    "DropoutReplay",
    "SharedSparseProduct",
    "StackedLinear",
    "can_batch",
    "pass_key",
    "train_many",
]

# config fields the models of one pass may differ in: each model has its own optimizer, masks and epoch cap
TRAINING_FIELDS = ("lr", "weight_decay", "dropout", "epochs")
# at most this many float32 values of standardised training features are kept for a whole pass
PRESTANDARDISE_LIMIT = 1 << 28
# a validation chunk holds about this many (model, row) pairs
EVAL_ROWS_PER_CHUNK = 4 * EVAL_BATCH_SIZE


@dataclass(frozen=True)
class ModelJob:
    """One model to train: its config and its seed (initialisation, dropout and batch order)."""

    config: EncoderConfig
    seed: int


def can_batch(config: EncoderConfig, task_kind: str) -> bool:
    """Whether a model of ``config`` can train in a pass with others (else it trains on its own)."""
    if task_kind not in TASK_KINDS or not encoder_spec(config.family).batched:
        return False
    return not (isinstance(config, BestLayerConfig) and config.layer is None)


def pass_key(config: EncoderConfig) -> tuple:
    """Configs with equal keys build models of the same shapes and walk the data in the same batches."""
    fields = config.to_dict()
    for name in TRAINING_FIELDS:
        fields.pop(name, None)
    return tuple(sorted((name, repr(value)) for name, value in fields.items()))


def train_many(
    jobs: Sequence[ModelJob],
    train: Dataset,
    val: Dataset,
    *,
    task_kind: str = "classification",
    num_classes: int | None = None,
    score_range: tuple[float, float] | None = None,
    device: str | torch.device = "cpu",
    recipe: TrainingRecipe = DEFAULT_RECIPE,
) -> list[TrainResult]:
    """Train every job, those that can share a pass together; results in the order of ``jobs``.

    The arguments are those of :func:`~ilge_search.engine.train_encoder` (one seed per job instead of
    ``seed``); each result is what ``train_encoder(job.config, train, val, seed=job.seed, ...)`` returns,
    but ``seconds``, a model's share of its pass.
    """
    recipe = recipe.resolved(task_kind)
    if task_kind == TAGGING:
        options = {"task_kind": task_kind, "num_classes": num_classes, "device": device, "recipe": recipe}
        return [train_encoder(job.config, train, val, seed=job.seed, **options) for job in jobs]  # type: ignore[arg-type]
    data = prepare_data(train, val, task_kind, num_classes, score_range)
    results: list[TrainResult | None] = [None] * len(jobs)
    for indices in _groups(jobs, task_kind):
        group = [jobs[i] for i in indices]
        if len(group) == 1:
            run = RunSettings(seed=group[0].seed, device=device, recipe=recipe)
            trained = [train_prepared(group[0].config, data, run)]
        else:
            trained = _Pass(group, data, PassSettings(resolve_device(device), recipe)).train()
        for index, result in zip(indices, trained, strict=True):
            results[index] = result
    return [result for result in results if result is not None]


def _groups(jobs: Sequence[ModelJob], task_kind: str) -> list[list[int]]:
    """Job indices grouped by pass key, in order of first appearance; jobs that cannot batch alone."""
    groups: dict[Any, list[int]] = {}
    for index, job in enumerate(jobs):
        key = pass_key(job.config) if can_batch(job.config, task_kind) else ("alone", index)
        groups.setdefault(key, []).append(index)
    return list(groups.values())


# --------------------------------------------------------------------------- dropout replay


def _dropout_arguments(args: tuple, kwargs: dict) -> tuple[torch.Tensor, float, bool]:
    """``(input, p, training)`` of a call ``torch.nn.functional.dropout(input, p=0.5, training=True, ...)``."""
    bound: dict[str, Any] = {"p": 0.5, "training": True}
    bound.update(zip(("input", "p", "training"), args[:3], strict=False))
    bound.update(kwargs)
    return bound["input"], float(bound["p"]), bool(bound["training"])


class DropoutReplay(TorchFunctionMode):
    """While active, stands in for ``torch.nn.functional.dropout`` in training mode (``nn.Dropout`` calls it).

    With ``masks`` unset it records each call's input shape and rate in ``calls`` and returns the input
    unchanged, drawing nothing; with ``masks`` set it multiplies the input of the i-th call by the i-th mask
    (``None``: the input unchanged), as dropout multiplies it by its scaled Bernoulli noise.
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[tuple[int, ...], float]] = []
        self.masks: Sequence[torch.Tensor | None] | None = None
        self.position = 0

    def replay(self, masks: Sequence[torch.Tensor | None]) -> None:
        """Replay ``masks`` from the first call on."""
        self.masks, self.position = masks, 0

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.sparse.mm and len(args) == 2 and not kwargs:
            return SharedSparseProduct.apply(*args)
        if func is nn.functional.linear:
            return StackedLinear.apply(*_linear_arguments(args, kwargs))
        if func is not nn.functional.dropout:
            return func(*args, **kwargs)
        x, p, training = _dropout_arguments(args, kwargs)
        if not training:
            return func(*args, **kwargs)
        if self.masks is None:
            self.calls.append((tuple(x.shape), p))
            return x
        mask = self.masks[self.position]
        self.position += 1
        return x if mask is None else x * mask


class SharedSparseProduct(torch.autograd.Function):
    """``torch.sparse.mm(adjacency, x)``, which under :func:`torch.func.vmap` over ``x`` alone (one graph, every
    model's node states) is one product of the block-diagonal adjacency (a copy per model) with every model's
    node states stacked as rows, where vmap's fallback would loop over the models. Stacking rows keeps each
    model's states contiguous, so the operations around the product need no transposed copies."""

    generate_vmap_rule = False

    @staticmethod
    def forward(adjacency: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.sparse.mm(adjacency, x)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        ctx.adjacency = inputs[0]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        return None, torch.sparse.mm(_transposed(ctx.adjacency), grad)

    @staticmethod
    def vmap(info: Any, in_dims: tuple, adjacency: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        if in_dims[0] is not None:
            raise ValueError("a pass shares one graph between its models; the adjacency must not be batched")
        states = x.movedim(in_dims[1], 0)  # (models, sources, width)
        models, width = states.shape[0], states.shape[-1]
        blocks = _block_diagonal(adjacency, models)
        product = SharedSparseProduct.apply(blocks, states.reshape(-1, width))
        return product.view(models, adjacency.shape[0], width), 0


# block-diagonal copies and transposes of the few adjacencies a pass uses, keyed by the tensor they come from
_SPARSE_MEMO: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
_SPARSE_MEMO_SIZE = 32


def _memo(adjacency: torch.Tensor, copies: int, build: Callable[[], torch.Tensor]) -> torch.Tensor:
    key = (id(adjacency), copies)
    held = _SPARSE_MEMO.get(key)
    if held is None or held[0] is not adjacency:  # an id may be reused once its tensor is gone
        if len(_SPARSE_MEMO) >= _SPARSE_MEMO_SIZE:
            _SPARSE_MEMO.pop(next(iter(_SPARSE_MEMO)))
        held = _SPARSE_MEMO[key] = (adjacency, build())
    return held[1]


def _block_diagonal(adjacency: torch.Tensor, copies: int) -> torch.Tensor:
    """``copies`` copies of a CSR matrix on the diagonal of one CSR matrix (model ``m``'s rows and columns
    follow model ``m - 1``'s)."""

    def build() -> torch.Tensor:
        csr = adjacency.to_sparse_csr()
        rows, columns = csr.shape
        crow, col, values = csr.crow_indices(), csr.col_indices(), csr.values()
        offsets = torch.arange(copies, device=crow.device)
        block_crow = torch.cat([crow[:1], (crow[1:].unsqueeze(0) + offsets.unsqueeze(1) * crow[-1]).reshape(-1)])
        block_col = (col.unsqueeze(0) + offsets.unsqueeze(1) * columns).reshape(-1)
        size = (rows * copies, columns * copies)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "sparse CSR support is in beta state"
            return torch.sparse_csr_tensor(block_crow, block_col, values.repeat(copies), size)

    return adjacency if copies == 1 else _memo(adjacency, copies, build)


def _transposed(adjacency: torch.Tensor) -> torch.Tensor:
    """The CSR transpose of an adjacency, made once (autograd would sort it again at every step)."""

    def build() -> torch.Tensor:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return adjacency.t().to_sparse_csr()

    return _memo(adjacency, 0, build)


def _linear_arguments(args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    bound: dict[str, Any] = {"bias": None}
    bound.update(zip(("input", "weight", "bias"), args[:3], strict=False))
    bound.update(kwargs)
    return bound["input"], bound["weight"], bound["bias"]


class StackedLinear(torch.autograd.Function):
    """``torch.nn.functional.linear``, which under :func:`torch.func.vmap` over stacked weights is one batched
    product with the bias added in it (``baddbmm``), or, for input shared by every model (validation), one
    product with every model's weights side by side, where vmap's own rule multiplies, then adds."""

    generate_vmap_rule = False

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return nn.functional.linear(x, weight, bias)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        ctx.save_for_backward(inputs[0], inputs[1])
        ctx.has_bias = inputs[2] is not None

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        x, weight = ctx.saved_tensors
        rows = grad.reshape(-1, grad.shape[-1])
        grad_weight = rows.t() @ x.reshape(-1, x.shape[-1])
        return grad @ weight, grad_weight, rows.sum(0) if ctx.has_bias else None

    @staticmethod
    def vmap(info: Any, in_dims: tuple, x: torch.Tensor, weight: torch.Tensor, bias: Any) -> tuple[torch.Tensor, int]:
        x_dim, weight_dim, bias_dim = in_dims
        if weight_dim is None or (bias is not None and bias_dim is None):
            raise ValueError("a pass stacks every model's weights and biases")
        weight = weight.movedim(weight_dim, 0)  # (models, out, in)
        models, width = weight.shape[0], weight.shape[1]
        stacked_bias = None if bias is None else bias.movedim(bias_dim, 0)  # (models, out)
        if x_dim is None:  # the same rows for every model
            flat = x.reshape(-1, x.shape[-1])
            every = weight.reshape(models * width, -1).t()
            out = flat @ every if stacked_bias is None else torch.addmm(stacked_bias.reshape(-1), flat, every)
            return out.view(*x.shape[:-1], models, width), x.dim() - 1
        rows = x.movedim(x_dim, 0)  # (models, ..., in)
        flat = rows.reshape(models, -1, rows.shape[-1])
        if stacked_bias is None:
            out = torch.bmm(flat, weight.transpose(1, 2))
        else:
            out = torch.baddbmm(stacked_bias.unsqueeze(1), flat, weight.transpose(1, 2))
        return out.view(*rows.shape[:-1], width), 0


def _draw_mask(out: torch.Tensor, p: float, generator: torch.Generator) -> None:
    """Fill ``out`` with the scaled Bernoulli noise CPU dropout multiplies its input by
    (``torch.nn.functional.dropout``)."""
    if p == 0:
        out.fill_(1.0)
    else:
        out.bernoulli_(1 - p, generator=generator).div_(1 - p)


@dataclass(frozen=True)
class _DropoutSite:
    """One dropout call of a forward: its input's shape and each model's rate."""

    shape: tuple[int, ...]
    rates: tuple[float, ...]


def _dropout_sites(models: Sequence[ILGEModel], batch: torch.Tensor) -> list[_DropoutSite]:
    """The dropout calls one training forward of ``batch`` makes, the same for every model of a pass."""
    recorded = []
    for model in models:
        recorder = DropoutReplay()
        model.train()
        with torch.no_grad(), recorder:
            model(batch)
        recorded.append(recorder.calls)
    shapes = [[shape for shape, _ in calls] for calls in recorded]
    if any(other != shapes[0] for other in shapes[1:]):
        raise RuntimeError("the models of one pass call dropout on differently shaped inputs")
    return [_DropoutSite(shape, tuple(calls[i][1] for calls in recorded)) for i, shape in enumerate(shapes[0])]


# --------------------------------------------------------------------------- one pass


@dataclass(frozen=True)
class PassSettings:
    """Where a pass runs and the (resolved) recipe every model of it follows."""

    device: torch.device
    recipe: TrainingRecipe


@dataclass
class _Member:
    """One model of a pass and what a run of its own would keep: optimizer, schedule, generators, best epoch."""

    job: ModelJob
    model: ILGEModel
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.ReduceLROnPlateau
    batch_order: torch.Generator
    dropout_rng: torch.Generator
    selection_metric: str
    history: list[dict[str, float]] = field(default_factory=list)
    best_metric: float = math.nan
    best_epoch: int = 0
    best_state: dict[str, torch.Tensor] | None = None
    stopped: bool = False

    def end_epoch(self, epoch: int, train_loss: float, val_metrics: dict[str, float], recipe: TrainingRecipe) -> None:
        """Record the epoch, step the schedule, keep the weights if they are the best, stop if patience ran out;
        as :func:`~ilge_search.engine.loop.run_epochs` does after each epoch."""
        metric = val_metrics[self.selection_metric]
        record: dict[str, float] = {"epoch": epoch, "train_loss": train_loss}
        record.update({f"val_{name}": value for name, value in val_metrics.items()})
        record["lr"] = self.optimizer.param_groups[0]["lr"]
        self.history.append(record)
        self.scheduler.step(metric)
        maximise = self.selection_metric != "loss"
        improved = metric > self.best_metric if maximise else metric < self.best_metric
        if improved or self.best_state is None:
            self.best_metric, self.best_epoch = metric, epoch
            self.best_state = copy.deepcopy(self.model.state_dict())
        out_of_patience = recipe.patience is not None and epoch - self.best_epoch >= recipe.patience
        self.stopped = out_of_patience or epoch >= self.job.config.epochs

    def result(self, seconds: float) -> TrainResult:
        """The best epoch's model in eval mode, as a run of its own returns it."""
        assert self.best_state is not None  # the first epoch always sets it
        self.model.load_state_dict(self.best_state)
        self.model.eval()
        return TrainResult(
            model=self.model,
            best_epoch=self.best_epoch,
            epochs_run=len(self.history),
            best_val_metric=float(self.best_metric),
            selection_metric=self.selection_metric,
            history=self.history,
            num_trainable_params=sum(p.numel() for p in self.model.parameters() if p.requires_grad),
            seconds=seconds,
        )


class _Features:
    """A split's features as the models see them after their (shared) standardiser: standardised once for
    the whole pass where that fits in memory, else batch by batch (the same numbers either way)."""

    def __init__(self, features: torch.Tensor, standardizer: nn.Module, device: torch.device) -> None:
        self.features, self.standardizer, self.device = features, standardizer, device
        self.full: torch.Tensor | None = None
        if features.numel() <= PRESTANDARDISE_LIMIT:
            full = torch.empty(features.shape, device=device)
            for start in range(0, features.shape[0], EVAL_BATCH_SIZE):
                full[start : start + EVAL_BATCH_SIZE] = self._standardised(slice(start, start + EVAL_BATCH_SIZE))
            self.full = full

    def rows(self, rows: torch.Tensor | slice) -> torch.Tensor:
        return self.full[rows] if self.full is not None else self._standardised(rows)

    @torch.no_grad()
    def _standardised(self, rows: torch.Tensor | slice) -> torch.Tensor:
        return self.standardizer(self.features[rows].to(device=self.device, dtype=torch.float32))


class _Pass:
    """The models of one group of jobs, trained together epoch by epoch until each has stopped."""

    def __init__(self, jobs: Sequence[ModelJob], data: PreparedData, settings: PassSettings) -> None:
        self.data, self.settings, self.device = data, settings, settings.device
        self.members = self._build(jobs)
        self.template = copy.deepcopy(self.members[0].model)  # runs every model's weights under vmap
        standardizer = self.template.standardizer
        self.template.register_module("standardizer", nn.Identity())  # the features come standardised
        self.train_x = _Features(data.train_x, standardizer, self.device)
        self.val_x = _Features(data.val_x, standardizer, self.device)
        self.sites: dict[int, list[_DropoutSite]] = {}
        self.replay = DropoutReplay()
        self.active = list(self.members)  # the models still training, in the order of the stacked rows
        named = [dict(member.model.named_parameters()) for member in self.members]
        self.params = {
            name: torch.stack([p[name].detach() for p in named]).requires_grad_(named[0][name].requires_grad)
            for name in named[0]
        }
        decays = tuple(float(member.job.config.weight_decay) for member in self.members)
        self.adam = StackedAdam(self.params, AdamSettings(decays, decoupled=settings.recipe.optimizer == "adamw"))

    def _build(self, jobs: Sequence[ModelJob]) -> list[_Member]:
        """Each model initialised as its own run initialises it, from the global RNG seeded with its seed."""

        data, recipe, device = self.data, self.settings.recipe, self.device
        fitted = None
        if recipe.standardize:
            fitted = FeatureStandardizer(data.train_x.shape[-2], data.train_x.shape[-1]).fit(data.train_x)
        members = []
        with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
            for job in jobs:
                torch.manual_seed(job.seed)
                run = RunSettings(seed=job.seed, device=device, recipe=recipe, fitted_standardizer=fitted)
                model = SequenceTask(job.config, data, run).build()
                members.append(self._member(job, model, _dropout_generator(job.seed, device)))
        return members

    def _member(self, job: ModelJob, model: ILGEModel, dropout_rng: torch.Generator) -> _Member:
        recipe, config = self.settings.recipe, job.config
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer_cls = torch.optim.AdamW if recipe.optimizer == "adamw" else torch.optim.Adam
        optimizer = optimizer_cls(params, lr=config.lr, weight_decay=config.weight_decay)
        maximise = recipe.selection_metric != "loss"
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, mode="max" if maximise else "min", factor=recipe.lr_factor, patience=recipe.lr_patience
        )
        return _Member(
            job=job,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            batch_order=torch.Generator().manual_seed(job.seed),
            dropout_rng=dropout_rng,
            selection_metric=str(recipe.selection_metric),
            best_metric=-math.inf if maximise else math.inf,
        )

    def train(self) -> list[TrainResult]:
        started = time.perf_counter()
        for epoch in range(1, max(member.job.config.epochs for member in self.members) + 1):
            if not self.active:
                break
            losses = self._train_epoch()
            self._write_back()
            for member, loss, metrics in zip(self.active, losses, self._validate(), strict=True):
                member.end_epoch(epoch, loss, metrics, self.settings.recipe)
            if any(member.stopped for member in self.active):
                rows = [row for row, member in enumerate(self.active) if not member.stopped]
                self.active = [self.active[row] for row in rows]
                self.params = self.adam.keep_rows(rows)
        share = (time.perf_counter() - started) / len(self.members)
        return [member.result(share) for member in self.members]

    def _write_back(self) -> None:
        """Copy each active model's row of the stacked weights into its own module."""
        with torch.no_grad():
            for row, member in enumerate(self.active):
                for name, param in member.model.named_parameters():
                    param.copy_(self.params[name][row])

    def _train_epoch(self) -> list[float]:
        """One pass over the training data, each model in its own seeded order; each model's mean loss."""
        active = self.active
        num_rows, batch_size = self.data.train_x.shape[0], active[0].job.config.batch_size
        orders = [
            torch.randperm(num_rows, generator=member.batch_order).to(self.data.train_x.device) for member in active
        ]
        self.template.train()
        loss_sum = torch.zeros(len(active), device=self.device)
        for start in range(0, num_rows, batch_size):
            rows = [order[start : start + batch_size] for order in orders]
            loss_sum += self._step(rows) * len(rows[0])
        return [float(value) / num_rows for value in loss_sum]

    def _step(self, rows: Sequence[torch.Tensor]) -> torch.Tensor:
        """One optimizer step of every active model on its own batch; the batch losses."""
        every = torch.cat(list(rows))  # one gather for every model's batch
        x = self.train_x.rows(every).view(len(rows), len(rows[0]), *self.data.train_x.shape[1:])
        y = self.data.train_y[every].view(len(rows), len(rows[0]), *self.data.train_y.shape[1:]).to(self.device)
        masks = self._masks(self.active, len(rows[0]))
        drawn = [mask for mask in masks if mask is not None]  # vmap maps tensors only

        def loss(params: dict[str, torch.Tensor], model_masks: list, xb: torch.Tensor, yb: torch.Tensor) -> Any:
            replayed = iter(model_masks)
            self.replay.replay([None if mask is None else next(replayed) for mask in masks])
            return task_loss(self.template, functional_call(self.template, params, (xb,)), yb)

        for param in self.params.values():
            param.grad = None
        with self.replay:
            losses = vmap(loss, randomness="error")(self.params, drawn, x, y)
        losses.sum().backward()
        self.adam.step([member.optimizer.param_groups[0]["lr"] for member in self.active])
        return losses.detach()

    def _masks(self, active: Sequence[_Member], batch_rows: int) -> list[torch.Tensor | None]:
        """Each dropout call's masks for this step, one per active model, drawn from the model's own generator."""
        if batch_rows not in self.sites:
            probe = torch.zeros((batch_rows, *self.data.train_x.shape[1:]), device=self.device)
            self.sites[batch_rows] = _dropout_sites([member.model for member in self.members], probe)
        index = {id(member): i for i, member in enumerate(self.members)}
        masks: list[torch.Tensor | None] = []
        for site in self.sites[batch_rows]:
            rates = [site.rates[index[id(member)]] for member in active]
            if not any(rates):
                masks.append(None)
                continue
            stacked = torch.empty((len(active), *site.shape), device=self.device)
            for row, (p, member) in enumerate(zip(rates, active, strict=True)):
                _draw_mask(stacked[row], p, member.dropout_rng)
            masks.append(stacked)
        return masks

    @torch.no_grad()
    def _validate(self) -> list[dict[str, float]]:
        """Every active model's metrics on the validation data (the same rows for all, run at once)."""
        params = {name: value.detach() for name, value in self.params.items()}
        self.template.eval()
        num_rows = self.data.val_x.shape[0]
        chunk = max(1, min(EVAL_BATCH_SIZE, EVAL_ROWS_PER_CHUNK // len(self.active)))
        outputs = []
        for start in range(0, num_rows, chunk):
            x = self.val_x.rows(slice(start, start + chunk))
            run = vmap(lambda p, xb: functional_call(self.template, p, (xb,)), in_dims=(0, None))
            with self.replay:
                outputs.append(run(params, x).float().cpu())
        stacked = torch.cat(outputs, dim=1)
        return [task_metrics(member.model, stacked[i], self.data.val_y) for i, member in enumerate(self.active)]


def _dropout_generator(seed: int, device: torch.device) -> torch.Generator:
    """The generator a model's dropout masks come from: on CPU the global RNG's state right after the model
    was built, which its own run's dropout would go on from; elsewhere one seeded with the model's seed."""
    if device.type == "cpu":
        generator = torch.Generator()
        generator.set_state(torch.get_rng_state())
        return generator
    return torch.Generator(device=device).manual_seed(seed)
