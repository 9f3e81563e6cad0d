"""Regenerate the ``recommended_config`` defaults from stored studies.

:func:`recommend_defaults` reads every study of an encoder family (``cayley``,
``fc``, ``deepset``) in a storage, groups them by family and model-size bucket,
and derives one configuration per group with the rule below. It writes a
defaults file that :func:`ilge_search.tuning.recommended_config` reads (schema
in :mod:`ilge_search.tuning`) and a Markdown page with the "Defaults by model
size" table and the evidence behind every value.

Where it writes: by default the user's defaults file
(:func:`ilge_search.settings.user_defaults_path`: ``$ILGE_SEARCH_DEFAULTS``,
else ``~/.config/ilge-search/recommended_defaults.json``), which
``recommended_config`` reads over the shipped defaults, and the Markdown page
next to it (same name, ``.md``). The package's own
``ilge_search/data/recommended_defaults.json`` is rewritten only with
``update_shipped=True`` (``ilge-search recommend --update-shipped``), for the
maintainers who regenerate the shipped defaults from the committed studies.

The rule (size buckets, normalised ranks, levels, coverage) is
:mod:`~ilge_search.report.defaults_rule`'s. ``exclude_tasks``
(``--exclude-task T``) leaves every study of the named tasks out, e.g. to see
what the defaults would be without a task.

Shipping only what generalises
------------------------------
Defaults regenerated from a storage's studies were chosen on those studies'
tasks. Before they replace the shipped ones (``update_shipped=True``), the
leave-one-task-out evaluation of :mod:`~ilge_search.report.loto` must be in the
storage and current for every (model, task) a family has a study of: for each
task, the defaults regenerated without that task and the built-in defaults,
each trained with no search on that task. A family's regenerated defaults are
shipped only when they beat the built-in ones on average over the left-out
tasks; otherwise the shipped file leaves the family out, so
``recommended_config`` falls back to the built-in values. ``defaults.md`` says
which happened and shows the table.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .._version import __version__
from ..configs import CONFIG_CLASSES
from ..settings import user_defaults_path
from ..storage import hide_password
from ..tuning import BUILTIN_RECOMMENDED, DEFAULTS_FORMAT_VERSION, load_recommended_defaults
from .defaults_rule import Problem, RecommendedValue, derive_defaults, normalised_ranks, problem_tasks, read_problems
from .document import MISSING, Cell, Document, plural, write_atomic
from .loto import LOTO_FAMILIES, LotoResult, loto_rows, loto_sentences, loto_verdict_rows, stored_loto

__all__ = [
    "DEFAULT_FAMILIES",
    "NEXT_TO_DEFAULTS",
    "recommend_defaults",
    "defaults_targets",
    "shipping_decision",
    "RecommendedValue",
    "normalised_ranks",
]

PathLike = Union[str, os.PathLike]

DEFAULT_FAMILIES: Tuple[str, ...] = ("cayley", "fc", "deepset")
NEXT_TO_DEFAULTS = "next-to-defaults"  # report_path default: the defaults file's name with .md


# ----------------------------------------------------------------------------- outputs


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _loto_section(doc: Document, meta: Mapping[str, Any], loto: Optional[LotoResult]) -> None:
    doc.heading(2, "On tasks they never saw")
    if loto is None or not loto.verdicts:
        doc.paragraph(
            "No leave-one-task-out evaluation is stored in this storage, so nothing here says whether "
            "these defaults generalise beyond the tasks they were chosen on. Run "
            f"`ilge-search loto --storage {meta['source']}` (the shipped defaults change only after it)."
        )
        return
    doc.paragraph(
        "For each task, the defaults were regenerated from every other task's studies and trained with "
        "no search on that task next to the built-in defaults (the published package's), each with the "
        "same seeds, on the data of the task's study; cells are test scores, mean ± std over the seeds, "
        "and the difference is regenerated minus built-in. Made with `ilge-search loto`."
    )
    doc.table(*loto_verdict_rows(loto))
    doc.bullets(loto_sentences(loto))
    shipping = meta.get("shipping")
    if shipping:
        doc.paragraph(
            "Shipped in `ilge_search/data/recommended_defaults.json` (regenerated defaults only where they "
            "win on average over the left-out tasks):"
        )
        doc.bullets([f"{group}: {decision}" for group, decision in shipping.items()])
    doc.table(*loto_rows(loto))


def _markdown(
    data: Mapping[str, Any],
    evidence: Mapping[Tuple[str, str], List[RecommendedValue]],
    groups: Mapping[Tuple[str, str], List[Problem]],
    families: Sequence[str],
    loto: Optional[LotoResult],
) -> str:
    meta = data["metadata"]
    doc = Document()
    doc.heading(1, "Defaults by model size")
    doc.paragraph(
        f"Generated {meta['generated']} by ilge-search {meta['ilge_search_version']} with "
        f"`ilge-search recommend --storage {meta['source']}`. `recommended_config(family, model_size_hint)` "
        "reads these values from `ilge_search/data/recommended_defaults.json`; a family or bucket without "
        "studies, or whose regenerated defaults were not shipped, keeps the built-in default (marked "
        "*built-in*)."
    )
    rows = []
    for family in families:
        cells = [Cell(family)]
        for bucket in ("small", "large"):
            values = data["families"].get(family, {}).get(bucket)
            if values:
                cells.append(Cell(", ".join(f"{k}={_format(v)}" for k, v in values.items())))
            else:
                builtin = BUILTIN_RECOMMENDED.get(family, {}).get(bucket, {})
                cells.append(Cell("*built-in*: " + ", ".join(f"{k}={_format(v)}" for k, v in builtin.items())))
        rows.append(cells)
    doc.table(["family", "small (up to 3B parameters)", "large (above 3B)"], rows)
    if meta.get("excluded_tasks"):
        doc.paragraph(
            "Regenerated without the studies of "
            + ", ".join(f"`{t}`" for t in meta["excluded_tasks"])
            + " (`--exclude-task`)."
        )
    _loto_section(doc, meta, loto)
    doc.heading(2, "Rule")
    doc.paragraph(meta["rule"])
    doc.heading(2, "Evidence")
    for (family, bucket), chosen in sorted(evidence.items()):
        problems = groups[(family, bucket)]
        defaults = [p.default_q for p in problems if p.default_q is not None]
        doc.heading(3, f"{family}, {bucket}")
        doc.paragraph(
            f"{plural(len(problems), 'study', 'studies')} ({sum(len(p.trials) for p in problems)} complete "
            "or pruned trials): " + ", ".join(f"`{p.study}`" for p in problems) + "."
        )
        if len(problems) < 3:
            doc.paragraph("Weak evidence: fewer than three studies; run more tasks before relying on these values.")
        if defaults:
            doc.paragraph(
                f"The previous default (each study's enqueued first trial) has mean normalised rank "
                f"{sum(defaults) / len(defaults):.3f} over {plural(len(defaults), 'study', 'studies')} "
                "(1 = best trial of every study, 0 = worst)."
            )
        evidence_rows = []
        for item in chosen:
            runner = (
                MISSING
                if item.runner_up is None
                else (f"{_format(item.runner_up[0])} ({item.runner_up[1]:.3f}, {item.runner_up[2]})")
            )
            evidence_rows.append(
                [
                    Cell(item.param),
                    Cell(_format(item.value)),
                    Cell(f"{item.score:.3f}"),
                    Cell(f"{item.coverage}/{item.problems}"),
                    Cell(str(item.trials)),
                    Cell(runner),
                ]
            )
        doc.table(
            ["parameter", "value", "score", "studies with it", "trials", "runner-up (score, studies)"], evidence_rows
        )
    if meta.get("skipped"):
        doc.paragraph("Studies not used:")
        doc.bullets(meta["skipped"])
    return doc.markdown()


_RULE = (
    "Per study, each complete trial's validation score becomes a normalised rank q in [0, 1] (1 = the study's "
    "best trial; pruned trials tie below every complete one). Per hyperparameter, values are compared on "
    "levels (categorical and integer values as they are; lr and weight_decay snapped to 1 or 3 x 10^k; "
    "dropout to steps of 0.1); a level's score is the mean over studies of the mean q of that study's trials "
    "at the level. Among levels tried in at least half the studies of the family and size bucket, the highest "
    "score wins (ties: more studies, more trials, the built-in value, the smaller level). gin_mlp_layers and "
    "gat_heads are chosen among trials with the chosen conv_type. Validation scores only."
)


def defaults_targets(
    out_path: Optional[PathLike] = None,
    report_path: Optional[PathLike] = NEXT_TO_DEFAULTS,
    *,
    update_shipped: bool = False,
) -> Tuple[Path, Optional[Path]]:
    """Where :func:`recommend_defaults` writes: (defaults file, Markdown page or ``None``).

    Raises:
        ValueError: ``update_shipped`` together with ``out_path``.
    """
    if update_shipped and out_path is not None:
        raise ValueError("give either out_path (--out) or update_shipped (--update-shipped), not both")
    if update_shipped:
        from ..tuning import RECOMMENDED_DEFAULTS_PATH  # looked up now: tests point it elsewhere

        target = RECOMMENDED_DEFAULTS_PATH
    else:
        target = user_defaults_path(out_path)
    if report_path == NEXT_TO_DEFAULTS:
        # the shipped file's page is reports/defaults.md in the repository, not inside the package
        return target, None if update_shipped else target.with_suffix(".md")
    return target, None if report_path is None else Path(report_path)


def shipping_decision(values: Mapping[str, Mapping[str, Any]], loto: LotoResult) -> Dict[str, str]:
    """The shipping rule: per ``family/bucket`` of ``values``, shipped or not and why.

    A group is shipped only when its regenerated defaults beat the built-in ones on average over the
    left-out tasks of a current leave-one-task-out evaluation (:class:`~ilge_search.report.loto.LotoResult`).

    Raises:
        ValueError: a group has no such evaluation, or rows of it are missing or stale.
    """
    decisions: Dict[str, str] = {}
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
            if verdict.regenerated_win:
                decisions[f"{family}/{bucket}"] = (
                    f"regenerated, {verdict.mean_difference:+.2f} points over the "
                    f"built-in defaults on {plural(verdict.rows, 'left-out row')}"
                )
            else:
                decisions[f"{family}/{bucket}"] = (
                    f"built-in kept: the regenerated defaults were "
                    f"{verdict.mean_difference:+.2f} points against them on "
                    f"{plural(verdict.rows, 'left-out row')}"
                )
    return decisions


def recommend_defaults(
    storage_url: str,
    out_path: Optional[PathLike] = None,
    report_path: Optional[PathLike] = NEXT_TO_DEFAULTS,
    *,
    families: Sequence[str] = DEFAULT_FAMILIES,
    update_shipped: bool = False,
    exclude_tasks: Sequence[str] = (),
) -> Dict[str, Any]:
    """Derive recommended defaults per family and model-size bucket from the studies in a storage.

    Args:
        storage_url: an Optuna RDB URL holding ilge-search studies.
        out_path: the defaults file to write (default: the user's file,
            :func:`ilge_search.settings.user_defaults_path`, which
            ``recommended_config`` reads over the shipped defaults).
        report_path: where to write the "Defaults by model size" Markdown page
            (default: next to the defaults file, same name with ``.md``; with
            ``update_shipped``, none unless given); ``None`` skips it.
        families: the encoder families to derive defaults for.
        update_shipped: rewrite the package's own
            ``ilge_search/data/recommended_defaults.json`` instead (maintainers only),
            under the shipping rule (:func:`shipping_decision`): a family whose
            regenerated defaults do not beat the built-in ones on the left-out
            tasks is left out of the file (the built-in values apply).
        exclude_tasks: leave every study of these tasks out (not with ``update_shipped``).

    Returns:
        The written defaults document (``format_version``, ``metadata``, ``families``).

    Raises:
        ValueError: unknown family, both ``out_path`` and ``update_shipped``, the
            storage cannot be opened, no study of ``families`` in it has at least
            two scored trials, an excluded task without studies, no complete
            leave-one-task-out evaluation for ``update_shipped``, or the file
            cannot be written.
    """
    target, report_target = defaults_targets(out_path, report_path, update_shipped=update_shipped)
    families = list(families)
    unknown = [f for f in families if f not in CONFIG_CLASSES]
    if unknown or not families:
        raise ValueError(f"unknown families {unknown}; choose from {sorted(CONFIG_CLASSES)}")
    exclude_tasks = list(dict.fromkeys(exclude_tasks))
    if update_shipped and exclude_tasks:
        raise ValueError(
            "the shipped defaults come from every study; drop --exclude-task or write your own file "
            "(--out) instead of --update-shipped"
        )
    all_groups, skipped = read_problems(storage_url, families)
    tasks = problem_tasks(all_groups)
    absent = [t for t in exclude_tasks if t not in tasks]
    if absent:
        raise ValueError(
            f"--exclude-task {', '.join(absent)}: no {'/'.join(families)} study of "
            f"{'that task' if len(absent) == 1 else 'those tasks'} in {hide_password(storage_url)} "
            f"(its tasks: {', '.join(tasks) or 'none'})"
        )
    result, evidence, groups = derive_defaults(all_groups, exclude_tasks)
    if not groups:
        raise ValueError(
            f"no {'/'.join(families)} study with at least two scored trials in "
            f"{hide_password(storage_url)}"
            + (" besides those of the excluded tasks" if exclude_tasks else "")
            + (f" ({'; '.join(skipped)})" if skipped else "")
            + "; run studies first (`ilge-search sweep studies/offline.toml`)"
        )
    loto_families = [f for f in families if f in LOTO_FAMILIES]
    loto = stored_loto(storage_url, families=loto_families) if loto_families else None
    shipping: Dict[str, str] = {}
    if update_shipped:
        if loto is None:
            raise ValueError(f"only {'/'.join(LOTO_FAMILIES)} defaults are regenerated and shipped")
        shipping = shipping_decision(result, loto)
        result = {
            family: {
                bucket: values
                for bucket, values in buckets.items()
                if shipping[f"{family}/{bucket}"].startswith("regenerated")
            }
            for family, buckets in result.items()
        }
        result = {family: buckets for family, buckets in result.items() if buckets}
    data = {
        "format_version": DEFAULTS_FORMAT_VERSION,
        "metadata": {
            "generated": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "source": hide_password(storage_url),
            "ilge_search_version": __version__,
            "rule": _RULE,
            "size_buckets": "small: up to 3B parameters (models of 1B-3B included, as the study runner buckets "
            "them); large: above 3B",
            "studies": {
                f"{family}/{bucket}": [p.study for p in problems]
                for (family, bucket), problems in sorted(groups.items())
            },
            "skipped": skipped,
            "excluded_tasks": exclude_tasks,
            "leave_one_task_out": {}
            if loto is None
            else {
                f"{v.family}/{v.bucket}": {
                    "rows": v.rows,
                    "mean_difference": round(v.mean_difference, 4),
                    "regenerated_win": v.regenerated_win,
                }
                for v in loto.verdicts.values()
            },
            "shipping": shipping,
        },
        "families": result,
    }
    try:
        write_atomic(target, json.dumps(data, indent=2) + "\n")
        load_recommended_defaults(target)  # what was written must read back
        if report_target is not None:
            write_atomic(report_target, _markdown(data, evidence, groups, families, loto))
    except OSError as exc:  # e.g. a read-only installed package, a full disk
        raise ValueError(
            f"cannot write {exc.filename or target}: {exc.strerror or exc}; pass another --out (out_path)"
        ) from exc
    return data
