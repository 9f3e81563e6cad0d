"""The cross-task matrix drawn and tabled, with its left-out checks (read from what ``portfolio`` stored).

:func:`draw_matrix` draws the normalised validation matrix with the default (``D``) and the other portfolio members
(``P``) marked, :func:`matrix_rows` tables it, :func:`held_out_rows` and :func:`held_out_verdict_rows` table the
left-out checks; :func:`portfolio_part` is what the results report and the defaults page show. Nothing is trained here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..defaults.choice import normalise
from ..defaults.shipping_check import ShippingEvidence, shipping_evidence
from ..defaults.transfer import METHODS, HeldOut, held_out_evidence, portfolio, stored_portfolio
from ..encoders import report_labels
from ..files import check_output_path
from .document import Cell, Document, plural, slug
from .figures import figure_style, new_figure, save_figure
from .tables import fmt

if TYPE_CHECKING:
    from ..defaults.portfolio import MatrixProblem, PortfolioRequest, PortfolioResult, TrainingSetup
    from ..defaults.shipping_check import ShippingCheck, ShippingEvidence

__all__ = [
    "PORTFOLIO_NOTE",
    "PORTFOLIO_RUN_OPTIONS",
    "PortfolioRun",
    "portfolio_text",
    "run_portfolio",
    "draw_matrix",
    "matrix_rows",
    "held_out_rows",
    "held_out_verdict_rows",
    "held_out_table",
    "verdict_lines",
    "choice_sentences",
    "portfolio_part",
    "SHIPPING_CHECK_NOTE",
    "shipping_check_sentences",
    "shipping_check_part",
    "shipping_check_text",
    "shipping_table",
    "SHIPPING_TABLE_MARKERS",
    "statistics_table",
]

PORTFOLIO_NOTE = (
    "Whole candidate configurations (the built-in defaults, the marginal rule's, each problem's top trials) "
    "trained with the same seeds on every problem's training subset and scored on its validation split "
    "(`ilge-search portfolio`; docs/transfer.md); the default (D) is the best mean normalised validation "
    "score, the portfolio (P) is chosen greedily. Left-out rows: everything chosen again without the held-out "
    "problems, on validation only, then each configuration scored on the held-out problem's test split "
    "(differences against the built-in defaults, in points)."
)
_METHOD_LABELS = {
    "marginal": "marginal rule",
    "portfolio_default": "portfolio default",
    "portfolio_best": "best member (by validation)",
}


def _problem_label(problem: MatrixProblem) -> str:
    return f"{problem.model}\n{problem.task}"


def _mark(result: PortfolioResult, index: int) -> str:
    """``D`` for the matrix's default, ``P`` for another portfolio member, else empty."""
    return "D" if index == result.default else ("P" if index in result.portfolio else "")


LABEL_INCHES_PER_CHARACTER = 0.06  # a 7-point tick label's width per character, rounded up


def draw_matrix(result: PortfolioResult, path: Path) -> Path:
    """The normalised validation matrix of a :class:`~ilge_search.defaults.portfolio.PortfolioResult` as a
    heatmap at ``path`` (PNG); missing cells are blank."""

    normalised = normalise(result.matrix.validation, [p.maximize for p in result.problems])
    rows, columns = normalised.shape
    marks = [_mark(result, index) for index in range(rows)]
    labels = [c.name + (f" [{m}]" if m else "") for c, m in zip(result.candidates, marks, strict=True)]
    label_inches = LABEL_INCHES_PER_CHARACTER * max((len(label) for label in labels), default=0)
    with figure_style():
        # the row labels sit left of the panel: a figure sized without them leaves the heatmap no width
        figure = new_figure(1.6 + label_inches + 0.9 * columns, 1.2 + 0.42 * rows)
        axes = figure.add_subplot()
        image = axes.imshow(np.ma.masked_invalid(normalised), cmap="viridis", vmin=0, vmax=1, aspect="auto")
        axes.set_xticks(range(columns), [_problem_label(p) for p in result.problems], fontsize=7)
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


def matrix_rows(result: PortfolioResult) -> tuple[list[str], list[list[Cell]]]:
    """(header, rows): per candidate, its mark (D default, P member), where it came from and its mean validation
    score on each problem (the problem's best in bold)."""
    header = ["candidate", "chosen", "from"] + [f"{p.model} · {p.task}" for p in result.problems]
    validation = result.matrix.validation
    rows = []
    for index, candidate in enumerate(result.candidates):
        cells = [Cell(candidate.name), Cell(_mark(result, index)), Cell(", ".join(candidate.sources))]
        for column, problem in enumerate(result.problems):
            value = validation[index, column]
            present = validation[:, column][validation[:, column] == validation[:, column]]
            best = (present.max() if problem.maximize else present.min()) if present.size else None
            cells.append(Cell("—" if value != value else f"{value:.4f}", bold=value == best))
        rows.append(cells)
    return header, rows


_SCORE_HEADERS = {
    "marginal": "marginal rule",
    "portfolio_default": "portfolio default",
    "portfolio_best": "best member",
}
_DIFF_HEADERS = {"marginal": "marginal diff", "portfolio_default": "default diff", "portfolio_best": "best-member diff"}


def held_out_rows(held_out: HeldOut) -> tuple[list[str], list[list[Cell]]]:
    """(header, rows): per held-out problem, the test scores of the built-in defaults and of the methods the rows
    hold (the marginal rule, the portfolio default, the best member by validation), each method's difference
    against the built-in defaults (the best score in bold), the default chosen and the member kept."""
    methods = [m for m in METHODS if m in held_out.methods]
    header = ["left out", "model", "task", "unit", "built-in", *(_SCORE_HEADERS[m] for m in methods)]
    header += [_DIFF_HEADERS[m] for m in methods] + ["default chosen"]
    header += ["member kept"] if "portfolio_best" in methods else []
    rows = []
    for row in held_out.rows:
        diffs = [row[f"{m}_diff"] for m in methods]
        present = [d for d in [0.0, *diffs] if d == d]
        top = round(max(present), 2)
        scores = [Cell(fmt(row["builtin"]), bold=top == 0.0)]
        for method, diff in zip(methods, diffs, strict=True):
            scores.append(Cell(fmt(row[method]), bold=diff == diff and round(diff, 2) == top))
        rows.append(
            [Cell(f"{row['fold']} {row['held_out']}"), Cell(row["model"]), Cell(row["task"]), Cell(row["unit"])]
            + scores
            + [Cell(fmt(d, signed=True)) for d in diffs]
            + [Cell(row["default_candidate"])]
            + ([Cell(row["best_member"])] if "portfolio_best" in methods else [])
        )
    return header, rows


def held_out_verdict_rows(held_out: HeldOut) -> tuple[list[str], list[list[Cell]]]:
    """(header, rows): per fold kind and method, the mean difference against the built-in defaults over the
    held-out problems with its bootstrap interval over problems and verdict, and on how many it was ahead and
    behind."""
    header = ["left out", "method (against built-in)", "problems", "mean difference", "95% interval", "verdict"]
    header += ["ahead", "behind"]
    rows = []
    for kind in sorted({kind for kind, _ in held_out.verdicts}):
        for method in (m for m in METHODS if m in held_out.methods):
            evidence = held_out_evidence(held_out, kind, method)
            if evidence is None:
                continue
            interval, c = evidence.comparison.interval, evidence.comparison
            rows.append(
                [
                    Cell(f"one {kind}"),
                    Cell(_METHOD_LABELS[method]),
                    Cell(str(c.wins + c.ties + c.losses)),
                    Cell(f"{interval.estimate:+.2f}", bold=evidence.passes),
                    Cell(f"[{interval.low:+.2f}, {interval.high:+.2f}]"),
                    Cell(interval.verdict),
                    Cell(str(c.wins)),
                    Cell(str(c.losses)),
                ]
            )
    return header, rows


def held_out_table(held_out: HeldOut) -> str:
    """:func:`held_out_rows` as Markdown (what ``ilge-search portfolio --check`` prints)."""
    doc = Document()
    doc.table(*held_out_rows(held_out))
    return doc.markdown().rstrip("\n").replace("**", "")


def verdict_lines(held_out: HeldOut) -> list[str]:
    """Per fold kind and method: mean difference against the built-in defaults with its interval over the
    held-out problems, ahead and behind."""
    lines = []
    for kind, method in sorted(held_out.verdicts):
        evidence = held_out_evidence(held_out, kind, method) if method in METHODS else None
        if evidence is not None:
            lines.append(
                f"{evidence.text()}: {method} against the built-in defaults (test, mean over seeds {held_out.seeds})"
            )
    return lines


def choice_sentences(result: PortfolioResult) -> list[str]:
    """What was chosen from the matrix, on what, and what is missing."""
    request, problems = result.request, result.problems
    out = [
        f"{request.family} ({request.bucket} models): {plural(len(problems), 'problem')} "
        f"({', '.join(f'{p.model} · {p.task}' for p in problems)}), {plural(len(result.candidates), 'candidate')}, "
        f"seeds {request.seed_list}"
        + (f"; without the tasks {', '.join(request.exclude_tasks)}" if request.exclude_tasks else "")
        + (f"; without the models {', '.join(request.exclude_models)}" if request.exclude_models else "")
        + "."
    ]
    if result.default is None:
        out.append(f"Nothing chosen yet: {result.matrix.missing} of {result.planned} cells are not stored.")
        return out
    members = ", ".join(result.candidates[i].name for i in result.portfolio)
    out.append(
        f"Chosen on validation: default {result.candidates[result.default].name}; portfolio [{members}] "
        f"(portfolio value {result.values[-1]:.3f} of 1; {len(result.portfolio)} of the {request.size} members "
        "asked for: the greedy step stops when no candidate adds anything)."
    )
    if result.matrix.missing:
        out.append(f"{result.matrix.missing} cells are not stored; candidates without every cell were not eligible.")
    return out


def portfolio_part(
    doc: Document,
    result: PortfolioResult,
    image: dict[str, str] | None = None,
    *,
    level: int = 3,
    widths: dict[str, int | None] | None = None,
) -> None:
    """One stored matrix in ``doc``: a heading, the note, the heatmap (``image``: caption -> path; ``widths`` as
    :meth:`~ilge_search.report.document.Document.images` takes them), the matrix table, the choice, and the
    left-out tables when there are left-out rows."""

    request = result.request
    key = slug(request.family, request.bucket)
    doc.heading(level, f"Cross-task matrix: {request.family} ({request.bucket} models)", anchor=f"portfolio-{key}")
    doc.paragraph(PORTFOLIO_NOTE)
    if image:
        doc.images(image, widths)
    doc.table(
        *matrix_rows(result),
        label=f"tab:portfolio-{key}",
        text_columns=3,
        caption="Mean validation score over seeds per candidate and problem (the problem's best in bold); "
        "D: default, P: portfolio member.",
    )
    doc.bullets(choice_sentences(result))
    held_out = result.held_out
    if held_out is None or not held_out.rows:
        return
    doc.table(
        *held_out_verdict_rows(held_out),
        label=f"tab:portfolio-{key}-verdict",
        text_columns=2,
        caption="Against the built-in defaults on the held-out problems (test, points; 95% bootstrap interval "
        "over the held-out problems, 2000 resamples, seed 0; win: the interval above 0, bold; tie: it contains 0).",
    )
    doc.table(
        *held_out_rows(held_out),
        label=f"tab:portfolio-{key}-held-out",
        text_columns=4,
        caption=f"Each held-out problem: test score, mean over seeds {held_out.seeds}, of the built-in defaults, "
        "the marginal rule and the portfolio default chosen without it, and of the portfolio member with the "
        "best validation score on it.",
    )
    if result.shipping_check is not None:
        shipping_check_part(doc, result.shipping_check, level=level + 1)


def _matrix_text(result: PortfolioResult) -> str:
    """The matrix as text: mean validation score per candidate and problem, the choice marked."""
    names = [f"{p.model.split('-')[0]}/{p.task[:10]}" for p in result.problems]
    lines = ["candidate   " + " ".join(f"{n:>18}" for n in names)]
    for index, candidate in enumerate(result.candidates):
        mark = _mark(result, index) or " "
        cells = " ".join(f"{v:18.4f}" if v == v else f"{'-':>18}" for v in result.matrix.validation[index])
        lines.append(f"{mark} {candidate.name:<9} {cells}")
    return "\n".join(lines)


def _incomplete_line(result: PortfolioResult) -> str:
    """Why no default or portfolio is shown or saved while cells are missing, and what to do."""
    busy = f", {result.matrix.running} of them being trained by another process now" if result.matrix.running else ""
    return (
        f"no default or portfolio chosen or saved: {result.matrix.missing} cells of the matrix are missing{busy}; "
        f"rerun `ilge-search portfolio --storage {result.storage} --family {result.request.family}` once they are "
        "stored (it trains only what is missing)"
    )


def _table_lines(result: PortfolioResult) -> list[str]:
    """The matrix, the default and portfolio with their configs, and the held-out check when there is one."""
    lines = [_matrix_text(result)]
    lines.append(f"D: default, P: portfolio member; trained {result.trained} cells, {result.matrix.missing} missing")
    if result.matrix.missing:
        lines.append(_incomplete_line(result))
    if result.default is not None:
        for rank, (index, value) in enumerate(zip(result.portfolio, result.values, strict=True), 1):
            config = result.candidates[index].config
            shown = ", ".join(f"{k}={v}" for k, v in config.items() if k not in ("family",))
            lines.append(f"{rank}. {result.candidates[index].name} (portfolio value {value:.3f}): {shown}")
    if result.held_out is not None:
        lines.append(held_out_table(result.held_out))
        lines.extend(verdict_lines(result.held_out))
    return lines


def portfolio_text(result: PortfolioResult, fmt: str, *, dry_run: bool = False) -> str:
    """What ``ilge-search portfolio`` prints for ``result``: a dry run's plan, or the matrix as ``fmt``
    (``csv``: one row per candidate; ``json``: the result with its held-out check; else the table)."""

    if dry_run:
        minutes = (result.estimated_seconds or 0) / 60
        return (
            f"{len(result.problems)} problems x {len(result.candidates)} candidates x {result.request.seeds} seeds: "
            f"{result.planned} cells, {result.matrix.missing} of the matrix missing; about {minutes:.0f} min "
            f"of training on one process (from the studies' own trial times); nothing was created"
        )
    if fmt == "csv":
        rows = ["candidate," + ",".join(p.study for p in result.problems)]
        for candidate, values in zip(result.candidates, result.matrix.validation, strict=True):
            rows.append(candidate.name + "," + ",".join("" if v != v else f"{v:.6f}" for v in values))
        return "\n".join(rows)
    if fmt == "json":
        out = result.to_json()
        if result.held_out is not None:
            out["held_out"] = {"rows": result.held_out.rows, "seeds": result.held_out.seeds}
        return json.dumps(out, indent=1)
    return "\n".join(_table_lines(result))


@dataclass(frozen=True)
class PortfolioRun:
    """How ``ilge-search portfolio`` runs and shows the matrix: processes, a dry run, ``check``, the
    ``plot`` file (refused before any training unless new or ``force``) and the output format."""

    workers: int = 1
    dry_run: bool = False
    check: bool = False
    plot: str | None = None
    force: bool = False
    fmt: str = "table"


# the command line's options of the same names that make a PortfolioRun (``fmt`` is the shared --format)
PORTFOLIO_RUN_OPTIONS = tuple(name for name in PortfolioRun.__dataclass_fields__ if name != "fmt")


def run_portfolio(storage: str, request: PortfolioRequest, setup: TrainingSetup, run: PortfolioRun) -> str:
    """Train what the matrix misses (none on a dry run), draw ``run.plot``, and return the text to print."""

    drawn = run.plot if run.plot and not run.dry_run else None
    if drawn:  # before any training: a refused --plot costs nothing
        check_output_path(drawn, force=run.force, option="--plot")
    result = portfolio(storage, request, setup, workers=run.workers, dry_run=run.dry_run, check=run.check)
    if drawn:
        draw_matrix(result, Path(drawn))
    return portfolio_text(result, run.fmt, dry_run=run.dry_run)


# ----------------------------------------------------------------------------- the shipping check

SHIPPING_CHECK_NOTE = (
    "The shipping rule's left-out checks in the setting that ships: on each fold's held-out problems, the portfolio "
    "default that fold chose (on the matrix's validation scores, as above) and the built-in defaults, each retrained "
    "with its configuration's own epochs and early stopping, with the matrix's seeds and on the same data, and "
    "scored on test (`ilge-search shipping-check`; docs/statistics.md)."
)


def shipping_check_sentences(check: ShippingCheck) -> list[str]:
    """How the check was made, what the folds chose, and what is missing."""
    out = [
        f"{plural(len(check.choices), 'fold')} (defaults chosen: {check.defaults_text()}), "
        f"{plural(len(check.cells), 'cell')} trained with {check.epochs} epochs and early stopping, seeds "
        f"{check.result.request.seed_list}, stored in `{check.study}`."
    ]
    if check.setting:
        out.append(f"Not the setting that ships: {check.setting}.")
    if check.missing:
        busy = f", {check.running} of them being trained now" if check.running else ""
        out.append(f"{check.missing} cells are not stored yet{busy}; the folds with missing cells are left out below.")
    return out


def shipping_check_part(doc: Document, check: ShippingCheck, *, level: int = 4) -> None:
    """The shipping check in ``doc``: a heading, the note, how it was made, and its left-out tables."""

    key = slug(check.result.request.family, check.result.request.bucket)
    doc.heading(level, f"In the setting that ships: {check.epochs} epochs", anchor=f"portfolio-{key}-shipping")
    doc.paragraph(SHIPPING_CHECK_NOTE)
    doc.bullets(shipping_check_sentences(check))
    if not check.held_out.rows:
        return
    doc.table(
        *held_out_verdict_rows(check.held_out),
        label=f"tab:portfolio-{key}-shipping-verdict",
        text_columns=2,
        caption=f"The portfolio default against the built-in defaults, both trained with {check.epochs} epochs and "
        "early stopping (test, points; 95% bootstrap interval over the held-out problems, 2000 resamples, seed 0).",
    )
    doc.table(
        *held_out_rows(check.held_out),
        label=f"tab:portfolio-{key}-shipping-held-out",
        text_columns=4,
        caption=f"Each held-out problem: test score, mean over seeds {check.held_out.seeds}, of the built-in "
        f"defaults and of the portfolio default chosen without it, both trained with {check.epochs} epochs.",
    )


def shipping_check_text(check: ShippingCheck, fmt: str, *, dry_run: bool = False) -> str:
    """What ``ilge-search shipping-check`` prints: a dry run's plan, the check as JSON, its held-out rows as CSV, or
    its tables, verdicts and the shipping rule's sentence (once every cell is stored)."""

    if dry_run:
        minutes = (check.estimated_seconds or 0) / 60
        return (
            f"{len(check.choices)} folds (defaults chosen: {check.defaults_text()}): {len(check.cells)} cells with "
            f"{check.epochs} epochs and seeds {check.result.request.seed_list}, {check.missing} of them missing; at "
            f"most about {minutes:.0f} min of training on one process (the problems' trial times scaled to "
            f"{check.epochs} epochs; early stopping ends sooner); nothing was created"
        )
    if fmt == "json":
        return json.dumps(check.to_json(), indent=1)
    if fmt == "csv":  # one row per held-out problem
        columns = ["fold", "held_out", "model", "task", "unit", "builtin", "portfolio_default"]
        columns += ["portfolio_default_diff", "default_candidate"]
        rows = [",".join(columns)] + [",".join(str(row[c]) for c in columns) for row in check.held_out.rows]
        return "\n".join(rows)
    lines = shipping_check_sentences(check)
    if check.held_out.rows:
        lines.append(held_out_table(check.held_out))
        lines.extend(verdict_lines(check.held_out))
    if check.complete:
        _, why = ShippingEvidence(check.held_out, check.setting, [check.note()], check).verdict()
        lines.append(f"shipping rule: {why}")
    else:
        lines.append(f"rerun the same command to train the {check.missing} missing cells (it trains only those)")
    return "\n".join(lines)


def shipping_table(evidence: ShippingEvidence, label: str) -> str:
    """The shipping rule's evidence for one default (``label``, e.g. the Cayley portfolio default) as the Markdown
    table docs/statistics.md shows: per left-out check its interval and verdict, then how the rows were trained
    and the decision."""
    rows = [] if evidence.held_out is None else evidence.held_out.rows
    defaults: dict[str, dict[str, str]] = {}
    for row in rows:
        defaults.setdefault(row["fold"], {})[row["held_out"]] = row["default_candidate"]
    lines = [f"| check | {label} against the built-in defaults | defaults chosen | verdict |", "|---|---|---|---|"]
    for kind in ("task", "model"):
        found = None if evidence.held_out is None else held_out_evidence(evidence.held_out, kind, "portfolio_default")
        if found is None:
            lines.append(f"| leave one {kind} out | no rows | | |")
            continue
        c, interval = found.comparison, found.comparison.interval
        names = list(defaults.get(kind, {}).values())
        chosen = ", ".join(n + (f" x{names.count(n)}" if names.count(n) > 1 else "") for n in dict.fromkeys(names))
        lines.append(
            f"| leave one {kind} out | {interval.estimate:+.2f} [{interval.low:+.2f}, {interval.high:+.2f}] "
            f"({c.wins} ahead, {c.losses} behind; sign p = {c.sign_p:.2f}, Wilcoxon p = {c.wilcoxon_p:.2f}) "
            f"| {chosen} | {interval.verdict} |"
        )
    _, why = evidence.verdict()
    return "\n".join(lines) + f"\n\nBy the rule: {why}.\n"


SHIPPING_TABLE_MARKERS = ("<!-- shipping-check table: begin -->", "<!-- shipping-check table: end -->")


def statistics_table(storage_url: str, family: str = "cayley", bucket: str = "small") -> str:
    """:func:`shipping_table` of the stored matrix of ``family`` and ``bucket`` in ``storage_url`` (chosen from every
    problem), what docs/statistics.md shows between :data:`SHIPPING_TABLE_MARKERS`; nothing is trained or written.

    Raises:
        ValueError: no such matrix in the storage.
    """

    result = stored_portfolio(storage_url, family, bucket)
    if result is None:
        raise ValueError(f"no {family} ({bucket}) cross-task matrix chosen from every problem in {storage_url}")
    label = report_labels("sentence").get(family, family)
    return shipping_table(shipping_evidence(storage_url, result), f"{label} portfolio default")
