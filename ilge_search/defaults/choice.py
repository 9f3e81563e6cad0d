"""Choosing a default and a portfolio from a candidates x problems matrix of validation scores.

Pure functions over numbers; :mod:`~ilge_search.defaults.portfolio` fills the matrix. Ties always go to
the earlier candidate (the built-in defaults come first); ``docs/transfer.md`` describes the choice.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["normalise", "eligible_rows", "choose_default", "greedy_portfolio", "portfolio_value", "warm_start_order"]


def normalise(scores: np.ndarray, maximize: Sequence[bool]) -> np.ndarray:
    """Each column of ``scores`` (candidates x problems; NaN: missing) mapped to [0, 1], 1 = best."""
    scores = np.asarray(scores, dtype=float)
    if scores.ndim != 2 or scores.shape[1] != len(maximize):
        raise ValueError(f"scores must be candidates x problems with {len(maximize)} problems, got {scores.shape}")
    out = np.full(scores.shape, np.nan)
    for column, up in enumerate(maximize):
        values = scores[:, column] if up else -scores[:, column]
        present = ~np.isnan(values)
        if not present.any():
            continue
        low, high = values[present].min(), values[present].max()
        out[present, column] = 1.0 if high == low else (values[present] - low) / (high - low)
    return out


def eligible_rows(normalised: np.ndarray) -> np.ndarray:
    """Indices of the candidates scored on every problem."""
    return np.flatnonzero(~np.isnan(normalised).any(axis=1))


def choose_default(normalised: np.ndarray) -> int:
    """The eligible candidate with the best mean normalised score (first on ties).

    Raises:
        ValueError: no candidate is scored on every problem.
    """
    rows = eligible_rows(normalised)
    if rows.size == 0:
        raise ValueError("no candidate has a score on every problem yet; train the missing cells first")
    means = normalised[rows].mean(axis=1)
    return int(rows[int(np.argmax(means))])


def portfolio_value(normalised: np.ndarray, members: Sequence[int]) -> float:
    """The mean over problems of the best member's normalised score."""
    if not members:
        return 0.0
    return float(normalised[list(members)].max(axis=0).mean())


def greedy_portfolio(normalised: np.ndarray, size: int) -> list[int]:
    """Up to ``size`` eligible candidates, each step adding the one that most raises the mean over problems of the best
    member's normalised score (so the first is the default); it stops early when none adds anything."""
    if size < 1:
        raise ValueError(f"a portfolio needs at least one member, got size {size}")
    members: list[int] = [choose_default(normalised)]  # raises when no candidate is eligible
    rows = [int(r) for r in eligible_rows(normalised)]
    while len(members) < size:
        current = portfolio_value(normalised, members)
        gains = [(portfolio_value(normalised, [*members, r]) - current, -r) for r in rows if r not in members]
        if not gains:
            break
        gain, negative_row = max(gains)
        if gain <= 1e-12:
            break
        members.append(-negative_row)
    return members


def warm_start_order(normalised: np.ndarray, members: Sequence[int]) -> list[int]:
    """``members`` (the greedy portfolio), then every other eligible candidate by mean normalised score, best
    first (ties: the earlier candidate)."""
    rest = [int(r) for r in eligible_rows(normalised) if int(r) not in members]
    rest.sort(key=lambda r: (-float(normalised[r].mean()), r))
    return [*members, *rest]
