"""Checked on what it never saw: the matrix's choices on left-out tasks and models (``docs/transfer.md``).

For each *fold* (the problems of one task, or of one model when the matrix has two or more, held out),
the candidates, the portfolio default, the greedy portfolio and the marginal defaults are chosen again
on the other problems' validation scores, leaving out every candidate that saw a held-out problem. On
each held-out problem the test scores of the built-in defaults, the fold's marginal defaults, its
portfolio default and the member best on that problem's validation are compared, as differences against
the built-in defaults in score units, in the direction of improvement. Test scores choose nothing.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import statistics
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..encoders import encoder_families
from ..record import (
    portfolio_study_name,
    save_portfolio_choice,
    save_portfolio_request,
    stored_portfolio_choice,
    stored_portfolio_request,
)
from ..storage import copy_study_once, open_storage
from ..tasks.scores import score_unit
from ..tuning import MODEL_SIZE_HINTS
from ..validation import check_int
from .choice import choose_default, greedy_portfolio, normalise, warm_start_order
from .evidence import LeftOutEvidence, left_out_evidence, setting_gap
from .portfolio import (
    BUILTIN,
    MARGINAL,
    MatrixProblem,
    PlannedCell,
    PortfolioRequest,
    PortfolioResult,
    TrainingSetup,
    build_matrix,
    cell_config,
    choose,
    estimate_seconds,
    marginal_values,
    plan_cells,
    portfolio_study,
    read_matrix,
    release_dead_claims,
    start_config_dict,
    stored_scores,
    train_cells,
)
from .problems import ConfigValues, Problem

__all__ = [
    "METHODS",
    "Fold",
    "HeldOut",
    "folds",
    "held_out_cells",
    "held_out_row",
    "held_out_verdicts",
    "builtin_index",
    "fold_choice",
    "train_in_processes",
    "held_out_check",
    "member_sources",
    "left_out_orders",
    "copy_portfolio",
    "shipping_verdict",
    "trained_setting",
    "held_out_evidence",
    "LEFT_OUT_CHECKS",
    "portfolio",
    "read_stored",
    "stored_portfolio",
    "stored_portfolios",
]

METHODS = ("marginal", "portfolio_default", "portfolio_best")  # compared with the built-in defaults


@dataclass(frozen=True)
class Fold:
    """One left-out check: ``kind`` is ``task`` or ``model``, ``name`` what is held out."""

    kind: str
    name: str
    held: tuple[int, ...]  # problem indices

    def label(self) -> str:
        return f"without {self.kind} {self.name}"


def folds(result: PortfolioResult) -> list[Fold]:
    """Leave one task out, then (with two models or more) leave one model out; each fold keeps at least one
    problem to choose from."""
    out = []
    for kind in ("task", "model"):
        names = sorted({getattr(p, kind) for p in result.problems})
        if kind == "model" and len(names) < 2:
            continue
        for name in names:
            held = tuple(i for i, p in enumerate(result.problems) if getattr(p, kind) == name)
            if len(held) < len(result.problems):
                out.append(Fold(kind, name, held))
    return out


def _marginal_config(request: PortfolioRequest, rule_problems: Sequence[Problem], result: PortfolioResult, fold: Fold):
    held = {result.problems[i].study for i in fold.held}
    kept = [p for p in rule_problems if p.study not in held]
    return start_config_dict(request.family, marginal_values(request.family, request.bucket, kept))


def held_out_cells(
    request: PortfolioRequest, rule_problems: Sequence[Problem], result: PortfolioResult
) -> list[PlannedCell]:
    """The cells the left-out checks need beyond the matrix: each fold's marginal defaults on its held-out problems."""
    cells: list[PlannedCell] = []
    for fold in folds(result):
        config = _marginal_config(request, rule_problems, result, fold)
        cells += plan_cells(request, [(-1, config)], result.problems, fold.held)
    return cells


def _fold_rows(result: PortfolioResult, fold: Fold) -> list[int]:
    """Candidates the fold may choose from: the built-in defaults and the other problems' top trials."""
    kept = {p.study for i, p in enumerate(result.problems) if i not in fold.held}
    return [
        i
        for i, c in enumerate(result.candidates)
        if c.name == BUILTIN or any(s.rsplit("#", 1)[0] in kept for s in c.sources if "#" in s)
    ]


@dataclass
class HeldOut:
    """The left-out checks: one row per (fold, held-out problem), and per fold kind and method the mean
    difference against the built-in defaults with how many problems it was ahead and behind (``methods``: those
    the rows hold, of :data:`METHODS`)."""

    rows: list[dict[str, Any]]
    verdicts: dict[tuple[str, str], dict[str, Any]]
    seeds: list[int]
    methods: tuple[str, ...] = METHODS


def held_out_row(
    result: PortfolioResult, fold: Fold, p: int, tests: dict[str, float], choices: dict[str, Any]
) -> dict[str, Any]:
    """One held-out problem's row: the test scores of ``tests`` (``builtin`` and any of :data:`METHODS`) in score
    units, each method's difference against the built-in defaults in the direction of improvement, and
    ``choices`` (what the fold chose)."""
    problem = result.problems[p]
    scale, unit = score_unit(problem.metric)
    sign = 1.0 if problem.maximize else -1.0
    row: dict[str, Any] = {"fold": fold.kind, "held_out": fold.name, "model": problem.model, "task": problem.task}
    row["unit"] = unit
    row["builtin"] = tests["builtin"] * scale
    for method in (m for m in METHODS if m in tests):
        row[method] = tests[method] * scale
        row[f"{method}_diff"] = sign * (tests[method] - tests["builtin"]) * scale
    return {**row, **choices}


def builtin_index(result: PortfolioResult) -> int:
    """The candidate index of the built-in defaults."""
    return next(i for i, c in enumerate(result.candidates) if c.name == BUILTIN)


def fold_choice(result: PortfolioResult, fold: Fold) -> tuple[int, list[int]]:
    """What ``fold`` chooses without its held-out problems, on the other problems' validation scores: (the
    portfolio default, the portfolio members), as candidate indices.

    Raises:
        ValueError: no candidate the fold may choose has every cell on the other problems.
    """

    rows = _fold_rows(result, fold)
    train = [i for i in range(len(result.problems)) if i not in fold.held]
    normalised = normalise(result.matrix.validation[np.ix_(rows, train)], [result.problems[i].maximize for i in train])
    default = rows[choose_default(normalised)]
    return default, [rows[i] for i in greedy_portfolio(normalised, result.request.size)]


def _fold_check(result: PortfolioResult, fold: Fold, marginal: dict[int, float]) -> list[dict[str, Any]]:
    validation, test = result.matrix.validation, result.matrix.test
    default, members = fold_choice(result, fold)
    builtin = builtin_index(result)
    out = []
    for p in fold.held:
        sign = 1.0 if result.problems[p].maximize else -1.0
        best = max(members, key=lambda m: (sign * validation[m, p], -members.index(m)))
        tests = {
            "builtin": test[builtin, p],
            "marginal": marginal.get(p, math.nan),
            "portfolio_default": test[default, p],
            "portfolio_best": test[best, p],
        }
        choices: dict[str, Any] = {
            "default_candidate": result.candidates[default].name,
            "best_member": result.candidates[best].name,
            "portfolio": [result.candidates[m].name for m in members],
        }
        out.append(held_out_row(result, fold, p, tests, choices))
    return out


def held_out_verdicts(
    rows: list[dict[str, Any]], methods: Sequence[str] = METHODS
) -> dict[tuple[str, str], dict[str, Any]]:
    """Per fold kind and method of ``methods``: the rows, the mean difference against the built-in defaults, and on
    how many problems it was ahead and behind (differences rounded to 0.01 first)."""
    verdicts: dict[tuple[str, str], dict[str, Any]] = {}
    for kind in sorted({r["fold"] for r in rows}):
        for method in methods:
            diffs = [r[f"{method}_diff"] for r in rows if r["fold"] == kind and not math.isnan(r[f"{method}_diff"])]
            shown = [round(d, 2) for d in diffs]
            verdicts[(kind, method)] = {
                "rows": len(diffs),
                "mean_difference": statistics.fmean(diffs) if diffs else math.nan,
                "ahead": sum(d > 0 for d in shown),
                "behind": sum(d < 0 for d in shown),
            }
    return verdicts


def held_out_check(
    storage_url: str,
    request: PortfolioRequest,
    rule_problems: Sequence[Problem],
    result: PortfolioResult,
    extra: Sequence[PlannedCell],
) -> HeldOut:
    """The left-out checks of ``result`` from stored cells (``extra``: :func:`held_out_cells`); rows of folds
    with missing cells are left out."""
    scores = stored_scores(storage_url, request, extra)
    rows: list[dict[str, Any]] = []
    for fold in folds(result):
        config = _marginal_config(request, rule_problems, result, fold)
        marginal: dict[int, float] = {}
        for p in fold.held:
            cells = [c for c in extra if c.problem == p and c.key.config == _capped(request, config, result, p)]
            found = [scores[c.key.digest].test for c in cells if c.key.digest in scores]
            if len(found) == request.seeds:
                marginal[p] = statistics.fmean(found)
        try:
            rows += _fold_check(result, fold, marginal)
        except ValueError:  # a candidate's cells are missing: nothing to choose from yet
            continue
    return HeldOut(rows=rows, verdicts=held_out_verdicts(rows), seeds=request.seed_list)


def _capped(request: PortfolioRequest, config: ConfigValues, result: PortfolioResult, p: int) -> ConfigValues:

    return dict(cell_config(request.family, config, result.problems[p], request.max_epochs).to_dict())


LEFT_OUT_CHECKS = ("task", "model")  # the shipping rule needs both


def held_out_evidence(held_out: HeldOut, kind: str, method: str) -> LeftOutEvidence | None:
    """``method`` against the built-in defaults over the held-out problems of the ``kind`` folds: the mean
    difference with its bootstrap interval and tests (``None``: no such rows)."""
    rows = [r for r in held_out.rows if r["fold"] == kind]
    diffs = [r[f"{method}_diff"] for r in rows if not math.isnan(r.get(f"{method}_diff", math.nan))]
    return left_out_evidence(kind, diffs) if diffs else None


def shipping_verdict(
    held_out: HeldOut | None, method: str = "portfolio_default", *, note: str = "", setting: str = ""
) -> tuple[bool, str]:
    """Whether ``method`` may be shipped, and the sentence that says so (``note`` first in its parentheses).

    The rule (:mod:`ilge_search.defaults.evidence`): in both left-out checks (leave one task out, leave
    one model out) the bootstrap interval of the mean difference over the held-out problems against the
    built-in defaults lies above 0, and the cells were trained in the setting that ships (``setting``:
    why not, from :func:`~ilge_search.defaults.evidence.setting_gap`; empty when they were).
    """
    found = [held_out_evidence(held_out, kind, method) for kind in LEFT_OUT_CHECKS] if held_out else []
    evidence = [e for e in found if e is not None]
    checked = {e.kind for e in evidence}
    ok = checked == set(LEFT_OUT_CHECKS) and all(e.passes for e in evidence) and not setting
    missing = [f"no leave-one-{kind}-out rows" for kind in LEFT_OUT_CHECKS if kind not in checked]
    reasons = [r for r in (note, setting) if r] + [e.text() for e in evidence] + missing
    return ok, ("shipped" if ok else "built-in kept") + f" ({'; '.join(reasons)})"


def trained_setting(result: PortfolioResult, values: dict[str, Any]) -> str:
    """Why the matrix's cells of ``values`` (search-space values) were not trained as they ship (empty: they
    were): each problem's cell is capped at the request's, else its study's, epochs."""

    shipped_epochs = int(start_config_dict(result.request.family, values)["epochs"])
    cap = result.request.max_epochs
    return setting_gap([cap if cap is not None else p.max_epochs for p in result.problems], shipped_epochs)


# ----------------------------------------------------------------------------- the command


def portfolio(
    storage_url: str,
    request: PortfolioRequest,
    setup: TrainingSetup | None = None,
    *,
    dry_run: bool = False,
    check: bool = False,
    workers: int = 1,
) -> PortfolioResult:
    """Build (train what is missing), store and choose from the cross-task matrix of ``request``.

    With ``dry_run`` nothing is trained or created: the result says how many cells are missing and
    ``estimated_seconds``. With ``check`` the left-out checks of :mod:`~ilge_search.defaults.transfer`
    run too (their extra cells trained). ``workers`` processes train at once, sharing the cells through
    the storage as processes on other hosts would. A default and portfolio are chosen only from a matrix
    with every cell stored (so processes sharing a storage end with the same choice, that of the last one to
    finish), and stored on the portfolio study (where ``run --warm-start`` reads it) only when no problem
    was excluded. Claims of dead processes of this host are freed first, never left queued.

    Raises:
        ValueError: a bad request, excluded names without problems, no problem at all.
    """
    setup = setup or TrainingSetup()
    rule_problems, result, cells = build_matrix(storage_url, request)
    if check:
        _check_has_folds(result)
    extra = held_out_cells(request, rule_problems, result) if check else []
    everything = [*cells, *extra]
    if not dry_run:
        _release_dead_claims(storage_url, request)
    done = stored_scores(storage_url, request, everything)
    missing = {c.key.digest for c in everything} - set(done)
    result.planned = len({c.key.digest for c in everything})
    result.estimated_seconds = estimate_seconds(everything, result.problems, missing)
    if dry_run:
        return _choose_if_complete(result)
    if missing:
        result.trained = train_in_processes(storage_url, request, everything, result.problems, setup, workers)
        result.matrix = read_matrix(storage_url, request, cells, result.matrix.validation.shape)
    _choose_if_complete(result)
    if check:
        result.held_out = held_out_check(storage_url, request, rule_problems, result, extra)
    _store_request(storage_url, request)
    if result.default is not None and not request.excludes:
        _store_choice(storage_url, result)
    return result


def _choose_if_complete(result: PortfolioResult) -> PortfolioResult:
    """Choose only from a whole matrix: while cells are missing (another process still training them, or a
    training that failed) a choice would rest on fewer candidates or problems than the next run sees, and two
    processes on one storage would save different choices depending on which ended last."""
    return choose(result) if result.matrix.missing == 0 else result


def _release_dead_claims(storage_url: str, request: PortfolioRequest) -> None:

    storage = open_storage(storage_url)
    study = portfolio_study(storage, request.family, request.bucket, create=False)
    if study is not None:
        release_dead_claims(storage, study)


def _check_has_folds(result: PortfolioResult) -> None:
    """``--check`` needs something to leave out: problems of two tasks, or of two models (else its table is empty)."""
    if folds(result):
        return
    shown = ", ".join(f"{p.model}/{p.task}" for p in result.problems)
    raise ValueError(
        f"--check leaves one task or one model out at a time, so it needs problems of two tasks or two models; "
        f"this matrix has {len(result.problems)} ({shown}): drop --check, or run studies of another task first"
    )


def train_in_processes(
    storage_url: str,
    request: PortfolioRequest,
    cells: Sequence[PlannedCell],
    problems: Sequence[MatrixProblem],
    setup: TrainingSetup,
    workers: int,
    study_name: str | None = None,
) -> int:
    """Train ``cells`` in ``workers`` processes (this one shows the progress) into ``study_name`` (default: the
    request's matrix study); the cells trained."""

    check_int("workers", workers)
    if workers == 1:
        return train_cells(storage_url, request, cells, problems, setup, study_name)[0]
    quiet = TrainingSetup(setup.data_dir, setup.cache_dir, setup.device, setup.threads, progress=False)
    # each helper starts at a different problem, so that the claims rarely collide
    starts = [i * len(cells) // workers for i in range(1, workers)]
    with ProcessPoolExecutor(workers - 1, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [
            pool.submit(train_cells, storage_url, request, [*cells[k:], *cells[:k]], problems, quiet, study_name)
            for k in starts
        ]
        trained = train_cells(storage_url, request, cells, problems, setup, study_name)[0]
        return trained + sum(f.result()[0] for f in futures)


def member_sources(result: PortfolioResult, index: int) -> list[str]:
    """The problems (study names) candidate ``index`` came from: the problems whose top trials it equals, every
    problem for the marginal rule (it votes over all of them), none for the built-in defaults."""
    candidate = result.candidates[index]
    if MARGINAL in candidate.sources:
        return [p.study for p in result.problems]
    return sorted({s.rsplit("#", 1)[0] for s in candidate.sources if "#" in s})


def _order_entry(result: PortfolioResult, order: Sequence[int], problems: Sequence[int]) -> dict[str, Any]:
    return {
        "warm_start": [result.candidates[i].config for i in order],
        "names": [result.candidates[i].name for i in order],
        "sources": [member_sources(result, i) for i in order],
        "problems": [result.problems[p].study for p in problems],
    }


def left_out_orders(result: PortfolioResult) -> dict[str, dict[str, Any]]:
    """Per task of the matrix, the warm-start order chosen again without that task's problems (leave one task out, on
    validation): its candidates are the built-in defaults and the other problems' top trials (not the marginal rule,
    which voted with the task's trials). A task whose fold has no complete candidate, or no other problem, gets none."""

    orders: dict[str, dict[str, Any]] = {}
    for fold in folds(result):
        if fold.kind != "task":
            continue
        rows = _fold_rows(result, fold)
        kept = [i for i in range(len(result.problems)) if i not in fold.held]
        normalised = normalise(
            result.matrix.validation[np.ix_(rows, kept)], [result.problems[i].maximize for i in kept]
        )
        try:
            members = greedy_portfolio(normalised, result.request.size)
        except ValueError:  # no candidate complete on the other problems yet
            continue
        orders[fold.name] = _order_entry(result, [rows[i] for i in warm_start_order(normalised, members)], kept)
    return orders


def _store_choice(storage_url: str, result: PortfolioResult) -> None:
    storage = open_storage(storage_url)
    study = portfolio_study(storage, result.request.family, result.request.bucket, create=True)
    everything = _order_entry(result, result.order, range(len(result.problems)))
    save_portfolio_choice(
        study,
        {
            "default": result.candidates[result.default].config if result.default is not None else None,
            "portfolio": [result.candidates[i].config for i in result.portfolio],
            "warm_start": everything["warm_start"],
            "warm_start_names": everything["names"],
            "warm_start_sources": everything["sources"],
            "by_task": left_out_orders(result),  # what a study of one of these tasks warm-starts with
            "problems": everything["problems"],
            "problem_tasks": [p.task for p in result.problems],
            "seeds": result.request.seed_list,
            "top_k": result.request.top_k,
            "size": result.request.size,
            "max_epochs": result.request.max_epochs,
        },
    )


def copy_portfolio(source_url: str, target_url: str, family: str = "cayley", bucket: str = "small") -> bool:
    """Copy the portfolio study of ``family`` and ``bucket`` (cells, stored choice and request) into another
    storage, once (``reports/warmstart.sh``: the warm-start searches' fresh storage gets the matrix's choice, and
    none of its problems' studies); whether it copied. The choice must hold the leave-one-task-out orders
    (:func:`left_out_orders`), so that a study of a matrix task warm-starts without that task's problems.

    Raises:
        ValueError: no such choice in ``source_url``, or ``target_url`` holds another study of that name.
    """

    source = open_storage(source_url, must_exist=True)
    name = portfolio_study_name(family, bucket)
    study = source.load_study(name)
    choice = None if study is None else stored_portfolio_choice(study)
    if not choice or not isinstance(choice.get("by_task"), dict):
        raise ValueError(
            f"{source.shown_url} holds no {family} ({bucket}) portfolio chosen with its leave-one-task-out orders; "
            f"run `ilge-search portfolio --storage {source.shown_url} --family {family}` without exclusions first "
            "(it trains nothing when the cells are stored)"
        )
    return copy_study_once(source, open_storage(target_url), name)


def _store_request(storage_url: str, request: PortfolioRequest) -> None:

    storage = open_storage(storage_url)
    study = portfolio_study(storage, request.family, request.bucket, create=True)
    values = dataclasses.asdict(request)
    save_portfolio_request(study, {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()})


def _request_from(family: str, bucket: str, stored: dict[str, Any], choice: bool) -> PortfolioRequest:
    """The request a stored choice (``choice``) or a stored request was made with."""
    if not choice:
        fields = {f for f in PortfolioRequest.__dataclass_fields__ if f in stored}
        values: dict[str, Any] = {k: tuple(stored[k]) if isinstance(stored[k], list) else stored[k] for k in fields}
        return PortfolioRequest(**{**values, "family": family, "bucket": bucket}).check()
    return PortfolioRequest(
        family=family,
        bucket=bucket,
        top_k=int(stored.get("top_k", 3)),
        size=int(stored.get("size") or len(stored.get("portfolio") or [1])),
        seeds=len(stored["seeds"]),
        seed=int(stored["seeds"][0]) - 1000,
        max_epochs=stored.get("max_epochs"),
    )


def read_stored(storage_url: str, request: PortfolioRequest) -> PortfolioResult:
    """The matrix of ``request`` from the stored cells, the choice made from it on validation and its left-out
    checks (rows whose cells are missing left out); nothing is trained or written."""
    rule_problems, result, _ = build_matrix(storage_url, request)
    choose(result)
    extra = held_out_cells(request, rule_problems, result)
    result.held_out = held_out_check(storage_url, request, rule_problems, result, extra)
    return result


def stored_portfolio(storage_url: str, family: str, bucket: str, *, latest: bool = False) -> PortfolioResult | None:
    """The matrix, choice and left-out checks of the portfolio ``ilge-search portfolio`` stored for ``family``
    and ``bucket``, read back without training (``None``: none stored). By default the one chosen with no
    problem excluded (what ``run --warm-start`` and ``recommend`` use); with ``latest`` the latest run's, its
    exclusions included (what the report shows), else that one."""

    storage = open_storage(storage_url, must_exist=True)
    study = storage.load_study(portfolio_study_name(family, bucket))
    if study is None:
        return None
    last = stored_portfolio_request(study) if latest else None
    if last:
        return read_stored(storage_url, _request_from(family, bucket, last, choice=False))
    choice = stored_portfolio_choice(study)
    if not choice or not choice.get("seeds"):
        return None
    return read_stored(storage_url, _request_from(family, bucket, choice, choice=True))


def stored_portfolios(
    storage_url: str, families: Sequence[str] | None = None, *, latest: bool = True
) -> tuple[list[PortfolioResult], list[str]]:
    """Each family's (default: every ILGE family's) and size bucket's stored matrix (:func:`stored_portfolio`;
    with ``latest`` the latest run's), and a sentence for each that could not be read back (its studies changed
    since, say)."""

    results, notes = [], []
    for family in encoder_families() if families is None else families:
        for bucket in MODEL_SIZE_HINTS:
            try:
                result = stored_portfolio(storage_url, family, bucket, latest=latest)
            except ValueError as exc:
                notes.append(f"The stored {family} ({bucket}) matrix could not be read back: {exc}")
                continue
            if result is not None:
                results.append(result)
    return results, notes
