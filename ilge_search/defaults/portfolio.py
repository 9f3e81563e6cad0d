"""The cross-task matrix: whole candidate configurations trained on every problem, a default and a portfolio.

The marginal rule (:mod:`~ilge_search.defaults.rule`) votes per hyperparameter, so the configuration it
assembles is one no study trained; here whole configurations are evaluated on every problem and chosen
from that matrix (``docs/transfer.md``). Candidates: the built-in defaults, the marginal rule's
configuration and each problem's ``top_k`` trials, identical ones merged. Each cell is a candidate
trained once per final seed on a problem's own data through the one engine and stored through
:mod:`ilge_search.record.portfolio`, so a rerun trains only what is missing and processes on one storage
share the work. The choice (:mod:`~ilge_search.defaults.choice`) reads validation scores only.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast, overload

import numpy as np
import optuna

from ..encoders import builtin_start, encoder_families
from ..progress import BarSpec, steps
from ..record import (
    WORKER_ATTR,
    CellKey,
    CellScores,
    StudyRecord,
    abandon_cell,
    cell_owners,
    claim_cell,
    finish_cell,
    portfolio_study_name,
    stored_cells,
    study_record,
    trial_config,
    trial_record,
    worker_stamp,
)
from ..storage import (
    Storage,
    fail_stale_trials,
    fail_waiting_trials,
    hide_password,
    open_storage,
)
from ..study.data import StudyData
from ..study.retraining import TrainingSetup, train_seeds
from ..tuning import MODEL_SIZE_HINTS
from ..validation import check_int
from .choice import choose_default, greedy_portfolio, normalise, portfolio_value, warm_start_order
from .loto import start_config
from .problems import ConfigValues, Problem, read_problems
from .rule import derive_defaults

if TYPE_CHECKING:
    import numpy as np
    import optuna

    from ..encoders.configs import EncoderConfig
    from ..record import StoredCell

__all__ = [
    "BUILTIN",
    "MARGINAL",
    "Candidate",
    "check_matrix",
    "MatrixProblem",
    "PortfolioRequest",
    "TrainingSetup",
    "PlannedCell",
    "Matrix",
    "PortfolioResult",
    "read_matrix_problems",
    "matrix_candidates",
    "plan_cells",
    "train_cells",
    "build_matrix",
    "choose",
    "estimate_seconds",
    "portfolio_study",
    "cells_study",
    "release_dead_claims",
    "read_matrix",
    "stored_scores",
]

logger = logging.getLogger(__name__)

BUILTIN = "built-in"
MARGINAL = "marginal"


@dataclass(frozen=True)
class Candidate:
    """One configuration evaluated on every problem: a short name, the config dict and where it came from
    (``built-in``, ``marginal``, or ``<study>#<trial>`` for each problem trial it equals)."""

    name: str
    config: ConfigValues
    sources: tuple[str, ...]


@dataclass(frozen=True)
class MatrixProblem:
    """One problem as the matrix needs it: its study, data key, direction, metric and epoch cap, and its
    complete trials' configurations best first (trial number, config dict)."""

    study: str
    model: str
    task: str
    metric: str
    maximize: bool
    max_epochs: int | None
    data: dict[str, object]
    ranked: tuple[tuple[int, ConfigValues], ...]
    seconds: float | None  # mean training seconds of its trials: what --dry-run estimates with
    train_texts: int | None = None  # its study's training split as searched (after the caps)


def check_matrix(family: str, bucket: str) -> None:
    """Refuse a family or size bucket no cross-task matrix is made for."""
    if family not in encoder_families():
        raise ValueError(f"unknown family {family!r}; choose from {list(encoder_families())}")
    if bucket not in MODEL_SIZE_HINTS:
        raise ValueError(f"unknown size bucket {bucket!r}; choose small or large")


@dataclass(frozen=True)
class PortfolioRequest:
    """What ``ilge-search portfolio`` is asked for (every field checked by :meth:`check`)."""

    family: str = "cayley"
    bucket: str = "small"
    top_k: int = 3
    size: int = 4
    seeds: int = 3
    seed: int = 0
    max_epochs: int | None = None
    exclude_tasks: tuple[str, ...] = ()
    exclude_models: tuple[str, ...] = ()

    def check(self) -> PortfolioRequest:
        check_matrix(self.family, self.bucket)
        check_int("top_k", self.top_k, minimum=0)
        check_int("size", self.size)
        check_int("seeds", self.seeds)
        check_int("seed", self.seed, minimum=0)
        if self.max_epochs is not None:
            check_int("max_epochs", self.max_epochs)
        return self

    @property
    def seed_list(self) -> list[int]:
        return [self.seed + 1000 + i for i in range(self.seeds)]

    @property
    def excludes(self) -> bool:
        return bool(self.exclude_tasks or self.exclude_models)


@dataclass(frozen=True)
class PlannedCell:
    """One cell to read or train: candidate and problem indices (``candidate`` is -1 for a configuration
    outside the candidate list, e.g. a left-out fold's marginal defaults), its config and key."""

    candidate: int
    problem: int
    config: EncoderConfig
    key: CellKey


# ----------------------------------------------------------------------------- problems and candidates


def _data_key(record: StudyRecord) -> dict[str, object]:
    identity, data = record.identity, record.data
    return {
        "model": identity.model if identity else None,
        "task": identity.task if identity else None,
        "setting": identity.data_setting() if identity else {},
        "fingerprints": (data.data_fingerprints or data.cache_keys or None) if data else None,
    }


def _matrix_problem(storage: Storage, problem: Problem) -> MatrixProblem:

    study = storage.load_study(problem.study)
    if study is None:  # read_problems just listed it
        raise ValueError(f"study {problem.study!r} vanished from the storage while it was read")
    record = study_record(study)
    complete = [
        t
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if t.value is not None and math.isfinite(t.value) and trial_record(t).config
    ]
    complete.sort(key=lambda t: (-cast(float, t.value) if record.maximize else cast(float, t.value), t.number))
    seconds = [s for s in (trial_record(t).seconds for t in complete) if s is not None]
    return MatrixProblem(
        study=problem.study,
        model=problem.model,
        task=problem.task,
        metric=(record.data.metric if record.data else None) or "score",
        maximize=record.maximize,
        max_epochs=record.identity.max_epochs if record.identity else None,
        data=_data_key(record),
        ranked=tuple((t.number, trial_config(t).to_dict()) for t in complete),
        seconds=statistics.fmean(seconds) if seconds else None,
        train_texts=(record.data.split_sizes.get("train") if record.data else None),
    )


def read_matrix_problems(storage_url: str, request: PortfolioRequest) -> tuple[list[Problem], list[MatrixProblem]]:
    """The rule's problems and the matrix's problems of ``request`` (exclusions applied), in one order.

    Raises:
        ValueError: an excluded task or model without a problem, or no problem left.
    """
    groups, _ = read_problems(storage_url, [request.family])
    found = groups.get((request.family, request.bucket), [])
    for what, names, known in (
        ("task", request.exclude_tasks, sorted({p.task for p in found})),
        ("model", request.exclude_models, sorted({p.model for p in found})),
    ):
        absent = [n for n in names if n not in known]
        if absent:
            raise ValueError(
                f"--exclude-{what} {', '.join(absent)}: no {request.family} ({request.bucket}) problem of that "
                f"{what} in {hide_password(storage_url)} (its {what}s: {', '.join(known) or 'none'})"
            )
    problems = [p for p in found if p.task not in request.exclude_tasks and p.model not in request.exclude_models]
    if not problems:
        raise ValueError(
            f"no {request.family} ({request.bucket}) study with two scored trials in {hide_password(storage_url)}"
            + (" besides the excluded ones" if request.excludes else "")
            + "; run studies first (`ilge-search sweep studies/offline.toml`)"
        )
    problems.sort(key=lambda p: (p.model, p.task, p.study))
    storage = open_storage(storage_url, must_exist=True)
    return problems, [_matrix_problem(storage, p) for p in problems]


def marginal_values(family: str, bucket: str, problems: Sequence[Problem]) -> ConfigValues:
    """The marginal rule's configuration (over the built-in values) from ``problems``."""
    builtin = builtin_start(family, bucket)
    values, _, _ = derive_defaults({(family, bucket): list(problems)})
    return {**builtin, **values.get(family, {}).get(bucket, {})}


def start_config_dict(family: str, values: ConfigValues) -> ConfigValues:
    return dict(start_config(family, {k: v for k, v in values.items() if k != "family"}, None).to_dict())


def matrix_candidates(
    request: PortfolioRequest, problems: Sequence[Problem], matrix_problems: Sequence[MatrixProblem]
) -> list[Candidate]:
    """Built-in, marginal rule, then each problem's top ``top_k`` trials; identical configurations (up to
    ``epochs``, which each cell caps) merged, the first source's config kept."""
    builtin = builtin_start(request.family, request.bucket)
    found: list[tuple[str, ConfigValues]] = [
        (BUILTIN, start_config_dict(request.family, builtin)),
        (MARGINAL, start_config_dict(request.family, marginal_values(request.family, request.bucket, problems))),
    ]
    for problem in matrix_problems:
        found += [(f"{problem.study}#{number}", config) for number, config in problem.ranked[: request.top_k]]
    merged: dict[str, tuple[ConfigValues, list[str]]] = {}
    for source, config in found:
        # a study's trials carry its epoch cap; every cell caps epochs again, so they do not tell configs apart
        key = repr(sorted((k, v) for k, v in config.items() if k != "epochs"))
        merged.setdefault(key, (config, []))[1].append(source)
    candidates = []
    for index, (config, sources) in enumerate(merged.values()):
        name = sources[0] if sources[0] in (BUILTIN, MARGINAL) else f"c{index}"
        candidates.append(Candidate(name=name, config=config, sources=tuple(sources)))
    return candidates


# ----------------------------------------------------------------------------- cells


def cell_config(family: str, config: ConfigValues, problem: MatrixProblem, max_epochs: int | None) -> EncoderConfig:
    """A candidate's config as trained on ``problem``: epochs capped at ``max_epochs``, else the study's cap."""
    cap = max_epochs if max_epochs is not None else problem.max_epochs
    return start_config(family, {k: v for k, v in config.items() if k != "family"}, cap)


def plan_cells(
    request: PortfolioRequest,
    configs: Sequence[tuple[int, ConfigValues]],
    problems: Sequence[MatrixProblem],
    columns: Sequence[int] | None = None,
) -> list[PlannedCell]:
    """Every (config, problem, seed) cell of ``configs`` (candidate index, config dict) on ``columns`` (problem
    indices; default all)."""
    cells = []
    for p in range(len(problems)) if columns is None else columns:
        for candidate, values in configs:
            config = cell_config(request.family, values, problems[p], request.max_epochs)
            for seed in request.seed_list:
                key = CellKey(config=config.to_dict(), problem=problems[p].study, data=problems[p].data, seed=seed)
                cells.append(PlannedCell(candidate, p, config, key))
    return cells


def _stamp(number: int) -> tuple[str, dict[str, object]]:
    return WORKER_ATTR, worker_stamp(number)


def _train_cells(cells: Sequence[PlannedCell], data: StudyData, device: str) -> list[CellScores]:
    """The scores of cells of one config on one problem, their seeds trained in one pass where the engine can."""

    start = time.perf_counter()
    trained = list(train_seeds(data, cells[0].config, [cell.key.seed for cell in cells], device=device))
    tested = [float(data.test_metrics(model.model)[data.metric]) for model in trained]
    share = (time.perf_counter() - start) / len(cells)
    return [
        CellScores(validation=model.val_score, test=test, epochs_run=model.epochs_run, seconds=round(share, 3))
        for model, test in zip(trained, tested, strict=True)
    ]


def _config_groups(cells: Sequence[PlannedCell]) -> list[list[PlannedCell]]:
    """``cells`` grouped by problem and config, in order: a group's cells differ only in their seed."""
    groups: dict[tuple[int, str], list[PlannedCell]] = {}
    for cell in cells:
        groups.setdefault((cell.problem, json.dumps(cell.config.to_dict(), sort_keys=True)), []).append(cell)
    return list(groups.values())


@overload
def portfolio_study(storage: Storage, family: str, bucket: str, create: Literal[True]) -> optuna.Study: ...
@overload
def portfolio_study(storage: Storage, family: str, bucket: str, create: Literal[False]) -> optuna.Study | None: ...
def portfolio_study(storage: Storage, family: str, bucket: str, create: bool) -> optuna.Study | None:
    return cells_study(storage, portfolio_study_name(family, bucket), create)


def cells_study(storage: Storage, name: str, create: bool) -> optuna.Study | None:
    """The study of cells named ``name`` (the matrix's, or another set of cells such as the shipping check's),
    created when missing only with ``create``."""

    study = storage.load_study(name)
    if study is None and create:
        study = optuna.create_study(study_name=name, storage=storage.rdb, direction="maximize", load_if_exists=True)
    return study


def release_dead_claims(storage: Storage, study: optuna.Study) -> None:
    """Free the cells of processes of this host that died: their claims are failed and not re-queued, since a
    cell is claimed afresh by whoever trains it and nothing ever runs a queued trial of this study; a queued
    copy already there (an earlier version re-queued such claims) is failed too."""
    fail_stale_trials(study, storage, retry=False)
    fail_waiting_trials(study, storage)


def train_cells(
    storage_url: str,
    request: PortfolioRequest,
    cells: Sequence[PlannedCell],
    problems: Sequence[MatrixProblem],
    setup: TrainingSetup,
    study_name: str | None = None,
) -> tuple[int, int]:
    """Train the cells of ``cells`` no process has stored or is training, into ``study_name`` (default: the
    request's matrix study; the problems' data is read from the same storage); (trained, left to others)."""

    storage = open_storage(storage_url)
    name = study_name or portfolio_study_name(request.family, request.bucket)
    study = cast("optuna.Study", cells_study(storage, name, create=True))
    release_dead_claims(storage, study)
    done, running = stored_cells(study)
    todo = [c for c in cells if c.key.digest not in done and c.key.digest not in running]
    todo = list({c.key.digest: c for c in todo}.values())
    first: dict[int, int] = {}  # one problem's arrays loaded at a time, problems in the order given
    for cell in todo:
        first.setdefault(cell.problem, len(first))
    todo.sort(key=lambda c: first[c.problem])
    loaded: dict[int, StudyData] = {}
    trained = skipped = 0
    bar = BarSpec(study_name or f"{request.family} matrix", unit="config", enabled=setup.progress)
    with setup.torch_threads():
        for group in steps(_config_groups(todo), bar):
            owned = cell_owners(study)
            claims = [(c, None if c.key.digest in owned else claim_cell(storage, study, c.key, _stamp)) for c in group]
            mine = [(cell, trial_id) for cell, trial_id in claims if trial_id is not None]
            skipped += len(group) - len(mine)
            if not mine:
                continue
            problem = group[0].problem
            try:
                if problem not in loaded:
                    loaded.clear()
                    loaded[problem] = setup.load_data(storage.existing_study(problems[problem].study), with_test=True)
                scores = _train_cells([cell for cell, _ in mine], loaded[problem], setup.device)
            except BaseException:
                for _, trial_id in mine:
                    abandon_cell(storage, trial_id)
                raise
            for (_, trial_id), cell_scores in zip(mine, scores, strict=True):
                finish_cell(storage, trial_id, cell_scores)
            trained += len(mine)
    return trained, skipped + len(running & {c.key.digest for c in cells})


# ----------------------------------------------------------------------------- the matrix


@dataclass
class Matrix:
    """Mean validation and test scores over seeds, candidates x problems (NaN: a cell missing)."""

    validation: np.ndarray  # candidates x problems
    test: np.ndarray
    missing: int  # cells not stored
    running: int  # cells other processes are training


def read_matrix(
    storage_url: str, request: PortfolioRequest, cells: Sequence[PlannedCell], shape: tuple[int, int]
) -> Matrix:
    """The stored scores of ``cells`` (those with a candidate index) as a :class:`Matrix`; nothing is created."""

    done, running = _stored_cells(storage_url, request)
    sums: dict[tuple[int, int], list[CellScores]] = {}
    missing = busy = 0
    for cell in cells:
        stored = done.get(cell.key.digest)
        if stored is None:
            missing += 1
            busy += cell.key.digest in running
            continue
        sums.setdefault((cell.candidate, cell.problem), []).append(stored.scores)
    validation, test = np.full(shape, np.nan), np.full(shape, np.nan)
    for (c, p), scores in sums.items():
        if c >= 0 and len(scores) == request.seeds:
            validation[c, p] = statistics.fmean(s.validation for s in scores)
            test[c, p] = statistics.fmean(s.test for s in scores)
    return Matrix(validation=validation, test=test, missing=missing, running=busy)


def _stored_cells(storage_url: str, request: PortfolioRequest) -> tuple[dict[str, StoredCell], set[str]]:
    """(the stored cells of ``request``'s matrix by digest, the digests being trained); nothing is created."""
    storage = open_storage(storage_url, must_exist=True)
    study = portfolio_study(storage, request.family, request.bucket, create=False)
    return stored_cells(study) if study is not None else ({}, set())


def stored_scores(storage_url: str, request: PortfolioRequest, cells: Sequence[PlannedCell]) -> dict[str, CellScores]:
    """Digest -> scores of the stored cells among ``cells``."""
    done, _ = _stored_cells(storage_url, request)
    wanted = {c.key.digest for c in cells}
    return {digest: cell.scores for digest, cell in done.items() if digest in wanted}


@dataclass
class PortfolioResult:
    """The matrix of one family and size bucket, and what was chosen from it (on validation only).

    ``default`` and ``portfolio`` are candidate indices (``None`` / empty while no candidate has every
    cell); ``values`` the portfolio's value after each member (mean best normalised score); ``order`` the
    order a warm start takes candidates in (the portfolio, then the other eligible candidates by mean
    normalised score, :func:`~ilge_search.defaults.choice.warm_start_order`).
    """

    storage: str
    request: PortfolioRequest
    problems: list[MatrixProblem]
    candidates: list[Candidate]
    matrix: Matrix
    default: int | None = None
    portfolio: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    order: list[int] = field(default_factory=list)
    trained: int = 0
    planned: int = 0
    estimated_seconds: float | None = None
    held_out: Any = None  # a transfer.HeldOut when the left-out checks were asked for
    shipping_check: Any = None  # a shipping_check.ShippingCheck, its left-out checks in the setting that ships

    def to_json(self) -> dict[str, Any]:
        """``{"problems", "candidates", "scores", "default", "portfolio"}`` (``scores``: candidates x problems
        mean validation scores, null where missing)."""

        def number(value: float) -> float | None:
            return None if value != value else round(float(value), 6)

        def member(index: int, value: float | None = None) -> dict[str, Any]:
            out = {"candidate": self.candidates[index].name, "config": self.candidates[index].config}
            return out if value is None else {**out, "portfolio_value": round(value, 6)}

        return {
            "family": self.request.family,
            "bucket": self.request.bucket,
            "seeds": self.request.seed_list,
            "problems": [
                {"study": p.study, "model": p.model, "task": p.task, "metric": p.metric} for p in self.problems
            ],
            "candidates": [{"name": c.name, "sources": list(c.sources), "config": c.config} for c in self.candidates],
            "scores": [[number(v) for v in row] for row in self.matrix.validation],
            "default": None if self.default is None else member(self.default),
            "portfolio": [member(i, v) for i, v in zip(self.portfolio, self.values, strict=True)],
            "warm_start_order": [self.candidates[i].name for i in self.order],
            "missing_cells": self.matrix.missing,
        }


def choose(result: PortfolioResult) -> PortfolioResult:
    """Fill ``default``, ``portfolio`` and ``values`` from the validation matrix (when some candidate is complete)."""
    normalised = normalise(result.matrix.validation, [p.maximize for p in result.problems])
    try:
        result.default = choose_default(normalised)
    except ValueError:
        return result
    result.portfolio = greedy_portfolio(normalised, result.request.size)
    result.values = [portfolio_value(normalised, result.portfolio[: i + 1]) for i in range(len(result.portfolio))]
    result.order = warm_start_order(normalised, result.portfolio)
    return result


def build_matrix(storage_url: str, request: PortfolioRequest) -> tuple[list[Problem], PortfolioResult, list]:
    """Problems, candidates and the planned cells of ``request``, with what is stored (nothing trained)."""
    request = request.check()
    rule_problems, problems = read_matrix_problems(storage_url, request)
    candidates = matrix_candidates(request, rule_problems, problems)
    cells = plan_cells(request, list(enumerate(c.config for c in candidates)), problems)
    matrix = read_matrix(storage_url, request, cells, (len(candidates), len(problems)))
    result = PortfolioResult(hide_password(storage_url), request, problems, candidates, matrix, planned=len(cells))
    return rule_problems, result, cells


def estimate_seconds(cells: Sequence[PlannedCell], problems: Sequence[MatrixProblem], missing: set[str]) -> float:
    """Training time of the missing cells, from the problems' own trials' recorded seconds."""
    known = [p.seconds for p in problems if p.seconds is not None]
    fallback = statistics.fmean(known) if known else 10.0
    return sum(
        problems[c.problem].seconds or fallback
        for c in {c.key.digest: c for c in cells}.values()
        if c.key.digest in missing
    )
