"""Do regenerated defaults generalise? Leave one task out, and compare with the built-in defaults.

The defaults ``recommend`` regenerates from a storage were chosen on the
storage's own tasks, so scoring them on those tasks flatters them. For each task
``T`` with studies in the storage, :func:`leave_one_task_out`:

1. regenerates the defaults from every study except those of ``T``
   (:func:`~ilge_search.report.defaults_rule.derive_defaults`, the rule
   ``recommend`` uses);
2. for each model and ILGE family (``cayley``, ``fc``, ``deepset``) with a
   study on ``T``, trains two configurations on that study's data with no
   search, through the one engine: the regenerated defaults and the built-in
   defaults (:data:`~ilge_search.tuning.BUILTIN_RECOMMENDED`, the published
   package's, which saw no task). Each is built exactly as a study's first
   trial is (search-space fields through a fixed trial, ``epochs`` capped at the
   study's ``max_epochs``), trained once per seed (``seed + 1000 + i``, the
   final seeds of ``run``) and scored once on test. The data is the study's own
   (its task, ``shots``, ``max_train``, ``max_eval`` and data seed, checked
   against the cache keys it stored);
3. stores both configurations' scores on that study as the user attr
   :data:`LOTO_ATTR` (``{key: record}``), keyed by a hash of everything that
   changes the numbers: model, task, family, the study's data setting and
   fingerprints, the seeds and both configurations. A rerun trains only what is
   missing; a record whose configurations are no longer the ones the storage
   gives (new studies changed the regenerated defaults) is stale, ignored and
   replaced.

:func:`stored_loto` reads the current records back without training (the
report's table, ``defaults.md`` and the shipping rule of
:mod:`~ilge_search.report.recommend` use it). Differences are regenerated minus
built-in, in score units (accuracy %, Spearman x 100), in the direction of
improvement; a family's regenerated defaults *win on average* when the mean
difference over its (model, left-out task) rows is above zero.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .._version import __version__
from ..configs import config_class_for
from ..models import model_size_bucket
from ..protocol import protocol_of
from ..storage import hide_password, open_storage
from ..tuning import BUILTIN_RECOMMENDED
from ..validation import check_int
from .data import open_report_storage, score_unit
from .defaults_rule import derive_defaults, problem_tasks, read_problems
from .document import MISSING, Cell, plural

__all__ = [
    "LOTO_ATTR",
    "LOTO_FAMILIES",
    "LotoVerdict",
    "LotoResult",
    "leave_one_task_out",
    "stored_loto",
    "loto_rows",
    "loto_verdict_rows",
    "loto_sentences",
    "start_config",
]

logger = logging.getLogger(__name__)

LOTO_ATTR = "loto_evaluations"  # study user attr: {key: record}
LOTO_FAMILIES: Tuple[str, ...] = ("cayley", "fc", "deepset")  # the families recommend regenerates
_RECORD_VERSION = 1
_DATA_KEYS = ("shots", "max_train", "max_eval", "data_seed", "max_epochs")
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


def start_config(family: str, values: Dict[str, Any], max_epochs: Optional[int]) -> Any:
    """The config a study's first trial trains when ``values`` are the recommended defaults: the search-space
    fields through a fixed trial (what a study enqueues), the rest at their class defaults, ``epochs`` capped."""
    import optuna

    from ..storage import quiet_optuna_warnings
    from ..study.trial import suggest_capped
    from ..tuning import suggest_config

    config = config_class_for(family)(**values)
    fixed = optuna.trial.FixedTrial({k: v for k, v in config.to_dict().items() if k != "family"})
    with quiet_optuna_warnings():
        suggest_config(fixed, family)
        return suggest_capped(optuna.trial.FixedTrial(dict(fixed.params)), family, max_epochs)


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class _Target:
    """One (model, task, family) and the study whose data it is evaluated on."""

    model: str
    task: str
    family: str
    bucket: str
    study: str
    attrs: Dict[str, Any]
    builtin: Any = None  # configs
    regenerated: Any = None
    regenerated_from: List[str] = field(default_factory=list)

    @property
    def maximize(self) -> bool:
        return self.attrs.get("direction") != "minimize"

    def key(self, seeds: Sequence[int]) -> Dict[str, Any]:
        return {
            "model": self.model,
            "task": self.task,
            "family": self.family,
            "data": {k: self.attrs.get(k) for k in _DATA_KEYS},
            "fingerprints": self.attrs.get("data_fingerprints") or self.attrs.get("cache_keys"),
            "seeds": list(seeds),
            "builtin": _digest(self.builtin.to_dict()),
            "regenerated": _digest(self.regenerated.to_dict()),
        }

    def is_current(self, record: Dict[str, Any]) -> bool:
        key = record.get("key") or {}
        return record.get("version") == _RECORD_VERSION and key == self.key(key.get("seeds") or [])


def _preference(summary: Any) -> Tuple:
    """Which study of a (model, task, family) LOTO evaluates on: full data first, then the report's order."""
    attrs = summary.user_attrs
    return (
        not attrs.get("shots"),
        "final_test_mean" in attrs,
        len(attrs.get("final_test_scores") or []),
        summary.n_trials,
        summary.study_name,
    )


def _targets(
    storage_url: str, families: Sequence[str], models: Sequence[str], tasks: Sequence[str]
) -> Tuple[List[_Target], List[str], List[str]]:
    """Every (model, task, family) to evaluate with its configurations; notes on those that cannot be; and
    every task with studies of ``families``."""
    import optuna

    storage = open_report_storage(storage_url)
    groups, _ = read_problems(storage_url, families)
    chosen: Dict[Tuple[str, str, str], Any] = {}
    for summary in optuna.get_all_study_summaries(storage.rdb, include_best_trial=False):
        attrs = summary.user_attrs
        if attrs.get("encoder") not in families or not attrs.get("model") or not attrs.get("task_kind"):
            continue
        if protocol_of(attrs) != "matched":  # LOTO trains and scores under the matched protocol only
            continue
        key = (str(attrs["model"]), str(attrs["task"]), str(attrs["encoder"]))
        if key not in chosen or _preference(summary) > _preference(chosen[key]):
            chosen[key] = summary
    all_tasks = sorted({task for _, task, _ in chosen} | set(problem_tasks(groups)))
    unknown = [t for t in tasks if t not in all_tasks]
    if unknown:
        raise ValueError(
            f"no {'/'.join(families)} study of task(s) {unknown} in {hide_password(storage_url)}; "
            f"its tasks are {all_tasks or 'none'}"
        )
    known_models = sorted({model for model, _, _ in chosen})
    missing_models = [m for m in models if m not in known_models]
    if missing_models:
        raise ValueError(
            f"no {'/'.join(families)} study of model(s) {missing_models} in "
            f"{hide_password(storage_url)}; its models are {known_models or 'none'}"
        )
    derived: Dict[str, Tuple[Dict[str, Any], Dict[Tuple[str, str], List[Any]]]] = {}
    targets: List[_Target] = []
    notes: List[str] = []
    for (model, task, family), summary in sorted(
        chosen.items(), key=lambda item: (item[0][1], item[0][0], families.index(item[0][2]))
    ):
        if (models and model not in models) or (tasks and task not in tasks):
            continue
        attrs = dict(summary.user_attrs)
        if task not in derived:
            values, _, used = derive_defaults(groups, exclude_tasks=[task])
            derived[task] = (values, used)
        values, used = derived[task]
        try:
            bucket = model_size_bucket(model, attrs.get("hidden_size"))
        except ValueError as exc:  # as recommend skips such a study
            notes.append(f"{model}/{task}/{family}: {exc}")
            continue
        regenerated = values.get(family, {}).get(bucket)
        if regenerated is None:
            notes.append(
                f"{model}/{task}/{family}: no {family} study of another task in the {bucket} bucket to "
                "regenerate defaults from"
            )
            continue
        builtin = dict(BUILTIN_RECOMMENDED.get(family, {}).get(bucket, {}))
        target = _Target(
            model=model,
            task=task,
            family=family,
            bucket=bucket,
            study=summary.study_name,
            attrs=attrs,
            regenerated_from=[p.study for p in used[(family, bucket)]],
        )
        target.builtin = start_config(family, builtin, attrs.get("max_epochs"))
        target.regenerated = start_config(family, {**builtin, **regenerated}, attrs.get("max_epochs"))
        targets.append(target)
    return targets, notes, all_tasks


def _best_record(
    target: _Target, records: Dict[str, Any], seeds: Optional[Sequence[int]] = None
) -> Optional[Dict[str, Any]]:
    """The current record with ``seeds`` (any seeds: the one with the most)."""
    current = [
        r
        for r in records.values()
        if isinstance(r, dict) and target.is_current(r) and (seeds is None or r["key"]["seeds"] == list(seeds))
    ]
    return max(current, key=lambda r: (len(r["key"]["seeds"]), r["key"]["seeds"]), default=None)


def _train_scores(config: Any, data: Any, seeds: Sequence[int], device: str) -> Tuple[List[float], List[float]]:
    """``config`` trained once per seed by the one engine: (test scores, best validation scores)."""
    from ..engine import evaluate, train_encoder

    test, val = [], []
    for seed in seeds:
        result = train_encoder(
            config,
            data.train,
            data.validation,
            task_kind=data.task_kind,
            num_classes=data.num_classes,
            seed=seed,
            device=device,
        )
        test.append(float(evaluate(result.model, *data.test, task_kind=data.task_kind)[data.metric]))
        val.append(float(result.best_val_metric))
    return test, val


def _row(target: _Target, record: Dict[str, Any]) -> Dict[str, Any]:
    scale, unit = score_unit(str(target.attrs.get("metric", "")))
    built, regen = record["builtin"]["test_scores"], record["regenerated"]["test_scores"]

    def spread(scores: List[float]) -> float:
        return statistics.stdev(scores) * scale if len(scores) > 1 else 0.0

    sign = 1.0 if target.maximize else -1.0
    return {
        "model": target.model,
        "task": target.task,
        "family": target.family,
        "bucket": target.bucket,
        "metric": target.attrs.get("metric"),
        "unit": unit,
        "study": target.study,
        "seeds": list(record["key"]["seeds"]),
        "builtin_mean": statistics.fmean(built) * scale,
        "builtin_std": spread(built),
        "regenerated_mean": statistics.fmean(regen) * scale,
        "regenerated_std": spread(regen),
        "difference": sign * (statistics.fmean(regen) - statistics.fmean(built)) * scale,
        "same_config": record["key"]["builtin"] == record["key"]["regenerated"],
        "regenerated_from": len(record.get("regenerated_from") or []),
        "builtin_scores": [s * scale for s in built],
        "regenerated_scores": [s * scale for s in regen],
        "builtin_config": record["builtin"]["config"],
        "regenerated_config": record["regenerated"]["config"],
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

    @property
    def regenerated_win(self) -> bool:
        """Whether the regenerated defaults beat the built-in ones on average (what shipping needs)."""
        return self.rows > 0 and self.mean_difference > 0


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
    rows: Any
    verdicts: Dict[Tuple[str, str], LotoVerdict]
    missing: List[str]
    notes: List[str]
    tasks: List[str] = field(default_factory=list)
    trained: int = 0

    def regenerated_win(self, family: str, bucket: str) -> Optional[bool]:
        """Whether ``family``'s regenerated defaults win for ``bucket`` (``None``: no evaluation)."""
        verdict = self.verdicts.get((family, bucket))
        return None if verdict is None else verdict.regenerated_win


def _result(
    storage_url: str,
    targets: List[_Target],
    records: Dict[str, Dict[str, Any]],
    notes: List[str],
    tasks: List[str],
    trained: int,
) -> LotoResult:
    import pandas as pd

    rows, missing = [], []
    for target in targets:
        record = records.get(target.study)
        if record is None:
            missing.append(f"{target.model}/{target.task}/{target.family}")
        else:
            rows.append(_row(target, record))
    frame = pd.DataFrame(rows, columns=ROW_COLUMNS)
    verdicts: Dict[Tuple[str, str], LotoVerdict] = {}
    for (family, bucket), group in frame.groupby(["family", "bucket"], sort=False):
        shown = group["difference"].round(2)
        verdicts[(family, bucket)] = LotoVerdict(
            family=family,
            bucket=bucket,
            rows=len(group),
            mean_difference=float(group["difference"].mean()),
            wins=int((shown > 0).sum()),
            losses=int((shown < 0).sum()),
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


def _check_names(families: Sequence[str]) -> List[str]:
    families = list(families)
    unknown = [f for f in families if f not in LOTO_FAMILIES]
    if unknown or not families:
        raise ValueError(f"unknown families {unknown}; choose from {list(LOTO_FAMILIES)}")
    return families


def stored_loto(storage_url: str, *, families: Sequence[str] = LOTO_FAMILIES) -> LotoResult:
    """The current leave-one-task-out records of a storage, read without training (stale ones ignored)."""
    import optuna

    families = _check_names(families)
    targets, notes, tasks = _targets(storage_url, families, (), ())
    storage = open_report_storage(storage_url)
    summaries = {s.study_name: s for s in optuna.get_all_study_summaries(storage.rdb, include_best_trial=False)}
    records = {}
    for target in targets:
        record = _best_record(target, summaries[target.study].user_attrs.get(LOTO_ATTR) or {})
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
    data_dir: Optional[str] = None,
    cache_dir: Optional[str] = None,
    device: str = "auto",
    threads: Optional[int] = None,
    show_progress: bool = True,
) -> LotoResult:
    """Regenerate the defaults without each task and score them against the built-in defaults on that task.

    Args:
        storage_url: a storage of ilge-search studies (written to: the results are stored on its studies).
        models, tasks: evaluate only these models and left-out tasks (empty: all the storage has); the
            defaults are always regenerated from every other task's studies.
        families: the ILGE families to evaluate (those with studies in the storage).
        final_seeds: training seeds per configuration, ``seed + 1000 + i`` as in ``run`` (at least 1; the
            report asks for 3 or more).
        data_dir, cache_dir, device: the task data and embedding cache the studies were run with.
        threads: torch CPU threads while training (restored afterwards).
        show_progress: a progress bar over the (model, task, family) rows.

    Returns:
        A :class:`LotoResult` with every row now stored (the ones evaluated earlier included).

    Raises:
        ValueError: an unknown family, a model or task without studies, task data that differ from a study's.
    """
    import torch
    from tqdm.auto import tqdm

    from ..study.export import load_training_data

    families = _check_names(families)
    check_int("final_seeds", final_seeds)
    check_int("seed", seed, minimum=0)
    seeds = [seed + 1000 + i for i in range(final_seeds)]
    targets, notes, all_tasks = _targets(storage_url, families, list(models), list(tasks))
    opened = open_storage(storage_url, must_exist=True)
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    records: Dict[str, Dict[str, Any]] = {}
    loaded: Dict[str, Any] = {}  # one data load per distinct data setting
    trained = 0
    try:
        for target in tqdm(targets, desc="leave one task out", unit="row", disable=not show_progress):
            study = opened.load_study(target.study)
            stored = dict(study.user_attrs.get(LOTO_ATTR) or {})
            record = _best_record(target, stored, seeds)
            if record is None:
                data_key = _digest(
                    [target.model, target.attrs.get("cache_keys"), {k: target.attrs.get(k) for k in _DATA_KEYS}]
                )
                if data_key not in loaded:
                    loaded[data_key] = load_training_data(
                        study, with_test=True, data_dir=data_dir, cache_dir=cache_dir, device=device
                    )
                data = loaded[data_key]
                builtin_test, builtin_val = _train_scores(target.builtin, data, seeds, device)
                if target.regenerated.to_dict() == target.builtin.to_dict():  # same config, same seeds
                    regen_test, regen_val = builtin_test, builtin_val
                    trained += 1
                else:
                    regen_test, regen_val = _train_scores(target.regenerated, data, seeds, device)
                    trained += 2
                key = target.key(seeds)
                record = {
                    "version": _RECORD_VERSION,
                    "key": key,
                    "ilge_search_version": __version__,
                    "regenerated_from": target.regenerated_from,
                    "builtin": {
                        "config": target.builtin.to_dict(),
                        "test_scores": builtin_test,
                        "val_scores": builtin_val,
                    },
                    "regenerated": {
                        "config": target.regenerated.to_dict(),
                        "test_scores": regen_test,
                        "val_scores": regen_val,
                    },
                }
                # records of configurations the storage no longer gives are stale: replaced, not kept
                kept = {k: r for k, r in stored.items() if isinstance(r, dict) and target.is_current(r)}
                study.set_user_attr(LOTO_ATTR, {**kept, _digest(key): record})
                logger.info(
                    "%s without %s on %s: built-in %.4f, regenerated %.4f",
                    target.family,
                    target.task,
                    target.model,
                    statistics.fmean(builtin_test),
                    statistics.fmean(regen_test),
                )
            records[target.study] = record
    finally:
        torch.set_num_threads(previous_threads)
    return _result(storage_url, targets, records, notes, all_tasks, trained)


# ----------------------------------------------------------------------------- tables and sentences


def _mean_std(mean: float, std: float, seeds: int) -> str:
    if math.isnan(mean):
        return MISSING
    return f"{mean:.2f} ± {std:.2f}" if seeds > 1 else f"{mean:.2f}"


def loto_rows(result: LotoResult) -> Tuple[List[str], List[List[Cell]]]:
    """(header, rows): per (model, left-out task, family), built-in and regenerated defaults' test scores
    (mean ± std over seeds), their difference, and how many other studies the regenerated ones came from."""
    header = [
        "model",
        "left-out task",
        "family",
        "unit",
        "seeds",
        "built-in",
        "regenerated without it",
        "difference",
        "from studies",
    ]
    rows = []
    for r in result.rows.itertuples():
        shown = round(r.difference, 2)  # the better of the two in bold, at the shown precision
        rows.append(
            [
                Cell(r.model),
                Cell(r.task),
                Cell(r.family),
                Cell(r.unit),
                Cell(str(len(r.seeds))),
                Cell(_mean_std(r.builtin_mean, r.builtin_std, len(r.seeds)), bold=shown < 0),
                Cell(
                    _mean_std(r.regenerated_mean, r.regenerated_std, len(r.seeds))
                    + (" (same config)" if r.same_config else ""),
                    bold=shown > 0,
                ),
                Cell(f"{r.difference:+.2f}"),
                Cell(str(r.regenerated_from)),
            ]
        )
    return header, rows


def loto_verdict_rows(result: LotoResult) -> Tuple[List[str], List[List[Cell]]]:
    """(header, rows): per family and size bucket, the mean difference and whether the regenerated defaults
    win on average."""
    header = ["family", "size", "rows", "mean difference", "regenerated ahead", "behind", "regenerated win"]
    rows = [
        [
            Cell(v.family),
            Cell(v.bucket),
            Cell(str(v.rows)),
            Cell(f"{v.mean_difference:+.2f}"),
            Cell(str(v.wins)),
            Cell(str(v.losses)),
            Cell("yes" if v.regenerated_win else "no", bold=v.regenerated_win),
        ]
        for v in result.verdicts.values()
    ]
    return header, rows


def loto_sentences(result: LotoResult) -> List[str]:
    """One sentence per family and bucket saying whether the regenerated defaults won, and what is missing."""
    out = []
    for v in result.verdicts.values():
        seeds = sorted(
            {
                len(s)
                for s in result.rows.loc[
                    (result.rows["family"] == v.family) & (result.rows["bucket"] == v.bucket), "seeds"
                ]
            }
        )
        verb = "beat" if v.regenerated_win else "do not beat"
        out.append(
            f"{v.family} ({v.bucket} models): defaults regenerated without the task {verb} the built-in "
            f"defaults on average over {plural(v.rows, 'left-out (model, task) row')}: "
            f"{v.mean_difference:+.2f} points (ahead on {v.wins}, behind on {v.losses}; "
            f"{'/'.join(map(str, seeds))} seeds per configuration)."
        )
    if result.missing:
        out.append(f"Not evaluated yet (or stale): {', '.join(result.missing)}.")
    out += result.notes
    return out
