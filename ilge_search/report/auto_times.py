"""The time parts of the auto measurement page (:mod:`.auto`): what each grid ran (described from its file), where
each auto study's wall-clock time went (the checks and data loading, the search, the final evaluation, the
ensemble and the leaderboard, from the :class:`~ilge_search.record.RunTimes` its runs recorded), and how runs
under ``--time-limit`` kept their limit (elapsed over limit)."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..record import run_times, study_record
from ..storage import open_storage, sqlite_database
from ..study.auto import is_auto
from ..study.grid import load_sweep
from ..tasks.core import get_task_spec
from .document import Cell, Document, plural

if TYPE_CHECKING:
    from ..record import RunTimes

__all__ = [
    "STAGES",
    "LIMIT_TOLERANCE",
    "grid_description",
    "has_timed_run",
    "study_times",
    "time_section",
    "timed_section",
]

STAGES = ("final", "ensemble", "leaderboard")  # the stages after an auto study's search, in their order
LIMIT_TOLERANCE = 1.10  # issue 39's target: a run under --time-limit ends within 10 % of it
_MISSING = "—"


def _count(value: int) -> str:
    return f"{value:,}"


def _usual_train(entries: Sequence[Any]) -> int | None:
    """The training cap most of a grid's studies have."""
    return Counter(e.max_train for e in entries).most_common(1)[0][0]


def _data_sizes(entries: Sequence[Any], unit: str) -> str:
    """``2,000 training texts, 400 validation and 400 test texts`` (a task with other caps named after)."""
    usual = _usual_train(entries)
    others = sorted({(e.task, e.max_train) for e in entries if e.max_train != usual})
    exceptions = "".join(f"; {task}: {_count(n)}" for task, n in others if n is not None)
    evals = {e.max_eval for e in entries}
    held = (
        f"{_count(next(iter(evals)))} validation and {_count(next(iter(evals)))} test {unit}"
        if len(evals) == 1 and None not in evals
        else f"validation and test {unit} as each task caps them"
    )
    train = "every training " + unit if usual is None else f"{_count(usual)} training {unit}"
    return f"{train}{exceptions and ' (' + exceptions[2:] + ')'}, {held}"


def grid_description(path: Path) -> tuple[str, str, list[str]]:
    """A grid file's section: its title, a paragraph saying what it ran (models, tasks, data, budget, seeds,
    processes, methods) read from the file, and the names of its studies."""

    sweep = load_sweep(path)
    entries = sweep.entries
    names = [entry.study_name for entry in entries]
    if not entries:
        return str(path), "", names
    tagging = all(get_task_spec(e.task).kind == "tagging" for e in entries)
    unit = "sentences" if tagging else "texts"
    models = list(dict.fromkeys(e.model for e in entries))
    tasks = list(dict.fromkeys(e.task for e in entries))
    budgets = sorted({e.n_trials for e in entries})
    options = sweep.study_options()
    seeds = options.final_seed_list()
    methods = {e.methods for e in entries}
    which = "every method serving the task"
    if methods != {None}:
        which = "; ".join(sorted(", ".join(m) if m else "all" for m in methods))
    epochs = {e.max_epochs for e in entries}
    paragraph = (
        f"`{path}`: {', '.join(models)} x {', '.join(tasks)} ({len(entries)} problems); "
        f"{_data_sizes(entries, unit)}; epochs capped at {', '.join(str(n) for n in sorted(epochs, key=str))}; "
        f"{' or '.join(str(n) for n in budgets)} trials per study (every method's start first, then "
        f"{options.search.sampler.upper()} from seed {options.search.seed}); methods: {which}; final seeds "
        f"{seeds[0]}-{seeds[-1]}, each scored once on test; {plural(options.runtime.workers, 'worker')} of "
        f"{plural(options.runtime.threads, 'thread') if options.runtime.threads else 'default threads'} each."
    )
    usual = _usual_train(entries)
    title = f"{', '.join(tasks) if len(tasks) <= 3 else f'{len(tasks)} tasks'} at " + (
        f"{_count(usual)} {unit}" if usual else f"all {unit}"
    )
    return title, paragraph, names


def _search_span(study: Any) -> float | None:
    """Wall seconds from the first trial's start to the last trial's end (the search of a study stored before
    runs recorded their times; with several workers, their overlap counted once)."""
    trials = [t for t in study.trials if t.datetime_start is not None and t.datetime_complete is not None]
    if not trials:
        return None
    first = min(t.datetime_start for t in trials)
    return (max(t.datetime_complete for t in trials) - first).total_seconds()


def study_times(study: Any) -> dict[str, Any]:
    """One study's times over all its recorded runs (seconds; ``None`` where not measured): before its search,
    the search, each stage of :data:`STAGES`, the whole runs, and how many runs; a study stored before runs
    recorded their times has its search span from the trials' stamps (``estimated``) and nothing else."""

    runs = run_times(study)
    out: dict[str, Any] = {"runs": len(runs), "trials": len(study.trials), "estimated": not runs}
    if not runs:
        return {**out, "before": None, "search": _search_span(study), "total": None, **dict.fromkeys(STAGES)}
    out.update(
        before=sum(r.before_search for r in runs),
        search=sum(r.search for r in runs),
        total=sum(r.elapsed for r in runs),
    )
    for stage in STAGES:
        spent = [r.stage(stage) for r in runs]
        known = [s for s in spent if s is not None]
        out[stage] = sum(known) if known else None
    return out


def _seconds(value: float | None) -> str:
    return _MISSING if value is None or math.isnan(value) else f"{value:,.0f}"


def _share(times: dict[str, Any]) -> float | None:
    """The part of a study's runs spent after its search (the stages), of the whole."""
    after = sum(times[stage] or 0.0 for stage in STAGES)
    return None if not times["total"] else after / times["total"]


def _auto_studies(url: str) -> list[tuple[Any, Any]]:
    """(identity, study) of every auto study of ``url``: sentence tasks first, by training size, model, task."""

    storage = open_storage(url, must_exist=True)
    found = []
    for summary in storage.study_summaries():
        identity = study_record(summary).identity
        if identity is not None and is_auto(identity.encoder):
            found.append((identity, storage.existing_study(summary.study_name)))
    found.sort(key=lambda pair: (pair[0].word_pooling is not None, pair[0].max_train or 0, *_problem(pair[0])[:2]))
    return found


def _problem(identity: Any) -> list[str]:
    """Model, task and setting, as the page's tables show a problem."""
    return [identity.model, identity.task, "" if identity.max_train is None else f"train{identity.max_train}"]


def time_section(doc: Document, url: str) -> None:
    """Where the time went: one row per auto study of ``url``, its runs' seconds per part and the stages' share."""
    doc.heading(2, "Where the time goes")
    doc.paragraph(
        "Wall-clock seconds per auto study, summed over the runs that worked on it (each run records them on the "
        "study): before its search (checks, data loading with any extraction and the GGUF conversion, the study's "
        "creation), the search, the final evaluation, the ensemble and the leaderboard, the whole run, and the "
        "part of it after the search. Studies stored before runs recorded their times show their search's span "
        "from the trials' start and end stamps (*) and no stage times. Machine: 2 shared CPU cores."
    )
    rows, shares = [], []
    for identity, study in _auto_studies(url):
        times = study_times(study)
        share = _share(times)
        if share is not None:
            shares.append(share)
        search = _seconds(times["search"]) + ("*" if times["estimated"] and times["search"] is not None else "")
        cells = [*_problem(identity), str(times["trials"]), str(times["runs"])]
        cells += [_seconds(times["before"]), search, *(_seconds(times[s]) for s in STAGES), _seconds(times["total"])]
        rows.append([*cells, _MISSING if share is None else f"{share:.0%}"])
    if not rows:
        doc.paragraph("No auto study is stored yet.")
        return
    header = ["model", "task", "setting", "trials", "runs", "before search", "search", *STAGES, "run", "after search"]
    doc.table(header, [[Cell(text) for text in row] for row in rows])
    if shares:
        doc.bullets(
            [
                f"Over the {plural(len(shares), 'study', 'studies')} with recorded times, the stages after the "
                "search took "
                f"{statistics.median(shares):.0%} of the run (median; from {min(shares):.0%} to {max(shares):.0%})."
            ]
        )


def _timed_runs(url: str) -> list[tuple[Any, RunTimes]]:
    """(identity, run) for every run under a time limit of ``url``'s auto studies, oldest first."""

    out: list[tuple[Any, RunTimes]] = []
    if _missing(url):
        return out
    for identity, study in _auto_studies(url):
        out += [(identity, run) for run in run_times(study) if run.limit]
    return sorted(out, key=lambda pair: pair[1].started)


def _missing(url: str) -> bool:
    """Whether ``url`` is a SQLite file that does not exist (yet)."""

    database = sqlite_database(url)
    return database is not None and not Path(database).exists()


def has_timed_run(url: str, study_name: str) -> bool:
    """Whether the study ``study_name`` of ``url`` recorded a run under a time limit (a storage or study that does
    not exist: no)."""

    if _missing(url):
        return False
    study = open_storage(url, must_exist=True).load_study(study_name)
    return study is not None and any(run.limit for run in run_times(study))


def timed_section(doc: Document, url: str) -> None:
    """How runs under ``--time-limit`` kept it: per run its limit, elapsed time, their ratio and what stopped the
    search, with the stages' seconds."""
    doc.heading(2, "Runs under a time limit")
    doc.paragraph(
        "Auto runs with `--time-limit` (the time-limit storage named above) and a trial cap set far above what "
        "the limit allows, so the limit ends the search. Elapsed: from the start of the run (after the command's "
        "imports) to the end of the study's stages and notes, as the run recorded it; the target is elapsed / "
        f"limit at most {LIMIT_TOLERANCE:.2f}."
    )
    runs = _timed_runs(url)
    if not runs:
        doc.paragraph("Not measured yet: no run under a time limit is stored (`reports/auto.sh`).")
        return
    rows = []
    for identity, run in runs:
        stopped = "trial cap" if run.cap_reached else "time limit"
        cells = [*_problem(identity), _seconds(run.limit), _seconds(run.elapsed)]
        cells += [f"{run.used:.3f}", str(run.trials_added), stopped, _seconds(run.before_search), _seconds(run.search)]
        rows.append([*cells, *(_seconds(run.stage(s)) for s in STAGES)])
    header = ["model", "task", "setting", "limit", "elapsed", "elapsed / limit", "trials", "search stopped by"]
    doc.table([*header, "before search", "search", *STAGES], [[Cell(text) for text in row] for row in rows])
    used = [run.used or 0.0 for _, run in runs]
    within = sum(value <= LIMIT_TOLERANCE for value in used)
    doc.bullets(
        [
            f"{within} of {plural(len(runs), 'run')} ended before {LIMIT_TOLERANCE:.0%} of their limit (the "
            f"target); elapsed / limit from {min(used):.3f} to {max(used):.3f} (median {statistics.median(used):.3f}).",
        ]
    )
