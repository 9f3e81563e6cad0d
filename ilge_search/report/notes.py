"""The report's prose: the introduction, the note on published numbers, the summary note and the closing notes."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

from .._version import __version__
from ..storage import hide_password
from .comparisons import difference_sentence, task_verdict
from .data import PAPER_SUFFIX, method_labels
from .document import MISSING, plural
from .paper_results import load_paper_results, paper_source
from .tables import CAYLEY_REFERENCES, DECIMALS, cayley_minus, full_data, model_order, model_protocols

if TYPE_CHECKING:
    from collections.abc import Mapping

    import pandas as pd

    from ..study.predictions import StoredPredictions

__all__ = ["SUMMARY_NOTE", "intro", "published_note", "no_published_note", "closing_notes"]

SUMMARY_NOTE = (
    "Whole training subsets only: a few-shot row is a point of its curve, not a task. Mean score over the "
    "tasks the method has; mean gain over the tasks with both the method and the last layer; wins: "
    "tasks where it is the best of the row (ties count for each); mean rank among the methods of each "
    "row (1 = best)."
)


def intro(storage_url: str, n_studies: int) -> str:
    """The opening paragraph: when, by which version, from where, and how to read a cell."""
    generated = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"Generated {generated} by ilge-search {__version__} from `{hide_password(storage_url)}` "
        f"({plural(n_studies, 'study', 'studies')}). Cells: final test score, mean ± std over the final seeds "
        "(the selected trial retrained with each seed); accuracy in %, Spearman correlation ×100. "
        f"Bold: best of the row. {MISSING}: no study or no final test score (never filled in). "
        "Each table says its protocol: *matched* (every method trained with its own head on the same "
        f"training data and scored by it) or *paper* (rows marked{PAPER_SUFFIX}: MTEB's few-shot "
        "logistic readout of the vectors, as in the published table); the two are never mixed in a row, "
        "a mean or a gain."
    )


def published_note() -> str:
    """Where the *published* rows come from."""
    source = paper_source()
    return (
        f'Rows marked *published* give the numbers of "{source["paper"]}" (arXiv {source["arxiv"]} '
        f"{source['version']}, {source['table']}), {source['transcription']}. Protocol: {source['protocol']}. "
        "They are shown only beside scores measured under the paper protocol, for the same model and task."
    )


def no_published_note() -> str:
    """Why no published row is shown, and which models and tasks the paper covers."""
    source, cells = paper_source(), load_paper_results()
    models = sorted({cell.model.rsplit("/", 1)[-1] for cell in cells})
    tasks = sorted({cell.task for cell in cells})
    return (
        f"No (model, task, method) measured here under the paper protocol has a published number in "
        f'"{source["paper"]}" (arXiv {source["arxiv"]}), so no published row is shown (published numbers sit '
        "only beside paper-protocol scores of the same model and task); the paper reports "
        f"{', '.join(models)} on {', '.join(tasks)}."
    )


def _cayley_verdicts(
    part: pd.DataFrame, other: str, tasks: list[str], predictions: Mapping[str, StoredPredictions]
) -> tuple[list[str | None], list[str | None]]:
    """Per task: the verdict of Cayley minus ``other`` and which interval gave it (:func:`task_verdict`)."""
    cells = part.set_index(["task", "method"])
    verdicts, kinds = [], []
    for task in tasks:
        cayley, baseline = cells.loc[(task, "cayley")], cells.loc[(task, other)]
        own = task == cayley["source_task"]  # a zero-shot row is scored on another task's test texts
        verdict, kind = task_verdict(
            (cayley["scores"], baseline["scores"]),
            (predictions.get(cayley["study"]), predictions.get(baseline["study"])) if own else (None, None),
            str(cayley["metric"]),
        )
        verdicts.append(verdict)
        kinds.append(kind)
    return verdicts, kinds


def closing_notes(
    frame: pd.DataFrame, summary: pd.DataFrame, predictions: Mapping[str, StoredPredictions] | None = None
) -> list[str]:
    """Per model and protocol: where Cayley stands against the last and the best single layer (per task by the
    paired bootstrap where both studies stored test predictions, in ``predictions`` by study name), and who
    ranks best."""
    notes = []
    frame = full_data(frame)  # as the summary: a few-shot row is a point of a curve, not another task
    for model, protocol in ((m, p) for m in model_order(frame["model"]) for p in model_protocols(frame, m)):
        part = frame[(frame["model"] == model) & (frame["protocol"] == protocol) & frame["mean"].notna()]
        table = part.pivot(index="task", columns="method", values="mean") if not part.empty else None
        parts = []
        for other, label in CAYLEY_REFERENCES:
            diff = None if table is None else cayley_minus(table, other)
            if diff is None:
                parts.append(f"no tasks with both Cayley and {label}")
                continue
            verdicts, kinds = _cayley_verdicts(part, other, list(diff.index), predictions or {})
            parts.append(difference_sentence(label, list(diff), verdicts, DECIMALS, kinds))
        model_summary = summary[(summary["model"] == model) & (summary["protocol"] == protocol)]
        lead = ""
        if not model_summary.empty:
            # only encoders with the widest coverage: a mean rank over fewer tasks is not comparable
            widest = model_summary[model_summary["tasks"] == model_summary["tasks"].max()]
            top = widest.sort_values(["mean_rank", "wins"], ascending=[True, False]).iloc[0]
            lead = (
                f" Among the methods with scores on {plural(int(top['tasks']), 'task')}, "
                f"{method_labels()[top['method']]} has the best mean rank ({top['mean_rank']:.2f}; best of the "
                f"row in {int(top['wins'])})."
            )
        notes.append(f"{model} ({protocol} protocol): " + "; ".join(parts) + "." + lead)
    return notes
