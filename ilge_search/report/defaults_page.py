"""The ``recommend`` command's outputs: the regenerated defaults file and its "Defaults by model size" page.

:func:`recommend_defaults` regenerates the defaults (:func:`ilge_search.defaults.recommend.regenerate_defaults`) and
writes the file :func:`ilge_search.tuning.recommended_config` reads, by default the user's
(:func:`ilge_search.settings.user_defaults_path`), with a Markdown page beside it: the defaults table, the stored
leave-one-task-out table, each stored cross-task matrix with its left-out checks, and the evidence behind every value.
The package's own file is rewritten only with ``update_shipped=True``
(:func:`~ilge_search.defaults.recommend.defaults_targets`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import tuning  # RECOMMENDED_DEFAULTS_PATH looked up per call: tests point it elsewhere
from ..defaults.loto import LotoResult
from ..defaults.recommend import (
    DEFAULT_FAMILIES,
    NEXT_TO_DEFAULTS,
    Recommendation,
    defaults_targets,
    regenerate_defaults,
)
from ..defaults.rule import RecommendedValue
from ..encoders import builtin_start
from ..files import check_output_path, write_output_text
from ..tuning import load_recommended_defaults
from .document import MISSING, Cell, Document, plural
from .loto import loto_rows, loto_sentences, loto_verdict_rows
from .portfolio import portfolio_part

__all__ = ["recommend_defaults", "defaults_page"]

PathLike = str | os.PathLike


def _format(value: object) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _loto_section(doc: Document, meta: Mapping[str, Any], recommendation: Recommendation) -> None:
    loto = recommendation.loto
    portfolios, notes = recommendation.portfolios
    doc.heading(2, "On tasks they never saw")
    if (loto is None or not loto.verdicts) and not portfolios:
        doc.paragraph(
            "No leave-one-task-out evaluation is stored in this storage, so nothing here says whether "
            "these defaults generalise beyond the tasks they were chosen on. Run "
            f"`ilge-search loto --storage {meta['source']}` (the shipped defaults change only after it)."
        )
    elif loto is not None and loto.verdicts:
        _loto_tables(doc, meta, loto)
    for result in portfolios:
        portfolio_part(doc, result)
    doc.bullets(notes)
    shipping = meta.get("shipping")
    if shipping and meta.get("method") == "portfolio":
        doc.paragraph(
            "Shipped in `ilge_search/data/recommended_defaults.json` and the start of new studies (a group's "
            "portfolio default only where it won both left-out checks, leaving one task out and one model out: "
            "the 95% bootstrap interval of its mean difference over the held-out problems against the built-in "
            "defaults above 0, measured in the setting that ships, the configuration's own epochs with early "
            "stopping; otherwise the built-in defaults). `recommended_config(family)` returns the published "
            'package\'s values either way; `recommended_config(family, source="regenerated")` reads this file:'
        )
        doc.bullets([f"{group}: {decision}" for group, decision in shipping.items()])


def _loto_tables(doc: Document, meta: Mapping[str, Any], loto: LotoResult) -> None:
    doc.paragraph(
        "For each task, the defaults were regenerated from every other task's studies and trained with "
        "no search on that task next to the built-in defaults (the published package's), each with the "
        "same seeds, on the data of the task's study; cells are test scores, mean ± std over the seeds, "
        "and the difference is regenerated minus built-in. Made with `ilge-search loto`."
    )
    doc.table(*loto_verdict_rows(loto))
    doc.bullets(loto_sentences(loto))
    shipping = meta.get("shipping")
    if shipping and meta.get("method") != "portfolio":  # the portfolio's decisions follow its matrices
        doc.paragraph(
            "Shipped in `ilge_search/data/recommended_defaults.json` (regenerated defaults only where the 95% "
            "bootstrap interval of their mean difference over the left-out tasks lies above 0, measured in the "
            "setting that ships):"
        )
        doc.bullets([f"{group}: {decision}" for group, decision in shipping.items()])
    doc.table(*loto_rows(loto))


def _defaults_table(doc: Document, recommendation: Recommendation) -> None:
    """Per family, the values of each size bucket (the built-in ones where nothing was regenerated)."""
    rows = []
    for family in recommendation.families:
        cells = [Cell(family)]
        for bucket in ("small", "large"):
            values = recommendation.document["families"].get(family, {}).get(bucket)
            if values:
                cells.append(Cell(", ".join(f"{k}={_format(v)}" for k, v in values.items())))
            else:
                builtin = builtin_start(family, bucket)
                cells.append(Cell("*built-in*: " + ", ".join(f"{k}={_format(v)}" for k, v in builtin.items())))
        rows.append(cells)
    doc.table(["family", "small (up to 3B parameters)", "large (above 3B)"], rows)


def _evidence_rows(chosen: Sequence[RecommendedValue]) -> list[list[Cell]]:
    rows = []
    for item in chosen:
        runner = (
            MISSING
            if item.runner_up is None
            else (f"{_format(item.runner_up[0])} ({item.runner_up[1]:.3f}, {item.runner_up[2]})")
        )
        rows.append(
            [
                Cell(item.param),
                Cell(_format(item.value)),
                Cell(f"{item.score:.3f}"),
                Cell(f"{item.coverage}/{item.problems}"),
                Cell(str(item.trials)),
                Cell(runner),
            ]
        )
    return rows


def _evidence_section(doc: Document, recommendation: Recommendation) -> None:
    """Per (family, bucket): the studies used, the previous default's rank, every chosen value's evidence."""
    doc.heading(2, "Evidence")
    for (family, bucket), chosen in sorted(recommendation.evidence.items()):
        problems = recommendation.groups[(family, bucket)]
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
        doc.table(
            ["parameter", "value", "score", "studies with it", "trials", "runner-up (score, studies)"],
            _evidence_rows(chosen),
        )


def _read_from(target: Path | None) -> str:
    """Where ``recommended_config`` reads the values of a defaults file written to ``target``."""

    if target is None or Path(target).resolve() == tuning.RECOMMENDED_DEFAULTS_PATH.resolve():
        return "reads these values from `ilge_search/data/recommended_defaults.json`"
    return (
        f"reads these values from the user defaults file `{target}` over the shipped ones, when "
        "`$ILGE_SEARCH_DEFAULTS` or `~/.config/ilge-search/recommended_defaults.json` names it"
    )


def defaults_page(recommendation: Recommendation, target: Path | None = None) -> str:
    """The "Defaults by model size" page (Markdown): the values, the leave-one-task-out check, the rule and the evidence
    behind every value; ``target`` is the defaults file the values were written to (``None``: the shipped one)."""
    meta = recommendation.document["metadata"]
    portfolio = meta.get("method") == "portfolio"
    command = f"ilge-search recommend --storage {meta['source']}" + (" --method portfolio" if portfolio else "")
    doc = Document()
    doc.heading(1, "Defaults by model size")
    doc.paragraph(
        f"Generated {meta['generated']} by ilge-search {meta['ilge_search_version']} with "
        f'`{command}`. `recommended_config(family, model_size_hint, source="regenerated")` (what new '
        f"studies start from) {_read_from(target)}; a family or bucket without "
        "studies, or whose regenerated defaults were not shipped, keeps the built-in default (marked "
        "*built-in*). `recommended_config(family, model_size_hint)` returns the built-in defaults, the "
        "published `ilge` 0.1.0 package's."
    )
    _defaults_table(doc, recommendation)
    if meta.get("excluded_tasks"):
        doc.paragraph(
            "Regenerated without the studies of "
            + ", ".join(f"`{t}`" for t in meta["excluded_tasks"])
            + " (`--exclude-task`)."
        )
    _loto_section(doc, meta, recommendation)
    doc.heading(2, "Rule")
    if portfolio:
        doc.paragraph(
            "The values above are each group's cross-task matrix default (chosen on validation, shipped only where "
            "it won its left-out checks). The marginal rule below is one of the matrix's candidates (`marginal`)."
        )
    doc.paragraph(meta["rule"])
    _evidence_section(doc, recommendation)
    if meta.get("skipped"):
        doc.paragraph("Studies not used:")
        doc.bullets(meta["skipped"])
    return doc.markdown()


def recommend_defaults(
    storage_url: str,
    out_path: PathLike | None = None,
    report_path: PathLike | None = NEXT_TO_DEFAULTS,
    *,
    families: Sequence[str] = DEFAULT_FAMILIES,
    update_shipped: bool = False,
    exclude_tasks: Sequence[str] = (),
    method: str = "marginal",
    force: bool = False,
) -> dict[str, Any]:
    """Derive recommended defaults per family and model-size bucket from the studies in a storage, and write
    them with their page.

    Args:
        storage_url: an Optuna RDB URL holding ilge-search studies.
        out_path: the defaults file to write (default: the user's file, :func:`ilge_search.settings.user_defaults_path`,
            which ``recommended_config`` reads over the shipped defaults).
        report_path: where to write the "Defaults by model size" Markdown page (default: next to the defaults file, same
            name with ``.md``; with ``update_shipped``, none unless given); ``None`` skips it.
        families: the encoder families to derive defaults for.
        update_shipped: rewrite the package's own ``ilge_search/data/recommended_defaults.json`` instead (maintainers
            only), under the shipping rule (:func:`~ilge_search.defaults.recommend.shipping_decision`): a family whose
            regenerated defaults do not beat the built-in ones on the left-out tasks is left out of the file (the
            built-in values apply).
        exclude_tasks: leave every study of these tasks out (not with ``update_shipped``).
        method: ``marginal`` or ``portfolio`` (:func:`~ilge_search.defaults.recommend.regenerate_defaults`).
        force: replace an existing defaults file or page, git-tracked ones included
            (:func:`~ilge_search.files.check_output_path`; the shipped file is rewritten by ``update_shipped`` alone).

    Returns:
        The written defaults document (``format_version``, ``metadata``, ``families``).

    Raises:
        ValueError: unknown family, both ``out_path`` and ``update_shipped``, the storage cannot be opened, no study of
            ``families`` in it has at least two scored trials, an excluded task without studies, no complete
            leave-one-task-out evaluation for ``update_shipped``, an existing file without ``force``, or a folder that
            cannot be written.
    """
    target, page_target = defaults_targets(out_path, report_path, update_shipped=update_shipped)
    # before the studies are read: a refused path costs nothing and creates nothing
    check_output_path(target, force=force or update_shipped, option="--out")
    if page_target is not None:
        check_output_path(page_target, force=force, option="--report")
    recommendation = regenerate_defaults(
        storage_url, families=families, update_shipped=update_shipped, exclude_tasks=exclude_tasks, method=method
    )
    _write_defaults(recommendation, target, page_target)
    return recommendation.document


def _write_defaults(recommendation: Recommendation, target: Path, page_target: Path | None) -> None:
    """Write the defaults file (checked by reading it back) and its page; a failed write becomes a ValueError."""
    try:
        write_output_text(target, json.dumps(recommendation.document, indent=2) + "\n")
        load_recommended_defaults(target)  # what was written must read back
        if page_target is not None:
            write_output_text(page_target, defaults_page(recommendation, Path(target)))
    except OSError as exc:  # e.g. a read-only installed package, a full disk
        raise ValueError(
            f"cannot write {exc.filename or target}: {exc.strerror or exc}; pass another --out (out_path)"
        ) from exc
