"""Reading a study storage into one :class:`ReportStudy` per ilge-search study.

A study is reported when its record names its model, task and encoder (one of :func:`methods`). Its row is its task,
with the shots of a few-shot study and, under the paper protocol, :data:`PAPER_SUFFIX` (``trec [paper protocol]``): the
two protocols never share a row. When several studies share a model, row and encoder, the one with final scores, the
most seeds, then the most finished trials is used and the others are returned as duplicates; a multi-objective study
gives way to a single-objective one of the same cell. A :class:`ReportStudy` is a study's
:class:`~ilge_search.record.StudyRecord` plus what the report computes from its trials.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import optuna
import pandas as pd
from optuna.trial import TrialState

from ..defaults.problems import open_existing_storage
from ..encoders import report_labels, report_methods, tagger_families
from ..record import FinalRecord, Identity, StudyRecord, TrialRecord, study_record, trial_record
from ..record.fields import finite
from ..study.auto import is_auto
from ..study.objectives import best_score_trial, score_of
from ..study.stages.leaderboard import REPORT_TITLE as AUTO_SECTION

if TYPE_CHECKING:
    import optuna
    import pandas as pd

    from ..storage import Storage

__all__ = ["methods", "method_labels", "PAPER_SUFFIX", "ReportStudy", "collect_records", "row_label"]

PAPER_SUFFIX = " [paper protocol]"  # ends the row label of every paper-protocol score


def methods() -> tuple[str, ...]:
    """The sentence-task families in table order, from the encoder registry."""
    return report_methods("sentence")


def method_labels() -> dict[str, str]:
    """``{family: label}`` of :func:`methods`."""
    return report_labels("sentence")


@dataclass
class ReportStudy:
    """One ilge-search study as the report needs it: its stored record and what its trials say.

    ``task`` is the row label (the task, plus the shots of a few-shot study and the paper protocol's
    suffix); ``trials`` the study's ``trials_dataframe()`` with the score as column ``value``;
    ``trial_records`` every trial's :class:`~ilge_search.record.TrialRecord` by trial number.
    """

    name: str
    model: str
    task: str
    base_task: str
    encoder: str
    metric: str
    maximize: bool
    stored: StudyRecord
    trials: pd.DataFrame
    trial_records: dict[int, TrialRecord]
    study: optuna.Study
    n_complete: int
    n_pruned: int
    n_failed: int
    best_value: float | None
    best_number: int | None
    layer_scores: list[float] = field(default_factory=list)
    chosen_layer: int | None = None
    trial_seconds: float | None = None  # mean wall time of a complete trial

    @property
    def identity(self) -> Identity:
        """What the study searched (a reported study always has one)."""
        if self.stored.identity is None:
            raise ValueError(f"{self.name} is not an ilge-search study")
        return self.stored.identity

    @property
    def final(self) -> FinalRecord | None:
        """The final evaluation under the rule the study was last evaluated with (``None``: none yet)."""
        return self.stored.final

    @property
    def by_rule(self) -> dict[str, FinalRecord]:
        """Every selection rule's final evaluation."""
        return self.stored.by_rule

    @property
    def protocol(self) -> str:
        """How the final scores were measured (:mod:`ilge_search.study.protocol`)."""
        return self.identity.protocol

    @property
    def multi_objective(self) -> bool:
        """Whether the study has more than one objective (its Pareto front is drawn)."""
        return self.identity.multi_objective

    @property
    def test_mean(self) -> float | None:
        return None if self.final is None else finite(self.final.test_mean)

    @property
    def test_std(self) -> float | None:
        return None if self.final is None else finite(self.final.test_std)

    @property
    def test_scores(self) -> list[float]:
        return [] if self.final is None else [float(s) for s in self.final.test_scores]

    @property
    def final_trial(self) -> int | None:
        return None if self.final is None else self.final.trial

    @property
    def val_test_gap(self) -> float | None:
        """The selected trial's objective minus its test mean (``None`` under the paper protocol)."""
        return None if self.final is None else finite(self.final.val_test_gap)

    @property
    def search_gain(self) -> float | None:
        """The selected trial's test mean minus the starting configuration's."""
        return None if self.final is None else finite(self.final.search_gain)


def row_label(identity: Identity) -> str:
    """The report row of a study: its task, its shots, its protocol."""
    label = f"{identity.task} ({identity.shots}-shot)" if identity.shots else str(identity.task)
    return label + (PAPER_SUFFIX if identity.protocol == "paper" else "")


def _trials_frame(study: optuna.Study) -> pd.DataFrame:
    """``trials_dataframe()`` with the score as column ``value``: a study that names its objective gets a
    ``value_<name>`` column (several objectives: ``values_<name>``)."""
    frame = study.trials_dataframe(attrs=("number", "value", "state", "datetime_start", "params"))
    names = study.metric_names or []
    multi = len(study.directions) > 1
    return frame.rename(
        columns={f"values_{names[0]}" if multi else f"value_{names[0]}": "value"}
        if names
        else {"values_0": "value"}
        if multi
        else {}
    )


def _mean_seconds(trials: list[optuna.trial.FrozenTrial], records: dict[int, TrialRecord]) -> float | None:
    """The mean wall time of the complete trials that recorded one."""

    recorded = (records[t.number].seconds for t in trials if t.state == TrialState.COMPLETE)
    seconds = [value for value in recorded if value is not None and not math.isnan(value)]
    return float(pd.Series(seconds, dtype=float).mean()) if seconds else None


def _read_study(storage: Storage, summary: optuna.study.StudySummary) -> tuple[ReportStudy | None, str | None]:

    stored = study_record(summary)
    name = stored.name
    if stored.identity is None:
        return None, f"{name}: not an ilge-search study (no model/task/encoder user attrs)"
    identity = stored.identity
    tagging = stored.data is not None and stored.data.task_kind == "tagging"
    if is_auto(identity.encoder):
        return None, (
            f"{name}: an auto study, not in the tables (its method is chosen per trial); its leaderboard is "
            f"under '{AUTO_SECTION}'"
        )
    if identity.encoder not in methods() and not (tagging and identity.encoder in tagger_families()):
        return None, f"{name}: unknown method {identity.encoder!r}"
    study = optuna.load_study(study_name=name, storage=storage.rdb)
    frame = _trials_frame(study)
    states = frame["state"].tolist() if not frame.empty else []
    count = {state: states.count(state.name) for state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)}
    trials = study.get_trials(deepcopy=False)
    trial_records = {t.number: trial_record(t) for t in trials}
    report = ReportStudy(
        name=name,
        model=str(identity.model),
        task=row_label(identity),
        base_task=str(identity.task),
        encoder=identity.encoder,
        metric=str(stored.data.metric if stored.data and stored.data.metric is not None else ""),
        maximize=study.directions[0] != optuna.study.StudyDirection.MINIMIZE,
        stored=stored,
        trials=frame,
        trial_records=trial_records,
        study=study,
        n_complete=count[TrialState.COMPLETE],
        n_pruned=count[TrialState.PRUNED],
        n_failed=count[TrialState.FAIL],
        best_value=None,
        best_number=None,
    )
    if report.n_complete:
        best = best_score_trial(study)
        report.best_value, report.best_number = finite(score_of(best)), best.number
        report.layer_scores = [float(s) for s in trial_records[best.number].layer_scores]
        report.chosen_layer = trial_records[best.number].layer
        report.trial_seconds = _mean_seconds(trials, trial_records)
    return report, None


def collect_records(storage_url: str) -> tuple[list[ReportStudy], list[ReportStudy], list[str]]:
    """(studies used, duplicates not shown, reasons for the studies skipped) of a storage."""

    storage = open_existing_storage(storage_url)
    records: list[ReportStudy] = []
    skipped: list[str] = []
    for summary in optuna.get_all_study_summaries(storage.rdb, include_best_trial=False):
        record, reason = _read_study(storage, summary)
        if record is None:
            skipped.append(str(reason))
        else:
            records.append(record)
    chosen: dict[tuple[str, str, str], ReportStudy] = {}
    duplicates: list[ReportStudy] = []

    def preference(r: ReportStudy) -> tuple:
        return (not r.multi_objective, r.test_mean is not None, len(r.test_scores), r.n_complete + r.n_pruned, r.name)

    for record in sorted(records, key=preference, reverse=True):
        key = (record.model, record.task, record.encoder)
        if key in chosen:
            duplicates.append(record)
        else:
            chosen[key] = record
    return list(chosen.values()), duplicates, skipped
