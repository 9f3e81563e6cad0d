"""The portfolio shipped with the package, written from a storage's stored cross-task matrix (maintainers only).

:func:`update_shipped_portfolio` (``ilge-search portfolio --update-shipped``) writes one family's and size bucket's
entry of ``ilge_search/data/portfolio.json`` (schema in :mod:`ilge_search.record.portfolio`) from a stored, complete
matrix and trains nothing. The members are the warm-start order (:func:`~ilge_search.defaults.choice.warm_start_order`)
without the package's starting configuration, which every new study trains first, so ship the defaults (``recommend
--update-shipped``) before this file. The provenance says what the members were chosen from, on validation scores.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._version import __version__
from ..record import load_shipped_portfolio, shipped_portfolio_path, write_shipped_portfolio
from ..study.trial import config_params
from ..tuning import load_recommended_defaults
from .portfolio import PortfolioRequest, PortfolioResult, start_config_dict
from .problems import ConfigValues
from .transfer import held_out_evidence, member_sources, read_stored

__all__ = ["check_evidence", "shipped_entry", "shipped_start", "update_shipped_portfolio"]

_NO_CAP = 10**9  # an entry chosen without an epoch cap counts as more epochs than any cap


def _left_out(result: PortfolioResult) -> dict[str, Any]:
    """The left-out checks' verdicts, per fold kind and method, with the interval of the mean difference over
    the held-out problems (empty when none are stored)."""
    if result.held_out is None:
        return {}
    out = {}
    for (kind, method), verdict in sorted(result.held_out.verdicts.items()):
        evidence = held_out_evidence(result.held_out, kind, method) if verdict["rows"] else None
        if evidence is None:
            continue
        interval = evidence.comparison.interval
        out[f"{kind}/{method}"] = {
            "problems": int(verdict["rows"]),
            "mean_difference": round(float(verdict["mean_difference"]), 4),
            "interval": [round(interval.low, 4), round(interval.high, 4)],
            "verdict": interval.verdict,
            "ahead": int(verdict["ahead"]),  # numpy integers, from numpy scores
            "behind": int(verdict["behind"]),
        }
    return out


def shipped_start(family: str, bucket: str) -> ConfigValues:
    """The configuration a new study of ``family`` and ``bucket`` starts from with the package's own defaults
    (built-in values merged with the shipped defaults file; a user's file plays no part in what is shipped)."""

    return start_config_dict(family, load_recommended_defaults().get(family, {}).get(bucket, {}))


def shipped_entry(result: PortfolioResult, note: str = "") -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(members, provenance) of the shipped file's entry for ``result`` (a complete, chosen matrix).

    Raises:
        ValueError: cells of the matrix are missing, or no member differs from the starting configuration.
    """

    request = result.request
    if result.matrix.missing or result.default is None:
        raise ValueError(
            f"{result.matrix.missing} of the {result.planned} cells of this {request.family} ({request.bucket}) "
            f"matrix are not stored in {result.storage}; run `ilge-search portfolio` with the same options first "
            "(--update-shipped trains nothing)"
        )
    start = config_params(request.family, shipped_start(request.family, request.bucket))
    order = [i for i in result.order if config_params(request.family, result.candidates[i].config) != start]
    members = order[: request.size]
    if not members:
        raise ValueError(
            "every candidate of this matrix is the starting configuration; there is nothing to warm-start with"
        )
    task_of = {p.study: p.task for p in result.problems}
    provenance = {
        "source": result.storage,
        "family": request.family,
        "bucket": request.bucket,
        "problems": [p.study for p in result.problems],
        "models": sorted({p.model for p in result.problems}),
        "tasks": sorted({p.task for p in result.problems}),
        "excluded_tasks": list(request.exclude_tasks),
        "excluded_models": list(request.exclude_models),
        "candidates": len(result.candidates),
        "top_k": request.top_k,
        "seeds": request.seed_list,
        "max_epochs": request.max_epochs,
        "train_texts": _train_texts(result),
        "chosen_on": "validation",
        "greedy_members": int(sum(i in result.portfolio for i in members)),
        "member_names": [result.candidates[i].name for i in members],
        # per member the tasks it came from: a warm start skips members that came only from its own task
        "member_tasks": [sorted({task_of[s] for s in member_sources(result, i)}) for i in members],
        "left_out_checks_on_test": _left_out(result),
        "generated": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "ilge_search_version": __version__,
        "note": note,
    }
    return [dict(result.candidates[i].config) for i in members], provenance


def _train_texts(result: PortfolioResult) -> int | None:
    """The training texts of every problem together (``None`` when a problem's study does not say)."""
    sizes = [p.train_texts for p in result.problems]
    return None if any(size is None for size in sizes) else int(sum(size or 0 for size in sizes))


def _evidence(provenance: Mapping[str, Any]) -> dict[str, int]:
    """What an entry was chosen from, as counts where more is more evidence (``max_epochs``: no cap counts as
    more than any cap); keys the provenance lacks (older files) are left out."""
    counts: dict[str, int] = {}
    for key in ("problems", "models", "tasks", "seeds"):
        if isinstance(provenance.get(key), list):
            counts[key] = len(provenance[key])
    if isinstance(provenance.get("train_texts"), int):
        counts["training texts"] = provenance["train_texts"]
    if "max_epochs" in provenance:
        cap = provenance["max_epochs"]
        counts["epochs"] = cap if isinstance(cap, int) else _NO_CAP
    return counts


def _shown(counts: Mapping[str, int]) -> str:
    def one(key: str, value: int) -> str:
        if key == "epochs":
            return "no epoch cap" if value == _NO_CAP else f"epochs capped at {value}"
        return f"{value} {key if value != 1 else key[:-1]}"

    return ", ".join(one(key, value) for key, value in counts.items())


def check_evidence(new: Mapping[str, Any], old: Mapping[str, Any] | None, where: str, force: bool) -> None:
    """Refuse to replace a shipped entry chosen from more evidence (more problems, models, tasks, seeds,
    training texts or epochs) than ``new`` unless ``force``; the line names both evidences."""
    if old is None or force:
        return
    ours, theirs = _evidence(new), _evidence(old)
    thinner = [key for key in ours if key in theirs and ours[key] < theirs[key]]
    if thinner:
        raise ValueError(
            f"--update-shipped: this matrix ({_shown(ours)}) is thinner evidence than the {new['family']} "
            f"({new['bucket']}) portfolio in {where} it would replace ({_shown(theirs)}; fewer "
            f"{', '.join(thinner)}); pass --force to replace it on purpose"
        )


def update_shipped_portfolio(
    storage_url: str,
    request: PortfolioRequest,
    *,
    note: str = "",
    path: str | Path | None = None,
    force: bool = False,
) -> tuple[Path, PortfolioResult, list[dict[str, Any]]]:
    """Write ``request``'s family and bucket into the shipped portfolio file (``path``: default the package's)
    from the matrix stored in ``storage_url``; trains nothing. (path written, the matrix, the members). An entry
    chosen from more evidence is replaced only with ``force`` (:func:`check_evidence`).

    Raises:
        ValueError: a bad request, no problem, cells missing, thinner evidence than the entry it replaces, or
            the file cannot be written.
    """

    result = read_stored(storage_url, request.check())
    members, provenance = shipped_entry(result, note)
    current = load_shipped_portfolio(path)["families"].get(request.family, {}).get(request.bucket)
    check_evidence(
        provenance, None if current is None else current["provenance"], str(shipped_portfolio_path(path)), force
    )
    try:
        written = write_shipped_portfolio(request.family, request.bucket, members, provenance, path)
    except OSError as exc:  # e.g. a read-only installed package
        raise ValueError(f"cannot write the shipped portfolio: {exc.strerror or exc} ({exc.filename})") from exc
    return written, result, members
