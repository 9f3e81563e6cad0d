"""Regenerate the ``recommended_config`` defaults from stored studies.

:func:`regenerate_defaults` reads a storage's studies as problems (:func:`~ilge_search.defaults.problems.read_problems`)
and derives one configuration per family and model-size bucket with the rule of :mod:`~ilge_search.defaults.rule`: a
:class:`Recommendation`, the document :func:`ilge_search.tuning.recommended_config` reads and the evidence behind every
value. ``exclude_tasks`` (``--exclude-task T``) leaves the named tasks' studies out. Writing the document and its page
is :func:`ilge_search.report.defaults_page.recommend_defaults`'s job; :func:`defaults_targets` says where it writes.

Shipping only what generalises: before regenerated defaults replace the shipped ones
(``update_shipped=True``), the leave-one-task-out evaluation (:mod:`~ilge_search.defaults.loto`) must be
stored and current for every (model, task) a family has a study of, and a family is shipped only when
the bootstrap interval of its regenerated defaults' mean difference to the built-in ones there lies above 0,
measured in the setting that ships (:mod:`~ilge_search.defaults.evidence`, :func:`shipping_decision`); otherwise
the shipped file leaves it out and ``recommended_config`` falls back to the built-in values.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import tuning  # RECOMMENDED_DEFAULTS_PATH looked up per call: tests point it elsewhere
from .._version import __version__
from ..encoders import config_classes, encoder_families
from ..settings import user_defaults_path
from ..storage import hide_password
from ..tuning import DEFAULTS_FORMAT_VERSION
from .loto import LOTO_FAMILIES, LotoResult, LotoVerdict, stored_loto
from .problems import ConfigValues, Problem, ProblemGroups, problem_tasks, read_problems
from .rule import RULE, RecommendedValue, derive_defaults
from .shipping_check import attach_shipping_checks, portfolio_defaults
from .transfer import stored_portfolios

if TYPE_CHECKING:
    from .portfolio import PortfolioResult

__all__ = [
    "DEFAULT_FAMILIES",
    "METHODS",
    "NEXT_TO_DEFAULTS",
    "Recommendation",
    "regenerate_defaults",
    "defaults_targets",
    "shipping_decision",
]

PathLike = str | os.PathLike

DEFAULT_FAMILIES: Sequence[str] = encoder_families()  # every ILGE family
METHODS = ("marginal", "portfolio")  # how a group's defaults are chosen (recommend --method)
NEXT_TO_DEFAULTS = "next-to-defaults"  # report_path default: the defaults file's name with .md
SIZE_BUCKETS_NOTE = (
    "small: up to 3B parameters (models of 1B-3B included, as the study runner buckets them); large: above 3B"
)

Values = dict[str, dict[str, ConfigValues]]  # family -> size bucket -> configuration values


@dataclass(frozen=True)
class Recommendation:
    """Regenerated defaults and what they were derived from.

    Attributes:
        document: the defaults file's content (``format_version``, ``metadata``, ``families``).
        evidence: per (family, bucket), each chosen value with its score, coverage and runner-up.
        groups: per (family, bucket), the problems (studies) the rule used.
        families: the families asked for, in order.
        loto: the stored leave-one-task-out evaluation of those families (``None``: none of them has one).
        portfolios: the stored cross-task matrices of those families with their left-out checks
            (:class:`~ilge_search.defaults.portfolio.PortfolioResult`: with ``method="portfolio"`` the ones the
            values came from, else each group's latest), and why any could not be read back.
    """

    document: dict[str, Any]
    evidence: dict[tuple[str, str], list[RecommendedValue]]
    groups: dict[tuple[str, str], list[Problem]]
    families: list[str]
    loto: LotoResult | None
    portfolios: tuple[list[PortfolioResult], list[str]] = ([], [])


def defaults_targets(
    out_path: PathLike | None = None,
    report_path: PathLike | None = NEXT_TO_DEFAULTS,
    *,
    update_shipped: bool = False,
) -> tuple[Path, Path | None]:
    """Where ``recommend`` writes: (defaults file, Markdown page or ``None``).

    Raises:
        ValueError: ``update_shipped`` together with ``out_path``.
    """
    if update_shipped and out_path is not None:
        raise ValueError("give either out_path (--out) or update_shipped (--update-shipped), not both")
    if update_shipped:
        target = tuning.RECOMMENDED_DEFAULTS_PATH
    else:
        target = user_defaults_path(out_path)
    if report_path == NEXT_TO_DEFAULTS:
        # the shipped file's page is reports/defaults.md in the repository, not inside the package
        return target, None if update_shipped else target.with_suffix(".md")
    return target, None if report_path is None else Path(report_path)


def _decision(verdict: LotoVerdict) -> str:
    """The shipping rule's sentence for one group: shipped or not, with the interval that decided it."""
    rows = f"{verdict.rows} left-out row{'' if verdict.rows == 1 else 's'}"
    evidence = f"; {verdict.evidence.text()}" if verdict.evidence is not None else ""
    if verdict.regenerated_win:
        return f"regenerated, {verdict.mean_difference:+.2f} points over the built-in defaults on {rows}{evidence}"
    setting = f"; {verdict.setting}" if verdict.setting else ""
    return (
        f"built-in kept: the regenerated defaults were {verdict.mean_difference:+.2f} points against them on "
        f"{rows}{setting}{evidence}"
    )


def shipping_decision(values: Mapping[str, Mapping[str, object]], loto: LotoResult) -> dict[str, str]:
    """The shipping rule: per ``family/bucket`` of ``values``, shipped or not and why.

    A group is shipped only when its regenerated defaults clearly beat the built-in ones (the interval of the
    mean difference above 0, in the setting that ships) over the
    left-out tasks of a current leave-one-task-out evaluation (:class:`~ilge_search.defaults.loto.LotoResult`).

    Raises:
        ValueError: a group has no such evaluation, or rows of it are missing or stale.
    """
    decisions: dict[str, str] = {}
    for family, buckets in values.items():
        for bucket in buckets:
            missing = [m for m in loto.missing if m.endswith(f"/{family}")]
            verdict = loto.verdicts.get((family, bucket))
            if verdict is None or missing:
                what = f" (missing or stale: {', '.join(missing)})" if missing else ""
                raise ValueError(
                    f"the leave-one-task-out evaluation of {family} ({bucket}) in {loto.storage} is "
                    f"not complete{what}; run `ilge-search loto --storage {loto.storage}` first (it "
                    "trains only what is missing): regenerated defaults are shipped only when they beat "
                    "the built-in ones on tasks they never saw"
                )
            decisions[f"{family}/{bucket}"] = _decision(verdict)
    return decisions


def _checked_request(families: Sequence[str], exclude_tasks: Sequence[str], update_shipped: bool) -> list[str]:
    """The families, checked, and the excluded tasks without repeats; one-line errors for what cannot be done."""
    unknown = [f for f in families if f not in config_classes()]
    if unknown or not families:
        raise ValueError(f"unknown families {unknown}; choose from {sorted(config_classes())}")
    excluded = list(dict.fromkeys(exclude_tasks))
    if update_shipped and excluded:
        raise ValueError(
            "the shipped defaults come from every study; drop --exclude-task or write your own file "
            "(--out) instead of --update-shipped"
        )
    return excluded


def _derived(
    storage_url: str, families: Sequence[str], exclude_tasks: list[str]
) -> tuple[Values, dict[tuple[str, str], list[RecommendedValue]], ProblemGroups, list[str]]:
    """The rule over the storage's problems without those of ``exclude_tasks``: values, evidence, the problems
    used, and why studies were skipped."""
    all_groups, skipped = read_problems(storage_url, families)
    tasks = problem_tasks(all_groups)
    if absent := [t for t in exclude_tasks if t not in tasks]:
        which = "that task" if len(absent) == 1 else "those tasks"
        where = f"{hide_password(storage_url)} (its tasks: {', '.join(tasks) or 'none'})"
        raise ValueError(f"--exclude-task {', '.join(absent)}: no {'/'.join(families)} study of {which} in {where}")
    values, evidence, groups = derive_defaults(all_groups, exclude_tasks)
    if not groups:
        raise ValueError(
            f"no {'/'.join(families)} study with at least two scored trials in "
            f"{hide_password(storage_url)}"
            + (" besides those of the excluded tasks" if exclude_tasks else "")
            + (f" ({'; '.join(skipped)})" if skipped else "")
            + "; run studies first (`ilge-search sweep studies/offline.toml`)"
        )
    return values, evidence, groups, skipped


def _shipped(values: Values, loto: LotoResult | None) -> tuple[Values, dict[str, str]]:
    """The groups of ``values`` the shipping rule lets into the package's file, and the decision for each."""
    if loto is None:
        raise ValueError(f"only {'/'.join(LOTO_FAMILIES)} defaults are regenerated and shipped")
    shipping = shipping_decision(values, loto)
    kept = {
        family: {
            bucket: chosen
            for bucket, chosen in buckets.items()
            if shipping[f"{family}/{bucket}"].startswith("regenerated")
        }
        for family, buckets in values.items()
    }
    return {family: buckets for family, buckets in kept.items() if buckets}, shipping


def _metadata(
    storage_url: str, groups: ProblemGroups, skipped: list[str], exclude_tasks: list[str], loto: LotoResult | None
) -> dict[str, Any]:
    """The defaults document's ``metadata`` (without ``shipping``): when, from what, by which rule."""
    return {
        "generated": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "source": hide_password(storage_url),
        "ilge_search_version": __version__,
        "rule": RULE,
        "size_buckets": SIZE_BUCKETS_NOTE,
        "studies": {
            f"{family}/{bucket}": [p.study for p in problems] for (family, bucket), problems in sorted(groups.items())
        },
        "skipped": skipped,
        "excluded_tasks": exclude_tasks,
        "leave_one_task_out": {}
        if loto is None
        else {
            f"{v.family}/{v.bucket}": {
                "rows": v.rows,
                "mean_difference": round(v.mean_difference, 4),
                "interval": None
                if v.evidence is None
                else [round(v.evidence.comparison.interval.low, 4), round(v.evidence.comparison.interval.high, 4)],
                "regenerated_win": v.regenerated_win,
            }
            for v in loto.verdicts.values()
        },
    }


@dataclass(frozen=True)
class _Choice:
    """How :func:`regenerate_defaults` chooses: its method, whether tasks were left out, whether for the package."""

    method: str
    excluded: bool
    update_shipped: bool


def _chosen_values(
    storage_url: str, values: Values, choice: _Choice, loto: LotoResult | None
) -> tuple[Values, dict[str, str]]:
    """The defaults ``choice.method`` picks from the derived ``values``, and why each group shipped or not."""
    if choice.method == "portfolio":
        if choice.excluded:
            raise ValueError(
                "--method portfolio reads the stored matrix; choose without tasks with `portfolio --exclude-task`"
            )
        return portfolio_defaults(storage_url, values, choice.update_shipped)
    if choice.method not in METHODS:
        raise ValueError(f"unknown method {choice.method!r}; choose from {list(METHODS)}")
    if choice.update_shipped:
        return _shipped(values, loto)
    return values, {}


def regenerate_defaults(
    storage_url: str,
    *,
    families: Sequence[str] = DEFAULT_FAMILIES,
    update_shipped: bool = False,
    exclude_tasks: Sequence[str] = (),
    method: str = "marginal",
) -> Recommendation:
    """Derive recommended defaults per family and model-size bucket from the studies in a storage.

    Args:
        storage_url: an Optuna RDB URL holding ilge-search studies.
        families: the encoder families to derive defaults for.
        update_shipped: for the package's own file: only the groups the shipping rule
            (:func:`shipping_decision`) lets in; the others are left out (the built-in values apply).
        exclude_tasks: leave every study of these tasks out (not with ``update_shipped``).
        method: ``marginal`` (the rule of :mod:`~ilge_search.defaults.rule`) or ``portfolio``: each group's default is
            the one ``ilge-search portfolio`` chose from its stored cross-task matrix, and ``update_shipped`` lets it in
            only where it won its left-out checks (:func:`~ilge_search.defaults.transfer.shipping_verdict`).

    Raises:
        ValueError: unknown family, the storage cannot be opened, no study of ``families`` in it has at least two scored
            trials, an excluded task without studies, ``exclude_tasks`` with ``update_shipped``, or no complete
            leave-one-task-out evaluation for ``update_shipped`` (``portfolio``: no stored portfolio of a group).
    """
    families = list(families)
    excluded = _checked_request(families, exclude_tasks, update_shipped)
    values, evidence, groups, skipped = _derived(storage_url, families, excluded)
    loto_families = [f for f in families if f in LOTO_FAMILIES]
    loto = stored_loto(storage_url, families=loto_families) if loto_families else None
    values, shipping = _chosen_values(storage_url, values, _Choice(method, bool(excluded), update_shipped), loto)
    document = {
        "format_version": DEFAULTS_FORMAT_VERSION,
        "metadata": {
            **_metadata(storage_url, groups, skipped, excluded, loto),
            "method": method,
            "shipping": shipping,
        },
        "families": values,
    }

    portfolios = stored_portfolios(storage_url, families, latest=method != "portfolio")
    attach_shipping_checks(storage_url, portfolios[0])
    return Recommendation(
        document=document,
        evidence=evidence,
        groups=groups,
        families=families,
        loto=loto,
        portfolios=portfolios,
    )
