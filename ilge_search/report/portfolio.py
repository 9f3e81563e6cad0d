"""The cross-task matrix drawn, and its left-out checks as a Markdown table (read from what ``portfolio`` stored).

:func:`draw_matrix` draws candidates x problems, each cell the candidate's mean
validation score normalised within its problem (1 = the problem's best
candidate), with the default (``D``) and the other portfolio members (``P``)
marked; :func:`held_out_table` renders the left-out rows of
:class:`~ilge_search.defaults.transfer.HeldOut` (test scores, differences
against the built-in defaults). Nothing is trained here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..defaults.choice import normalise
from ..defaults.transfer import METHODS, HeldOut
from .figures import figure_style, new_figure, save_figure

__all__ = ["draw_matrix", "held_out_table", "verdict_lines"]


def _problem_label(problem: Any) -> str:
    return f"{problem.model}\n{problem.task}"


def draw_matrix(result: Any, path: Path) -> Path:
    """The normalised validation matrix of a :class:`~ilge_search.defaults.portfolio.PortfolioResult` as a
    heatmap at ``path`` (PNG); missing cells are blank."""
    import numpy as np

    normalised = normalise(result.matrix.validation, [p.maximize for p in result.problems])
    rows, columns = normalised.shape
    with figure_style():
        figure = new_figure(1.6 + 0.9 * columns, 1.2 + 0.42 * rows)
        axes = figure.add_subplot()
        image = axes.imshow(np.ma.masked_invalid(normalised), cmap="viridis", vmin=0, vmax=1, aspect="auto")
        axes.set_xticks(range(columns), [_problem_label(p) for p in result.problems], fontsize=7)
        labels = []
        for index, candidate in enumerate(result.candidates):
            mark = " [D]" if index == result.default else (" [P]" if index in result.portfolio else "")
            labels.append(candidate.name + mark)
        axes.set_yticks(range(rows), labels, fontsize=7)
        for r in range(rows):
            for c in range(columns):
                value = result.matrix.validation[r, c]
                if value == value:
                    shade = "black" if normalised[r, c] > 0.6 else "white"
                    axes.text(c, r, f"{value:.3f}", ha="center", va="center", fontsize=6, color=shade)
        axes.set_title(
            f"{result.request.family} ({result.request.bucket}): mean validation score over seeds "
            f"{result.request.seed_list}\ncolour: normalised within each problem; D default, P portfolio member",
            fontsize=8,
        )
        figure.colorbar(image, ax=axes, shrink=0.8)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_figure(figure, path)
    return path


def held_out_table(held_out: HeldOut) -> str:
    """One Markdown row per held-out problem: test scores and differences against the built-in defaults."""
    head = (
        "| left out | model | task | unit | built-in | marginal | portfolio default | best member "
        "| marginal diff | default diff | best-member diff | default chosen | best member |"
    )
    lines = [head, "|" + "---|" * 13]
    for row in held_out.rows:
        lines.append(
            f"| {row['fold']} {row['held_out']} | {row['model']} | {row['task']} | {row['unit']} "
            f"| {row['builtin']:.2f} | {row['marginal']:.2f} | {row['portfolio_default']:.2f} "
            f"| {row['portfolio_best']:.2f} | {row['marginal_diff']:+.2f} | {row['portfolio_default_diff']:+.2f} "
            f"| {row['portfolio_best_diff']:+.2f} | {row['default_candidate']} | {row['best_member']} |"
        )
    return "\n".join(lines)


def verdict_lines(held_out: HeldOut) -> list[str]:
    """Per fold kind and method: mean difference against the built-in defaults, ahead and behind."""
    lines = []
    for (kind, method), verdict in sorted(held_out.verdicts.items()):
        if method in METHODS and verdict["rows"]:
            lines.append(
                f"leave one {kind} out, {method}: {verdict['mean_difference']:+.2f} points against the built-in "
                f"defaults (test, mean over seeds {held_out.seeds}); ahead on {verdict['ahead']}, behind on "
                f"{verdict['behind']} of {verdict['rows']} problems"
            )
    return lines
