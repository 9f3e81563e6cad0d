"""Warm-started vs cold searches, as ``reports/warmstart.md`` shows them; trains nothing.

Reads, from one storage or several (``reports/warmstart.sh`` keeps its two budgets in two storages, since
both budgets of one search share a study name), every matched-protocol, full-subset, score-only study of an
ILGE family with a final evaluation. A row is one search (``warm K``: the start and then K portfolio
members enqueued before the sampler; ``cold``: the sampler alone after the start), in score points: its
test mean ± std and the difference to the cold search of the same setting; the search gain on test
(:attr:`~ilge_search.record.FinalRecord.search_gain`) and on validation; the trials run until one reached
the start's validation score; and the test mean minus the ``best-layer`` study's of the same setting.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from optuna.trial import TrialState

from ..encoders import encoder_families
from ..files import check_output_path, write_output_text
from ..record import StudyRecord, study_record, trial_record, warm_start_record
from ..storage import open_storage
from ..study.statistics import problems_interval, seeds_interval
from ..tasks.scores import score_unit
from .document import plural

if TYPE_CHECKING:
    import optuna

    from ..storage import Storage

__all__ = [
    "WARMSTART_NOTE",
    "WARMSTART_BUDGETS",
    "WarmRow",
    "warmstart_rows",
    "warmstart_table",
    "summary_lines",
    "write_warmstart_page",
]

WARMSTART_NOTE = (
    "Each row is one search of Optuna's TPE sampler on the validation split, its selected trial retrained with "
    "the final seeds and scored once on test. *cold*: the starting configuration (the built-in defaults) and then "
    "the sampler; *warm K*: the starting configuration, then the first K members of the portfolio's warm-start "
    "order (chosen on validation scores of other tasks' problems only: a study whose task the portfolio saw takes "
    "the order chosen without that task), then the sampler, same sampler seed. Test columns are test scores; "
    "*val* columns are validation scores (what the search optimises); nothing here was chosen on test."
)


WARMSTART_BUDGETS = (8, 16)  # the trial budgets reports/warmstart.sh runs


@dataclass(frozen=True)
class WarmRow:
    """One search as the page shows it (scores in points; ``None``: not stored)."""

    study: str
    encoder: str
    model: str
    task: str
    max_train: int | None
    warm: int  # portfolio members enqueued after the start; 0: cold
    trials: int  # finished (complete or pruned) trials
    unit: str
    test_mean: float
    test_std: float
    start_test: float | None
    gain_test: float | None
    gain_val: float | None
    to_reach: int | None  # trials after the start until one reached the start's validation score
    best_layer: float | None
    members: tuple[str, ...] = ()
    select: str = "best"  # the selection rule of the final evaluation
    test_scores: tuple[float, ...] = ()  # per final seed, in points, signed so that higher is better
    start_scores: tuple[float, ...] = ()  # the starting configuration's, the same seeds and sign

    @property
    def setting(self) -> tuple[str, str, str, int | None, int]:
        return (self.encoder, self.model, self.task, self.max_train, self.trials)


def _eligible(record: StudyRecord) -> bool:
    identity = record.identity
    return (
        identity is not None
        and record.final is not None
        and identity.shots is None
        and identity.protocol in (None, "matched")
        and list(identity.objectives or ["score"]) == ["score"]
    )


def _trial_numbers(study: optuna.Study) -> tuple[float | None, int | None, int]:
    """(the start's validation value, trials after the start until one scored at least that, finished trials)
    of a study, from its trials in number order."""

    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    start = next((t for t in finished if trial_record(t).recommended), finished[0] if finished else None)
    if start is None or start.value is None:
        return None, None, len(finished)
    sign = 1.0 if study.direction.name == "MAXIMIZE" else -1.0
    start_value = float(start.value)
    after = 0
    for trial in finished:
        if trial.number == start.number:
            continue
        after += 1
        if trial.state == TrialState.COMPLETE and sign * (cast(float, trial.value) - start_value) >= 0:
            return start_value, after, len(finished)
    return start_value, None, len(finished)


def _selected_value(study: optuna.Study, record: StudyRecord) -> float | None:
    final = record.final
    if final is None:
        return None
    if final.selected_value is not None:
        return float(final.selected_value)
    chosen = [t.value for t in study.get_trials(deepcopy=False) if t.number == final.trial and t.value is not None]
    return float(chosen[0]) if chosen else None


def _best_layers(storage: Storage) -> dict[tuple[str, str, str], float]:
    """(model, task, data setting) -> the best-layer study's final test mean (raw units)."""
    found = {}
    for summary in storage.study_summaries():
        record = study_record(summary)
        if _eligible(record) and record.identity is not None and record.identity.encoder == "best-layer":
            key = (record.identity.model, record.identity.task, repr(sorted(record.identity.data_setting().items())))
            assert record.final is not None  # _eligible
            found[key] = record.final.test_mean
    return found


def _row(study: optuna.Study, record: StudyRecord, best_layer: float | None) -> WarmRow:
    identity, final, data = record.identity, record.final, record.data
    assert identity is not None and final is not None  # _eligible
    scale, unit = score_unit((data.metric if data is not None else None) or "")
    start_value, to_reach, finished = _trial_numbers(study)
    selected = _selected_value(study, record)
    sign = 1.0 if study.direction.name == "MAXIMIZE" else -1.0
    warm = warm_start_record(study)
    return WarmRow(
        study=study.study_name,
        encoder=identity.encoder,
        model=identity.model,
        task=identity.task,
        max_train=identity.max_train,
        warm=int(identity.warm_start or 0),
        trials=finished,
        unit=unit,
        test_mean=final.test_mean * scale,
        test_std=final.test_std * scale,
        start_test=None if final.start_test_mean is None else final.start_test_mean * scale,
        gain_test=None if final.search_gain is None else final.search_gain * scale,
        gain_val=None if selected is None or start_value is None else sign * (selected - start_value) * scale,
        to_reach=to_reach,
        best_layer=None if best_layer is None else best_layer * scale,
        members=tuple(m.name for m in warm.members) if warm is not None else (),
        select=final.select,
        test_scores=tuple(sign * v * scale for v in final.test_scores),
        start_scores=tuple(sign * v * scale for v in final.start_test_scores or []),
    )


def warmstart_rows(storage_urls: str | Sequence[str]) -> list[WarmRow]:
    """Every eligible search of an ILGE family in ``storage_urls`` (see the module docstring), sorted by encoder,
    model, task, training texts, trials and warm start; the best single layer looked up in every storage."""

    urls = [storage_urls] if isinstance(storage_urls, str) else list(storage_urls)
    storages = [open_storage(url, must_exist=True) for url in urls]
    layers: dict[tuple[str, str, str], float] = {}
    for storage in storages:
        layers = {**_best_layers(storage), **layers}
    rows = []
    for storage in storages:
        for summary in storage.study_summaries():
            record = study_record(summary)
            identity = record.identity
            if not _eligible(record) or identity is None or identity.encoder not in encoder_families():
                continue
            key = (identity.model, identity.task, repr(sorted(identity.data_setting().items())))
            rows.append(_row(storage.existing_study(summary.study_name), record, layers.get(key)))
    return sorted(rows, key=lambda r: (r.encoder, r.model, r.task, r.max_train or 0, r.trials, r.warm))


def _fmt(value: float | None, signed: bool = False) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:+.2f}" if signed else f"{value:.2f}"


def warmstart_table(rows: Sequence[WarmRow]) -> list[str]:
    """The page's table, one line per search (Markdown)."""
    cold = {r.setting: r for r in rows if r.warm == 0}
    header = [
        "model",
        "task",
        "train",
        "trials",
        "search",
        "test (mean ± std)",
        "test − cold",
        "gain test",
        "gain val",
        "trials to reach start (val)",
        "test − best layer",
        "members",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        base = cold.get(r.setting)
        versus = _fmt(r.test_mean - base.test_mean, signed=True) if base is not None and r.warm else "-"
        layer = "not stored" if r.best_layer is None else _fmt(r.test_mean - r.best_layer, signed=True)
        cells = [
            r.model,
            r.task,
            str(r.max_train or "all"),
            str(r.trials),
            f"warm {r.warm}" if r.warm else "cold",
            f"{_fmt(r.test_mean)} ± {_fmt(r.test_std)}",
            versus,
            _fmt(r.gain_test, signed=True),
            _fmt(r.gain_val, signed=True),
            "never" if r.to_reach is None else str(r.to_reach),
            layer,
            ", ".join(r.members) or "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def summary_lines(rows: Sequence[WarmRow], *, max_train: int = 500, trials: int = 8) -> list[str]:
    """The targets' two lines per search kind (cold, warm K) at ``max_train`` texts and ``trials`` trials: the
    mean test search gain, and how many searches end below their start on test (gain below -0.005 points)."""
    chosen = [r for r in rows if r.max_train == max_train and r.trials == trials and r.gain_test is not None]
    if not any(r.warm for r in chosen):
        return [f"No warm-started {trials}-trial search at {max_train} training texts is stored yet."]
    lines = []
    for warm in sorted({r.warm for r in chosen}, key=lambda k: (k == 0, k)):
        kind = [r for r in chosen if r.warm == warm]
        gains = [float(r.gain_test) for r in kind if r.gain_test is not None]
        below = sum(round(g, 2) < 0 for g in gains)
        name = f"warm-started (K = {warm})" if warm else "cold"
        lines.append(
            f"Mean search gain of {name} {trials}-trial searches at {max_train} texts (test, selected trial minus "
            f"start, same seeds): {statistics.fmean(gains):+.2f} points over {len(gains)} searches."
        )
        verb = "ends" if below == 1 else "end"
        lines.append(f"Of these {len(gains)} {name} searches, {below} {verb} below their start on test.")
    return lines


def _seed_verdict(first: Sequence[float], second: Sequence[float]) -> str | None:
    if len(first) != len(second) or len(first) < 2:
        return None
    return seeds_interval([a - b for a, b in zip(first, second, strict=True)]).verdict


def interval_lines(rows: Sequence[WarmRow], *, max_train: int = 500, trials: int = 8) -> list[str]:
    """Per warm-start K at ``max_train`` texts and ``trials`` trials: warm minus cold on test (same setting and
    seeds) and the search gain, each with a 95% bootstrap interval over the searches and the per-search
    win/tie/loss counts from the t interval over the seeds (:mod:`ilge_search.study.statistics`)."""
    chosen = [r for r in rows if r.max_train == max_train and r.trials == trials]
    cold = {r.setting: r for r in chosen if r.warm == 0}
    lines = []
    for warm in sorted({r.warm for r in chosen}, key=lambda k: (k == 0, k)):
        kind = [r for r in chosen if r.warm == warm]
        name = f"warm-started (K = {warm})" if warm else "cold"
        pairs = [
            (r, cold[r.setting])
            for r in kind
            if warm and r.setting in cold and r.test_scores and cold[r.setting].test_scores
        ]
        if pairs:
            diffs = [statistics.fmean(r.test_scores) - statistics.fmean(c.test_scores) for r, c in pairs]
            verdicts = [_seed_verdict(r.test_scores, c.test_scores) for r, c in pairs]
            described = _described(diffs, verdicts)
            lines.append(
                f"{name} minus cold, {trials} trials at {max_train} texts (test, higher is better): {described}."
            )
        gains = [r for r in kind if r.gain_test is not None]
        if gains:
            verdicts = [_seed_verdict(r.test_scores, r.start_scores) for r in gains]
            described = _described([float(r.gain_test or 0.0) for r in gains], verdicts)
            lines.append(f"Search gain of {name} {trials}-trial searches at {max_train} texts (test): {described}.")
    return lines


def _described(diffs: Sequence[float], verdicts: Sequence[str | None]) -> str:
    interval = problems_interval(diffs)
    counts = {v: sum(x == v for x in verdicts) for v in ("win", "tie", "loss")}
    return (
        f"{interval.estimate:+.2f} points [{interval.low:+.2f}, {interval.high:+.2f}] over "
        f"{plural(len(diffs), 'search', 'searches')} "
        f"(95% bootstrap over searches: a {interval.verdict}; per search over the seeds, 95% t interval: "
        f"{counts['win']} win, {counts['tie']} tie, {counts['loss']} loss)"
    )


def _target_lines(rows: Sequence[WarmRow]) -> list[str]:
    """The page's targets (500 texts and 8 trials first, then every other size and budget), then its intervals."""
    sizes = sorted({r.max_train for r in rows if r.max_train is not None})
    shown = sorted({r.trials for r in rows})
    lines = ["## The targets", ""]
    lines += [f"- {line}" for line in summary_lines(rows)]
    for size in sizes:
        for budget in shown:
            if (size, budget) != (500, 8):
                extra = summary_lines(rows, max_train=size, trials=budget)
                if not extra[0].startswith("No "):
                    lines += [f"- {line}" for line in extra]
    lines += ["", "## With intervals", ""]
    for size in sizes:
        for budget in shown:
            lines += [f"- {line}" for line in interval_lines(rows, max_train=size, trials=budget)]
    return lines


def write_warmstart_page(
    storage_url: str | Sequence[str],
    out: str | Path,
    budgets: Sequence[int] = WARMSTART_BUDGETS,
    *,
    force: bool = False,
) -> Path:
    """Write the warm-start page (``reports/warmstart.md``) from the searches stored in ``storage_url`` (one URL or
    several); trains nothing and writes nothing to the storages. The path written.

    ``out`` obeys the output rule (:func:`~ilge_search.files.check_output_path`) before any storage is read: an
    existing or git-tracked file is replaced only with ``force``. Only searches whose finished trials equal one
    of ``budgets`` are shown: a search stopped part of the way to its budget is listed by name as still running,
    since its final evaluation belongs to fewer trials."""
    path = check_output_path(out, force=force)
    every = warmstart_rows(storage_url)
    rows = [r for r in every if r.trials in budgets]
    running = [r for r in every if r.trials not in budgets]
    urls = [storage_url] if isinstance(storage_url, str) else list(storage_url)
    lines = ["# Warm-started vs cold searches (measured)", "", WARMSTART_NOTE, ""]
    lines += [
        "Storages: " + ", ".join(f"`{url}`" for url in urls) + ". Scores in points (accuracy %, Spearman x 100); "
        "`test − cold`: against the cold search of the same model, task, size and trials; `gain`: selected trial "
        "minus the starting configuration; `trials to reach start`: trials after the start until one scored at "
        "least the start's validation score; `members`: the portfolio members a warm search enqueued. Selection "
        f"rule of the final evaluations: {', '.join(sorted({r.select for r in rows})) or '-'}.",
        "",
    ]
    if not rows:
        lines += ["No search with a final evaluation is stored yet.", ""]
    else:
        lines += [*warmstart_table(rows), "", *_target_lines(rows), ""]
    if running:
        names = ", ".join(f"`{r.study}` ({r.trials} trials)" for r in running)
        lines += [
            f"Not shown, short of a budget of {' or '.join(map(str, budgets))} trials: {names}.",
            "",
        ]
    return write_output_text(path, "\n".join(lines))
