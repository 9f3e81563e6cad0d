"""The shipping rule: a regenerated default ships only on a clear win in both left-out checks, measured as it ships."""

from __future__ import annotations

from ilge_search.defaults.evidence import left_out_evidence, setting_gap
from ilge_search.defaults.transfer import HeldOut, shipping_verdict


def _held_out(by_kind: dict[str, list[float]]) -> HeldOut:
    rows = [
        {"fold": kind, "portfolio_default_diff": diff, "marginal_diff": float("nan"), "portfolio_best_diff": 0.0}
        for kind, diffs in by_kind.items()
        for diff in diffs
    ]
    return HeldOut(rows=rows, verdicts={}, seeds=[1000, 1001, 1002])


CLEAR = [1.2, 0.8, 1.5, 0.9, 1.1, 1.3, 0.7, 1.0]
NARROW = [3.0, -2.5, 0.4, 1.0, -1.8, 0.9, 0.2, 2.0]  # mean ahead and ahead on more problems, but a tie


def test_a_clear_win_in_both_checks_in_the_shipped_setting_ships():
    ok, why = shipping_verdict(_held_out({"task": CLEAR, "model": CLEAR}))
    assert ok and why.startswith("shipped (leave one task out: +1.06 points [")
    assert "a win" in why and "leave one model out" in why


def test_a_tie_a_missing_check_or_a_capped_setting_keeps_the_builtin_defaults():
    ok, why = shipping_verdict(_held_out({"task": CLEAR, "model": NARROW}))
    assert not ok and "leave one model out: +0.40 points" in why and "a tie" in why
    ok, why = shipping_verdict(_held_out({"task": CLEAR}))
    assert not ok and why.endswith("no leave-one-model-out rows)")
    gap = setting_gap([10, 10, None], 50)
    assert gap == "measured with epochs capped at 10, not in the setting that ships: 50 epochs with early stopping"
    ok, why = shipping_verdict(_held_out({"task": CLEAR, "model": CLEAR}), setting=gap)
    assert not ok and why.startswith(f"built-in kept ({gap}; leave one task out")


def test_the_setting_and_the_evidence():
    assert setting_gap([None, 50, 60], 50) == ""  # no cap, or a cap at or above the shipped epochs
    assert "capped at 2, 10" in setting_gap([10, 2], 50)
    evidence = left_out_evidence("task", NARROW)
    assert not evidence.passes and (evidence.comparison.wins, evidence.comparison.losses) == (6, 2)
    assert evidence.comparison.interval.resamples == 2000 and evidence.comparison.interval.seed == 0
