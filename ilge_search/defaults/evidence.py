"""The shipping rule's evidence: a regenerated default ships only on a clear win in the setting it ships in.

A regenerated default (the marginal rule's, checked leaving one task out, or the cross-task matrix's,
checked leaving one task out and leaving one model out) becomes the start of new studies only when,
in every left-out check, the bootstrap interval of its mean difference over the held-out problems
against the built-in defaults lies above 0 (:func:`left_out_evidence`, the interval of
:func:`ilge_search.study.statistics.compare_problems` with :data:`SHIPPING_BOOTSTRAP`), *and* those
problems were trained the way the default ships: with the configuration's own epochs and early
stopping, not an epoch cap below them (:func:`setting_gap`). A margin inside the interval is a tie,
and a tie keeps the built-in defaults.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..study.statistics import BootstrapSettings, ProblemsComparison, compare_problems

__all__ = ["SHIPPING_BOOTSTRAP", "LeftOutEvidence", "left_out_evidence", "setting_gap"]

SHIPPING_BOOTSTRAP = BootstrapSettings(resamples=2000, confidence=0.95, seed=0)


@dataclass(frozen=True)
class LeftOutEvidence:
    """One left-out check (``kind``: ``task`` or ``model``) of a default against the built-in defaults:
    the mean difference over its held-out problems, in score units, with its interval and tests."""

    kind: str
    comparison: ProblemsComparison

    @property
    def passes(self) -> bool:
        """Whether the whole interval lies above 0."""
        return self.comparison.interval.verdict == "win"

    def text(self) -> str:
        """``leave one task out: +0.18 points [-0.52, +0.86] over 12 problems, a tie (ahead on 9, ...)``."""
        c = self.comparison
        interval = c.interval
        problems = c.wins + c.ties + c.losses
        return (
            f"leave one {self.kind} out: {interval.estimate:+.2f} points [{interval.low:+.2f}, {interval.high:+.2f}] "
            f"over {problems} problems, a {interval.verdict} (ahead on {c.wins}, behind on {c.losses}; "
            f"sign test p = {c.sign_p:.2f}, Wilcoxon p = {c.wilcoxon_p:.2f})"
        )


def left_out_evidence(kind: str, differences: Iterable[float]) -> LeftOutEvidence:
    """The evidence of one left-out check from its per-problem differences (default minus built-in)."""
    return LeftOutEvidence(kind, compare_problems(list(differences), SHIPPING_BOOTSTRAP))


def setting_gap(trained_epochs: Iterable[int | None], shipped_epochs: int) -> str:
    """Empty when every evaluation trained the configuration's own ``shipped_epochs`` (``None``: no cap);
    else the sentence saying it did not."""
    caps = sorted({epochs for epochs in trained_epochs if epochs is not None and epochs < shipped_epochs})
    if not caps:
        return ""
    shown = ", ".join(str(cap) for cap in caps)
    return (
        f"measured with epochs capped at {shown}, not in the setting that ships: {shipped_epochs} epochs "
        "with early stopping"
    )
