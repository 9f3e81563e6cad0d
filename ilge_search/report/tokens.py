"""Tagging studies in the report: their own table, CSV and figure, never mixed into the sequence tables.

Token accuracy is not comparable with a text task's accuracy, so tagging studies stay out of the
per-model tables, means and ranks; here, per model, each (task, data setting, method) shows its final
token accuracy and macro-F1 over the test words, mean ± std over the final seeds.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from ..encoders import report_labels, report_methods
from .data import ReportStudy
from .document import MISSING, Cell
from .figures import figure_style, new_figure, save_figure

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "token_methods",
    "TOKEN_NOTE",
    "is_tagging",
    "split_tagging",
    "tokens_frame",
    "token_rows",
    "draw_token_figures",
]

TOKEN_NOTE = (
    "Tagging studies (one tag per word): final token accuracy and macro-F1 (the unweighted mean of the tags' "
    "F1) on the test split (%), mean ± std over the final seeds, each seed scored once ('—': not recorded, "
    "evaluations stored before macro-F1 was); the row says the training sentences and the validation/test cap. "
    "'Cayley per sentence' passes messages over one Cayley graph per sentence whose nodes are every (word, "
    "layer) pair; 'Cayley per word' is the Cayley graph over each word's own layers (no messages between "
    "words); the other methods read each word alone. Kept out of the sequence tables, means and ranks."
)
TOKEN_COLUMNS = [
    "model",
    "task",
    "setting",
    "method",
    "mean",
    "std",
    "n_seeds",
    "scores",
    "macro_f1",
    "macro_f1_std",
    "best_val",
    "n_complete",
    "n_pruned",
    "word_pooling",
    "trial_seconds",
    "study",
]


def is_tagging(record: ReportStudy) -> bool:
    """Whether ``record`` is a tagging study."""
    return record.stored.data is not None and record.stored.data.task_kind == "tagging"


def split_tagging(records: Sequence[ReportStudy]) -> tuple[list[ReportStudy], list[ReportStudy]]:
    """``(sequence studies, tagging studies)``."""
    return [r for r in records if not is_tagging(r)], [r for r in records if is_tagging(r)]


def _setting(record: ReportStudy) -> str:
    identity = record.identity
    parts = [f"train {identity.max_train}" if identity.max_train else "full train"]
    if identity.max_eval:
        parts.append(f"eval {identity.max_eval}")
    if identity.max_epochs:
        parts.append(f"≤{identity.max_epochs} epochs")
    if identity.word_pooling and identity.word_pooling != "first":
        parts.append(f"{identity.word_pooling} of pieces")
    return ", ".join(parts)


def _macro_f1(record: ReportStudy) -> tuple[float, float]:
    """(mean, std) of the final seeds' test macro-F1 in %; NaN when the evaluation did not record it."""
    scores = None if record.final is None else record.final.test_macro_f1
    if not scores:
        return math.nan, math.nan
    return statistics.fmean(scores) * 100.0, (statistics.stdev(scores) if len(scores) > 1 else 0.0) * 100.0


def tokens_frame(records: Sequence[ReportStudy]) -> pd.DataFrame:
    """One row per tagging study with a final evaluation: token accuracy and macro-F1 in % (columns
    :data:`TOKEN_COLUMNS`)."""

    rows = []
    for r in records:
        if r.test_mean is None:
            continue
        macro_f1, macro_f1_std = _macro_f1(r)
        rows.append(
            {
                "model": r.model,
                "task": r.base_task,
                "setting": _setting(r),
                "method": r.encoder,
                "mean": r.test_mean * 100.0,
                "std": (r.test_std or 0.0) * 100.0,
                "n_seeds": len(r.test_scores),
                "scores": json.dumps([round(s * 100.0, 2) for s in r.test_scores]),
                "macro_f1": macro_f1,
                "macro_f1_std": macro_f1_std,
                "best_val": math.nan if r.best_value is None else r.best_value * 100.0,
                "n_complete": r.n_complete,
                "n_pruned": r.n_pruned,
                "word_pooling": r.identity.word_pooling or "first",
                "trial_seconds": math.nan if r.trial_seconds is None else round(r.trial_seconds, 1),
                "study": r.name,
            }
        )
    return pd.DataFrame(rows, columns=TOKEN_COLUMNS)


def token_methods() -> tuple[str, ...]:
    """Methods in the order of the tables (the per-word encoders, then the per-sentence graphs), from the registry."""
    return report_methods("token")


def _methods(frame: pd.DataFrame) -> list[str]:
    present = set(frame["method"])
    return [m for m in token_methods() if m in present] + sorted(present - set(token_methods()))


def _best(values: pd.Series) -> float:
    """The largest of ``values`` that is a number (NaN when none is)."""
    finite = [float(v) for v in values if not math.isnan(float(v))]
    return max(finite) if finite else math.nan


def token_rows(frame: pd.DataFrame, model: str) -> tuple[list[str], list[list[Cell]]]:
    """``(header, rows)`` of one model's table: a row per (task, setting, method), token accuracy and macro-F1
    in their own columns, the best of each (task, setting) in bold."""
    part = frame[frame["model"] == model]
    order = {method: position for position, method in enumerate(_methods(part))}
    rows = []
    for (task, setting), group in part.groupby(["task", "setting"], sort=True):
        best_accuracy, best_f1 = _best(group["mean"]), _best(group["macro_f1"])
        for _, row in sorted(group.iterrows(), key=lambda item: order[item[1]["method"]]):
            mean, f1 = float(row["mean"]), float(row["macro_f1"])
            accuracy = Cell(f"{mean:.1f} ± {row['std']:.1f} ({row['n_seeds']})", bold=mean == best_accuracy)
            macro = (
                Cell(MISSING)
                if math.isnan(f1)
                else Cell(f"{f1:.1f} ± {float(row['macro_f1_std']):.1f}", bold=f1 == best_f1)
            )
            method = str(row["method"])
            rows.append(
                [Cell(str(task)), Cell(str(setting)), Cell(report_labels("token").get(method, method)), accuracy, macro]
            )
    return ["task", "setting", "method", "token accuracy", "macro-F1"], rows


def draw_token_figures(frame: pd.DataFrame, folder: Path) -> dict[str, Path]:
    """Per model, a bar chart of every method's token accuracy (mean, with the seeds' std): model -> path."""
    paths = {}
    labels = report_labels("token")
    for model in sorted(set(frame["model"])):
        part = frame[frame["model"] == model]
        settings = sorted(set(zip(part["task"], part["setting"], strict=True)))
        methods = _methods(part)
        with figure_style():  # one context per figure: it cannot be entered twice
            figure = new_figure(1.2 + 0.8 * len(methods), 0.6 + 2.2 * len(settings))
            axes = figure.subplots(len(settings), 1, squeeze=False)[:, 0]
            for ax, (task, setting) in zip(axes, settings, strict=True):
                rows = part[(part["task"] == task) & (part["setting"] == setting)].set_index("method")
                shown = [m for m in methods if m in rows.index]
                means = [float(rows.loc[m, "mean"]) for m in shown]
                ax.bar(range(len(shown)), means, yerr=[float(rows.loc[m, "std"]) for m in shown], capsize=3)
                ax.set_xticks(range(len(shown)), [labels.get(m, m) for m in shown], rotation=30, ha="right")
                ax.set_ylim(max(0.0, min(means) - 10.0), min(100.0, max(means) + 5.0))
                ax.set_ylabel("token accuracy (%)")
                ax.set_title(f"{model}: {task}, test\n{setting}", fontsize="medium")  # two lines: fits 4 bars
            path = folder / f"tokens_{_safe(model)}.png"
            save_figure(figure, path)
        paths[model] = path
    return paths


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
