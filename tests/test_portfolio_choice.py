"""The choice from a candidates x problems matrix: normalisation per problem, the default, the greedy portfolio."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ilge_search.defaults.choice import choose_default, greedy_portfolio, normalise, portfolio_value


def test_each_problem_is_normalised_on_its_own_in_its_direction():
    scores = np.array([[0.5, 10.0, 3.0], [0.7, 30.0, 3.0], [0.6, 20.0, 3.0]])
    out = normalise(scores, [True, False, True])
    np.testing.assert_allclose(out[:, 0], [0.0, 1.0, 0.5])
    np.testing.assert_allclose(out[:, 1], [1.0, 0.0, 0.5])  # minimised: the lowest is best
    np.testing.assert_allclose(out[:, 2], [1.0, 1.0, 1.0])  # all equal: every one is best
    with_missing = normalise(np.array([[0.2, np.nan], [0.4, 0.9]]), [True, True])
    assert math.isnan(with_missing[0, 1]) and with_missing[1, 1] == 1.0


def test_the_default_is_the_best_mean_and_needs_every_problem():
    # candidate 2 is best on average although candidate 0 wins the first problem by a mile
    scores = np.array([[0.95, 0.10, 0.10], [0.50, 0.50, 0.20], [0.80, 0.70, 0.60]])
    normalised = normalise(scores, [True] * 3)
    assert choose_default(normalised) == 2
    scores[2, 1] = np.nan  # a candidate with a missing cell is not eligible
    assert choose_default(normalise(scores, [True] * 3)) == 1
    with pytest.raises(ValueError, match="no candidate has a score on every problem"):
        choose_default(normalise(np.full((2, 2), np.nan), [True, True]))


def test_the_greedy_portfolio_finds_the_complementary_pair():
    # candidate 0 is the best single default; the best second member is candidate 3, which covers the two
    # problems candidate 0 is bad at, not candidate 1, the runner-up on average that fails where 0 fails
    scores = np.array(
        [
            [1.0, 1.0, 0.0, 0.0, 0.9],
            [0.9, 0.9, 0.1, 0.1, 0.8],
            [0.0, 0.0, 0.5, 0.5, 0.0],
            [0.0, 0.0, 1.0, 1.0, 0.0],
        ]
    )
    normalised = normalise(scores, [True] * 5)
    assert choose_default(normalised) == 0
    members = greedy_portfolio(normalised, 2)
    assert members == [0, 3]
    assert portfolio_value(normalised, members) == pytest.approx(1.0)
    assert portfolio_value(normalised, [0]) == pytest.approx(0.6)
    # nothing more to gain: the portfolio stops at two members
    assert greedy_portfolio(normalised, 4) == [0, 3]
    with pytest.raises(ValueError, match="at least one member"):
        greedy_portfolio(normalised, 0)


def test_ties_go_to_the_earlier_candidate():
    normalised = normalise(np.array([[0.5, 0.5], [0.5, 0.5]]), [True, True])
    assert choose_default(normalised) == 0
    assert greedy_portfolio(normalised, 2) == [0]


def test_the_warm_start_order_is_the_portfolio_then_the_rest_by_mean():
    from ilge_search.defaults.choice import warm_start_order

    scores = np.array(
        [
            [1.0, 1.0, 0.0, 0.0, 0.9],
            [0.9, 0.9, 0.1, 0.1, 0.8],
            [0.0, 0.0, 0.5, 0.5, 0.0],
            [0.0, 0.0, 1.0, 1.0, 0.0],
            [0.5, np.nan, 0.5, 0.5, 0.5],  # a missing cell: never eligible
        ]
    )
    normalised = normalise(scores, [True] * 5)
    members = greedy_portfolio(normalised, 4)
    assert members == [0, 3]  # the greedy step stops: nothing more to gain
    # then candidate 1 (mean 0.56) before candidate 2 (mean 0.2)
    assert warm_start_order(normalised, members) == [0, 3, 1, 2]
