"""Many models in one pass against one at a time: the final evaluation's 3 seeds and a K = 5 ensemble's
members x 3 seeds, on MiniLM-L6 (7 x 384, 500 texts) and SmolLM2-135M (31 x 576, 2,000 texts) shapes.

Both sides train the same jobs on the same data in the same process: one at a time with
``engine.train_encoder`` (what ``train_seeds`` did before passes), and in one pass with
``engine.train_many``. The rounds alternate (sequential, pass, sequential, pass, ...); the median round of
each side counts. Early stopping is off so both sides run every epoch (a pass ends with its last model;
with it on, both sides would stop each model at the same epoch).

The 5 ensemble members share the Cayley default's shapes and differ in learning rate, weight decay and
dropout, so all 15 models go in one pass; members of different shapes train in one pass per shape.

Features: ``--features NAME=FILE.npz`` (arrays ``x`` (N, L, D) and ``y``) for real cached embeddings;
otherwise synthetic ones at the model's shape (``ilge_search.testing.synthetic``, 6 classes as trec).

    python benchmarks/bench_many.py --quick            # ends with: seeds3 <ratio>x models15 <ratio>x
    python benchmarks/bench_many.py --device cuda --rounds 3
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch

from ilge_search.encoders.configs import CayleyConfig
from ilge_search.engine import ModelJob, TrainingRecipe, train_encoder, train_many
from ilge_search.testing.synthetic import LayerSignal, classification_features

SHAPES = {"minilm-l6": (7, 384, 500), "smollm2-135m": (31, 576, 2000)}
SEEDS = (1000, 1001, 1002)
MEMBERS = (  # (lr, weight_decay, dropout): same shapes as the default, so one pass holds all 15
    (1e-3, 1e-4, 0.1),
    (3e-3, 1e-4, 0.2),
    (1e-3, 1e-3, 0.0),
    (5e-4, 1e-4, 0.3),
    (2e-3, 1e-5, 0.1),
)


@dataclass(frozen=True)
class Problem:
    name: str
    train: tuple[torch.Tensor, torch.Tensor]
    val: tuple[torch.Tensor, torch.Tensor]


def load_problem(name: str, features: dict[str, str]) -> Problem:
    if name in features:
        arrays = np.load(features[name])
        x, y = torch.from_numpy(arrays["x"]), torch.from_numpy(arrays["y"]).long()
    else:
        num_layers, hidden, texts = SHAPES[name]
        labels = np.random.default_rng(0).integers(0, 6, texts)
        signal = LayerSignal(layer=-2, strength=3.0)
        x = torch.from_numpy(classification_features(labels, num_layers, hidden, signal)).half()
        y = torch.from_numpy(labels)
    cut = int(0.8 * len(y))
    return Problem(name, (x[:cut], y[:cut]), (x[cut:], y[cut:]))


def workloads(epochs: int) -> dict[str, list[ModelJob]]:
    start = CayleyConfig(epochs=epochs)
    members = [start.replace(lr=lr, weight_decay=wd, dropout=p) for lr, wd, p in MEMBERS]
    return {
        "seeds3": [ModelJob(start, seed) for seed in SEEDS],
        "models15": [ModelJob(config, seed) for config in members for seed in SEEDS],
    }


def sequential(jobs: list[ModelJob], problem: Problem, device: str, recipe: TrainingRecipe) -> float:
    started = time.perf_counter()
    for job in jobs:
        train_encoder(job.config, problem.train, problem.val, seed=job.seed, device=device, recipe=recipe)
    return _synced(device, started)


def one_pass(jobs: list[ModelJob], problem: Problem, device: str, recipe: TrainingRecipe) -> float:
    started = time.perf_counter()
    train_many(jobs, problem.train, problem.val, device=device, recipe=recipe)
    return _synced(device, started)


def _synced(device: str, started: float) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - started


def measure(jobs: list[ModelJob], problem: Problem, args: argparse.Namespace) -> tuple[float, float]:
    """Median seconds of the sequential and the one-pass side over interleaved rounds."""
    recipe = TrainingRecipe(patience=None)
    times: dict[str, list[float]] = {"sequential": [], "pass": []}
    for _ in range(args.rounds):
        times["sequential"].append(sequential(jobs, problem, args.device, recipe))
        times["pass"].append(one_pass(jobs, problem, args.device, recipe))
    return statistics.median(times["sequential"]), statistics.median(times["pass"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 epochs, 2 rounds (a few minutes on 2 cores)")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--features", nargs="*", default=[], metavar="NAME=FILE.npz")
    args = parser.parse_args()
    if args.quick:
        args.epochs, args.rounds = 2, 2
    if args.threads:
        torch.set_num_threads(args.threads)
    features = dict(item.split("=", 1) for item in args.features)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}, "
        f"{args.epochs} epochs, {args.rounds} rounds"
    )
    ratios: dict[str, list[float]] = {"seeds3": [], "models15": []}
    for name in args.models:
        problem = load_problem(name, features)
        source = "cached" if name in features else "synthetic"
        train_encoder(CayleyConfig(epochs=1), problem.train, problem.val, device=args.device)  # warm up
        for label, jobs in workloads(args.epochs).items():
            seq, batched = measure(jobs, problem, args)
            ratios[label].append(seq / batched)
            print(
                f"{name:13s} {source:9s} {label:8s} {len(jobs):2d} models: sequential {seq:7.2f} s, "
                f"one pass {batched:7.2f} s, {seq / batched:.2f}x"
            )
    summary = {label: math.exp(statistics.fmean(math.log(r) for r in values)) for label, values in ratios.items()}
    print(f"seeds3 {summary['seeds3']:.2f}x models15 {summary['models15']:.2f}x")


if __name__ == "__main__":
    main()
