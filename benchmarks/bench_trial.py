"""Where a Cayley trial's time goes, and how far the aggregator's forward + backward is from the machine's floor.

1. A trial of the default Cayley config (the study's starting configuration) on MiniLM-L6 (7 x 384,
   500 texts) and SmolLM2-135M (31 x 576, 2,000 texts) shaped features, trained by the engine's own
   pieces (``prepare_data``, the standardiser, the model, Adam, ``predict_logits``) in the engine's order,
   each timed: data preparation (checks, batch order, row gather and upcast), standardisation (the fit and
   each batch), forward (aggregator, head, loss), backward, optimizer (zero_grad, step), validation (every
   epoch's scores, the schedule, the best state) and storage writes (an Optuna trial in a fresh SQLite
   file: one intermediate value per epoch, then the tell). ``engine.train_encoder`` on the same data is
   timed beside it, so the parts can be checked against the whole.
2. The floor: the aggregator's forward + backward FLOPs (every ``nn.Linear``, forward, weight gradient and
   input gradient, less the input projection's input gradient that autograd never computes; the sparse
   message sums are counted too) at the matrix-multiply throughput measured in the same run
   (``torch.mm``, 2048 x 2048, best of several). ``ratio`` = measured forward + backward / floor.

Features: ``--features NAME=FILE.npz`` (arrays ``x`` and ``y``) for real cached embeddings, else synthetic.

    python benchmarks/bench_trial.py --quick        # prints a line: floor <ratio>x
    python benchmarks/bench_trial.py --device cuda
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch import nn

from ilge_search.encoders.configs import CayleyConfig
from ilge_search.engine import build_model, predict_logits, train_encoder
from ilge_search.engine.core import prepare_data, task_loss, task_metrics

try:  # run as a script from the repository root
    from bench_many import SHAPES, load_problem
except ImportError:  # pragma: no cover - imported as benchmarks.bench_trial
    from benchmarks.bench_many import SHAPES, load_problem


class Clock:
    """Seconds per part; ``part(name)`` times a block (synchronising a GPU first and last)."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.seconds = device, defaultdict(float)

    def part(self, name: str):
        clock = self

        class _Block:
            def __enter__(self):
                clock.sync()
                self.started = time.perf_counter()

            def __exit__(self, *exc):
                clock.sync()
                clock.seconds[name] += time.perf_counter() - self.started

        return _Block()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def timed_trial(config: CayleyConfig, problem, device: torch.device, storage_dir: Path) -> dict[str, float]:
    """One trial by the engine's pieces, every part timed."""
    import optuna

    clock = Clock(device)
    with clock.part("data preparation"):
        data = prepare_data(problem.train, problem.val, "classification", None, None)
    torch.manual_seed(0)
    model = build_model(config, data.train_x.shape[1], data.train_x.shape[2], "classification", data.num_classes)
    with clock.part("standardisation"):
        model.standardizer.fit(data.train_x)
    model = model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", factor=0.5, patience=3)
    with clock.part("storage writes"):
        study = optuna.create_study(storage=f"sqlite:///{storage_dir / 'trial.db'}", direction="maximize")
        trial = study.ask()
    generator, best = torch.Generator().manual_seed(0), -1.0
    for epoch in range(1, config.epochs + 1):
        train_epoch(model, optimizer, data, generator, clock)
        with clock.part("validation"):
            metric = task_metrics(model, predict_logits(model, data.val_x, device=device), data.val_y)["accuracy"]
            scheduler.step(metric)
            if metric > best:
                best, _ = metric, copy.deepcopy(model.state_dict())
        with clock.part("storage writes"):
            trial.report(metric, epoch)
    with clock.part("storage writes"):
        study.tell(trial, best)
    return dict(clock.seconds)


def train_epoch(model, optimizer, data, generator, clock: Clock) -> None:
    device, batch_size = clock.device, 64
    model.train()
    with clock.part("data preparation"):
        order = torch.randperm(data.train_x.shape[0], generator=generator)
    for start in range(0, len(order), batch_size):
        with clock.part("data preparation"):
            rows = order[start : start + batch_size]
            xb = data.train_x[rows].to(device=device, dtype=torch.float32)
            yb = data.train_y[rows].to(device)
        with clock.part("standardisation"):
            z = model.standardizer(xb)
        with clock.part("forward"):
            loss = task_loss(model, model.head(model.aggregator(z)), yb)
        with clock.part("optimizer"):
            optimizer.zero_grad(set_to_none=True)
        with clock.part("backward"):
            loss.backward()
        with clock.part("optimizer"):
            optimizer.step()


def matmul_flops_per_second(device: torch.device, size: int = 2048, repeats: int = 5) -> float:
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best


def aggregator_flops(aggregator: nn.Module, x: torch.Tensor) -> float:
    """Forward + backward FLOPs of one batch: linear layers (3 matrix products each, 2 for the input
    projection, whose input needs no gradient) and sparse sums (2 per edge and channel, forward and back)."""
    counts = {"linear": 0.0, "sparse": 0.0}

    def count_linear(module: nn.Linear, inputs, output) -> None:
        rows = inputs[0].numel() // module.in_features
        products = 2 if inputs[0] is first_input[0] else 3
        counts["linear"] += products * 2 * rows * module.in_features * module.out_features

    first_input: list = [None]
    original = torch.sparse.mm

    def counted_sparse(adjacency, dense):
        counts["sparse"] += 2 * 2 * adjacency._nnz() * dense.shape[-1]
        return original(adjacency, dense)

    hooks = [m.register_forward_hook(count_linear) for m in aggregator.modules() if isinstance(m, nn.Linear)]
    projection = next(m for m in aggregator.modules() if isinstance(m, nn.Linear))
    hooks.append(projection.register_forward_pre_hook(lambda m, inputs: first_input.__setitem__(0, inputs[0])))
    torch.sparse.mm = counted_sparse
    try:
        with torch.no_grad():
            aggregator(x)
    finally:
        torch.sparse.mm = original
        for hook in hooks:
            hook.remove()
    return counts["linear"] + counts["sparse"]


def forward_backward_seconds(aggregator: nn.Module, x: torch.Tensor, repeats: int) -> float:
    """Median seconds of the aggregator's forward + backward on ``x`` (sum of outputs as the loss)."""
    aggregator.train()
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        aggregator(x).sum().backward()
        if x.device.type == "cuda":
            torch.cuda.synchronize(x.device)
        times.append(time.perf_counter() - started)
    return sorted(times[1:])[len(times[1:]) // 2]


def floor_ratio(shape: tuple[int, int, int], device: torch.device, throughput: float, repeats: int) -> float:
    from ilge_search.encoders.aggregator import build_aggregator

    batch, num_layers, hidden = shape
    torch.manual_seed(0)
    aggregator = build_aggregator(CayleyConfig(dropout=0.0), num_layers, hidden).to(device)
    x = torch.randn(batch, num_layers, hidden, device=device)
    flops = aggregator_flops(aggregator, x)
    measured = forward_backward_seconds(aggregator, x, repeats)
    floor = flops / throughput
    print(
        f"aggregator fwd+bwd at {shape}: {measured * 1e3:.2f} ms, {flops / 1e9:.3f} GFLOP, "
        f"floor {floor * 1e3:.2f} ms, {measured / floor:.2f}x the floor"
    )
    return measured / floor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 epochs per trial, fewer repeats")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--features", nargs="*", default=[], metavar="NAME=FILE.npz")
    args = parser.parse_args()
    epochs, repeats = (3, 5) if args.quick else (args.epochs, 20)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    features = dict(item.split("=", 1) for item in args.features)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {device}, {epochs} epochs")
    config = CayleyConfig(epochs=epochs)
    for name in args.models:
        problem = load_problem(name, features)
        train_encoder(config.replace(epochs=1), problem.train, problem.val, device=device)  # warm up
        with tempfile.TemporaryDirectory() as storage_dir:
            parts = timed_trial(config, problem, device, Path(storage_dir))
        started = time.perf_counter()
        train_encoder(config, problem.train, problem.val, device=device)
        engine_seconds = time.perf_counter() - started
        total = sum(parts.values())
        print(
            f"{name} ({'cached' if name in features else 'synthetic'} features): {total:.2f} s in parts, "
            f"engine.train_encoder {engine_seconds:.2f} s (no storage)"
        )
        for part, seconds in sorted(parts.items(), key=lambda item: -item[1]):
            print(f"  {part:17s} {seconds:7.3f} s  {100 * seconds / total:5.1f}%")
    throughput = matmul_flops_per_second(device)
    print(f"matrix multiply: {throughput / 1e9:.1f} GFLOP/s (2048 x 2048, best of 5)")
    ratios = [floor_ratio((64, 25, 1024), device, throughput, repeats)]
    for name in args.models:
        num_layers, hidden, _ = SHAPES[name]
        ratios.append(floor_ratio((64, num_layers, hidden), device, throughput, repeats))
    print(f"floor {ratios[0]:.2f}x (aggregator fwd+bwd at (64, 25, 1024) over its FLOPs at the measured throughput)")


if __name__ == "__main__":
    main()
