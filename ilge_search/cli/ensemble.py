"""The body of ``ilge-search ensemble``: the ensemble evaluation of an existing study, and its table.

Imported by the command when it runs, not by the group, so that ``--help`` loads neither numpy nor torch.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from ..record import EnsembleRecord, StudyRecord, ensemble_record, study_record
from ..settings import PathLike, Settings
from ..storage import Storage, open_storage
from ..study.notes import write_study_note
from ..study.options import FinalOptions
from ..study.selection import DEFAULT_SELECT
from ..study.stages.ensemble_work import (
    SLOW_MEMBER_FACTOR,
    EnsembleRun,
    check_ensemble_study,
    complete_trials,
    ensemble_evaluation,
    ensemble_is_current,
)
from ..study.stored import load_run_study, load_training_data

__all__ = ["EnsembleRequest", "ensemble_study", "format_ensemble"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnsembleRequest:
    """Which ensembles of which study: the size K asked for (the study's ensemble) and other ``sizes`` to
    score; ``seed`` is the training seed of backfilled validation predictions (the study's ``--seed``);
    ``artifact_dir`` where the storage keeps its artifacts (default: beside a SQLite file)."""

    study_name: str
    size: int
    sizes: tuple[int, ...] = ()
    seed: int = 0
    artifact_dir: PathLike | None = None
    progress: bool = True


def ensemble_study(
    storage: str | Storage | None, request: EnsembleRequest, settings: Settings | None = None
) -> EnsembleRecord:
    """``ilge-search ensemble``: the ensemble evaluation of an existing study, with the seeds, epoch cap and
    selection rule of its final evaluation (3 seeds from ``request.seed``, ``best``, when it has none), on the
    data, cache and device of ``settings`` (default: the defaults'). Checks the study before loading any data."""
    if not isinstance(storage, Storage):
        storage = open_storage(storage, must_exist=True, artifact_dir=request.artifact_dir)
    study = load_run_study(storage, request.study_name, purpose="ensembled")
    record = study_record(study)
    for size in (request.size, *request.sizes):
        check_ensemble_study(record, int(size))
    if not complete_trials(study):
        raise ValueError(f"study {request.study_name!r} has no complete trial to ensemble; run it first")
    device = "auto" if settings is None else settings.device
    run = _ensemble_run(record, request, device, storage.artifact_store())
    stored = ensemble_record(study)
    if stored is not None and ensemble_is_current(study, run):
        logger.info("%s: the ensemble evaluation is up to date; nothing to train", request.study_name)
        return stored
    data = load_training_data(
        study,
        data_dir=None if settings is None else settings.data_dir,
        cache_dir=None if settings is None else settings.cache_dir,
        device=device,
        progress=request.progress,
        with_test=True,
    )
    out = ensemble_evaluation(study, data, run)
    try:  # the dashboard's study note shows the ensemble; a note is for reading and never fails the command
        write_study_note(study)
    except Exception as exc:
        logger.warning("%s: could not rewrite its dashboard note: %s", request.study_name, exc)
    return out


def _ensemble_run(record: StudyRecord, request: EnsembleRequest, device: str, artifact_store: object) -> EnsembleRun:
    """The evaluation ``request`` asks of the study of ``record``, with its final evaluation's seeds and rule."""
    final, identity = record.final, record.identity
    return EnsembleRun(
        size=request.size,
        sizes=tuple(int(s) for s in request.sizes),
        seeds=list(final.seeds) if final is not None and final.seeds else FinalOptions().seed_list(request.seed),
        max_epochs=None if identity is None else identity.max_epochs,
        select=final.select if final is not None else DEFAULT_SELECT,
        prediction_seed=request.seed,
        device=device,
        artifact_store=artifact_store,
        progress=request.progress,
    )


def _row(name: str, members: str, val: float | None, scores: Sequence[float] | None, metric: str) -> dict[str, object]:
    values = list(scores or [])
    mean = statistics.fmean(values) if values else float("nan")
    return {
        "model": name,
        "members": members,
        "val": val,
        f"test_{metric}": mean,
        "test_std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "val_test_gap": None if val is None else val - mean,
    }


def format_ensemble(record: EnsembleRecord, metric: str = "score") -> str:
    """The ensemble evaluation as a table: each size beside the selected trial, the start and the best layer."""
    rows = [
        _row(
            f"ensemble of {size.size}",
            " ".join(f"{n}x{c}" if c > 1 else n for n, c in size.members.items()),
            size.val_score,
            size.test_scores,
            metric,
        )
        for size in sorted(record.sizes.values(), key=lambda s: s.size)
    ]
    selected = f"selected trial ({record.select})"
    rows.append(_row(selected, str(record.selected_trial), None, record.selected_test_scores, metric))
    if record.start_test_scores:
        rows.append(_row("starting configuration", str(record.start_trial), None, record.start_test_scores, metric))
    if record.best_layer_test_scores:
        rows.append(_row("best single layer", "-", None, record.best_layer_test_scores, metric))
    table = pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.4f}", na_rep="-")
    cost = (
        f"seeds {record.seeds}; members trained in {record.member_seconds or 0:.1f} s per seed; forward "
        f"{record.latency_ms or 0:.2f} ms per 1,000 samples (one member: {record.single_latency_ms or 0:.2f} ms); "
        f"mix: {record.mix}"
    )
    if record.reused:
        cost += f"; not retrained (the final evaluation's models): trial(s) {', '.join(map(str, record.reused))}"
    if record.left_out:
        slow = ", ".join(f"{n} ({seconds:.0f} s)" for n, seconds in record.left_out.items())
        cost += f"; left out for their search time (over {SLOW_MEMBER_FACTOR:g}x the median trial): {slow}"
    return f"{table}\n{cost}"
