"""Reading studies back: one :class:`StudyResult` per study, a listing of a storage, text tables."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Union

from ..storage import Storage, hide_password, open_storage

__all__ = ["StudyResult", "study_result", "list_studies", "format_results", "summary_line"]


@dataclass
class StudyResult:
    """One study's outcome, read back from the storage.

    ``test_mean``/``test_std``/``test_scores`` are the final test scores over
    the final seeds (``None``/empty before a final evaluation ran).
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
    best_value: Optional[float] = None
    best_trial: Optional[int] = None
    best_config: Optional[Dict[str, Any]] = None
    test_mean: Optional[float] = None
    test_std: Optional[float] = None
    test_scores: List[float] = field(default_factory=list)
    artifacts: Dict[str, str] = field(default_factory=dict)

    @property
    def n_finished(self) -> int:
        """Complete plus pruned trials (what ``--n-trials`` counts)."""
        return self.n_complete + self.n_pruned


def study_result(study: Any, storage: Union[str, Storage] = "") -> StudyResult:
    """A :class:`StudyResult` from a loaded ``optuna.Study``; ``storage`` (a URL or a
    :class:`~ilge_search.storage.Storage`) is recorded with its password hidden."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    count = {state: sum(t.state == state for t in trials) for state in TrialState}
    attrs = study.user_attrs
    best = study.best_trial if count[TrialState.COMPLETE] else None
    if isinstance(storage, Storage):
        shown = storage.shown_url
    else:
        shown = hide_password(storage) if storage else ""
    return StudyResult(
        study_name=study.study_name,
        storage=shown,
        model=attrs.get("model", ""),
        task=attrs.get("task", ""),
        encoder=attrs.get("encoder", ""),
        metric=attrs.get("metric", ""),
        n_complete=count[TrialState.COMPLETE],
        n_pruned=count[TrialState.PRUNED],
        n_failed=count[TrialState.FAIL],
        best_value=None if best is None else float(best.value),
        best_trial=None if best is None else best.number,
        best_config=None if best is None else best.user_attrs.get("config"),
        test_mean=attrs.get("final_test_mean"),
        test_std=attrs.get("final_test_std"),
        test_scores=list(attrs.get("final_test_scores", [])),
        artifacts=dict(attrs.get("final_artifacts", {})),
    )


def list_studies(storage: Union[str, Storage, None] = None) -> Any:
    """One row per study in ``storage``: identity, trial counts, best validation
    value and final test mean/std (a ``pandas.DataFrame``, sorted by model, task, encoder).

    Raises:
        StorageError: the storage cannot be opened, or is a SQLite file that does not exist.
    """
    import pandas as pd

    opened = storage if isinstance(storage, Storage) else open_storage(storage, must_exist=True)
    rows = []
    for summary in opened.study_summaries():
        attrs = summary.user_attrs
        best = summary.best_trial
        rows.append({
            "study": summary.study_name,
            "model": attrs.get("model"),
            "task": attrs.get("task"),
            "encoder": attrs.get("encoder"),
            "metric": attrs.get("metric"),
            "trials": summary.n_trials,
            "best_val": None if best is None else best.value,
            "best_trial": None if best is None else best.number,
            "test_mean": attrs.get("final_test_mean"),
            "test_std": attrs.get("final_test_std"),
            "seeds": len(attrs.get("final_test_scores", [])),
        })
    columns = ["study", "model", "task", "encoder", "metric", "trials", "best_val", "best_trial", "test_mean",
               "test_std", "seeds"]
    frame = pd.DataFrame(rows, columns=columns)
    if not frame.empty:
        frame = frame.sort_values(["model", "task", "encoder", "study"], na_position="last").reset_index(drop=True)
    return frame


def format_results(results: Iterable[StudyResult]) -> str:
    """A plain-text table of :class:`StudyResult` rows (what ``run`` and ``sweep`` print)."""
    header = ("study", "trials", "pruned", "failed", "best val", "test mean +- std")
    rows = [header]
    for r in results:
        test = "-" if r.test_mean is None else f"{r.test_mean:.4f} +- {r.test_std:.4f} ({len(r.test_scores)} seeds)"
        best = "-" if r.best_value is None else f"{r.best_value:.4f} ({r.metric})"
        rows.append((r.study_name, str(r.n_complete + r.n_pruned + r.n_failed), str(r.n_pruned), str(r.n_failed),
                     best, test))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows)
    return "\n".join(lines)


def summary_line(result: StudyResult) -> str:
    """One log line: trial counts, best validation value and the final test score."""
    text = (f"{result.study_name}: {result.n_complete} complete, {result.n_pruned} pruned, "
            f"{result.n_failed} failed")
    if result.best_value is not None:
        text += f"; best validation {result.metric} {result.best_value:.4f} (trial {result.best_trial})"
    if result.test_mean is not None:
        text += (f"; test {result.metric} {result.test_mean:.4f} +- {result.test_std:.4f} "
                 f"over {len(result.test_scores)} seeds")
    return text
