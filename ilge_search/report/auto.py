"""The auto measurement: per problem, the model an auto study chose (its export) against the best single-layer
probe, paired over the same test texts and seeds (from its leaderboard), and against the per-method studies
of the same model, task and data setting in other storages: the last layer, Cayley and its ensemble, and the
best per-method study. :func:`write_auto_page` (``reports/auto.sh``) writes ``OUT_STEM.md``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..study.statistics import Interval, compare_problems
from .document import Cell, Document
from .tables import fmt

if TYPE_CHECKING:
    import optuna
    import pandas as pd

__all__ = ["AUTO_COLUMNS", "auto_frame", "auto_sentences", "write_auto_page"]

AUTO_COLUMNS = (
    "model",
    "task",
    "setting",
    "chosen",
    "auto",
    "best_layer",
    "vs_best_layer",
    "ci_low",
    "ci_high",
    "verdict",
    "last_layer",
    "cayley",
    "cayley_ensemble",
    "best_study",
    "best_study_encoder",
    "trials",
)


def _references(urls: Sequence[str]) -> dict[str, dict[str, float]]:
    """Per-method studies by name (``model:task:encoder:setting``) -> test mean and ensemble test mean."""
    from ..study.results import list_studies

    out: dict[str, dict[str, float]] = {}
    for url in urls:
        listing = list_studies(url)
        for row in listing.itertuples():
            known = out.setdefault(str(row.study), {"test": math.nan, "ensemble": math.nan})
            for key, value in (("test", row.test_mean), ("ensemble", getattr(row, "ensemble_test_mean", None))):
                if math.isnan(known[key]) and value is not None and not math.isnan(float(value)):
                    known[key] = float(value)
    return out


def _auto_row(study: optuna.Study, references: dict[str, dict[str, float]]) -> dict[str, object] | None:
    """One auto study's row (``None``: it has no leaderboard yet)."""
    from ..record import leaderboard_record, study_record
    from ..study.auto import is_auto
    from ..study.identity import identity_name
    from ..study.leaderboard import export_choice
    from ..tasks.scores import score_unit

    record = study_record(study)
    identity, board = record.identity, leaderboard_record(study)
    choice = export_choice(study)
    if identity is None or not is_auto(identity.encoder) or board is None or choice is None:
        return None
    chosen = board.row("ensemble" if choice[0] else "selected")
    reference = board.row("best single layer") or next(r for r in board.rows if r.kind == "reference")
    if chosen is None:
        return None
    scale = score_unit(board.metric)[0]

    def method(encoder: str, key: str = "test") -> float:
        # the per-method study of the same problem and data setting, by the name a run gives it
        name = identity_name(dataclasses.replace(identity, encoder=encoder, methods=None))
        return references.get(name, {}).get(key, math.nan) * scale

    methods = {m: method(m) for m in ("last-layer", "best-layer", "mean-layers", "scalar-mix", "mlp-last")}
    methods.update({m: method(m) for m in ("cayley", "fc", "deepset")})
    known = {m: v for m, v in methods.items() if not math.isnan(v)}
    best = max(known, key=known.__getitem__) if known else ""
    low, high = (math.nan, math.nan) if chosen.difference is None else chosen.difference[1:]
    return {
        "model": identity.model,
        "task": identity.task,
        "setting": f"train{identity.max_train}",
        "chosen": "ensemble" if choice[0] else chosen.name,
        "auto": chosen.test_mean * scale,
        "best_layer": reference.test_mean * scale,
        "vs_best_layer": (chosen.test_mean - reference.test_mean) * scale,
        "ci_low": low * scale,
        "ci_high": high * scale,
        "verdict": chosen.verdict or "tie",
        "last_layer": methods["last-layer"],
        "cayley": methods["cayley"],
        "cayley_ensemble": method("cayley", "ensemble"),
        "best_study": known.get(best, math.nan),
        "best_study_encoder": best,
        "trials": len(study.trials),
    }


def auto_frame(auto_url: str, reference_urls: Sequence[str]) -> pd.DataFrame:
    """One row per auto study of ``auto_url`` with a leaderboard (:data:`AUTO_COLUMNS`, scores in points)."""
    import pandas as pd

    from ..storage import open_storage

    references = _references(reference_urls)
    storage = open_storage(auto_url, must_exist=True)
    rows = []
    for summary in storage.study_summaries():
        row = _auto_row(storage.existing_study(summary.study_name), references)
        if row is not None:
            rows.append(row)
    frame = pd.DataFrame(rows, columns=list(AUTO_COLUMNS))
    return frame.sort_values(["setting", "model", "task"], ignore_index=True)


def _interval_text(interval: Interval) -> str:
    return f"{interval.estimate:+.2f} [{interval.low:+.2f}, {interval.high:+.2f}]"


def auto_sentences(frame: pd.DataFrame) -> list[str]:
    """The measurement's verdicts: auto against the best single layer over the problems, its wins per
    problem, and how far behind the best per-method study it falls at most."""
    if frame.empty:
        return []
    differences = frame["vs_best_layer"].tolist()
    over = compare_problems(differences)
    counts = frame["verdict"].value_counts().to_dict()
    behind = (frame["auto"] - frame["best_study"]).dropna()
    lines = [
        f"Auto minus the best single-layer probe, mean over {len(frame)} problems: "
        f"{_interval_text(over.interval)} points (bootstrap over problems); per problem, paired over test "
        f"texts and seeds: {counts.get('win', 0)} win, {counts.get('tie', 0)} tie, {counts.get('loss', 0)} loss; "
        f"ahead on {int((frame['vs_best_layer'] > 0).sum())} of {len(frame)}.",
    ]
    if not behind.empty:
        worst = behind.idxmin()
        lines.append(
            f"Against the best per-method study of the same problem: {behind.mean():+.2f} points on average, "
            f"at worst {behind.min():+.2f} ({frame.at[worst, 'model']} {frame.at[worst, 'task']}, "
            f"{frame.at[worst, 'best_study_encoder']}); more than 1 point behind on "
            f"{int((behind < -1).sum())} of {len(behind)}."
        )
    return lines


def write_auto_page(auto_url: str, reference_urls: Sequence[str], stem: Path, *, force: bool = False) -> Path:
    """Write ``stem.md``: the measurement table and its sentences, under the output rule."""
    from ..files import check_output_path, write_output_text

    path = check_output_path(stem.parent / f"{stem.name}.md", force=force, option="stem")
    frame = auto_frame(auto_url, reference_urls)
    doc = Document()
    doc.heading(1, "Auto against the single-method studies")
    doc.paragraph(
        f"Auto studies of `{auto_url}` (one search over every method, the model its validation chose), against "
        f"the best single-layer probe retrained on the same seeds (paired bootstrap over test texts and seeds, "
        f"95 %), and the per-method studies of {', '.join(f'`{u}`' for u in reference_urls)} at the same data "
        "setting (test mean over their final seeds; Cayley's ensemble where stored). Points: accuracy % or "
        "Spearman x 100; matched protocol."
    )
    header = [
        "model",
        "task",
        "setting",
        "chosen",
        "auto",
        "best layer",
        "auto - best layer [95% CI]",
        "last layer",
        "cayley",
        "cayley ens.",
        "best study",
    ]
    rows = [
        [
            r.model,
            r.task,
            r.setting,
            r.chosen,
            fmt(r.auto),
            fmt(r.best_layer),
            f"{r.vs_best_layer:+.2f} [{r.ci_low:+.2f}, {r.ci_high:+.2f}] {r.verdict}",
            fmt(r.last_layer),
            fmt(r.cayley),
            fmt(r.cayley_ensemble),
            f"{fmt(r.best_study)} ({r.best_study_encoder})" if r.best_study_encoder else fmt(None),
        ]
        for r in frame.itertuples()
    ]
    doc.table(header, [[Cell(text) for text in row] for row in rows])
    doc.bullets(auto_sentences(frame))
    return write_output_text(path, doc.markdown())
