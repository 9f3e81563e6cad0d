"""A stored cross-task matrix whose scores the test chooses, with no training.

For tests of what reads the matrix (the report, the defaults page, the shipped portfolio):
:func:`add_matrix_problems` stores one study per (model, task) of an ILGE family through the study record
(:func:`~ilge_search.testing.store.add_study`), its complete trials the given configurations with the given
validation scores, so the matrix's candidates are known; :func:`store_matrix` stores every cell of a
request's matrix and of its left-out checks with scores from a function of the test, exactly as ``ilge-search
portfolio --check`` stores trained cells, then runs the command, which finds nothing to train and stores the
request and the choice. Usage::

    add_matrix_problems(url, {("minilm-l6", "trec"): [(start, 0.70), (wide, 0.80)]})
    result = store_matrix(url, PortfolioRequest(top_k=1, seeds=1), lambda candidate, problem, seed: (0.8, 0.7))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..defaults.portfolio import (
    Candidate,
    MatrixProblem,
    PortfolioRequest,
    PortfolioResult,
    build_matrix,
    portfolio_study,
)
from ..defaults.transfer import held_out_cells, portfolio
from ..record import WORKER_ATTR, CellScores, Identity, TrialRecord, claim_cell, finish_cell, worker_stamp
from ..storage import open_storage
from ..study.trial import config_params
from .store import FakeTrial, add_study, classification_data, similarity_data

__all__ = ["CellScore", "add_matrix_problems", "store_matrix"]

# (candidate, or None for a left-out fold's marginal defaults; problem; seed) -> (validation, test) score
CellScore = Callable[[Candidate | None, MatrixProblem, int], tuple[float, float]]
SIMILARITY_TASKS = ("stsb", "sick_r")  # scored by Spearman; the other tasks by accuracy


def add_matrix_problems(
    url: str,
    trials: Mapping[tuple[str, str], Sequence[tuple[dict[str, Any], float]]],
    *,
    family: str = "cayley",
    max_train: int | None = 500,
) -> list[str]:
    """One study per (model, task) of ``trials``, whose complete trials are the given (config dict, validation
    score) pairs in order, the first marked as the starting configuration; the study names."""

    names = []
    for (model, task), configs in trials.items():
        data = similarity_data if task in SIMILARITY_TASKS else classification_data
        fake = [
            FakeTrial(score, params=config_params(family, config), record=TrialRecord(config=dict(config)))
            for config, score in configs
        ]
        if fake:
            fake[0] = FakeTrial(fake[0].value, params=fake[0].params, record=fake[0].record, recommended=True)
        study = add_study(
            url,
            Identity(model=model, task=task, encoder=family, max_train=max_train),
            data=data(hidden_size=384, num_layers=7),
            trials=fake,
        )
        names.append(study.study_name)
    return names


def store_matrix(url: str, request: PortfolioRequest, score: CellScore) -> PortfolioResult:
    """Store every cell of ``request``'s matrix and of its left-out checks with ``score``'s numbers (one call per
    cell and seed), then run ``ilge-search portfolio --check`` on it (nothing left to train) and return its
    result."""
    rule_problems, result, cells = build_matrix(url, request)
    extra = held_out_cells(request, rule_problems, result)
    storage = open_storage(url)
    study = portfolio_study(storage, request.family, request.bucket, create=True)
    # a fold's marginal config may equal a candidate's: the same cell, stored once with the candidate's scores
    for cell in {c.key.digest: c for c in reversed([*cells, *extra])}.values():
        candidate = result.candidates[cell.candidate] if cell.candidate >= 0 else None
        validation, test = score(candidate, result.problems[cell.problem], cell.key.seed)
        trial_id = claim_cell(storage, study, cell.key, lambda number: (WORKER_ATTR, worker_stamp(number)))
        if trial_id is None:  # stored by an earlier call
            continue
        finish_cell(storage, trial_id, CellScores(validation=float(validation), test=float(test)))
    return portfolio(url, request, check=True)
