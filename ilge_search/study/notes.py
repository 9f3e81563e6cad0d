"""Markdown notes for optuna-dashboard: what a reader sees first on a trial's or a study's page.

- :func:`write_trial_note` gives every trial a note with its configuration
  (the tuned fields marked), validation score, trainable parameters, epochs
  and seconds, read from its :class:`~ilge_search.record.TrialRecord`;
  :func:`write_live_note` is what a trial calls as it finishes (in every
  worker process), and never fails the trial;
- :func:`write_study_note` gives the study a note with its identity, the best
  trial and the final test scores (mean +- std and one row per seed), linking
  the uploaded weights, read from its :class:`~ilge_search.record.StudyRecord`;
  a multi-objective study's note also lists its final front (optuna-dashboard
  draws its Pareto front by itself, from the study's directions and metric names);
- :func:`write_notes` fills in both for studies run before notes existed.

The server that shows them is :func:`ilge_search.report.dashboard.serve_dashboard`.
"""

from __future__ import annotations

import json
import logging
import math
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import optuna
from optuna.trial import TrialState

from ..record import (
    EnsembleRecord,
    FinalRecord,
    StudyRecord,
    WarmStartRecord,
    study_record,
    trial_record,
    warm_start_record,
)
from ..storage import ENDED_STATES
from .results import study_result

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

__all__ = [
    "TrialCounts",
    "TrialOutcome",
    "trial_note_markdown",
    "study_note_markdown",
    "write_trial_note",
    "write_live_note",
    "write_study_note",
    "write_notes",
]

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------- Markdown


def _cell(value: object) -> str:
    """One Markdown table cell: short numbers, code for lists and dicts, escaped pipes."""
    if value is None:
        text = "-"
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, float):
        text = "nan" if math.isnan(value) else f"{value:.4g}"
    elif isinstance(value, (list, tuple, dict)):
        text = f"`{json.dumps(value)}`"
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _score(value: float | None) -> str:
    return "-" if value is None else f"{float(value):.4f}"


def _table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    lines += ["| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows]
    return lines


@dataclass(frozen=True)
class TrialOutcome:
    """What training a trial did, as its note shows it (``None``: not recorded, shown as ``-``).

    Attributes:
        val_metric: best validation value over the epochs run.
        num_trainable_params, epochs_run, best_epoch, seconds: what training did.
        layer: the layer the best-layer baseline picked.
    """

    val_metric: float | None = None
    num_trainable_params: int | None = None
    epochs_run: int | None = None
    best_epoch: int | None = None
    seconds: float | None = None
    layer: int | None = None


def trial_note_markdown(
    number: int,
    config: Mapping[str, object],
    *,
    metric: str = "value",
    state: str = "complete",
    outcome: TrialOutcome = TrialOutcome(),
    tuned: Iterable[str] = (),
    recommended: bool = False,
) -> str:
    """The Markdown note of one trial.

    Args:
        number: the trial number.
        config: the full config dict (``EncoderConfig.to_dict()``).
        metric: the validation metric's name (``accuracy``, ``spearman`` ...).
        state: ``complete``, ``pruned``, ``fail`` ...
        outcome: what training did (:class:`TrialOutcome`).
        tuned: config fields that the sampler chose (marked in the table).
        recommended: the trial runs the family's ``recommended_config``.

    >>> outcome = TrialOutcome(val_metric=0.5, num_trainable_params=1234, epochs_run=3, best_epoch=2, seconds=1.5)
    >>> print(trial_note_markdown(0, {"family": "fc", "lr": 0.001}, metric="accuracy", outcome=outcome,
    ...                           tuned=["lr"]).splitlines()[0])
    ## Trial 0 · fc · complete
    """
    family = config.get("family", "?")
    state = state.lower()
    lines = [f"## Trial {number} · {family} · {state}", ""]
    if recommended:
        lines += ["The family's recommended configuration, enqueued as the study's first trial.", ""]
    if state == "pruned" and outcome.epochs_run is not None:
        lines += [f"Pruned after epoch {outcome.epochs_run}: its validation {metric} fell behind the other trials.", ""]
    lines += _outcome_table(metric, outcome)
    if outcome.layer is not None:
        lines += ["", f"Layer picked on validation: **{int(outcome.layer)}**."]
    tuned = set(tuned)
    lines += ["", "### Configuration", ""]
    lines += _table(
        ["field", "value", "tuned"],
        [[key, value, "✓" if key in tuned else ""] for key, value in config.items() if key != "family"],
    )
    return "\n".join(lines) + "\n"


def _outcome_table(metric: str, outcome: TrialOutcome) -> list[str]:
    best = _score(outcome.val_metric)
    if outcome.val_metric is not None and outcome.best_epoch is not None:
        best += f" (epoch {outcome.best_epoch})"
    params = "-" if outcome.num_trainable_params is None else f"{int(outcome.num_trainable_params):,}"
    return _table(
        [f"validation {metric}", "trainable parameters", "epochs", "seconds"],
        [
            [
                best,
                params,
                "-" if outcome.epochs_run is None else str(int(outcome.epochs_run)),
                "-" if outcome.seconds is None else f"{float(outcome.seconds):.2f}",
            ]
        ],
    )


@dataclass(frozen=True)
class TrialCounts:
    """A study's trials as its note states them: how many ended in each state, and the best one."""

    complete: int = 0
    pruned: int = 0
    failed: int = 0
    best_trial: int | None = None
    best_value: float | None = None


def _metric(record: StudyRecord) -> str:
    return (record.data.metric if record.data is not None else None) or "value"


def _protocol_words(record: StudyRecord) -> str:
    """How the final scores were measured, as the end of a sentence."""
    identity = record.identity
    if identity is None or identity.protocol != "paper":
        return " by its own head (matched protocol)"
    return (
        " under the paper protocol: its vectors read out as MTEB does (logistic regression on "
        f"{identity.samples_per_label} examples per label, mean over 10 draws; cosine Spearman for "
        "similarity; last, best and mean layers untrained)"
    )


def _identity_lines(record: StudyRecord) -> list[str]:
    """The title and the facts of the study: model, task, examples, settings, version."""
    identity, data = record.identity, record.data
    named = [] if identity is None else [identity.model, identity.task, identity.encoder]
    title = " · ".join(str(value) for value in named if value) or record.name
    lines = [f"## {title}", "", f"Study `{record.name}`."]
    facts = []
    if identity is not None and identity.model:
        width = ""
        if data is not None and data.num_layers and data.hidden_size:
            width = f" ({data.num_layers} hidden states × {data.hidden_size})"
        facts.append(f"- model `{identity.model}`{width}")
    if identity is not None and identity.task:
        kind = f"{(data.task_kind if data is not None else None) or '?'}, metric {_metric(record)}"
        if data is not None and data.num_classes:
            kind += f", {data.num_classes} classes"
        facts.append(f"- task `{identity.task}` ({kind})")
    sizes = {} if data is None else data.split_sizes
    if sizes:
        facts.append("- examples: " + ", ".join(f"{name} {count}" for name, count in sizes.items()))
    settings = {} if identity is None else identity.data_setting()
    limits = [
        f"{key.replace('_', ' ')} {settings[key]}"
        for key in ("shots", "max_train", "max_eval", "max_epochs")
        if settings.get(key) is not None
    ]
    if limits:
        facts.append("- settings: " + ", ".join(limits))
    if data is not None and data.ilge_search_version:
        facts.append(f"- ilge-search {data.ilge_search_version}")
    return lines + (["", *facts] if facts else [])


def _seed_lines(record: StudyRecord, final: FinalRecord) -> list[str]:
    """The final test score as mean +- std, then one row per seed (the seed whose weights were kept marked)."""
    metric, scores = _metric(record), list(final.test_scores)
    lines = [
        f"**{_score(final.test_mean)} ± {_score(final.test_std)}** over {len(scores)} "
        f"seed{'s' if len(scores) != 1 else ''}: trial {final.trial}'s configuration retrained per seed on train, "
        "each model evaluated on test once" + _protocol_words(record) + ".",
        "",
    ]
    seeds: list[int | None] = list(final.seeds) if final.seeds else [None] * len(scores)
    val_scores: list[float | None] = list(final.val_scores) if final.val_scores else [None] * len(scores)
    rows = [
        [
            str(seed) if seed is not None else str(i),
            _score(val),
            _score(test),
            "✓" if seed is not None and seed == final.artifact_seed else "",
        ]
        for i, (seed, val, test) in enumerate(zip(seeds, val_scores, scores, strict=False))
    ]
    return lines + _table(["seed", f"validation {metric}", f"test {metric}", "weights"], rows)


def _front_lines(final: FinalRecord, metric: str) -> list[str]:
    if not final.front:
        return []
    size = final.front_size if final.front_size is not None else len(final.front)
    lines = ["", f"### Final front ({len(final.front)} of {size} Pareto-front trials retrained)", ""]
    return lines + _table(
        ["trial", "params", "latency ms/1k", f"validation {metric}", f"test {metric} (mean ± std)"],
        [
            [
                str(member.trial),
                _cell(member.params),
                _score(member.latency_ms),
                _score(member.val_score),
                f"{_score(member.test_mean)} ± {_score(member.test_std)}",
            ]
            for member in final.front
        ],
    )


def _zero_shot_lines(final: FinalRecord) -> list[str]:
    if not final.zero_shot:
        return []
    lines = ["", "Zero-shot Spearman of the same models on other similarity tasks:", ""]
    return lines + _table(
        ["task", "mean ± std", "per seed"],
        [
            [name, f"{_score(v.mean)} ± {_score(v.std)}", ", ".join(_score(s) for s in v.scores)]
            for name, v in final.zero_shot.items()
        ],
    )


def _artifact_lines(final: FinalRecord, study_id: int | None) -> list[str]:
    if not final.artifacts:
        return []
    lines = ["", "### Artifacts", ""]
    described = {
        "weights": "weights of the best seed by validation (safetensors)",
        "config": "config, label names and provenance (JSON)",
    }
    for name, artifact_id in final.artifacts.items():
        label = described.get(name, name)
        if study_id is not None:
            lines.append(f"- [{name}](/artifacts/{study_id}/{artifact_id}): {label}")
        else:
            lines.append(f"- {name} (`{artifact_id}`): {label}")
    return lines


def study_note_markdown(
    record: StudyRecord,
    counts: TrialCounts | None = None,
    *,
    study_id: int | None = None,
    ensemble: EnsembleRecord | None = None,
    warm: WarmStartRecord | None = None,
    stage_lines: Sequence[str] = (),
) -> str:
    """The Markdown note of a study, from its record.

    Shows the identity (model, task, encoder, data), the trial ``counts`` (none
    given: no trial), the best trial, and -- once the final evaluation ran -- the
    test score as mean +- std with one row per seed, plus links to the uploaded
    artifacts (``study_id`` is needed for the links; the dashboard serves
    ``/artifacts/<study_id>/<id>``); the ``ensemble`` evaluation, when there is one, and the study stages'
    ``stage_lines`` (:meth:`~.stages.Stage.note_lines`); and for a warm-started study, which portfolio members
    it enqueued and what they were chosen from (``warm``).
    """
    counts = counts or TrialCounts()
    metric = _metric(record)
    lines = _identity_lines(record)
    if warm is not None:
        lines += ["", f"Warm start: {warm.describe()}."]
    lines += ["", f"Trials: {counts.complete} complete, {counts.pruned} pruned, {counts.failed} failed."]
    if counts.best_trial is not None:
        lines.append(f"Best validation {metric}: **{_score(counts.best_value)}** (trial {counts.best_trial}).")
    lines += ["", f"### Final test {metric}", ""]
    final = record.final
    if final is None or not final.test_scores:
        lines.append("No final evaluation yet: it runs after the search when `--final-seeds` is above 0.")
        return "\n".join(lines) + "\n"
    lines += _seed_lines(record, final)
    lines += _front_lines(final, metric)
    lines += _zero_shot_lines(final)
    lines += _artifact_lines(final, study_id)
    lines += ensemble_note_lines(ensemble, metric)
    lines += stage_lines
    return "\n".join(lines) + "\n"


def ensemble_note_lines(ensemble: EnsembleRecord | None, metric: str) -> list[str]:
    """The ensemble evaluation: each size's test score beside the selected trial's, with the same seeds."""
    if ensemble is None:
        return []

    def mean(scores: list[float] | None) -> str:
        return "-" if not scores else f"{sum(scores) / len(scores):.4f}"

    lines = [
        "",
        f"### Ensembles (test {metric}, seeds {', '.join(map(str, ensemble.seeds))})",
        "",
        f"Greedy forward selection with replacement on the trials' validation predictions; {ensemble.mix}.",
        "",
        "| ensemble | trials (x picks) | validation | test mean +- std | gap |",
        "|---|---|---|---|---|",
    ]
    for size in sorted(ensemble.sizes.values(), key=lambda s: s.size):
        members = ", ".join(f"{n} x{c}" for n, c in size.members.items())
        gap = "-" if size.val_test_gap is None else f"{size.val_test_gap:+.4f}"
        lines.append(
            f"| K = {size.size} | {members} | {size.val_score:.4f} | {size.test_mean:.4f} +- {size.test_std:.4f} "
            f"| {gap} |"
        )
    lines += [
        "",
        f"Selected trial {ensemble.selected_trial} ({ensemble.select}): {mean(ensemble.selected_test_scores)}; "
        f"starting configuration: {mean(ensemble.start_test_scores)}; "
        f"best single layer: {mean(ensemble.best_layer_test_scores)}.",
    ]
    return lines


# ----------------------------------------------------------------------------- writing notes


def _note_target(study: optuna.Study, trial: optuna.Trial | FrozenTrial) -> optuna.Trial | types.SimpleNamespace:
    """What ``optuna_dashboard.save_note`` accepts for ``trial``: a live ``Trial`` as it is, a ``FrozenTrial`` as
    a stand-in with the attributes it reads (a live ``Trial`` for a finished one would consult the sampler)."""

    if isinstance(trial, optuna.Trial):
        return trial
    return types.SimpleNamespace(storage=study._storage, study=study, _trial_id=trial._trial_id)


def write_trial_note(
    study: optuna.Study, trial: optuna.Trial | FrozenTrial, *, state: str | None = None, metric: str | None = None
) -> str:
    """Save (and return) the Markdown note of ``trial`` in ``study``'s storage.

    ``trial`` is a live ``optuna.Trial`` (inside an objective, before it
    returns; give ``state="pruned"`` when it is about to be pruned) or a
    ``FrozenTrial``. Everything shown comes from the trial's record;
    ``metric`` defaults to the study's.
    """
    from optuna_dashboard import save_note  # heavy: the dashboard only when served

    record = trial_record(trial)
    if state is None:
        frozen_state = getattr(trial, "state", None)
        state = frozen_state.name.lower() if frozen_state is not None else "complete"
    if metric is None:
        metric = _metric(study_record(study))
    body = trial_note_markdown(
        trial.number,
        record.config or dict(trial.params),
        metric=metric,
        state=state,
        outcome=TrialOutcome(
            record.val_metric, record.params, record.epochs_run, record.best_epoch, record.seconds, record.layer
        ),
        tuned=trial.params.keys(),
        recommended=record.recommended,
    )
    save_note(_note_target(study, trial), body)
    return body


def write_live_note(trial: optuna.Trial, metric: str, state: str = "complete") -> None:
    """Write a running trial's note as it finishes, so it shows while the search runs.

    Every trial calls this as it ends (in every worker process);
    :func:`write_notes` at the end of a run fills in any that are
    missing. A note is for reading: a failure to write it is logged as a
    warning and never fails the trained trial.
    """
    try:
        write_trial_note(trial.study, trial, state=state, metric=metric)
    except Exception as exc:
        logger.warning("trial %d: could not write its dashboard note: %s", trial.number, exc)


def write_study_note(study: optuna.Study) -> str:
    """Save (and return) the study's Markdown note: identity, best trial, final test scores."""
    from optuna_dashboard import save_note  # heavy: the dashboard only when served

    from .stages.registry import registered_stages  # cycle: the built-in stages use this module

    result = study_result(study)
    counts = TrialCounts(result.n_complete, result.n_pruned, result.n_failed, result.best_trial, result.best_value)

    record = study_record(study)
    metric = _metric(record)
    body = study_note_markdown(
        record,
        counts,
        study_id=study._study_id,
        warm=warm_start_record(study),
        stage_lines=[line for stage in registered_stages() for line in stage.note_lines(study, metric)],
    )
    save_note(study, body)
    return body


def _note_version_key(trial_id: int) -> str:
    """The study system attr in which optuna-dashboard 0.21 counts a trial's note versions (its private
    ``_note.note_ver_key``): it has no public "has a note" call, and ``get_note`` per trial reads every attr."""
    return f"dashboard:{trial_id}:note_ver"


def _has_note(system_attrs: Mapping[str, object], trial_id: int) -> bool:
    return _note_version_key(trial_id) in system_attrs


def write_notes(study: optuna.Study, *, overwrite: bool = False) -> int:
    """Give every ended trial (complete, pruned or failed) without a note its note, then (re)write the
    study note.

    ``overwrite=True`` rewrites every ended trial's note. Returns the number
    of trial notes written. Safe to run while workers add trials.
    """

    ended = tuple(TrialState[name] for name in ENDED_STATES)
    system_attrs = study._storage.get_study_system_attrs(study._study_id)
    metric = _metric(study_record(study))
    written = 0
    for trial in study.get_trials(deepcopy=False, states=ended):
        if overwrite or not _has_note(system_attrs, trial._trial_id):
            write_trial_note(study, trial, metric=metric)
            written += 1
    write_study_note(study)
    return written
