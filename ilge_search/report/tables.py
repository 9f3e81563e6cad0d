"""The report's numbers as pandas frames, and the table rows every document format renders.

One function per frame (:func:`results_frame`, :func:`summary_frame`, :func:`selection_frame`) and per
table (:func:`model_tables`, :func:`summary_rows`, :func:`studies_rows`, :func:`selection_rows`,
:func:`selection_summary_rows`), the rows as :class:`~ilge_search.report.document.Cell` lists. Scores are
in score units; output column names (``method``, ...) are the report's file format and stay as they are.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import pandas as pd

from ..embeddings.models import model_num_params
from ..record import Identity
from ..tasks.scores import score_unit
from .data import PAPER_SUFFIX, ReportStudy, collect_records, method_labels, methods
from .document import MISSING, Cell, plural
from .paper_results import published_result

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "DECIMALS",
    "CAYLEY_REFERENCES",
    "cayley_minus",
    "RESULT_COLUMNS",
    "collect_results",
    "full_data",
    "results_frame",
    "model_order",
    "pivot",
    "summary_frame",
    "model_tables",
    "model_protocols",
    "seed_note",
    "summary_rows",
    "studies_rows",
    "fmt",
    "selection_frame",
    "selection_rows",
    "selection_summary_rows",
    "SELECTION_NOTE",
]

DECIMALS = 2
RESULT_COLUMNS = [
    "model",
    "task",
    "method",
    "metric",
    "unit",
    "mean",
    "std",
    "n_seeds",
    "scores",
    "gain",
    "is_best",
    "published",
    "best_val",
    "n_complete",
    "n_pruned",
    "n_failed",
    "study",
    "base_task",
    "shots",
    "maximize",
    "source_task",
    "protocol",
    "samples_per_label",
]


def model_order(models: Iterable[str]) -> list[str]:
    """Models by parameter count (unknown ones last), then by name."""

    def key(model: str) -> tuple[float, str]:
        params = model_num_params(model)
        return (params if params is not None else math.inf, model)

    return sorted(set(models), key=key)


def results_frame(records: Sequence[ReportStudy]) -> pd.DataFrame:
    """The long table: one row per (model, task, encoder), columns :data:`RESULT_COLUMNS`."""

    rows: list[dict[str, object]] = []
    for r in records:
        rows.append(_study_row(r))
        rows.extend(_zero_shot_rows(r))
    frame = pd.DataFrame(rows, columns=RESULT_COLUMNS)
    if frame.empty:
        return frame
    _mark_best_and_gain(frame)
    return _sorted_results(frame)


def _shared_cells(r: ReportStudy) -> dict[str, object]:
    """The cells a study's own row and its zero-shot rows have in common."""
    return {
        "model": r.model,
        "method": r.encoder,
        "gain": math.nan,
        "is_best": False,
        "n_complete": r.n_complete,
        "n_pruned": r.n_pruned,
        "n_failed": r.n_failed,
        "study": r.name,
        "source_task": r.task,
        "protocol": r.protocol,
        "samples_per_label": r.identity.samples_per_label,
    }


def _study_row(r: ReportStudy) -> dict[str, object]:
    """The row of one study's final test scores on its own task."""
    scale, unit = score_unit(r.metric)
    published = None
    if not r.identity.shots and r.protocol == "paper":  # the paper's numbers are paper-protocol scores
        cell = published_result(r.model, r.base_task, r.encoder)
        published = None if cell is None else cell.value
    return {
        **_shared_cells(r),
        "task": r.task,
        "metric": r.metric,
        "unit": unit,
        "mean": math.nan if r.test_mean is None else r.test_mean * scale,
        "std": math.nan if r.test_std is None else r.test_std * scale,
        "n_seeds": len(r.test_scores),
        "scores": json.dumps([round(s * scale, 4) for s in r.test_scores]),
        "published": math.nan if published is None else published,
        "best_val": math.nan if r.best_value is None else r.best_value * scale,
        "base_task": r.base_task,
        "shots": r.identity.shots,
        "maximize": r.maximize,
    }


def _zero_shot_rows(r: ReportStudy) -> list[dict[str, object]]:
    """Similarity encoders evaluated on other STS tasks without training on them (the paper's zero-shot STS)."""
    rows = []
    for name, zero in sorted((r.final.zero_shot if r.final else {}).items()):
        z_scale, z_unit = score_unit("spearman")
        z_scores = [float(v) for v in zero.scores]
        rows.append(
            {
                **_shared_cells(r),
                "task": f"{name} (zero-shot, {_without_protocol(r.task)} encoder)"
                + (PAPER_SUFFIX if r.protocol == "paper" else ""),
                "metric": "spearman",
                "unit": z_unit,
                "mean": float(zero.mean) * z_scale,
                "std": float(zero.std) * z_scale,
                "n_seeds": len(z_scores),
                "scores": json.dumps([round(v * z_scale, 4) for v in z_scores]),
                "published": math.nan,
                "best_val": math.nan,
                "base_task": name,
                "shots": None,
                "maximize": True,
            }
        )
    return rows


def _mark_best_and_gain(frame: pd.DataFrame) -> None:
    """Fill ``is_best`` (best shown mean per model and task) and ``gain`` (over last-layer) in place."""
    for _, group in frame.groupby(["model", "task"], sort=False):
        shown = group["mean"].round(DECIMALS)
        if shown.notna().any():
            target = shown.max() if group["maximize"].iloc[0] else shown.min()
            frame.loc[group.index, "is_best"] = (shown == target).to_numpy()
        last = group.loc[group["method"] == "last-layer", "mean"]
        if len(last) and not math.isnan(last.iloc[0]):
            frame.loc[group.index, "gain"] = group["mean"] - last.iloc[0]


def _sorted_results(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows by model, shots, task and encoder; zero-shot rows follow the task their encoder was trained on."""
    encoder_rank = {m: i for i, m in enumerate(methods())}
    model_rank = {m: i for i, m in enumerate(model_order(frame["model"]))}
    frame = frame.assign(
        _m=frame["model"].map(model_rank),
        _k=frame["method"].map(encoder_rank),
        _z=frame["task"] != frame["source_task"],
        _s=_by_shots(frame["source_task"]),
        _t=_by_shots(frame["task"]),
    )
    order = ["_m", "_s", "_z", "_t", "_k"]
    return frame.sort_values(order).drop(columns=["_m", "_k", "_z", "_s", "_t"]).reset_index(drop=True)


def _by_shots(labels: pd.Series) -> pd.Series:
    """Task labels that sort few-shot rows by their number of shots (8, 16, 32), not as text (16, 32, 8)."""
    return labels.str.replace(r"\((\d+)-shot\)", lambda m: f"({int(m.group(1)):09d}-shot)", regex=True)


def _without_protocol(label: str) -> str:
    return label[: -len(PAPER_SUFFIX)] if label.endswith(PAPER_SUFFIX) else label


def collect_results(storage_url: str) -> pd.DataFrame:
    """The report's long table (one row per model, task and method) without writing anything."""
    records, _, _ = collect_records(storage_url)
    return results_frame(records)


def pivot(frame: pd.DataFrame, model: str, column: str) -> pd.DataFrame:
    """Tasks x :func:`~ilge_search.report.data.methods` of ``column`` for one model (NaN = missing)."""
    part = frame[frame["model"] == model]
    table = part.pivot(index="task", columns="method", values=column)
    return table.reindex(index=list(part["task"].unique()), columns=list(methods())).astype(float)


def full_data(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``frame`` trained on the whole training subset (few-shot rows are points of the curves)."""
    return frame[frame["shots"].isna()]


def summary_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (model, protocol, encoder): tasks with a score, mean score, mean gain, wins and mean rank
    (the protocols are never averaged together; few-shot rows are not tasks of their own)."""

    rows = []
    frame = full_data(frame)
    for model, protocol in _model_protocols(frame):
        part = frame[(frame["model"] == model) & (frame["protocol"] == protocol) & frame["mean"].notna()]
        # ranked at the shown precision, like the bold cells
        signed = part["mean"].round(DECIMALS).where(part["maximize"].astype(bool), -part["mean"].round(DECIMALS))
        ranks = part.assign(shown=signed).groupby("task")["shown"].rank(ascending=False, method="average")
        part = part.assign(rank=ranks)
        for encoder in methods():
            mine = part[part["method"] == encoder]
            if mine.empty:
                continue
            gains = mine["gain"].dropna()
            rows.append(
                {
                    "model": model,
                    "protocol": protocol,
                    "method": encoder,
                    "tasks": len(mine),
                    "mean_score": float(mine["mean"].mean()),
                    "mean_gain": float(gains.mean()) if len(gains) else math.nan,
                    "gain_tasks": len(gains),
                    "wins": int(mine["is_best"].sum()),
                    "mean_rank": float(mine["rank"].mean()),
                }
            )
    return pd.DataFrame(
        rows,
        columns=["model", "protocol", "method", "tasks", "mean_score", "mean_gain", "gain_tasks", "wins", "mean_rank"],
    )


def _model_protocols(frame: pd.DataFrame) -> list[tuple[str, str]]:
    """(model, protocol) pairs of ``frame``: models by size, matched before paper."""
    return [
        (model, protocol)
        for model in model_order(frame["model"])
        for protocol in ("matched", "paper")
        if ((frame["model"] == model) & (frame["protocol"] == protocol)).any()
    ]


def model_protocols(frame: pd.DataFrame, model: str) -> list[str]:
    """The protocols of ``model``'s rows, matched first."""
    return [protocol for m, protocol in _model_protocols(frame) if m == model]


# what Cayley is compared with in the notes: (encoder, how a sentence names it)
CAYLEY_REFERENCES = (("last-layer", "the last layer"), ("best-layer", "the best single layer"))


def cayley_minus(table: pd.DataFrame, other: str) -> pd.Series | None:
    """Cayley's score minus ``other``'s per task of ``table`` (tasks x encoders), over the tasks with both
    (``None``: no such task)."""
    if "cayley" not in table or other not in table:
        return None
    both = table[["cayley", other]].dropna()
    return None if both.empty else both["cayley"] - both[other]


def fmt(value: float | None, signed: bool = False) -> str:
    """``value`` at the shown precision (``signed``: with its sign); :data:`MISSING` for None/NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    return f"{value:+.{DECIMALS}f}" if signed else f"{value:.{DECIMALS}f}"


def _cell_text(row: pd.Series | None) -> str:
    if row is None or math.isnan(row["mean"]):
        return MISSING
    if row["n_seeds"] >= 2:
        return f"{row['mean']:.{DECIMALS}f} ± {row['std']:.{DECIMALS}f}"
    return f"{row['mean']:.{DECIMALS}f}"


def model_tables(
    frame: pd.DataFrame, model: str, protocol: str | None = None
) -> tuple[list[str], list[list[Cell]], list[list[Cell]]]:
    """(header, score rows, gain rows) for one model (and one ``protocol``, default: all), as cells every
    writer renders. The published numbers follow paper-protocol rows only."""
    part = frame[frame["model"] == model]
    if protocol is not None:
        part = part[part["protocol"] == protocol]
    header = ["task", "metric"] + [method_labels()[m] for m in methods()]
    score_rows: list[list[Cell]] = []
    gain_rows: list[list[Cell]] = []
    for task in part["task"].unique():  # the frame's row order
        rows = part[part["task"] == task]
        by_encoder = {row["method"]: row for _, row in rows.iterrows()}
        unit = rows["unit"].iloc[0]
        score_rows.append(
            [Cell(task), Cell(unit)]
            + [
                Cell(_cell_text(by_encoder.get(m)), bold=bool(by_encoder[m]["is_best"]) if m in by_encoder else False)
                for m in methods()
            ]
        )
        published = {}
        # the paper's numbers sit beside paper-protocol scores only, never beside few-shot rows
        if not rows["shots"].notna().any() and (rows["protocol"] == "paper").all():
            for encoder in methods():
                cell = published_result(model, rows["base_task"].iloc[0], encoder)
                if cell is not None:
                    published[encoder] = cell.value
        if published:
            score_rows.append(
                [Cell(f"{task}, published", italic=True), Cell(unit, italic=True)]
                + [Cell(f"{published[m]:.2f}" if m in published else MISSING, italic=True) for m in methods()]
            )
        gain_rows.append(
            [Cell(task)]
            + [Cell(fmt(by_encoder[m]["gain"], signed=True) if m in by_encoder else MISSING) for m in methods()[1:]]
        )
    return header, score_rows, gain_rows


def seed_note(frame: pd.DataFrame, model: str) -> str:
    """How many final seeds the model's cells have."""
    part = frame[(frame["model"] == model) & frame["mean"].notna()]
    if part.empty:
        return "No final test scores stored yet."
    counts = sorted(set(part["n_seeds"]))
    if len(counts) == 1:
        return f"Final seeds: {counts[0]} for every cell."
    most = max(counts)
    fewer = part[part["n_seeds"] < most]
    listed = ", ".join(f"{r.task}/{r.method} ({r.n_seeds})" for r in fewer.itertuples())
    return f"Final seeds: {most} for most cells; fewer for {listed}."


def summary_rows(summary: pd.DataFrame) -> tuple[list[str], list[list[Cell]]]:
    """(header, rows) of the across-models table."""
    header = ["model", "protocol", "method", "tasks", "mean score", "mean gain vs last layer", "wins", "mean rank"]
    rows = []
    for r in summary.itertuples():
        if r.method == "last-layer":
            gain = "(reference)"
        elif math.isnan(r.mean_gain):
            gain = MISSING
        else:
            gain = f"{r.mean_gain:+.{DECIMALS}f} ({plural(r.gain_tasks, 'task')})"
        rows.append(
            [
                Cell(r.model),
                Cell(r.protocol),
                Cell(method_labels()[r.method]),
                Cell(str(r.tasks)),
                Cell(fmt(r.mean_score)),
                Cell(gain),
                Cell(str(r.wins)),
                Cell(f"{r.mean_rank:.2f}"),
            ]
        )
    return header, rows


def _setting(identity: Identity) -> str:
    keys = ("shots", "max_train", "max_eval", "max_epochs", "cv")
    parts = [f"{key}={getattr(identity, key)}" for key in keys if getattr(identity, key)]
    return ", ".join(parts) or "full data"


def studies_rows(records: Sequence[ReportStudy]) -> tuple[list[str], list[list[Cell]]]:
    """(header, rows) of the list of studies: setting, trial counts, best validation value, final seeds, the
    finally evaluated trial and its rule, its validation-to-test gap and the search gain (``—`` when the
    study's final evaluation predates them)."""
    header = [
        "study",
        "setting",
        "protocol",
        "complete",
        "pruned",
        "failed",
        "best val (trial)",
        "final seeds",
        "final trial (rule)",
        "val − test",
        "search gain",
    ]
    rows = []
    for r in sorted(records, key=lambda r: r.name):
        scale = score_unit(r.metric)[0]
        best = MISSING if r.best_value is None else f"{r.best_value * scale:.{DECIMALS}f} ({r.best_number})"
        final = MISSING if r.final_trial is None else f"{r.final_trial} ({r.stored.select})"
        rows.append(
            [
                Cell(r.name),
                Cell(_setting(r.identity)),
                Cell(_protocol_text(r)),
                Cell(str(r.n_complete)),
                Cell(str(r.n_pruned)),
                Cell(str(r.n_failed)),
                Cell(best),
                Cell(str(len(r.test_scores))),
                Cell(final),
                Cell(fmt(_nan(r.val_test_gap, scale), signed=True)),
                Cell(fmt(_nan(r.search_gain, scale), signed=True)),
            ]
        )
    return header, rows


def _protocol_text(record: ReportStudy) -> str:
    if record.protocol == "paper" and record.metric != "spearman":
        return f"paper ({record.identity.samples_per_label} per label)"
    return record.protocol


# ----------------------------------------------------------------------------- selection rules compared

SELECTION_COLUMNS = [
    "model",
    "task",
    "encoder",
    "max_train",
    "cv",
    "unit",
    "rule",
    "trial",
    "test_mean",
    "test_std",
    "n_seeds",
    "start_mean",
    "search_gain",
    "val_test_gap",
    "trial_seconds",
    "n_trials",
    "study",
]
SELECTION_NOTE = (
    "Each study is evaluated under both rules on the same trials: *best* retrains the trial with the best "
    "objective, *one-se* the one with the fewest trainable parameters among those within one standard error "
    "of the best (the starting configuration wins ties). *start* is the recommended starting configuration "
    "(trial 0) retrained with the same seeds: what no search gives. Search gain = test score of the retrained "
    "trial minus start (negative: the search did worse than no search); val − test = the trial's objective "
    "(validation score, or its mean over folds with cv) minus its test score. s/trial: mean wall time of a "
    "complete trial, on a shared CPU."
)


def selection_frame(records: Sequence[ReportStudy]) -> pd.DataFrame:
    """One row per (study, rule) of every study evaluated under more than one selection rule
    (``final_by_rule``), in score units (columns :data:`SELECTION_COLUMNS`). A study evaluated under one rule
    only compares nothing, so it is left out (the list of studies shows its rule)."""

    rows = []
    for r in records:
        if len(r.by_rule) < 2:
            continue
        scale, unit = score_unit(r.metric)
        for rule, kept in sorted(r.by_rule.items()):
            scores = [float(v) for v in kept.test_scores]
            rows.append(
                {
                    "model": r.model,
                    "task": r.task,
                    "encoder": r.encoder,
                    "max_train": r.identity.max_train,
                    "cv": r.identity.cv or 0,
                    "unit": unit,
                    "rule": rule,
                    "trial": kept.trial,
                    "test_mean": _nan(kept.test_mean, scale),
                    "test_std": _nan(kept.test_std, scale),
                    "n_seeds": len(scores),
                    "start_mean": _nan(kept.start_test_mean, scale),
                    "search_gain": _nan(kept.search_gain, scale),
                    "val_test_gap": _nan(kept.val_test_gap, scale),
                    "trial_seconds": math.nan if r.trial_seconds is None else r.trial_seconds,
                    "n_trials": r.n_complete + r.n_pruned,
                    "study": r.name,
                }
            )
    frame = pd.DataFrame(rows, columns=SELECTION_COLUMNS)
    if frame.empty:
        return frame
    model_rank = {m: i for i, m in enumerate(model_order(frame["model"]))}
    frame = frame.assign(_m=frame["model"].map(model_rank), _t=frame["max_train"].fillna(0))
    return frame.sort_values(["_m", "_t", "task", "cv", "rule"]).drop(columns=["_m", "_t"]).reset_index(drop=True)


def _nan(value: float | None, scale: float) -> float:
    return math.nan if value is None else float(value) * scale


def _mean_std(mean: float, std: float) -> str:
    return MISSING if math.isnan(mean) else f"{mean:.{DECIMALS}f} ± {std:.{DECIMALS}f}"


def selection_rows(frame: pd.DataFrame) -> tuple[list[str], list[list[Cell]]]:
    """(header, rows) of :func:`selection_frame`: one row per study, both rules side by side; the better test
    mean of the two in bold. An encoder column when the studies are of more than one encoder."""
    several = frame["encoder"].nunique() > 1
    header = (
        ["model", "task"]
        + (["encoder"] if several else [])
        + [
            "train",
            "cv",
            "unit",
            "start",
            "best (trial)",
            "one-se (trial)",
            "gain best",
            "gain one-se",
            "val − test best",
            "val − test one-se",
            "s/trial",
        ]
    )
    rows: list[list[Cell]] = []
    for _, group in frame.groupby("study", sort=False):
        by_rule = {row["rule"]: row for _, row in group.iterrows()}
        first = group.iloc[0]
        means = {rule: row["test_mean"] for rule, row in by_rule.items() if not math.isnan(row["test_mean"])}
        top = round(max(means.values()), DECIMALS) if means else None
        max_train, cv = first["max_train"], first["cv"]
        train = MISSING if max_train is None or max_train != max_train else str(int(max_train))  # NaN != NaN
        rows.append(
            [Cell(first["model"]), Cell(first["task"])]
            + ([Cell(method_labels().get(first["encoder"], first["encoder"]))] if several else [])
            + [
                Cell(train),
                Cell(str(int(cv)) if cv else "no"),
                Cell(first["unit"]),
                Cell(fmt(first["start_mean"])),
                _test_cell(by_rule.get("best"), top),
                _test_cell(by_rule.get("one-se"), top),
                _signed_cell(by_rule.get("best"), "search_gain"),
                _signed_cell(by_rule.get("one-se"), "search_gain"),
                _signed_cell(by_rule.get("best"), "val_test_gap"),
                _signed_cell(by_rule.get("one-se"), "val_test_gap"),
                Cell(MISSING if math.isnan(first["trial_seconds"]) else f"{first['trial_seconds']:.1f}"),
            ]
        )
    return header, rows


def _test_cell(row: pd.Series | None, top: float | None) -> Cell:
    if row is None:
        return Cell(MISSING)
    text = f"{_mean_std(row['test_mean'], row['test_std'])} ({row['trial']})"
    return Cell(text, bold=top is not None and round(row["test_mean"], DECIMALS) == top)


def _signed_cell(row: pd.Series | None, column: str) -> Cell:
    return Cell(MISSING if row is None else fmt(row[column], signed=True))


def selection_summary_rows(frame: pd.DataFrame) -> tuple[list[str], list[list[Cell]]]:
    """(header, rows): per (training size, cv, rule), over the studies of :func:`selection_frame` evaluated
    under every rule (so both rules are averaged over the same studies): studies, mean test score, mean search
    gain, how many gains are negative, mean validation-to-test gap, mean seconds per trial."""
    header = [
        "train",
        "cv",
        "rule",
        "studies",
        "mean test",
        "mean search gain",
        "negative gains",
        "mean val − test",
        "mean s/trial",
    ]
    rows: list[list[Cell]] = []
    scored = frame[frame["test_mean"].notna()]
    paired = scored.groupby("study")["rule"].transform("nunique") == scored["rule"].nunique()
    scored = scored.assign(train=scored["max_train"].fillna(0).astype(int))  # 0: the whole training split
    for (train, cv, rule), group in scored[paired].groupby(["train", "cv", "rule"], sort=True):
        done = group[group["test_mean"].notna()]
        gains = done["search_gain"].dropna()
        seconds = group["trial_seconds"].dropna()
        rows.append(
            [
                Cell(str(train) if train else "all"),
                Cell(str(int(cv)) if cv else "no"),
                Cell(rule),
                Cell(str(len(done))),
                Cell(fmt(float(done["test_mean"].mean()) if len(done) else None)),
                Cell(fmt(float(gains.mean()) if len(gains) else None, signed=True)),
                Cell(f"{int((gains < 0).sum())} of {len(gains)}"),
                Cell(fmt(float(done["val_test_gap"].mean()) if len(done) else None, signed=True)),
                Cell(f"{seconds.mean():.1f}" if len(seconds) else MISSING),
            ]
        )
    return header, rows
