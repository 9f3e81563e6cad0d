"""Independent TPE against TPE(multivariate=True, group=True) on the auto study's search space.

The space is the real one (:func:`ilge_search.study.auto.suggest_auto` over every sentence method, each method's
start enqueued first); the score is made up, so no model trains and a seed takes a second: each method has its
own best score and its own best learning rate, the GNN fields add small effects, and a little noise is added.
Prints the mean best score after 20, 30 and 60 trials over ``SEEDS`` seeds per sampler.

    python benchmarks/bench_auto_sampler.py [SEEDS]
"""

from __future__ import annotations

import math
import random
import statistics
import sys
import warnings

import optuna

from ilge_search.study.auto import auto_methods, method_params, suggest_auto
from ilge_search.study.trial import recommended_params

METHODS = auto_methods(None, tagging=False)
BASE = {
    "cayley": 0.80,
    "fc": 0.78,
    "deepset": 0.79,
    "last-layer": 0.76,
    "best-layer": 0.81,
    "mean-layers": 0.72,
    "scalar-mix": 0.77,
    "mlp-last": 0.78,
}
BEST_LOG_LR = {
    "cayley": -3.0,
    "fc": -3.2,
    "deepset": -2.8,
    "last-layer": -2.2,
    "best-layer": -2.0,
    "mean-layers": -2.5,
    "scalar-mix": -2.3,
    "mlp-last": -3.0,
}
CHECKPOINTS = (20, 30, 60)


def score(config, rng: random.Random) -> float:
    value = BASE[config.family] - 0.03 * (math.log10(config.lr) - BEST_LOG_LR[config.family]) ** 2
    value -= 0.01 * abs(math.log10(config.weight_decay) + 4)
    value += {128: -0.01, 256: 0.0, 512: 0.01}.get(getattr(config, "hidden_dim", 256), 0.0)
    if config.family in ("cayley", "fc", "deepset"):
        value -= 0.04 * (config.dropout - 0.2) ** 2
    if getattr(config, "conv_type", None) == "gat":
        value += 0.012
    return value + rng.gauss(0, 0.003)


def best_after(sampler, seed: int) -> list[float]:
    rng = random.Random(seed)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for method in METHODS:
        study.enqueue_trial(method_params(method, recommended_params(method, 384, "minilm-l6")))
    study.optimize(lambda trial: score(suggest_auto(trial, METHODS), rng), n_trials=max(CHECKPOINTS))
    values = [trial.value for trial in study.trials]
    return [max(values[:n]) for n in CHECKPOINTS]


def main() -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.simplefilter("ignore")
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    samplers = {
        "independent TPE": lambda s: optuna.samplers.TPESampler(seed=s),
        "TPE multivariate+group": lambda s: optuna.samplers.TPESampler(seed=s, multivariate=True, group=True),
    }
    for name, make in samplers.items():
        rows = [best_after(make(seed), seed) for seed in range(seeds)]
        means = [round(statistics.fmean(row[i] for row in rows), 4) for i in range(len(CHECKPOINTS))]
        print(f"{name}: mean best score after {'/'.join(map(str, CHECKPOINTS))} trials {means} ({seeds} seeds)")


if __name__ == "__main__":
    main()
