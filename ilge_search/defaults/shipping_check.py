"""The shipping rule's left-out checks, trained in the setting that ships (``ilge-search shipping-check``).

A cross-task matrix trains every cell with its problem study's epoch cap (10 in the committed storages), so the
left-out checks read from it (:mod:`~ilge_search.defaults.transfer`) measure the candidates in that setting, not as
a default ships: with the configuration's own epochs (50) and early stopping. The shipping rule
(:mod:`~ilge_search.defaults.evidence`) compares only two scores per held-out problem: the portfolio default the
fold chose without the held-out problems, and the built-in defaults. :func:`shipping_check` trains exactly those
cells, each configuration with its own epochs and early stopping, with the matrix's seeds and on the same problem
data, through the one training path (:func:`~ilge_search.defaults.portfolio.train_cells`, hence
:func:`~ilge_search.study.retraining.train_seeds`); which default each fold chooses stays decided on the stored
matrix's validation scores, as ``portfolio --check`` decides it. The cells go into a study of their own whose name
carries their epochs (:func:`~ilge_search.record.shipping_check_study_name`), never into the matrix's, so cells of
different epochs never mix; a rerun trains only what is missing, and processes on one storage share the work.

:func:`shipping_evidence` says which rows the rule reads for a stored matrix: the shipping check's once it is
complete, else the matrix's own (with the sentence saying they were capped); :func:`portfolio_defaults`
(``recommend --method portfolio``) decides with it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..encoders import builtin_start
from ..record import CellKey, portfolio_study_name, save_shipping_check, shipping_check_study_name, stored_cells
from ..storage import hide_password, open_storage
from ..study.trial import config_params
from ..validation import check_int
from .evidence import setting_gap
from .loto import start_config
from .portfolio import PlannedCell, PortfolioResult, TrainingSetup, cells_study, check_matrix, release_dead_claims
from .problems import ConfigValues
from .transfer import (
    BUILTIN,
    Fold,
    HeldOut,
    builtin_index,
    fold_choice,
    folds,
    held_out_row,
    held_out_verdicts,
    shipping_verdict,
    stored_portfolio,
    train_in_processes,
    trained_setting,
)

if TYPE_CHECKING:
    from ..record import CellScores

__all__ = [
    "CHECK_METHODS",
    "ShippingCheckRequest",
    "ShippingCheck",
    "ShippingEvidence",
    "shipped_epochs",
    "checked_matrix",
    "fold_defaults",
    "check_cells",
    "shipping_check",
    "stored_shipping_check",
    "shipping_evidence",
    "attach_shipping_checks",
    "portfolio_defaults",
]

CHECK_METHODS = ("portfolio_default",)  # what the shipping rule compares with the built-in defaults


@dataclass(frozen=True)
class ShippingCheckRequest:
    """Which stored matrix to check (``family``, ``bucket``) and with how many epochs its cells train (``None``:
    each configuration's own, the setting that ships; a smaller number is measured and said to be capped)."""

    family: str = "cayley"
    bucket: str = "small"
    epochs: int | None = None

    def check(self) -> ShippingCheckRequest:
        check_matrix(self.family, self.bucket)
        if self.epochs is not None:
            check_int("epochs", self.epochs)
            own = shipped_epochs(self.family, self.bucket)
            if self.epochs > own:
                raise ValueError(
                    f"epochs {self.epochs} is above the configuration's own {own}: a {self.family} default ships with "
                    f"{own} epochs and early stopping, the most a shipping check trains"
                )
        return self


def shipped_epochs(family: str, bucket: str = "small") -> int:
    """The epochs a default of ``family`` ships with: its configuration's own (early stopping may end sooner)."""
    builtin = builtin_start(family, bucket)
    return int(start_config(family, builtin, None).epochs)


@dataclass
class ShippingCheck:
    """A shipping check of one stored matrix: the matrix and its choice (``result``), the epochs its cells train with,
    its study, the default each fold chose (``choices``: fold, candidate index), the distinct cells it needs and
    those not stored yet (``missing_cells``; ``running``: how many of them another process is training), and the
    left-out rows of the folds whose cells are all stored (``held_out``, method ``portfolio_default`` only)."""

    result: PortfolioResult
    epochs: int
    study: str
    choices: list[tuple[Fold, int]]
    cells: list[PlannedCell]
    missing_cells: list[PlannedCell]
    running: int
    held_out: HeldOut
    trained: int = 0
    estimated_seconds: float | None = None

    @property
    def missing(self) -> int:
        return len(self.missing_cells)

    @property
    def complete(self) -> bool:
        return not self.missing_cells

    @property
    def shipped_epochs(self) -> int:
        return shipped_epochs(self.result.request.family, self.result.request.bucket)

    @property
    def setting(self) -> str:
        """Why the cells were not trained as the defaults ship (empty: they were)."""
        return setting_gap([self.epochs], self.shipped_epochs)

    def note(self) -> str:
        """How the rows were measured, for the shipping sentence."""
        caps = sorted({p.max_epochs for p in self.result.problems if p.max_epochs is not None})
        chosen = f"epochs capped at {', '.join(map(str, caps))}" if caps else "each configuration's own epochs"
        return (
            f"held-out problems trained with {self.epochs} epochs and early stopping, seeds "
            f"{self.result.request.seed_list} ({self.study}); each fold's default chosen on the matrix's "
            f"validation scores ({chosen})"
        )

    def defaults_text(self) -> str:
        """The defaults the folds chose, by kind: ``task: c6 x4, c4, c7; model: c4 x2``."""
        parts = []
        for kind in sorted({fold.kind for fold, _ in self.choices}, reverse=True):
            names = [self.result.candidates[d].name for fold, d in self.choices if fold.kind == kind]
            counted = {name: names.count(name) for name in names}
            parts.append(f"{kind}: " + ", ".join(n + (f" x{c}" if c > 1 else "") for n, c in counted.items()))
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        request = self.result.request
        return {
            "family": request.family,
            "bucket": request.bucket,
            "study": self.study,
            "epochs": self.epochs,
            "shipped_epochs": self.shipped_epochs,
            "seeds": request.seed_list,
            "storage": self.result.storage,
            "choices": [
                {"fold": f.kind, "held_out": f.name, "default": self.result.candidates[d].name} for f, d in self.choices
            ],
            "cells": len(self.cells),
            "missing_cells": self.missing,
            "trained": self.trained,
            "held_out": {"rows": self.held_out.rows, "seeds": self.held_out.seeds},
        }


def checked_matrix(storage_url: str, request: ShippingCheckRequest) -> PortfolioResult:
    """The stored matrix of ``request`` as ``recommend --method portfolio`` reads it (chosen without exclusions),
    complete and with something to leave out; nothing is created.

    Raises:
        ValueError: no such matrix, cells of it missing, or no fold (problems of one task and one model).
    """
    shown = hide_password(storage_url)
    what = f"{request.family} ({request.bucket})"
    again = f"`ilge-search portfolio --storage {shown} --family {request.family} --bucket {request.bucket} --check`"
    result = stored_portfolio(storage_url, request.family, request.bucket)
    if result is None:
        raise ValueError(f"{shown} holds no {what} cross-task matrix chosen without exclusions; run {again} first")
    if result.matrix.missing or result.default is None:
        raise ValueError(
            f"the {what} matrix in {shown} misses {result.matrix.missing} cells; run {again} until it is complete "
            "(it trains only what is missing)"
        )
    if not folds(result):
        raise ValueError(f"the {what} matrix in {shown} has problems of one task and one model: nothing to leave out")
    return result


def fold_defaults(result: PortfolioResult) -> list[tuple[Fold, int]]:
    """Each fold with the portfolio default it chooses without its held-out problems (on validation)."""
    return [(fold, fold_choice(result, fold)[0]) for fold in folds(result)]


def _check_config(result: PortfolioResult, candidate: int, epochs: int | None):
    values = {k: v for k, v in result.candidates[candidate].config.items() if k != "family"}
    return start_config(result.request.family, values, epochs)


def check_cells(result: PortfolioResult, choices: Sequence[tuple[Fold, int]], epochs: int | None) -> list[PlannedCell]:
    """The distinct cells the check needs: on each fold's held-out problems, the built-in defaults and the fold's
    default, each with ``epochs`` (``None``: its own) and every seed of the matrix, on the problem's data."""

    builtin = builtin_index(result)
    cells: dict[str, PlannedCell] = {}
    for fold, default in choices:
        for p in fold.held:
            problem = result.problems[p]
            for candidate in dict.fromkeys((builtin, default)):
                config = _check_config(result, candidate, epochs)
                for seed in result.request.seed_list:
                    key = CellKey(config=config.to_dict(), problem=problem.study, data=problem.data, seed=seed)
                    cells.setdefault(key.digest, PlannedCell(candidate, p, config, key))
    return list(cells.values())


def _mean_tests(
    cells: Sequence[PlannedCell], scores: dict[str, CellScores], seeds: int
) -> dict[tuple[int, int], float]:
    """(candidate, problem) -> mean test score over the seeds, where every seed's cell is stored."""
    found: dict[tuple[int, int], list[float]] = {}
    for cell in cells:
        if cell.key.digest in scores:
            found.setdefault((cell.candidate, cell.problem), []).append(scores[cell.key.digest].test)
    return {key: statistics.fmean(tests) for key, tests in found.items() if len(tests) == seeds}


def _held_out(result: PortfolioResult, choices: Sequence[tuple[Fold, int]], means: dict[tuple[int, int], float]):
    """The left-out rows of the folds whose cells are all stored."""
    builtin = builtin_index(result)
    rows: list[dict[str, Any]] = []
    for fold, default in choices:
        if any((c, p) not in means for p in fold.held for c in (builtin, default)):
            continue
        for p in fold.held:
            tests = {"builtin": means[(builtin, p)], "portfolio_default": means[(default, p)]}
            rows.append(held_out_row(result, fold, p, tests, {"default_candidate": result.candidates[default].name}))
    return HeldOut(rows, held_out_verdicts(rows, CHECK_METHODS), result.request.seed_list, methods=CHECK_METHODS)


def _stored(storage_url: str, study_name: str) -> tuple[dict[str, CellScores], set[str]] | None:
    """(scores by digest, digests being trained) of the check's study, or ``None`` when it does not exist."""

    study = cells_study(open_storage(storage_url, must_exist=True), study_name, create=False)
    if study is None:
        return None
    done, running = stored_cells(study)
    return {digest: cell.scores for digest, cell in done.items()}, running


def _check_of(
    result: PortfolioResult, epochs: int | None, stored: tuple[dict[str, CellScores], set[str]]
) -> ShippingCheck:
    """The check of ``result`` with cells of ``epochs`` (``None``: their own), given its study's (scores by digest,
    digests being trained)."""
    request = result.request
    trained_epochs = epochs or shipped_epochs(request.family, request.bucket)
    scores, running = stored
    choices = fold_defaults(result)
    cells = check_cells(result, choices, epochs)
    missing = [c for c in cells if c.key.digest not in scores]
    return ShippingCheck(
        result=result,
        epochs=trained_epochs,
        study=shipping_check_study_name(request.family, request.bucket, trained_epochs),
        choices=choices,
        cells=cells,
        missing_cells=missing,
        running=sum(c.key.digest in running for c in missing),
        held_out=_held_out(result, choices, _mean_tests(cells, scores, request.seeds)),
    )


def _estimate(result: PortfolioResult, cells: Sequence[PlannedCell], epochs: int) -> float:
    """At most how long ``cells`` train on one process: each problem's trials' mean time, scaled from the study's
    epoch cap to ``epochs`` (early stopping ends sooner)."""
    known = [p.seconds for p in result.problems if p.seconds is not None]
    fallback = statistics.fmean(known) if known else 10.0
    total = 0.0
    for cell in cells:
        problem = result.problems[cell.problem]
        total += (problem.seconds or fallback) * epochs / (problem.max_epochs or epochs)
    return total


def _save(storage_url: str, check: ShippingCheck) -> None:
    """What the check was made from, on its study (created here when no cell was trained into it)."""
    result = check.result
    request = result.request
    study = cells_study(open_storage(storage_url), check.study, create=True)
    assert study is not None
    choices = [
        {
            "fold": f.kind,
            "held_out": f.name,
            "default": result.candidates[d].name,
            "config": result.candidates[d].config,
        }
        for f, d in check.choices
    ]
    save_shipping_check(
        study,
        {
            "family": request.family,
            "bucket": request.bucket,
            "epochs": check.epochs,
            "shipped_epochs": check.shipped_epochs,
            "seeds": request.seed_list,
            "matrix": portfolio_study_name(request.family, request.bucket),
            "matrix_epochs": sorted({p.max_epochs for p in result.problems if p.max_epochs is not None}),
            "problems": [p.study for p in result.problems],
            "choices": choices,
        },
    )


def _release_dead_claims(storage_url: str, study_name: str) -> None:

    storage = open_storage(storage_url)
    study = cells_study(storage, study_name, create=False)
    if study is not None:
        release_dead_claims(storage, study)


def shipping_check(
    storage_url: str,
    request: ShippingCheckRequest | None = None,
    setup: TrainingSetup | None = None,
    *,
    workers: int = 1,
    dry_run: bool = False,
) -> ShippingCheck:
    """Train what is missing of the shipping check of the stored matrix of ``request`` into its own study of
    ``storage_url``, and read it back; with ``dry_run`` nothing is trained or created. ``estimated_seconds`` says at
    most how long the cells missing before this call take on one process. ``workers`` processes train at once,
    sharing the cells through the storage; each problem's data is read as its study in ``storage_url`` recorded it
    (``setup``: where the data and the embedding cache are now, the device and threads).

    Raises:
        ValueError: a bad request or worker count, no complete stored matrix, nothing to leave out.
    """
    request = (request or ShippingCheckRequest()).check()
    check_int("workers", workers)
    result = checked_matrix(storage_url, request)
    epochs = request.epochs or shipped_epochs(request.family, request.bucket)
    name = shipping_check_study_name(request.family, request.bucket, epochs)
    before = _check_of(result, request.epochs, _stored(storage_url, name) or ({}, set()))
    estimate = _estimate(result, before.missing_cells, epochs)
    if dry_run:
        before.estimated_seconds = estimate
        return before
    _release_dead_claims(storage_url, name)
    trained = 0
    if before.missing_cells:
        setup = setup or TrainingSetup()
        trained = train_in_processes(
            storage_url, result.request, before.missing_cells, result.problems, setup, workers, name
        )
    check = _check_of(result, request.epochs, _stored(storage_url, name) or ({}, set()))
    check.trained, check.estimated_seconds = trained, estimate
    _save(storage_url, check)
    return check


def stored_shipping_check(storage_url: str, result: PortfolioResult, epochs: int | None = None) -> ShippingCheck | None:
    """The shipping check of the stored matrix ``result`` as its study holds it now, trained with ``epochs``
    (``None``: the setting that ships); ``None`` when there is no such study, or ``result`` left problems out (the
    check is of the matrix chosen from every problem). Nothing is trained or created."""
    request = result.request
    if request.excludes or not folds(result) or result.matrix.missing:
        return None
    name = shipping_check_study_name(
        request.family, request.bucket, epochs or shipped_epochs(request.family, request.bucket)
    )
    stored = _stored(storage_url, name)
    return None if stored is None else _check_of(result, epochs, stored)


# ----------------------------------------------------------------------------- what the shipping rule reads


@dataclass
class ShippingEvidence:
    """The rows the shipping rule reads for a stored matrix's default (``held_out``), why they were not trained as
    the default ships (``setting``; empty: they were), and what else its sentence says (``notes``)."""

    held_out: HeldOut | None
    setting: str
    notes: list[str] = field(default_factory=list)
    check: ShippingCheck | None = None

    def verdict(self) -> tuple[bool, str]:
        """Whether the default ships, and the sentence saying so (:func:`~.transfer.shipping_verdict`)."""
        return shipping_verdict(self.held_out, note="; ".join(self.notes), setting=self.setting)


def shipping_evidence(storage_url: str, result: PortfolioResult) -> ShippingEvidence:
    """What the shipping rule reads for ``result``'s default: the complete shipping check's rows in the setting that
    ships when the storage holds one, else the matrix's own left-out rows with the sentence saying how they were
    capped (and, when a check was started, how many of its cells are stored)."""

    family = result.request.family
    notes = []
    if result.default is not None and result.candidates[result.default].name == BUILTIN:
        notes.append("the matrix's default is the built-in defaults")  # nothing new: say so, not only +0.00
    check = stored_shipping_check(storage_url, result)
    if check is not None and check.complete:
        return ShippingEvidence(check.held_out, check.setting, [*notes, check.note()], check)
    if check is not None:
        stored = len(check.cells) - check.missing
        notes.append(f"{check.study} holds {stored} of its {len(check.cells)} cells, so the matrix's own rows decide")
    default = {} if result.default is None else config_params(family, result.candidates[result.default].config)
    return ShippingEvidence(result.held_out, trained_setting(result, default), notes, check)


def attach_shipping_checks(storage_url: str, results: Sequence[PortfolioResult]) -> None:
    """Set each result's ``shipping_check`` to its stored check in the setting that ships (what the report and the
    defaults page show), where there is one."""
    for result in results:
        result.shipping_check = stored_shipping_check(storage_url, result)


def portfolio_defaults(
    storage_url: str, values: dict[str, dict[str, ConfigValues]], update_shipped: bool
) -> tuple[dict[str, dict[str, ConfigValues]], dict[str, str]]:
    """``recommend --method portfolio``: each group of ``values`` replaced by its stored portfolio default (as
    search-space values); with ``update_shipped`` only the groups whose default won its left-out checks in the
    setting that ships (:func:`shipping_evidence`).

    Raises:
        ValueError: a group without a stored, complete portfolio.
    """

    chosen: dict[str, dict[str, ConfigValues]] = {}
    shipping: dict[str, str] = {}
    for family, buckets in values.items():
        for bucket in buckets:
            result = stored_portfolio(storage_url, family, bucket)
            if result is None or result.default is None:
                raise ValueError(
                    f"no complete portfolio of {family} ({bucket}) in {hide_password(storage_url)}; run "
                    f"`ilge-search portfolio --storage {hide_password(storage_url)} --family {family} --check` first"
                )
            ship, why = shipping_evidence(storage_url, result).verdict()
            shipping[f"{family}/{bucket}"] = why
            if ship or not update_shipped:
                chosen.setdefault(family, {})[bucket] = config_params(family, result.candidates[result.default].config)
    return chosen, shipping
