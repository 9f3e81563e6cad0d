"""Reading a study storage into one :class:`StudyRecord` per ilge-search study.

A study is reported when its user attrs name its ``model``, ``task`` and
``encoder`` (one of :data:`METHODS`). Its row is its task, with the shots of a
few-shot study and, under the paper protocol, :data:`PAPER_SUFFIX`
(``trec [paper protocol]``): scores of the two protocols are never in one row.
When several studies share a model, row and encoder (e.g. different
``max_train``), the one with final scores, the most seeds, then the most
finished trials is used; the others are returned as duplicates, which the
report lists as not shown. A multi-objective study
(:mod:`ilge_search.objectives`) gives way to a single-objective study of the
same cell (the tables compare scores searched for alone); its Pareto front is
shown in the report's own section either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ..objectives import best_score_trial, score_of, study_objectives
from ..protocol import protocol_of
from ..storage import Storage, open_storage
from ..study.final import LEGACY_SELECT

__all__ = [
    "METHODS",
    "METHOD_LABELS",
    "PAPER_SUFFIX",
    "StudyRecord",
    "score_unit",
    "open_report_storage",
    "collect_records",
    "row_label",
]

METHODS: Tuple[str, ...] = (
    "last-layer",
    "best-layer",
    "mean-layers",
    "scalar-mix",
    "mlp-last",
    "deepset",
    "fc",
    "cayley",
)
METHOD_LABELS: Dict[str, str] = {
    "last-layer": "Last layer",
    "best-layer": "Best layer",
    "mean-layers": "Mean layers",
    "scalar-mix": "Scalar mix",
    "mlp-last": "MLP (last)",
    "deepset": "DeepSet",
    "fc": "FC",
    "cayley": "Cayley",
}
PAPER_SUFFIX = " [paper protocol]"  # ends the row label of every paper-protocol score
_PERCENT_METRICS = {
    "accuracy": "acc. %",
    "spearman": "Spearman ×100",
    "pearson": "Pearson ×100",
    "f1": "F1 %",
    "macro_f1": "macro-F1 %",
}


@dataclass
class StudyRecord:
    """One ilge-search study as the report needs it."""

    name: str
    model: str
    task: str  # row label: the task name, plus the shots of a few-shot study
    base_task: str
    encoder: str
    metric: str
    maximize: bool
    attrs: Dict[str, Any]
    trials: Any  # trials_dataframe()
    study: Any
    n_complete: int
    n_pruned: int
    n_failed: int
    best_value: Optional[float]
    best_number: Optional[int]
    test_mean: Optional[float]
    test_std: Optional[float]
    test_scores: List[float]
    layer_scores: List[float]
    chosen_layer: Optional[int]
    # the selection (None/empty for studies evaluated before selection rules): the rule, the
    # selected trial's objective minus its test mean, its test mean minus the starting configuration's
    select: Optional[str] = None
    final_trial: Optional[int] = None
    val_test_gap: Optional[float] = None
    search_gain: Optional[float] = None
    start_test_mean: Optional[float] = None
    by_rule: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    cv: Optional[int] = None
    trial_seconds: Optional[float] = None  # mean wall time of a complete trial
    protocol: str = "matched"  # how the final scores were measured (ilge_search.protocol)
    samples_per_label: Optional[int] = None  # the paper protocol's examples per label
    objectives: Tuple[str, ...] = ("score",)

    @property
    def multi_objective(self) -> bool:
        """Whether the study has more than one objective (its Pareto front is drawn)."""
        return len(self.objectives) > 1


def score_unit(metric: str) -> Tuple[float, str]:
    """(scale, unit label) of a metric: accuracy and correlations are shown x 100."""
    if metric in _PERCENT_METRICS:
        return 100.0, _PERCENT_METRICS[metric]
    return 1.0, metric


def open_report_storage(storage_url: str) -> Storage:
    """The storage to read from; an empty URL or a SQLite file that does not exist is an error
    (opening it would silently create an empty database)."""
    if not storage_url:
        raise ValueError("give a storage URL, e.g. sqlite:///studies/offline.db")
    return open_storage(storage_url, must_exist=True)


def row_label(task: str, attrs: Dict[str, Any]) -> str:
    """The report row of a study on ``task`` with these user attrs: the task, its shots, its protocol."""
    shots = attrs.get("shots")
    label = f"{task} ({shots}-shot)" if shots else task
    return label + (PAPER_SUFFIX if protocol_of(attrs) == "paper" else "")


def _finite(value: Any) -> Optional[float]:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _read_study(storage: Storage, summary: Any) -> Tuple[Optional[StudyRecord], Optional[str]]:
    import optuna
    from optuna.trial import TrialState

    attrs = dict(summary.user_attrs)
    name = summary.study_name
    if not all(attrs.get(key) for key in ("model", "task", "encoder")):
        return None, f"{name}: not an ilge-search study (no model/task/encoder user attrs)"
    if attrs["encoder"] not in METHODS:
        return None, f"{name}: unknown method {attrs['encoder']!r}"
    study = optuna.load_study(study_name=name, storage=storage.rdb)
    frame = study.trials_dataframe(attrs=("number", "value", "state", "datetime_start", "params", "user_attrs"))
    # a study that names its objective gets a "value_<name>" column (several objectives: "values_<name>"); the
    # report reads the score as "value"
    names = study.metric_names or []
    multi = len(study.directions) > 1
    frame = frame.rename(
        columns={f"values_{names[0]}" if multi else f"value_{names[0]}": "value"}
        if names
        else {"values_0": "value"}
        if multi
        else {}
    )
    states = frame["state"].tolist() if not frame.empty else []
    count = {state: states.count(state.name) for state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)}
    maximize = study.directions[0] != optuna.study.StudyDirection.MINIMIZE
    best_value = best_number = None
    layer_scores: List[float] = []
    chosen_layer = None
    if count[TrialState.COMPLETE]:
        best = best_score_trial(study)
        best_value, best_number = _finite(score_of(best)), best.number
        layer_scores = [float(s) for s in best.user_attrs.get("layer_scores", [])]
        chosen_layer = best.user_attrs.get("layer")
    scores = [float(s) for s in attrs.get("final_test_scores", []) or []]
    seconds = None
    if count[TrialState.COMPLETE] and "user_attrs_seconds" in frame:
        done = frame.loc[frame["state"] == TrialState.COMPLETE.name, "user_attrs_seconds"].dropna()
        seconds = float(done.mean()) if len(done) else None
    return StudyRecord(
        name=name,
        model=str(attrs["model"]),
        task=row_label(str(attrs["task"]), attrs),
        base_task=str(attrs["task"]),
        encoder=attrs["encoder"],
        metric=str(attrs.get("metric", "")),
        maximize=maximize,
        attrs=attrs,
        trials=frame,
        study=study,
        n_complete=count[TrialState.COMPLETE],
        n_pruned=count[TrialState.PRUNED],
        n_failed=count[TrialState.FAIL],
        best_value=best_value,
        best_number=best_number,
        test_mean=_finite(attrs.get("final_test_mean")),
        test_std=_finite(attrs.get("final_test_std")),
        test_scores=scores,
        layer_scores=layer_scores,
        chosen_layer=chosen_layer,
        select=attrs.get("final_select", LEGACY_SELECT if "final_test_mean" in attrs else None),
        final_trial=attrs.get("final_trial"),
        val_test_gap=_finite(attrs.get("final_val_test_gap")),
        search_gain=_finite(attrs.get("final_search_gain")),
        start_test_mean=_finite(attrs.get("final_start_test_mean")),
        by_rule=dict(attrs.get("final_by_rule") or {}),
        cv=attrs.get("cv"),
        trial_seconds=seconds,
        objectives=study_objectives(attrs),
        protocol=protocol_of(attrs),
        samples_per_label=attrs.get("samples_per_label"),
    ), None


def collect_records(storage_url: str) -> Tuple[List[StudyRecord], List[StudyRecord], List[str]]:
    """(records used, duplicates not shown, reasons for the studies skipped) of a storage."""
    import optuna

    storage = open_report_storage(storage_url)
    records: List[StudyRecord] = []
    skipped: List[str] = []
    for summary in optuna.get_all_study_summaries(storage.rdb, include_best_trial=False):
        record, reason = _read_study(storage, summary)
        if record is None:
            skipped.append(reason)
        else:
            records.append(record)
    chosen: Dict[Tuple[str, str, str], StudyRecord] = {}
    duplicates: List[StudyRecord] = []

    def preference(r: StudyRecord) -> Tuple:
        return (not r.multi_objective, r.test_mean is not None, len(r.test_scores), r.n_complete + r.n_pruned, r.name)

    for record in sorted(records, key=preference, reverse=True):
        key = (record.model, record.task, record.encoder)
        if key in chosen:
            duplicates.append(record)
        else:
            chosen[key] = record
    return list(chosen.values()), duplicates, skipped
