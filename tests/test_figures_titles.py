"""Titles fit their figure: the one figure-saving path (``report.figures.save_figure``) wraps and, when needed,
shrinks a title that is wider than the figure or its panel, so no title is cut at the figure's edges."""

from __future__ import annotations

from pathlib import Path

import pytest

from ilge_search.report.figures import MIN_FONT, figure_style, new_figure, save_figure

LONG = (
    "banking77: optimisation history per encoder (dots: complete trials; line: best so far) "
    "for a model whose name is long enough to overflow"
)


def _inside(text, figure) -> bool:
    renderer = figure.canvas.get_renderer()
    box, frame = text.get_window_extent(renderer), figure.bbox
    return frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1


@pytest.mark.parametrize("width", [2.9, 5.8, 11.6])
def test_a_long_figure_title_lies_inside_the_saved_figure(tmp_path: Path, width: float) -> None:
    with figure_style():
        figure = new_figure(width, 3.1)
        ax = figure.subplots()
        ax.plot([0, 1], [0, 1])
        title = figure.suptitle(LONG)
        save_figure(figure, tmp_path / "history.png")
    assert _inside(title, figure)
    assert title.get_fontsize() >= MIN_FONT
    assert " ".join(title.get_text().split()) == LONG  # wrapped, never shortened


def test_panel_titles_fit_their_panels(tmp_path: Path) -> None:
    with figure_style():
        figure = new_figure(5.8, 2.6)
        axes = figure.subplots(1, 2)
        for ax in axes:
            ax.set_title("gin over the hidden states of every layer, 8 complete, 8 pruned, 2 failed")
        save_figure(figure, tmp_path / "panels.png")
    renderer = figure.canvas.get_renderer()
    for ax in axes:
        box = ax.title.get_window_extent(renderer)
        assert box.width <= ax.bbox.width * 1.1 + 1
        assert _inside(ax.title, figure)


def test_a_title_that_fits_is_left_alone(tmp_path: Path) -> None:
    with figure_style():
        figure = new_figure(6, 3)
        figure.subplots().set_title("short")
        title = figure.suptitle("trec: probes")
        size = title.get_fontsize()
        save_figure(figure, tmp_path / "short.png")
    assert title.get_text() == "trec: probes" and title.get_fontsize() == size
