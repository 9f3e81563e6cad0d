"""An auto study's leaderboard: every method's best trial, the selected trial and the ensembles on the same seeds.

As AutoGluon's ``leaderboard()``, one row per model the run produced, with what it costs. Each row's
configuration is retrained with the final seeds (through :func:`~.retraining.train_seeds`, reusing what the
final evaluation trained) and scored on validation and test; the reference is the best single-layer probe
(a linear probe per layer, the layer chosen on validation, per seed), and every other row's test difference
to it comes with a 95 % paired bootstrap interval over the same test texts and seeds
(:func:`~.statistics.paired_bootstrap`): a row whose interval contains 0 is a ``tie``. Over fewer than
:data:`~.limits.MIN_TEST_ROWS` test texts (words) the rows carry the difference alone, no interval and no
verdict, and the table says why (docs/statistics.md, "Minimum sizes"). The ensemble without
its ILGE members is the same ensemble's baseline members, reweighted, from the same predictions: what the
inter-layer encoders add to it.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from optuna.trial import TrialState

from ..embeddings.models import model_size_bucket
from ..encoders import encoder_specs
from ..engine import select_best_layer
from ..engine.ensemble import mixed, prediction_score, predictions_of
from ..progress import BarSpec
from ..record import (
    Identity,
    LeaderboardRecord,
    LeaderboardRow,
    ensemble_record,
    leaderboard_record,
    study_record,
    trial_config,
    trial_record,
)
from ..storage import Storage, count_trials, open_storage
from ..tasks.scores import score_unit
from ..tuning import recommended_config
from .auto import is_auto
from .data import StudyData
from .export import load_run_study
from .limits import MIN_SEEDS, MIN_TEST_ROWS, too_few_for_an_interval
from .objectives import measure_latency
from .options import option_default
from .predictions import predicted_labels, upload_test_predictions
from .retraining import train_seeds
from .selection import DEFAULT_SELECT, select_trial
from .statistics import BootstrapSettings, paired_bootstrap

__all__ = ["LeaderboardRun", "leaderboard_evaluation", "leaderboard_is_current", "ilge_member", "never_made"]


@dataclass(frozen=True)
class LeaderboardRun:
    """How a leaderboard is made: the final seeds, the epoch cap, the selection rule whose trial is shown,
    where it trains and stores the predictions, and the models earlier stages trained (trial -> seed ->
    (model, seconds)), reused."""

    seeds: list[int]
    max_epochs: int | None
    select: str = DEFAULT_SELECT
    device: str = "cpu"
    artifact_store: Any = None
    progress: bool = True
    reuse: Mapping[int, Mapping[int, tuple[Any, float]]] = field(default_factory=dict)
    resamples: int = 2000
    confidence: float = 0.95


@dataclass
class _Model:
    """One configuration trained with every final seed: per seed its validation and test predictions and
    training seconds; its forward time and trainable parameters (of the first seed's model)."""

    validation: dict[int, np.ndarray] = field(default_factory=dict)
    test: dict[int, np.ndarray] = field(default_factory=dict)
    seconds: dict[int, float] = field(default_factory=dict)
    predict_ms: float = 0.0
    params: int = 0


def ilge_member(config_family: str) -> bool:
    """Whether a family is an inter-layer (ILGE) encoder, not a layer baseline."""
    return any(spec.name == config_family and spec.role == "ilge" for spec in encoder_specs())


def _measured(model: Any, data: StudyData, out: _Model) -> None:
    out.predict_ms = measure_latency(model, data.test_split()[0])
    out.params = int(sum(p.numel() for p in model.parameters() if p.requires_grad))


def _trained(trial: Any, data: StudyData, run: LeaderboardRun) -> _Model:
    out = _Model()
    config = trial_config(trial)
    if run.max_epochs is not None and config.epochs > run.max_epochs:
        config = config.replace(epochs=run.max_epochs)
    bar = BarSpec(f"leaderboard trial {trial.number}", enabled=run.progress, transient=True)
    reused = run.reuse.get(trial.number, {})
    for trained in train_seeds(data, config, run.seeds, device=run.device, bar=bar, reuse=reused):
        out.seconds[trained.seed] = trained.seconds
        out.validation[trained.seed] = predictions_of(trained.model, data.validation[0])
        out.test[trained.seed] = predictions_of(trained.model, data.test_split()[0])
        if len(out.seconds) == 1:
            _measured(trained.model, data, out)
    return out


def _probe(data: StudyData, run: LeaderboardRun, model_name: str) -> _Model:
    """The best single-layer probe (the recommended best-layer recipe, the layer chosen on validation) per seed."""
    config: Any = recommended_config("best-layer", model_size_hint=model_size_bucket(model_name, data.hidden_size))
    if run.max_epochs is not None and config.epochs > run.max_epochs:
        config = config.replace(epochs=run.max_epochs)
    out = _Model()
    for seed in run.seeds:
        started = time.perf_counter()
        _, result, _ = select_best_layer(config, data.train, data.validation, **data.train_options(seed, run.device))
        out.seconds[seed] = time.perf_counter() - started
        out.validation[seed] = predictions_of(result.model, data.validation[0])
        out.test[seed] = predictions_of(result.model, data.test_split()[0])
        if len(out.seconds) == 1:
            _measured(result.model, data, out)
    return out


@dataclass(frozen=True)
class _Entry:
    """A row before it is scored: its name and kind, and its members (trial number -> weight)."""

    name: str
    kind: str
    members: dict[int, int]


def _complete(study: Any) -> dict[int, Any]:
    """Trial number -> the study's complete trials that recorded a config."""
    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return {t.number: t for t in trials if t.values and trial_record(t).config}


def _entries(study: Any, select: str, complete: Mapping[int, Any]) -> list[_Entry]:
    """The rows: each method's best complete trial (by its search score), the selected trial, the ensemble
    and the ensemble without its ILGE members (where it has baseline members and ILGE ones)."""
    best: dict[str, Any] = {}
    for trial in complete.values():
        family = trial_config(trial).family
        if family not in best or trial.value > best[family].value:
            best[family] = trial
    ranked = sorted(best.items(), key=lambda item: -item[1].value)
    entries = [_Entry(family, "method", {trial.number: 1}) for family, trial in ranked]
    selected = select_trial(study, select).number
    entries.append(_Entry(f"selected (trial {selected})", "selected", {selected: 1}))
    stored = ensemble_record(study)
    ensemble = None if stored is None else stored.ensemble
    if ensemble is not None:
        members = {int(n): int(c) for n, c in ensemble.members.items()}
        entries.append(_Entry(f"ensemble of {ensemble.size}", "ensemble", members))
        families = {n: trial_config(complete[n]).family for n in members}
        baselines = {n: c for n, c in members.items() if not ilge_member(families[n])}
        if baselines and len(baselines) < len(members):
            entries.append(_Entry("ensemble without ILGE members", "ensemble-baselines", baselines))
    return entries


def _mix(entry: _Entry, models: Mapping[int, _Model], split: str, seed: int) -> np.ndarray:
    return mixed({n: getattr(models[n], split)[seed] for n in entry.members}, entry.members)


def _row(entry: _Entry, models: Mapping[int, _Model], data: StudyData, run: LeaderboardRun) -> LeaderboardRow:
    targets = {"validation": np.asarray(data.validation[1]), "test": np.asarray(data.test_split()[1])}

    def scores(split: str) -> list[float]:
        return [
            prediction_score(_mix(entry, models, split, seed), targets[split], data.task_kind, data.metric)
            for seed in run.seeds
        ]

    distinct = [models[n] for n in entry.members]
    return LeaderboardRow(
        name=entry.name,
        kind=entry.kind,
        members={str(n): c for n, c in sorted(entry.members.items())},
        val_scores=scores("validation"),
        test_scores=scores("test"),
        train_seconds=statistics.fmean(sum(m.seconds[s] for m in distinct) for s in run.seeds),
        predict_ms=sum(m.predict_ms for m in distinct),
        params=sum(m.params for m in distinct),
    )


def _with_interval(row: LeaderboardRow, first: np.ndarray, reference: np.ndarray, truth: np.ndarray, **how: Any):
    """``row`` with its test difference to the reference and the interval's verdict; over fewer than
    :data:`MIN_TEST_ROWS` test examples the difference alone (NaN bounds, no verdict)."""
    if truth.size < MIN_TEST_ROWS:
        # a bootstrap over so few examples has too few distinct resamples to hold its level: the seed-mean
        # difference (what the bootstrap's estimate is) without an interval or a verdict drawn from it
        return dataclasses.replace(row, difference=(row.test_mean - how["base"], math.nan, math.nan), verdict=None)
    settings = BootstrapSettings(resamples=how["resamples"], confidence=how["confidence"], seed=0)
    interval = paired_bootstrap(truth, first, reference, metric=how["metric"], settings=settings)
    return dataclasses.replace(
        row, difference=(interval.estimate, interval.low, interval.high), verdict=interval.verdict
    )


def leaderboard_evaluation(study: Any, data: StudyData, run: LeaderboardRun, model_name: str) -> LeaderboardRecord:
    """Retrain every row's trials with the final seeds, score them, compare each with the probe on the same
    test texts and seeds, store the per-example test predictions; the record (not yet saved)."""
    complete = _complete(study)
    entries = _entries(study, run.select, complete)
    numbers = sorted({n for entry in entries for n in entry.members})
    models = {n: _trained(complete[n], data, run) for n in numbers}
    probe = _probe(data, run, model_name)
    models[-1] = probe
    reference = _Entry("best single layer", "reference", {-1: 1})
    truth = np.asarray(data.test_split()[1])
    labels = {
        e.name: np.stack([predicted_labels(_mix(e, models, "test", s), data.task_kind) for s in run.seeds])
        for e in [*entries, reference]
    }
    base = _row(reference, models, data, run)
    how = dict(resamples=run.resamples, confidence=run.confidence, metric=data.metric, base=base.test_mean)
    rows = [
        _with_interval(_row(e, models, data, run), labels[e.name], labels[reference.name], truth, **how)
        for e in entries
    ]
    methods = sorted((row for row in rows if row.kind == "method"), key=lambda row: -row.val_mean)
    rows = [*methods, *(row for row in rows if row.kind != "method"), base]
    arrays = {"truth": truth, **{f"row{i}": labels[r.name] for i, r in enumerate(rows)}}
    artifact = upload_test_predictions(study, arrays, run.artifact_store, "leaderboard_test_predictions.npz")
    return LeaderboardRecord(
        metric=data.metric,
        seeds=list(run.seeds),
        rows=rows,
        max_epochs=run.max_epochs,
        select=run.select,
        confidence=run.confidence,
        resamples=run.resamples,
        predictions=artifact,
        unit="words" if data.task_kind == "tagging" else "texts",
        test_rows=int(truth.size),  # what the bootstrap resamples: texts, pairs, or a tagger's words
    )


def leaderboard_is_current(study: Any, run: LeaderboardRun) -> bool:
    """Whether the stored leaderboard was made with this run's seeds, epoch cap and rule, after the ensemble."""
    stored = leaderboard_record(study)
    if stored is None or not stored.matches(run.seeds, run.max_epochs, run.select):
        return False
    ensemble = ensemble_record(study)
    shown = stored.row("ensemble")
    members = None if ensemble is None or ensemble.ensemble is None else ensemble.ensemble.members
    return (shown is None and members is None) or (
        shown is not None and members is not None and shown.members == {k: int(v) for k, v in members.items()}
    )


def no_interval(record: LeaderboardRecord) -> str | None:
    """Why the leaderboard's differences have no interval (``12 test texts: too few for an interval``): a test
    split under :data:`MIN_TEST_ROWS`; ``None`` when they have one, or the size is unknown (stored before it was
    recorded)."""
    if record.test_rows is None or record.test_rows >= MIN_TEST_ROWS:
        return None
    # the bootstrap pairs over examples, not seeds, so one seed is enough; the limits module names a task
    # kind's rows, while the record knows its unit ("texts" or "words"), which its footnote uses too
    note = too_few_for_an_interval(record.test_rows, MIN_SEEDS, None) or ""
    return note.replace(" test rows:", f" test {record.unit}:")


def _points(value: float, scale: float) -> float | None:
    return None if not math.isfinite(value) else round(value * scale, 2)


def format_rows(record: LeaderboardRecord) -> list[dict[str, Any]]:
    """The leaderboard as plain rows (what the table, CSV and JSON show), scores in the metric's points; over a
    test split too small for an interval, each difference without one and ``no_interval`` saying why."""
    scale = score_unit(record.metric)[0]
    note = no_interval(record)
    out = []
    for row in record.rows:
        difference = row.difference
        # a record may hold intervals drawn before the minimum was enforced: they are not shown either
        bounds = (None, None) if difference is None or note else (difference[1], difference[2])
        out.append(
            {
                "model": row.name,
                "kind": row.kind,
                "val": round(row.val_mean * scale, 2),
                "test_mean": round(row.test_mean * scale, 2),
                "test_std": round(row.test_std * scale, 2),
                "vs_best_layer": None if difference is None else round(difference[0] * scale, 2),
                "ci_low": None if bounds[0] is None else _points(bounds[0], scale),
                "ci_high": None if bounds[1] is None else _points(bounds[1], scale),
                "verdict": None if note else row.verdict,
                "no_interval": None if difference is None else note,
                "train_s": round(row.train_seconds, 2),
                "predict_ms_per_1k": round(row.predict_ms, 2),
                "params": row.params,
            }
        )
    return out


def row_cells(row: Mapping[str, Any]) -> list[str]:
    """A leaderboard row's cells as the table shows them (:data:`HEADER`)."""
    if row["vs_best_layer"] is None:
        versus = "reference"
    elif row.get("no_interval") or row["ci_low"] is None:
        versus = f"{row['vs_best_layer']:+.2f}" + (f" ({row['no_interval']})" if row.get("no_interval") else "")
    else:
        versus = f"{row['vs_best_layer']:+.2f} [{row['ci_low']:+.2f}, {row['ci_high']:+.2f}]"
        versus += " tie" if row["verdict"] == "tie" else ""
    return [
        str(row["model"]),
        f"{row['val']:.2f}",
        f"{row['test_mean']:.2f} ± {row['test_std']:.2f}",
        versus,
        f"{row['train_s']:.1f}",
        f"{row['predict_ms_per_1k']:.1f}",
        f"{row['params']:,}",
    ]


HEADER = ("model", "val", "test mean ± std", "vs best layer [95% CI]", "train s", "predict ms/1k", "params")


def format_table(record: LeaderboardRecord) -> str:
    """The leaderboard as an aligned text table, with one line saying how it was measured (no interval over a
    test split too small for one: the line says why instead of naming a bootstrap)."""
    note = no_interval(record)
    header = [*HEADER[:3], "vs best layer" if note else HEADER[3], *HEADER[4:]]
    cells = [header, *[row_cells(row) for row in format_rows(record)]]
    widths = [max(len(line[i]) for line in cells) for i in range(len(HEADER))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    measured = (
        f"paired over the same test {record.unit} and seeds, without an interval (under {MIN_TEST_ROWS} test "
        f"{record.unit}: too few for one)"
        if note
        else f"{record.confidence:.0%} paired bootstrap over the same test {record.unit} and seeds "
        f"({record.resamples} resamples); 'tie': the interval contains 0"
    )
    lines.append(
        f"{score_unit(record.metric)[1]} over final seeds {record.seeds}; differences: test minus the best "
        f"single-layer probe, {measured}; predict ms per 1,000 {record.unit}"
    )
    return "\n".join(lines)


EXPORT_RULE = (
    "an auto study exports its ensemble when the ensemble's validation score, mean over the final seeds, is "
    "above the selected trial's; otherwise (a tie too: it is cheaper) the selected trial"
)


def export_choice(study: Any) -> tuple[bool, str] | None:
    """For an auto study with a leaderboard: whether its export is the ensemble, and the sentence saying why
    (:data:`EXPORT_RULE`); ``None`` for any other study."""
    identity = study_record(study).identity
    stored = leaderboard_record(study)
    if identity is None or not is_auto(identity.encoder) or stored is None:
        return None
    ensemble, selected = stored.row("ensemble"), stored.row("selected")
    if ensemble is None or selected is None:
        why = "tagging studies have none" if stored.unit == "words" else "none was made"
        return False, f"the auto study has no ensemble ({why}): its selected trial is exported"
    chosen = ensemble.val_mean > selected.val_mean
    what = "the ensemble" if chosen else "the selected trial"
    return chosen, (
        f"exported {what}: validation {ensemble.val_mean:.4f} (ensemble) vs {selected.val_mean:.4f} "
        f"({selected.name}); rule: {EXPORT_RULE}"
    )


def study_export_choice(storage: Any, study_name: str) -> tuple[bool, str] | None:
    """:func:`export_choice` of the stored study ``study_name``."""
    opened = storage if isinstance(storage, Storage) else open_storage(storage, must_exist=True)
    return export_choice(load_run_study(opened, study_name, purpose="exported"))


def never_made(identity: Identity | None) -> str | None:
    """Why no run can make this study a leaderboard (``None``: a run with final seeds makes one)."""
    if identity is None or not is_auto(identity.encoder):
        return "it is not an auto study (a leaderboard ranks the methods of an `ilge-search run --encoder auto` study)"
    if identity.multi_objective:
        return (
            f"it optimises several objectives ({', '.join(identity.objectives)}), so its final evaluation keeps a "
            "Pareto front, not one selected trial to rank against the best single layer"
        )
    if identity.protocol != "matched":
        return (
            f"it is scored under the {identity.protocol} protocol (each final model read out as MTEB does), "
            "while a leaderboard's rows are retrained and compared under the matched protocol"
        )
    return None


def study_leaderboard(storage: Any, study_name: str) -> LeaderboardRecord:
    """The stored leaderboard of ``study_name``.

    Raises:
        ValueError: no such study, or one without a leaderboard (one line saying why, and how to make it or
        what to read instead).
    """
    opened = storage if isinstance(storage, Storage) else open_storage(storage, must_exist=True)
    study = load_run_study(opened, study_name, purpose="shown")
    stored = leaderboard_record(study)
    if stored is not None:
        return stored
    identity = study_record(study).identity
    reason = never_made(identity)
    seeds = f"--final-seeds {option_default('final_seeds')}"
    if reason is not None:
        advice = f"`ilge-search studies --storage {opened.shown_url}` shows its final scores"
    elif not count_trials(study, ("COMPLETE",)):
        starts = len(identity.methods or ()) if identity is not None else 1
        reason = "it has no complete trial yet, and the leaderboard ranks the complete trials of each method"
        advice = f"rerun its `ilge-search run` command with --n-trials {max(starts, 1)} (every method's start) {seeds}"
    else:
        reason = "it is made after the search when the run has final seeds"
        advice = f"rerun its `ilge-search run` command with --n-trials 0 {seeds} to make it"
    raise ValueError(f"study {study_name!r} has no leaderboard: {reason}; {advice}")
