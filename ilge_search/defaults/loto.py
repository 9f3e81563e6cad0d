"""Do regenerated defaults generalise? Leave one task out, and compare with the built-in defaults.

Defaults chosen on a storage's own tasks are flattered by those tasks. For each task ``T``, :func:`leave_one_task_out`
regenerates the defaults without ``T``'s studies (the rule ``recommend`` uses), trains them and the built-in defaults
(:func:`~ilge_search.encoders.builtin_start`) with no search on each ILGE study of ``T`` (built as a study's first
trial is, on the study's own data, once per final seed) and stores both scores on that study as a
:class:`~ilge_search.record.LotoRecord`, keyed by everything that changes the numbers: a rerun trains only what is
missing, and a record whose configurations the storage no longer gives is stale and replaced.

:func:`stored_loto` reads the current records back without training (the report, ``defaults.md`` and the
shipping rule of :mod:`~ilge_search.defaults.recommend`). Differences are regenerated minus built-in, in
score units and in the direction of improvement; a family's regenerated defaults *win* when the
bootstrap interval of the mean difference over its (model, left-out task) rows lies above zero and the rows
were trained as the defaults ship (:mod:`~ilge_search.defaults.evidence`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import optuna
import pandas as pd

from .._version import __version__
from ..embeddings.models import model_size_bucket
from ..encoders import builtin_start, config_class_for, encoder_families
from ..progress import BarSpec, steps
from ..record import LotoRecord, LotoScores, StudyRecord, save_loto, study_record
from ..storage import hide_password, open_storage, quiet_optuna_warnings
from ..study.data import StudyData
from ..study.retraining import TrainingSetup, train_seeds
from ..study.trial import suggest_capped
from ..tasks.scores import score_unit
from ..tuning import suggest_config
from ..validation import check_int
from .evidence import LeftOutEvidence, left_out_evidence, setting_gap
from .problems import ConfigValues, ProblemGroups, open_existing_storage, problem_tasks, read_problems
from .rule import derive_defaults

if TYPE_CHECKING:
    import optuna
    import pandas as pd

    from ..encoders.configs import EncoderConfig

__all__ = [
    "LOTO_FAMILIES",
    "ROW_COLUMNS",
    "LotoVerdict",
    "LotoResult",
    "leave_one_task_out",
    "stored_loto",
    "start_config",
]

logger = logging.getLogger(__name__)

LOTO_FAMILIES: Sequence[str] = encoder_families()  # the families recommend regenerates: every ILGE family
ROW_COLUMNS = [
    "model",
    "task",
    "family",
    "bucket",
    "metric",
    "unit",
    "study",
    "seeds",
    "builtin_mean",
    "builtin_std",
    "regenerated_mean",
    "regenerated_std",
    "difference",
    "same_config",
    "regenerated_from",
    "builtin_scores",
    "regenerated_scores",
    "builtin_config",
    "regenerated_config",
]


def start_config(family: str, values: ConfigValues, max_epochs: int | None) -> EncoderConfig:
    """The config a study's first trial trains when ``values`` are the recommended defaults: the search-space
    fields through a fixed trial (what a study enqueues), the rest at their class defaults, ``epochs`` capped."""

    config = config_class_for(family)(**values)
    fixed = optuna.trial.FixedTrial({k: v for k, v in config.to_dict().items() if k != "family"})
    with quiet_optuna_warnings():
        suggest_config(fixed, family)
        return suggest_capped(optuna.trial.FixedTrial(dict(fixed.params)), family, max_epochs)


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- what is evaluated


@dataclass
class _Target:
    """One (model, task, family) and the study whose data it is evaluated on."""

    model: str
    task: str
    family: str
    bucket: str
    study: str
    stored: StudyRecord
    builtin: EncoderConfig
    regenerated: EncoderConfig
    regenerated_from: list[str] = field(default_factory=list)

    def key(self, seeds: Sequence[int]) -> dict[str, Any]:
        """Everything the numbers depend on (a stored record whose key differs is stale)."""
        identity, data = self.stored.identity, self.stored.data
        return {
            "model": self.model,
            "task": self.task,
            "family": self.family,
            "data": identity.data_setting() if identity else {},
            "fingerprints": (data.data_fingerprints or data.cache_keys or None) if data else None,
            "seeds": list(seeds),
            "builtin": _digest(self.builtin.to_dict()),
            "regenerated": _digest(self.regenerated.to_dict()),
        }

    def is_current(self, record: LotoRecord) -> bool:
        return record.version == LotoRecord.VERSION and record.key == self.key(record.key.get("seeds") or [])


def _preference(record: StudyRecord, n_trials: int) -> tuple:
    """Which study of a (model, task, family) LOTO evaluates on: full data first, then the report's order."""
    final = record.final
    shots = record.identity.shots if record.identity else None
    return (not shots, final is not None, len(final.test_scores) if final else 0, n_trials, record.name)


def _evaluated_studies(storage_url: str, families: Sequence[str]) -> dict[tuple[str, str, str], StudyRecord]:
    """Per (model, task, family), the matched-protocol study made by ``run`` whose data LOTO trains on."""

    storage = open_existing_storage(storage_url)
    chosen: dict[tuple[str, str, str], tuple[StudyRecord, int]] = {}
    for summary in optuna.get_all_study_summaries(storage.rdb, include_best_trial=False):
        record = study_record(summary)
        identity = record.identity
        if identity is None or identity.encoder not in families or not record.has_data:
            continue
        if identity.protocol != "matched":  # LOTO trains and scores under the matched protocol only
            continue
        if record.data is not None and record.data.task_kind == "tagging":  # defaults are derived without them
            continue
        key = (str(identity.model), str(identity.task), str(identity.encoder))
        if key not in chosen or _preference(record, summary.n_trials) > _preference(*chosen[key]):
            chosen[key] = (record, summary.n_trials)
    return {key: record for key, (record, _) in chosen.items()}


def _check_requested(
    storage_url: str, families: Sequence[str], requested: Sequence[str], known: list[str], what: str
) -> None:
    """A one-line error for requested models or tasks (``what``) without studies."""
    unknown = [name for name in requested if name not in known]
    if unknown:
        raise ValueError(
            f"no {'/'.join(families)} study of {what}(s) {unknown} in {hide_password(storage_url)}; "
            f"its {what}s are {known or 'none'}"
        )


def _target(key: tuple[str, str, str], record: StudyRecord, derived: tuple[dict, ProblemGroups]) -> _Target | str:
    """The target of one (model, task, family) with both configurations, or why it cannot be evaluated."""
    model, task, family = key
    values, used = derived
    try:
        bucket = model_size_bucket(model, record.data.hidden_size if record.data else None)
    except ValueError as exc:  # as recommend skips such a study
        return f"{model}/{task}/{family}: {exc}"
    regenerated = values.get(family, {}).get(bucket)
    if regenerated is None:
        return (
            f"{model}/{task}/{family}: no {family} study of another task in the {bucket} bucket to "
            "regenerate defaults from"
        )
    builtin = builtin_start(family, bucket)
    max_epochs = record.identity.max_epochs if record.identity else None
    return _Target(
        model=model,
        task=task,
        family=family,
        bucket=bucket,
        study=record.name,
        stored=record,
        builtin=start_config(family, builtin, max_epochs),
        regenerated=start_config(family, {**builtin, **regenerated}, max_epochs),
        regenerated_from=[p.study for p in used[(family, bucket)]],
    )


def _targets(
    storage_url: str, families: Sequence[str], models: Sequence[str], tasks: Sequence[str]
) -> tuple[list[_Target], list[str], list[str]]:
    """Every (model, task, family) to evaluate with its configurations; notes on those that cannot be; and
    every task with studies of ``families``."""
    groups, _ = read_problems(storage_url, families)
    chosen = _evaluated_studies(storage_url, families)
    all_tasks = sorted({task for _, task, _ in chosen} | set(problem_tasks(groups)))
    _check_requested(storage_url, families, tasks, all_tasks, "task")
    _check_requested(storage_url, families, models, sorted({model for model, _, _ in chosen}), "model")
    derived: dict[str, tuple[dict, ProblemGroups]] = {}
    targets: list[_Target] = []
    notes: list[str] = []
    for key, record in sorted(chosen.items(), key=lambda item: (item[0][1], item[0][0], families.index(item[0][2]))):
        model, task, _ = key
        if (models and model not in models) or (tasks and task not in tasks):
            continue
        if task not in derived:
            values, _, used = derive_defaults(groups, exclude_tasks=[task])
            derived[task] = (values, used)
        target = _target(key, record, derived[task])
        if isinstance(target, str):
            notes.append(target)
        else:
            targets.append(target)
    return targets, notes, all_tasks


def _best_record(
    target: _Target, records: dict[str, LotoRecord], seeds: Sequence[int] | None = None
) -> LotoRecord | None:
    """The current record with ``seeds`` (any seeds: the one with the most)."""
    current = [r for r in records.values() if target.is_current(r) and (seeds is None or r.key["seeds"] == list(seeds))]
    return max(current, key=lambda r: (len(r.key["seeds"]), r.key["seeds"]), default=None)


# ----------------------------------------------------------------------------- training and storing


def _train_scores(
    config: EncoderConfig, data: StudyData, seeds: Sequence[int], device: str
) -> tuple[list[float], list[float]]:
    """``config`` trained once per seed by the one engine: (test scores, best validation scores)."""
    test, val = [], []
    for trained in train_seeds(data, config, seeds, device=device):
        test.append(float(data.test_metrics(trained.model)[data.metric]))
        val.append(trained.val_score)
    return test, val


def _evaluate(
    target: _Target, study: optuna.Study, seeds: list[int], setup: TrainingSetup, loaded: dict[str, StudyData]
) -> tuple[LotoRecord, int]:
    """Both configurations of ``target`` trained on its study's data (``loaded``: one load per data setting);
    the record and how many configurations were trained (one when they are equal)."""
    identity, data_record = target.stored.identity, target.stored.data
    data_key = _digest(
        [target.model, data_record.cache_keys if data_record else None, identity.data_setting() if identity else {}]
    )
    if data_key not in loaded:
        loaded[data_key] = setup.load_data(study, with_test=True)
    data = loaded[data_key]
    builtin = _train_scores(target.builtin, data, seeds, setup.device)
    if target.regenerated.to_dict() == target.builtin.to_dict():  # same config, same seeds
        regenerated, trained = builtin, 1
    else:
        regenerated, trained = _train_scores(target.regenerated, data, seeds, setup.device), 2
    record = LotoRecord(
        key=target.key(seeds),
        builtin=LotoScores(target.builtin.to_dict(), *builtin),
        regenerated=LotoScores(target.regenerated.to_dict(), *regenerated),
        regenerated_from=target.regenerated_from,
        ilge_search_version=__version__,
        version=LotoRecord.VERSION,
    )
    return record, trained


def _stored_or_trained(
    study: optuna.Study, target: _Target, seeds: list[int], setup: TrainingSetup, loaded: dict[str, StudyData]
) -> tuple[LotoRecord, int]:
    """The study's current record for ``seeds``, or a new one trained and stored; and the configurations trained."""
    stored = study_record(study).loto
    record = _best_record(target, stored, seeds)
    if record is not None:
        return record, 0
    record, trained = _evaluate(target, study, seeds, setup, loaded)
    # records of configurations the storage no longer gives are stale: replaced, not kept
    kept = {digest: r for digest, r in stored.items() if target.is_current(r)}
    save_loto(study, {**kept, _digest(record.key): record})
    logger.info(
        "%s without %s on %s: built-in %.4f, regenerated %.4f",
        target.family,
        target.task,
        target.model,
        statistics.fmean(record.builtin.test_scores),
        statistics.fmean(record.regenerated.test_scores),
    )
    return record, trained


# ----------------------------------------------------------------------------- the result


def _row(target: _Target, record: LotoRecord) -> dict[str, object]:
    metric = target.stored.data.metric if target.stored.data else None
    scale, unit = score_unit(metric or "")
    built, regen = record.builtin.test_scores, record.regenerated.test_scores

    def spread(scores: list[float]) -> float:
        return statistics.stdev(scores) * scale if len(scores) > 1 else 0.0

    sign = 1.0 if target.stored.maximize else -1.0
    return {
        "model": target.model,
        "task": target.task,
        "family": target.family,
        "bucket": target.bucket,
        "metric": metric,
        "unit": unit,
        "study": target.study,
        "seeds": list(record.key["seeds"]),
        "builtin_mean": statistics.fmean(built) * scale,
        "builtin_std": spread(built),
        "regenerated_mean": statistics.fmean(regen) * scale,
        "regenerated_std": spread(regen),
        "difference": sign * (statistics.fmean(regen) - statistics.fmean(built)) * scale,
        "same_config": record.key["builtin"] == record.key["regenerated"],
        "regenerated_from": len(record.regenerated_from or []),
        "builtin_scores": [s * scale for s in built],
        "regenerated_scores": [s * scale for s in regen],
        "builtin_config": record.builtin.config,
        "regenerated_config": record.regenerated.config,
    }


@dataclass
class LotoVerdict:
    """One family and size bucket over its left-out (model, task) rows."""

    family: str
    bucket: str
    rows: int
    mean_difference: float  # regenerated minus built-in, score units, in the direction of improvement
    wins: int
    losses: int
    evidence: LeftOutEvidence | None = None  # the mean difference's interval over the left-out rows
    setting: str = ""  # why the rows were not trained as the defaults ship (empty: they were)

    @property
    def regenerated_win(self) -> bool:
        """Whether the regenerated defaults clearly beat the built-in ones in the setting they ship in: the
        interval of the mean difference over the left-out rows above 0 (what shipping needs)."""
        return self.rows > 0 and self.evidence is not None and self.evidence.passes and not self.setting


@dataclass
class LotoResult:
    """The leave-one-task-out table of a storage.

    Attributes:
        storage: the storage URL (password hidden).
        rows: one row per (model, left-out task, family), columns :data:`ROW_COLUMNS` (a ``pandas.DataFrame``).
        verdicts: per (family, bucket), the mean difference and who won.
        missing: ``model/task/family`` that have a study but no current evaluation.
        notes: what could not be evaluated, and why.
        trained: configurations trained by this call (0 when everything was stored).
    """

    storage: str
    rows: pd.DataFrame
    verdicts: dict[tuple[str, str], LotoVerdict]
    missing: list[str]
    notes: list[str]
    tasks: list[str] = field(default_factory=list)
    trained: int = 0

    def regenerated_win(self, family: str, bucket: str) -> bool | None:
        """Whether ``family``'s regenerated defaults win for ``bucket`` (``None``: no evaluation)."""
        verdict = self.verdicts.get((family, bucket))
        return None if verdict is None else verdict.regenerated_win


def _trained_setting(family: str, configs: Any) -> str:
    """Why the regenerated configurations were not trained as they ship (each capped at its study's epochs)."""
    trained, shipped = [], []
    for config in configs:
        values = {k: v for k, v in config.items() if k not in ("family", "epochs")}
        trained.append(int(config.get("epochs", 0)) or None)
        shipped.append(int(start_config(family, values, None).epochs))
    return setting_gap(trained, min(shipped)) if shipped else ""


def _result(
    storage_url: str,
    targets: list[_Target],
    records: dict[str, LotoRecord],
    notes: list[str],
    tasks: list[str],
    trained: int,
) -> LotoResult:

    rows, missing = [], []
    for target in targets:
        record = records.get(target.study)
        if record is None:
            missing.append(f"{target.model}/{target.task}/{target.family}")
        else:
            rows.append(_row(target, record))
    frame = pd.DataFrame(rows, columns=ROW_COLUMNS)
    verdicts: dict[tuple[str, str], LotoVerdict] = {}
    for (family, bucket), group in frame.groupby(["family", "bucket"], sort=False):
        shown = group["difference"].round(2)
        verdicts[(family, bucket)] = LotoVerdict(
            family=family,
            bucket=bucket,
            rows=len(group),
            mean_difference=float(group["difference"].mean()),
            wins=int((shown > 0).sum()),
            losses=int((shown < 0).sum()),
            evidence=left_out_evidence("task", group["difference"]),
            setting=_trained_setting(family, group["regenerated_config"]),
        )
    return LotoResult(
        storage=hide_password(storage_url),
        rows=frame,
        verdicts=verdicts,
        missing=missing,
        notes=notes,
        tasks=tasks,
        trained=trained,
    )


def _check_names(families: Sequence[str]) -> list[str]:
    families = list(families)
    unknown = [f for f in families if f not in LOTO_FAMILIES]
    if unknown or not families:
        raise ValueError(f"unknown families {unknown}; choose from {list(LOTO_FAMILIES)}")
    return families


def stored_loto(storage_url: str, *, families: Sequence[str] = LOTO_FAMILIES) -> LotoResult:
    """The current leave-one-task-out records of a storage, read without training (stale ones ignored)."""
    families = _check_names(families)
    targets, notes, tasks = _targets(storage_url, families, (), ())
    records = {}
    for target in targets:
        record = _best_record(target, target.stored.loto)
        if record is not None:
            records[target.study] = record
    return _result(storage_url, targets, records, notes, tasks, 0)


def leave_one_task_out(
    storage_url: str,
    *,
    models: Sequence[str] = (),
    tasks: Sequence[str] = (),
    families: Sequence[str] = LOTO_FAMILIES,
    final_seeds: int = 3,
    seed: int = 0,
    setup: TrainingSetup | None = None,
) -> LotoResult:
    """Regenerate the defaults without each task and score them against the built-in defaults on that task.

    Args:
        storage_url: a storage of ilge-search studies (written to: the results are stored on its studies).
        models, tasks: evaluate only these models and left-out tasks (empty: all the storage has); the
            defaults are always regenerated from every other task's studies.
        families: the ILGE families to evaluate (those with studies in the storage).
        final_seeds: training seeds per configuration, ``seed + 1000 + i`` as in ``run`` (at least 1; the
            report asks for 3 or more).
        setup: the task data and embedding cache the studies were run with, the training device, torch's CPU
            threads while training (restored afterwards) and whether a progress bar counts the (model, task,
            family) rows (default: :class:`~ilge_search.study.data.TrainingSetup`'s).

    Returns:
        A :class:`LotoResult` with every row now stored (the ones evaluated earlier included).

    Raises:
        ValueError: an unknown family, a model or task without studies, task data that differ from a study's.
    """

    setup = setup or TrainingSetup()
    families = _check_names(families)
    check_int("final_seeds", final_seeds)
    check_int("seed", seed, minimum=0)
    seeds = [seed + 1000 + i for i in range(final_seeds)]
    targets, notes, all_tasks = _targets(storage_url, families, list(models), list(tasks))
    opened = open_storage(storage_url, must_exist=True)
    records: dict[str, LotoRecord] = {}
    loaded: dict[str, StudyData] = {}  # one data load per distinct data setting
    trained = 0
    with setup.torch_threads():
        for target in steps(targets, BarSpec("leave one task out", unit="row", enabled=setup.progress)):
            records[target.study], count = _stored_or_trained(
                opened.existing_study(target.study), target, seeds, setup, loaded
            )
            trained += count
    return _result(storage_url, targets, records, notes, all_tasks, trained)
