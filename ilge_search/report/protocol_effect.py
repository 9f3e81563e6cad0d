"""The protocol effect: the same model, task and method scored under the matched and the paper protocol.

The two protocols (``docs/protocols.md``) move the last layer by as much as the gains the paper reports,
so the report puts them side by side per model: the last layer and Cayley under each protocol and their
differences, Cayley's gain over the last layer within each, and the published numbers.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd

from ..study.protocol import MTEB_N_EXPERIMENTS, MTEB_VERSION
from .data import PAPER_SUFFIX
from .document import MISSING, Cell, model_sentence, plural
from .paper_results import published_result
from .tables import DECIMALS, fmt, model_order

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "EFFECT_COLUMNS",
    "PROTOCOL_EFFECT_NOTE",
    "protocol_effect_frame",
    "protocol_effect_rows",
    "protocol_effect_notes",
]

EFFECT_METHODS = ("last-layer", "cayley")
EFFECT_COLUMNS = [
    "model",
    "task",
    "unit",
    "last_matched",
    "last_paper",
    "last_effect",
    "cayley_matched",
    "cayley_paper",
    "cayley_effect",
    "gain_matched",
    "gain_paper",
    "published_last",
    "published_cayley",
    "samples_per_label",
]
PROTOCOL_EFFECT_NOTE = (
    "*Matched*: every method is trained with its own head on the study's training split and scored by that head "
    "on test (the other tables). *Paper*: the published table's protocol, MTEB's evaluators (code of mteb "
    f"{MTEB_VERSION}): each final model's vectors (the last layer raw and untrained) are read out by a logistic "
    f"regression fitted on a few examples per label drawn from the training split, mean accuracy over "
    f"{MTEB_N_EXPERIMENTS} draws; similarity tasks: Spearman correlation of the vectors' cosine. "
    "*paper − matched*: what the protocol alone moves a method. *Cayley − last*: the encoder's gain within one "
    "protocol. Each protocol has its own study (the same search space, seeds and budget), so the configuration "
    "each retrains may differ too. *Published*: the paper's number for the same model, task and method, shown "
    "beside the paper-protocol scores only."
)


def _cell(
    frame: pd.DataFrame, model: str, task: str, method: str, protocol: str
) -> tuple[float, float, pd.Series | None]:
    """(mean, std, row) of one result cell; NaN and ``None`` when missing."""
    label = task + (PAPER_SUFFIX if protocol == "paper" else "")
    rows = frame[(frame["model"] == model) & (frame["task"] == label) & (frame["method"] == method)]
    if rows.empty:
        return math.nan, math.nan, None
    row = rows.iloc[0]
    return float(row["mean"]), float(row["std"]), row


def _effect_row(part: pd.DataFrame, model: str, task: str) -> dict[str, object] | None:
    """The protocol effect of one (model, task); ``None`` unless a method has a score under both protocols."""
    values = {
        (method, protocol): _cell(part, model, task, method, protocol)
        for method in EFFECT_METHODS
        for protocol in ("matched", "paper")
    }
    if not any(
        not math.isnan(values[(m, "matched")][0]) and not math.isnan(values[(m, "paper")][0]) for m in EFFECT_METHODS
    ):
        return None
    first = next(row for _, _, row in values.values() if row is not None)
    shots = first["shots"]
    few_shot = shots is not None and shots == shots and bool(shots)  # NaN != NaN
    published = {}
    for method in EFFECT_METHODS:
        cell = None if few_shot else published_result(model, first["base_task"], method)
        published[method] = math.nan if cell is None else cell.value
    mean = {key: value[0] for key, value in values.items()}
    paper_row = next(
        (row for (_, protocol), (_, _, row) in values.items() if protocol == "paper" and row is not None), None
    )
    return {
        "model": model,
        "task": task,
        "unit": first["unit"],
        "last_matched": mean[("last-layer", "matched")],
        "last_paper": mean[("last-layer", "paper")],
        "last_effect": mean[("last-layer", "paper")] - mean[("last-layer", "matched")],
        "cayley_matched": mean[("cayley", "matched")],
        "cayley_paper": mean[("cayley", "paper")],
        "cayley_effect": mean[("cayley", "paper")] - mean[("cayley", "matched")],
        "gain_matched": mean[("cayley", "matched")] - mean[("last-layer", "matched")],
        "gain_paper": mean[("cayley", "paper")] - mean[("last-layer", "paper")],
        "published_last": published["last-layer"],
        "published_cayley": published["cayley"],
        # similarity is scored by cosine Spearman under the paper protocol: no examples per label
        "samples_per_label": None
        if paper_row is None or paper_row["metric"] == "spearman"
        else paper_row["samples_per_label"],
    }


def protocol_effect_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, task) measured under both protocols (for the last layer or Cayley), columns
    :data:`EFFECT_COLUMNS`, in score units; ``frame`` is :func:`~ilge_search.report.tables.results_frame`'s."""

    rows: list[dict[str, object]] = []
    if frame.empty:
        return pd.DataFrame(rows, columns=EFFECT_COLUMNS)
    for model in model_order(frame["model"]):
        part = frame[frame["model"] == model]
        paper = part[part["protocol"] == "paper"]
        tasks = list(dict.fromkeys(label[: -len(PAPER_SUFFIX)] for label in paper["task"]))
        for task in tasks:
            row = _effect_row(part, model, task)
            if row is not None:
                rows.append(row)
    return pd.DataFrame(rows, columns=EFFECT_COLUMNS)


def protocol_effect_rows(effect: pd.DataFrame, model: str) -> tuple[list[str], list[list[Cell]]]:
    """(header, rows) of one model's protocol effect table."""
    header = [
        "task",
        "unit",
        "last: matched",
        "last: paper",
        "last: paper − matched",
        "Cayley: matched",
        "Cayley: paper",
        "Cayley: paper − matched",
        "Cayley − last: matched",
        "Cayley − last: paper",
        "published last",
        "published Cayley",
    ]
    rows: list[list[Cell]] = []
    for r in effect[effect["model"] == model].itertuples():
        spl = r.samples_per_label
        task = r.task if spl is None or spl != spl else f"{r.task} ({int(spl)} per label)"  # NaN != NaN
        rows.append(
            [
                Cell(task),
                Cell(r.unit),
                Cell(fmt(r.last_matched)),
                Cell(fmt(r.last_paper)),
                Cell(fmt(r.last_effect, signed=True)),
                Cell(fmt(r.cayley_matched)),
                Cell(fmt(r.cayley_paper)),
                Cell(fmt(r.cayley_effect, signed=True)),
                Cell(fmt(r.gain_matched, signed=True)),
                Cell(fmt(r.gain_paper, signed=True)),
                Cell(_published(r.published_last)),
                Cell(_published(r.published_cayley)),
            ]
        )
    return header, rows


def _published(value: float) -> str:
    return MISSING if math.isnan(value) else f"{value:.2f}"


def _mean(values: pd.Series) -> float | None:
    values = values.dropna()
    return float(values.mean()) if len(values) else None


def protocol_effect_notes(effect: pd.DataFrame) -> list[str]:
    """Per model, one sentence: the mean protocol effect on the last layer and on Cayley, and Cayley's mean gain
    under each protocol (over the tasks that have both numbers)."""
    notes = []
    for model in list(dict.fromkeys(effect["model"])):
        part = effect[effect["model"] == model]
        pieces = []
        for column, text in (("last_effect", "moves the last layer by"), ("cayley_effect", "moves Cayley by")):
            value = _mean(part[column])
            if value is not None:
                pieces.append(
                    f"the paper protocol {text} {value:+.{DECIMALS}f} points on average "
                    f"({plural(int(part[column].notna().sum()), 'task')})"
                )
        for column, protocol in (("gain_matched", "matched"), ("gain_paper", "paper")):
            value = _mean(part[column])
            if value is not None:
                behind = int((part[column].dropna().round(DECIMALS) < 0).sum())
                pieces.append(
                    f"Cayley's gain over the last layer is {value:+.{DECIMALS}f} under the {protocol} "
                    f"protocol (behind on {behind} of {plural(int(part[column].notna().sum()), 'task')})"
                )
        notes += model_sentence(model, pieces)
    return notes
