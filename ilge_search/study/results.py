"""Reading studies back: one :class:`StudyResult` per study, a listing of a storage, text tables."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd
from optuna.trial import TrialState

from ..record import (
    DEFAULT_PROTOCOL,
    EnsembleSize,
    FrontMember,
    LeaderboardRecord,
    StudyRecord,
    ensemble_record,
    leaderboard_record,
    study_record,
    trial_record,
)
from ..storage import Storage, artifact_dir_for, hide_password, open_storage
from .limits import MIN_SEEDS, MIN_TEST_ROWS, too_few_for_an_interval
from .objectives import best_score_trial, score_of
from .predictions import interval_kind, paired_interval, stored_final_predictions
from .statistics import Interval, seeds_interval

if TYPE_CHECKING:
    import optuna
    import pandas as pd

__all__ = [
    "StudyResult",
    "study_result",
    "export_choice",
    "list_studies",
    "format_results",
    "format_front",
    "summary_line",
]


@dataclass
class StudyResult:
    """One study's outcome, read back from the storage.

    ``test_mean``/``test_std``/``test_scores`` are the final test scores over
    the final seeds (``None``/empty before a final evaluation ran) of trial
    ``final_trial``, chosen by the rule ``select``; ``search_gain`` is its test
    mean minus that of the starting configuration retrained with the same
    seeds, ``val_test_gap`` its objective minus its test mean (``None`` for
    evaluations stored before these existed, and under the paper protocol).
    ``best_value`` is the best score. A multi-objective study names its
    ``objectives`` and keeps its final front's records in ``front``
    (``final_trial`` is the front's best-score trial).
    ``protocol`` says how the test scores were measured (``matched`` or
    ``paper``, with ``samples_per_label`` examples per label; see
    :mod:`ilge_search.study.protocol`).
    """

    study_name: str
    storage: str
    model: str
    task: str
    encoder: str
    metric: str
    n_complete: int
    n_pruned: int
    n_failed: int
    best_value: float | None = None
    best_trial: int | None = None
    best_config: dict[str, Any] | None = None
    test_mean: float | None = None
    test_std: float | None = None
    test_scores: list[float] = field(default_factory=list)
    artifacts: dict[str, str] = field(default_factory=dict)
    final_trial: int | None = None
    select: str | None = None
    search_gain: float | None = None
    val_test_gap: float | None = None
    objectives: list[str] = field(default_factory=lambda: ["score"])
    front: list[FrontMember] = field(default_factory=list)
    protocol: str = DEFAULT_PROTOCOL
    samples_per_label: int | None = None
    ensemble: EnsembleSize | None = None  # the stored ensemble evaluation's asked-for size, with the same seeds
    export_seed: int | None = None  # the seed `export` takes (the best final seed by validation)
    export_test: float | None = None  # that seed's test score (None under the paper protocol)
    gain_scores: list[float] = field(default_factory=list)  # per seed: selected minus start, improvement positive
    gain_interval: Interval | None = None  # the search gain's 95% interval (its method says which)
    leaderboard: LeaderboardRecord | None = field(default=None, repr=False)  # an auto study's stored leaderboard
    too_few_rows: str | None = None  # why no interval is shown at all: too few test examples (None: enough)

    @property
    def n_finished(self) -> int:
        """Complete plus pruned trials (what ``--n-trials`` counts)."""
        return self.n_complete + self.n_pruned


def _final_fields(record: StudyRecord) -> dict[str, Any]:
    """The :class:`StudyResult` fields of a study's final evaluation (none: left at their defaults)."""
    final = record.final
    if final is None:
        return {}
    return {
        "test_mean": final.test_mean,
        "test_std": final.test_std,
        "test_scores": list(final.test_scores),
        "artifacts": dict(final.artifacts),
        "final_trial": final.trial,
        "select": final.select,
        "search_gain": final.search_gain,
        "val_test_gap": final.val_test_gap,
        "front": list(final.front),
        "gain_scores": _gain_scores(final.test_scores, final.start_test_scores, record.maximize),
    }


def _gain_scores(test: list[float], start: list[float] | None, maximize: bool) -> list[float]:
    """Per final seed, the selected trial minus the start with the same seed (empty when they do not pair)."""
    if not start or len(start) != len(test):
        return []
    sign = 1.0 if maximize else -1.0
    return [sign * (a - b) for a, b in zip(test, start, strict=True)]


def gain_interval(record: StudyRecord, artifacts: Any) -> Interval | None:
    """The search gain's 95% interval: the paired bootstrap over the test examples and seeds where the final
    evaluation stored the selected trial's and the start's test predictions (in ``artifacts``, the artifact
    folder or store), else the t interval over the final seeds; ``None`` with fewer than two paired seeds or
    :data:`~.limits.MIN_TEST_ROWS` test examples."""
    final = record.final
    if final is None or _too_few_rows(record) is not None:
        return None
    if final.predictions and record.maximize:
        stored = stored_final_predictions(artifacts, final)
        metric = (record.data.metric if record.data else None) or ""
        paired = paired_interval(stored.get("selected"), stored.get("start"), metric)
        if paired is not None:
            return paired
    gains = _gain_scores(final.test_scores, final.start_test_scores, record.maximize)
    return seeds_interval(gains) if len(gains) > 1 else None


def _too_few_rows(record: StudyRecord) -> str | None:
    """Why no interval of the study means anything: fewer than ``MIN_TEST_ROWS`` test examples."""
    rows = record.data.split_sizes.get("test") if record.data else None
    if rows is None or rows >= MIN_TEST_ROWS:
        return None
    return too_few_for_an_interval(rows, MIN_SEEDS, record.data.task_kind if record.data else None)


def gain_note(record: StudyRecord, interval: Interval | None) -> str | None:
    """Why the search gain has no interval (too few test examples or seeds); ``None`` when it has one or
    lacks it for another reason (no start scores to pair with)."""
    final = record.final
    if final is None or final.search_gain is None or interval is not None:
        return None
    paired = _gain_scores(final.test_scores, final.start_test_scores, record.maximize)
    kind = record.data.task_kind if record.data else None
    return _too_few_rows(record) or (too_few_for_an_interval(None, len(paired), kind) if paired else None)


def _with_interval(
    text: str, differences: list[float], interval: Interval | None = None, too_few: str | None = None
) -> str:
    """``text`` followed by ``interval`` (a paired bootstrap, named) or else the 95% t interval of per-seed
    ``differences``, and its verdict (two seeds or more); with ``too_few`` test examples, or a single seed, the
    reason there is none."""
    if too_few is not None:
        return f"{text} ({too_few})"
    if interval is not None and interval_kind(interval) == "paired bootstrap":
        return f"{text} [{interval.low:+.4f}, {interval.high:+.4f}] {interval.verdict} (paired bootstrap)"
    if len(differences) < MIN_SEEDS:
        return text if not differences else f"{text} ({too_few_for_an_interval(None, len(differences), None)})"
    interval = seeds_interval(differences)
    return f"{text} [{interval.low:+.4f}, {interval.high:+.4f}] {interval.verdict}"


def _artifacts_of(storage: str | Storage) -> Any:
    """The artifact folder of ``storage`` (``None`` for no storage): read only, never created."""
    if isinstance(storage, Storage):
        return storage.artifact_dir
    return artifact_dir_for(storage) if storage else None


def study_result(study: optuna.Study, storage: str | Storage = "") -> StudyResult:
    """A :class:`StudyResult` from a loaded ``optuna.Study``; ``storage`` (a URL or a
    :class:`~ilge_search.storage.Storage`) is recorded with its password hidden."""

    trials = study.get_trials(deepcopy=False)
    count = {state: sum(t.state == state for t in trials) for state in TrialState}
    record = study_record(study)
    identity, data = record.identity, record.data
    best = best_score_trial(study) if count[TrialState.COMPLETE] else None
    shown = storage.shown_url if isinstance(storage, Storage) else hide_password(storage) if storage else ""
    return StudyResult(
        study_name=study.study_name,
        storage=shown,
        model=(identity.model if identity else None) or "",
        task=(identity.task if identity else None) or "",
        encoder=(identity.encoder if identity else None) or "",
        metric=(data.metric if data else None) or "",
        n_complete=count[TrialState.COMPLETE],
        n_pruned=count[TrialState.PRUNED],
        n_failed=count[TrialState.FAIL],
        best_value=None if best is None else score_of(best),
        best_trial=None if best is None else best.number,
        best_config=None if best is None else trial_record(best).config,
        objectives=list(record.objectives),
        protocol=identity.protocol if identity else DEFAULT_PROTOCOL,
        samples_per_label=identity.samples_per_label if identity else None,
        ensemble=_ensemble_of(study),
        leaderboard=leaderboard_record(study),
        gain_interval=gain_interval(record, _artifacts_of(storage)),
        too_few_rows=_too_few_rows(record),
        **_final_fields(record),
        **_export_columns(record),
    )


def _ensemble_of(study: optuna.Study) -> EnsembleSize | None:
    stored = ensemble_record(study)
    return None if stored is None else stored.ensemble


# the columns of list_studies before the study stages' own
_LISTING_COLUMNS = [
    "study",
    "model",
    "task",
    "encoder",
    "protocol",
    "metric",
    "trials",
    "best_val",
    "best_trial",
    "test_mean",
    "test_std",
    "seeds",
    "select",
    "final_trial",
    "search_gain",
    "search_gain_verdict",
    "search_gain_interval",
    "objectives",
    "export_seed",
    "export_test",
]


def list_studies(storage: str | Storage | None = None) -> pd.DataFrame:
    """One row per study in ``storage``: identity, trial counts, best validation
    value and final test mean/std (a ``pandas.DataFrame``, sorted by model, task, encoder).

    Raises:
        StorageError: the storage cannot be opened, or is a SQLite file that does not exist.
    """
    from .stages.registry import registered_stages  # cycle: the built-in stages use this module

    opened = storage if isinstance(storage, Storage) else open_storage(storage, must_exist=True)
    rows = [_listing_row(opened, summary) for summary in opened.study_summaries()]
    columns = [*_LISTING_COLUMNS, *(name for stage in registered_stages() for name in stage.column_names)]
    frame = pd.DataFrame(rows, columns=columns)
    # trial numbers stay integers where some are missing (a float column would print 7.0000)
    frame["final_trial"] = pd.Series([math.nan if pd.isna(v) else int(v) for v in frame["final_trial"]], dtype=object)
    if not frame.empty:
        frame = frame.sort_values(["model", "task", "encoder", "study"], na_position="last").reset_index(drop=True)
    return frame


def _listing_row(opened: Storage, summary: Any) -> dict[str, Any]:
    """One row of :func:`list_studies`: a study's summary and record, with each study stage's columns."""
    from .stages.registry import registered_stages  # cycle: the built-in stages use this module

    record = study_record(summary)
    identity, data, final = record.identity, record.data, record.final
    model = identity.model if identity else None
    gain = gain_interval(record, opened.artifact_dir)
    best = summary.best_trial
    if len(record.objectives) > 1 and model is not None:  # Optuna summarises only single-objective studies' best
        study = opened.load_study(summary.study_name)
        best = best_score_trial(study) if study is not None and study.best_trials else None
    return {
        "study": summary.study_name,
        "model": model,
        "task": identity.task if identity else None,
        "encoder": identity.encoder if identity else None,
        "protocol": identity.protocol if identity and model else None,
        "metric": data.metric if data else None,
        "trials": summary.n_trials,
        "best_val": None if best is None else score_of(best),
        "best_trial": None if best is None else best.number,
        "test_mean": final.test_mean if final else None,
        "test_std": final.test_std if final else None,
        "seeds": len(final.test_scores) if final else 0,
        "select": record.select,
        "final_trial": final.trial if final else None,
        "search_gain": final.search_gain if final else None,
        "search_gain_verdict": None if gain is None else gain.verdict,
        "search_gain_interval": interval_kind(gain) or gain_note(record, gain),
        "objectives": "+".join(record.objectives),
        **_export_columns(record),
        **{key: value for stage in registered_stages() for key, value in stage.columns(summary).items()},
    }


def export_choice(record: StudyRecord) -> tuple[int | None, float | None]:
    """(seed, its test score) of what ``ilge-search export`` takes from the study: the final seed with the best
    validation score, whose weights the final evaluation kept; the score is ``None`` under the paper protocol
    (its test scores are a logistic readout, not the exported head) or without a final evaluation."""
    final = record.final
    if final is None or final.artifact_seed is None:
        return None, None
    seeds, seed = list(final.seeds), int(final.artifact_seed)
    paper = record.identity is not None and record.identity.protocol == "paper"
    if paper or seed not in seeds[: len(final.test_scores)]:
        return seed, None
    return seed, float(final.test_scores[seeds.index(seed)])


def _export_columns(record: StudyRecord) -> dict[str, Any]:
    seed, test = export_choice(record)
    return {"export_seed": seed, "export_test": test}


def format_results(results: Iterable[StudyResult]) -> str:
    """A plain-text table of :class:`StudyResult` rows (what ``run`` and ``sweep`` print).

    ``test mean +- std`` is that of the trial the selection rule chose (``(trial N, rule; export: seed S test T)``:
    the seed `export` takes, the best by validation, and its own test score);
    ``search gain`` is its test mean minus the starting configuration's, signed (``-`` when unknown), with its
    95% interval and verdict (win / tie / loss): ``(paired bootstrap)`` over the test examples and seeds where
    both sides' test predictions are stored, else the t interval of the per-seed differences; the ensemble's
    difference to the selected trial carries the t interval;
    ``protocol`` says how the test scores were measured.
    """
    results = list(results)
    with_ensemble = any(r.ensemble is not None for r in results)
    header: tuple[str, ...] = ("study", "protocol", "trials", "pruned", "failed", "best val", "test mean +- std")
    header += ("search gain",) + (("ensemble test (picks, vs selected)",) if with_ensemble else ())
    rows = [header]
    for r in results:
        test = "-" if r.test_mean is None else f"{r.test_mean:.4f} +- {r.test_std:.4f} ({len(r.test_scores)} seeds)"
        if r.test_mean is not None and r.final_trial is not None:
            test += f" (trial {r.final_trial}, {r.select}{_export_text(r)})"
        best = "-" if r.best_value is None else f"{r.best_value:.4f} ({r.metric})"
        gain = (
            "-"
            if r.search_gain is None
            else _with_interval(f"{r.search_gain:+.4f}", r.gain_scores, r.gain_interval, r.too_few_rows)
        )
        rows.append(
            (
                r.study_name,
                r.protocol,
                str(r.n_complete + r.n_pruned + r.n_failed),
                str(r.n_pruned),
                str(r.n_failed),
                best,
                test,
                gain,
            )
            + ((_ensemble_cell(r),) if with_ensemble else ())
        )
    lines = _aligned(rows)
    for r in results:
        if r.front:
            lines += ["", format_front(r)]
    return "\n".join(lines)


def _export_text(result: StudyResult) -> str:
    """What `export` takes, beside the mean the table shows: its seed and that seed's test score."""
    if result.export_seed is None:
        return ""
    test = "" if result.export_test is None else f" test {result.export_test:.4f}"
    return f"; export: seed {result.export_seed}{test}"


def _ensemble_cell(result: StudyResult) -> str:
    ensemble = result.ensemble
    if ensemble is None:
        return "-"
    cell = f"{ensemble.test_mean:.4f} +- {ensemble.test_std:.4f} ({ensemble.describe()}"
    if result.test_mean is not None:
        cell += f"; {ensemble.test_mean - result.test_mean:+.4f} vs selected"
        if len(ensemble.test_scores) == len(result.test_scores):
            paired = [a - b for a, b in zip(ensemble.test_scores, result.test_scores, strict=True)]
            cell = _with_interval(cell, paired, too_few=result.too_few_rows)
    return cell + ")"


def format_front(result: StudyResult) -> str:
    """The final front of a multi-objective study as text: per retrained trial its parameters, latency,
    validation score and test mean +- std, best score first."""
    header = ("trial", "params", "latency ms/1k", f"val {result.metric}", "test mean +- std")
    rows = [header]
    for member in result.front:
        rows.append(
            (
                str(member.trial),
                "-" if member.params is None else f"{int(member.params):,}",
                "-" if member.latency_ms is None else f"{member.latency_ms:.1f}",
                f"{member.val_score:.4f}",
                f"{member.test_mean:.4f} +- {member.test_std:.4f} ({len(member.test_scores)} seeds)",
            )
        )
    title = (
        f"final front of {result.study_name} ({' vs '.join(result.objectives)}; "
        f"{len(result.front)} Pareto-front trials retrained):"
    )
    return "\n".join([title, *_aligned(rows, indent="  ")])


def _aligned(rows: Sequence[Sequence[str]], indent: str = "") -> list[str]:
    """Text rows in left-aligned columns two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def _protocol_text(result: StudyResult) -> str:
    if result.protocol == "paper" and result.metric == "accuracy":
        return f"paper protocol: logistic readout, {result.samples_per_label} per label"
    return f"{result.protocol} protocol"


def summary_line(result: StudyResult) -> str:
    """One log line: trial counts, best validation value and the final test score."""
    text = f"{result.study_name}: {result.n_complete} complete, {result.n_pruned} pruned, {result.n_failed} failed"
    if result.best_value is not None:
        text += f"; best validation {result.metric} {result.best_value:.4f} (trial {result.best_trial})"
    if result.test_mean is not None:
        text += (
            f"; test {result.metric} {result.test_mean:.4f} +- {result.test_std:.4f} "
            f"over {len(result.test_scores)} seeds ({_protocol_text(result)})"
        )
        if result.search_gain is not None:
            text += f" (trial {result.final_trial}, {result.select}; search gain {result.search_gain:+.4f})"
    if result.ensemble is not None:
        ensemble = result.ensemble
        text += (
            f"; ensemble of {ensemble.describe()}: test {result.metric} "
            f"{ensemble.test_mean:.4f} +- {ensemble.test_std:.4f}"
        )
    return text
