"""How small a difference the report's comparisons can see: per task, the smallest detectable difference.

A normal approximation of a paired difference of two methods (:func:`ilge_search.study.statistics.
detectable_difference`): with ``S`` seeds on ``N`` test texts it is ``z * sqrt(q / N + 2 s**2 / S)``, where ``s``
is a method's per-seed standard deviation (measured: Cayley's, median over the models) and ``q`` the two
methods' disagreement rate on test texts (assumed: :data:`POWER_DISAGREEMENT`; it applies to accuracy only).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from ..study.statistics import PowerAssumptions, detectable_difference
from .tables import full_data

__all__ = ["POWER_SEEDS", "POWER_TEXTS", "POWER_DISAGREEMENT", "POWER_NOTE", "power_lines"]

POWER_SEEDS, POWER_TEXTS = 3, 400
POWER_DISAGREEMENT = 0.10
POWER_NOTE = (
    f"The smallest difference between two methods that {POWER_SEEDS} seeds at {POWER_TEXTS} test texts detect "
    "(two-sided 95% test, 80% power), in points: z × sqrt(q / N + 2 s² / S) with z = 1.96 + 0.84, s Cayley's "
    "per-seed standard deviation on the task (the median over the models, measured), S the seeds, N the test "
    f"texts and q the two methods' disagreement rate on test texts (assumed {POWER_DISAGREEMENT:.2f}; accuracy "
    "only). The seeds for 1 point assume unlimited test texts (the training noise alone); at q = 0.10, 1 point "
    "needs at least 7,850 test texts even with unlimited seeds."
)


def _seeds_for_one_point(seed_std: float, z: float) -> int:
    return max(1, math.ceil(2.0 * seed_std**2 / (0.01 / z) ** 2))


def power_lines(frame: Any) -> list[str]:
    """Per task with Cayley scored over several seeds (matched protocol, whole training subsets): the measured
    seed spread and the smallest detectable differences, one sentence each."""
    part = full_data(frame)
    part = part[(part["method"] == "cayley") & (part["protocol"] == "matched") & (part["n_seeds"] > 1)]
    lines = []
    for task, group in part.groupby("task", sort=True):
        seed_std = statistics.median(float(v) for v in group["std"].dropna()) / 100.0
        seeds_only = PowerAssumptions(disagreement=0.0, seed_std=seed_std)
        with_texts = PowerAssumptions(disagreement=POWER_DISAGREEMENT, seed_std=seed_std)
        metric = str(group["metric"].iloc[0])
        texts = (
            f", {100 * detectable_difference(POWER_SEEDS, POWER_TEXTS, with_texts):.1f} with the test texts' noise"
            if metric == "accuracy"
            else ""
        )
        lines.append(
            f"{task} ({metric}): Cayley's seed std {100 * seed_std:.2f} points; {POWER_SEEDS} seeds at "
            f"{POWER_TEXTS} test texts detect {100 * detectable_difference(POWER_SEEDS, POWER_TEXTS, seeds_only):.1f} "
            f"points from the seeds' noise alone{texts}; 1 point needs {_seeds_for_one_point(seed_std, seeds_only.z)} "
            "seeds."
        )
    return lines
