"""What a run will do and how long it will take, before it starts (``ilge-search run --dry-run``).

:func:`plan_run` goes through :func:`~.check.check_run`, as ``run_study`` does, then says what the run would
do (:class:`RunPlan`) and estimates its wall time from a short calibration, creating and writing nothing:
the first trial's configuration trained :data:`CALIBRATION_EPOCHS` epochs on at most :data:`CALIBRATION_ROWS`
rows of the cached features (random ones of the same shape on a cold cache), scaled to the split, every
trial assumed to run all its epochs; :data:`EXTRACTION_SAMPLE` texts embedded for the splits not cached;
``workers`` trials at a time; each registered stage after the search costed by its own
:meth:`~ilge_search.study.stages.Stage.reserve_seconds` on the planned trials, each retraining as that first
configuration (upper bounds: a reused start and left-out slow trials make them shorter). The estimate holds
for the machine's load while it was measured (:attr:`RunPlan.cpu_per_second`). A run logs it when it is over
:data:`LONG_RUN_SECONDS`, calibrating only when :func:`may_be_long` says it could be.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import optuna
import torch

from .. import engine  # its training functions looked up per call: tests count them
from ..embeddings.cache import EmbeddingCache
from ..embeddings.extraction import LayerEmbedder
from ..embeddings.models import conversion_bytes, known_model, pending_conversion, resolve_device
from ..embeddings.weights import weights_memo_read_only
from ..encoders.configs import BestLayerConfig
from ..engine import TrainingRecipe
from ..files import format_bytes
from ..record import StudyRecord, study_record
from ..storage import Storage, finished_trial_count, quiet_optuna_warnings
from ..validation import usable_cpus
from .auto import auto_methods, is_auto
from .budget import StageCost, TimeSplit, TrialCosts
from .check import PlannedStudy, RunCheck, check_run, missing_sqlite_file
from .data import load_study_data
from .options import StudyOptions
from .stages import StageCosting, StudyFacts
from .tokens import CALIBRATION_SENTENCES, calibration_counts, head, random_word_data, rows_of
from .trial import recommended_params, suggest_capped

if TYPE_CHECKING:  # pragma: no cover
    from ..encoders.configs import EncoderConfig
    from ..engine.core import Dataset

__all__ = [
    "PlannedStudy",
    "RunCheck",
    "StudyPlan",
    "RunPlan",
    "check_run",
    "plan_run",
    "estimate_run",
    "may_be_long",
    "missing_sqlite_file",
    "format_seconds",
    "LONG_RUN_SECONDS",
    "CALIBRATION_EPOCHS",
    "CALIBRATION_ROWS",
    "EXTRACTION_SAMPLE",
]

LONG_RUN_SECONDS = 300.0  # a run estimated longer than this says so in one log line at its start
CALIBRATION_EPOCHS = 3  # epochs of the first trial's config timed per encoder (the first one carries the set-up)
CALIBRATION_ROWS = 1024  # training rows the calibration trains on; the time per epoch is scaled to the split
EXTRACTION_SAMPLE = 32  # texts embedded to measure the extraction rate of a cold cache
WARM_UP_ROWS = 16  # rows of the untimed epoch that absorbs an encoder's one-time set-up before timing
OPEN_ENDED_TRIALS = 100  # a search without a trial count is costed as leaving this many: more than stages retrain
WORKER_START_SECONDS = 10.0  # a spawned worker imports torch and reads the cached arrays before its first trial
# pessimistic costs for may_be_long: seconds per row x layer x dimension x epoch to train, and per text and model
# parameter to extract, a few times what a small CPU took (docs/guide.md, `--dry-run`)
_PRIOR_TRAIN_SECONDS = 5e-7
_PRIOR_EXTRACT_SECONDS = 1e-9
_UNKNOWN_MODEL = (33, 4096, 8e9)  # layers, width and parameters assumed for a model outside the table
_UNTIMED = "with the extraction estimated, not timed (see the note)"
_UNTIMED_WORDS = "with the extraction estimated, not timed"


# ----------------------------------------------------------------------------- the plan


@dataclass
class StudyPlan:
    """One study of a run: what it holds now, what the run adds and how long that should take.

    Attributes:
        trials: trials the run adds (``None``: until ``timeout``).
        epochs: epochs every trial runs at most (the config's ``epochs``, capped by ``max_epochs``).
        trial_seconds: one training of the first config on the full splits (all its epochs); a
            cross-validated trial (``cv``) trains one per fold.
        stages: what each registered stage that applies keeps after the search (:class:`~.budget.StageCost`:
            its retrainings, each seed one, at most those; seconds, each retraining as the first config).
        seconds: this study's estimated wall time (trials, worker start, the stages).
    """

    encoder: str
    study_name: str
    exists: bool
    finished: int
    trials: int | None
    epochs: int
    stages: list[StageCost] = field(default_factory=list)
    trial_seconds: float = math.nan
    seconds: float = math.nan
    time_split: TimeSplit | None = None  # --time-limit: this study's share, as the search and each stage
    facts: StudyFacts | None = field(default=None, repr=False, compare=False)

    def runs(self, stage: str) -> int:
        """The retrainings the stage named ``stage`` counts (0: it does not apply or retrains nothing)."""
        return sum(cost.trainings for cost in self.stages if cost.name == stage)


@dataclass
class RunPlan:
    """What ``run_study`` would do with these arguments, and its estimated wall time.

    Attributes:
        split_sizes: rows per split after ``shots``, ``max_train`` and ``max_eval``.
        cached: per split the study reads, whether its embeddings are in the cache now.
        cache_keys: the embedding-cache key of each split.
        parallel: trials running at once (``workers``, bounded by the CPU threads).
        extraction_seconds: embedding the splits not in the cache (0 when all are).
        seconds: the whole run's estimated wall time (``nan`` without calibration).
        calibration: how the estimate was measured, in words.
        calibration_seconds: what measuring it took.
        cpu_per_second: CPU seconds this process used per second of timed training (well below the
            threads it may use: the machine was busy, and the estimate holds only while it stays so busy).
    """

    model: str
    task: str
    storage: str
    studies: list[StudyPlan]
    split_sizes: dict[str, int]
    cached: dict[str, bool]
    cache_keys: dict[str, str]
    workers: int
    parallel: int
    threads: int | None
    device: str
    final_seeds: int
    num_layers: int | None = None
    hidden_size: int | None = None
    texts_to_embed: int = 0
    extraction_seconds: float = 0.0
    extraction_timed: bool = True
    seconds: float = math.nan
    calibration: str = "not measured"
    calibration_seconds: float = 0.0
    cpu_per_second: float = math.nan
    notes: list[str] = field(default_factory=list)

    @property
    def is_long(self) -> bool:
        """Whether the estimate is over :data:`LONG_RUN_SECONDS`."""
        return not math.isnan(self.seconds) and self.seconds > LONG_RUN_SECONDS

    def estimate_line(self) -> str:
        """The estimate as one line (what a long run logs at its start)."""
        trials = [s.trials for s in self.studies]
        until = "until the time limit" if any(s.time_split for s in self.studies) else "until the timeout"
        added = until if None in trials else f"{sum(t for t in trials if t is not None)} trials"
        epochs = sorted({s.epochs for s in self.studies})
        extraction = f", {format_seconds(self.extraction_seconds)} of it extraction" if self.extraction_seconds else ""
        return (
            f"estimated wall time {format_seconds(self.seconds)}{extraction}: {len(self.studies)} "
            f"{'study' if len(self.studies) == 1 else 'studies'}, {added} of up to "
            f"{'/'.join(map(str, epochs))} epochs on {self.split_sizes.get('train', 0)} training texts, "
            f"{self.parallel} at a time, then {self.final_seeds} final seeds "
            f"(measured: {self.calibration}; pruned and early-stopped trials make it shorter)"
        )

    def describe(self) -> str:
        """The plan as the lines ``ilge-search run --dry-run`` prints."""
        sizes = ", ".join(f"{name} {size}" for name, size in self.split_sizes.items())
        cache = ", ".join(f"{name} {'cached' if hit else 'not cached'}" for name, hit in self.cached.items())
        shape = f" ({self.num_layers} layers x {self.hidden_size})" if self.num_layers else ""
        lines = [
            f"dry run: nothing is created or written (storage {self.storage})",
            f"model {self.model}{shape}, task {self.task}",
            f"data after the caps: {sizes}",
            f"embedding cache: {cache}" + (f"; {self.texts_to_embed} texts to embed" if self.texts_to_embed else ""),
            f"workers {self.workers} ({self.parallel} trial{'s' if self.parallel > 1 else ''} at a time), "
            f"threads {self.threads if self.threads is not None else 'default'}, device {self.device}, "
            f"final seeds {self.final_seeds}",
            "studies:",
        ]
        width = max(len(s.study_name) for s in self.studies)
        for s in self.studies:
            state = f"resumes with {s.finished} finished trials" if s.exists else "new"
            trials = (
                ("until the time limit" if s.time_split else "until timeout")
                if s.trials is None
                else f"+{s.trials} trials"
            )
            costs = "".join(_cost_text(cost) for cost in s.stages)
            time_text = (
                ""
                if math.isnan(s.seconds)
                else (f"  ~{format_seconds(s.seconds)} ({format_seconds(s.trial_seconds)} per trial)")
            )
            lines.append(f"  {s.study_name:<{width}}  {state}; {trials} x up to {s.epochs} epochs{costs}{time_text}")
            if s.time_split is not None:
                lines.append(f"  {'':<{width}}  {s.time_split.line()}")
        lines.append(self.estimate_line() if not math.isnan(self.seconds) else "no time estimate (calibrate=False)")
        if self.threads == 1 and self.cpu_per_second < 0.75:
            lines.append(
                f"note: the calibration got {self.cpu_per_second:.0%} of a CPU core (a busy machine); "
                "the estimate assumes the load stays the same"
            )
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)


def _cost_text(cost: StageCost) -> str:
    """A stage's part of a study's dry-run line: its retrainings, or else its own seconds (none: nothing)."""
    if cost.trainings:
        return f", {cost.name} {'up to ' if cost.reuses else ''}{cost.trainings} retrainings"
    return f", {cost.name} ~{format_seconds(cost.seconds)}" if cost.seconds > 0 else ""


def format_seconds(seconds: float) -> str:
    """``"45 s"``, ``"12 min"``, ``"2.5 h"``."""
    if math.isnan(seconds):
        return "unknown"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def plan_run(
    model: str,
    task: str,
    encoders: str | Sequence[str] = "cayley",
    *,
    storage: str | Storage | None = None,
    options: StudyOptions | None = None,
    calibrate: bool = True,
) -> RunPlan:
    """What ``run_study`` would do with the same arguments, with its estimated wall time (a dry run).

    Nothing is created or written: not the storage (an existing one is only read,
    to find the studies the run would resume), not a study, not the cache.

    Args:
        model, task, encoders, storage: as in :func:`~ilge_search.study.run_study`.
        options: a :class:`StudyOptions`, as ``run_study`` takes it (default: ``StudyOptions()``).
        calibrate: measure the estimate (a few epochs per encoder, and the
            extraction rate when the cache is cold); ``False`` only plans.

    Raises:
        ValueError: whatever ``run_study`` would refuse, with the same message.
    """

    options = StudyOptions() if options is None else options
    with weights_memo_read_only():
        check = check_run(model, task, encoders, storage, options, dry_run=True)
        return estimate_run(check, calibrate=calibrate)


def _parallel(options: StudyOptions, device: str) -> int:
    """Trials that really run at once: ``workers``, on a CPU no more than its cores allow."""
    if options.runtime.workers == 1 or device != "cpu":
        return options.runtime.workers
    return max(1, min(options.runtime.workers, usable_cpus() // options.runtime.worker_threads()))


def _study_plans(check: RunCheck) -> list[StudyPlan]:
    options = check.options
    plans = []
    for planned in check.studies:
        enc = planned.encoder
        study = check.storage.load_study(planned.name) if check.storage is not None else None
        finished = finished_trial_count(study) if study is not None else 0
        count = planned.count
        total = options.search.total_for(enc)
        if total is not None:
            room = max(0, total - finished)
            count = room if count is None else min(count, room)
        facts = _facts(check, planned, study, finished, count)
        plans.append(
            StudyPlan(
                encoder=enc,
                study_name=planned.name,
                exists=study is not None,
                finished=finished,
                trials=count,
                epochs=_first_config(enc, check, _dims(check)[1]).epochs,
                stages=_stage_costs(facts, 1.0),
                facts=facts,
            )
        )
    return plans


def _facts(check: RunCheck, planned: PlannedStudy, study: Any, finished: int, count: int | None) -> StudyFacts:
    """The study as its stages are costed: its record (a new study's as it would be created) and the complete
    trials the search is planned to leave it."""
    kind = check.task_data.kind
    created = {**planned.attrs, "task_kind": kind}  # a new study's record as it would be created
    record = StudyRecord.from_attrs(planned.name, created) if study is None else study_record(study)
    complete = finished + (OPEN_ENDED_TRIALS if count is None else count)
    return StudyFacts(planned.name, record, check.options, kind, complete, study if count == 0 else None)


def _stage_costs(facts: StudyFacts, seconds: float) -> list[StageCost]:
    """What each registered stage that applies keeps after the search, its planned trials costing ``seconds``
    each: trial 1 the best and the start (trial 0) the second, so that no count comes out below what a stage
    may retrain, and each of an auto study's methods' best one more trial beyond them."""
    count = facts.complete
    methods = len((facts.record.identity and facts.record.identity.methods) or ())
    ranked = [1, 0, *range(2, count)] if count > 1 else list(range(count))
    bests = list(range(count, count + methods))
    trials = TrialCosts(dict.fromkeys(range(count + methods), seconds), ranked, 0, seconds, bests)
    return StageCosting(facts)(count, trials)


def _first_config(encoder: str, check: RunCheck, hidden_size: int | None) -> EncoderConfig:
    """The configuration a new study runs as trial 0 (recommended, epochs capped)."""

    if is_auto(encoder):  # an auto study starts with its first method's start
        encoder = auto_methods(check.options.search.methods, tagging=check.task_data.kind == "tagging")[0]
    params = recommended_params(encoder, hidden_size, check.model)
    with quiet_optuna_warnings():
        return suggest_capped(optuna.trial.FixedTrial(params), encoder, check.options.search.max_epochs)


def _needed_splits(check: RunCheck) -> list[str]:
    return ["train", "validation"] + (["test"] if check.options.final.seeds > 0 else [])


def _cached_keys(check: RunCheck) -> set:

    return {entry.key for entry in EmbeddingCache(check.spec.cache_dir).ls()}


def _dims(check: RunCheck) -> tuple[int, int, float]:

    known = known_model(check.model)
    if known is None:
        return _UNKNOWN_MODEL
    return known.num_layers, known.hidden_size, known.num_params


def may_be_long(check: RunCheck) -> bool:
    """Whether a pessimistic count of the run's work could exceed :data:`LONG_RUN_SECONDS`
    (only then does the runner spend seconds calibrating an estimate)."""
    options = check.options
    if options.search.timeout is not None and any(planned.count is None for planned in check.studies):
        return options.search.timeout * len(check.studies) > LONG_RUN_SECONDS
    layers, width, params = _dims(check)
    sizes = {name: len(check.task_data.splits[name]) for name in check.task_data.splits}
    rows = sizes.get("train", 0) + sizes.get("validation", 0)
    work = 0.0
    for planned in check.studies:
        enc, count = planned.encoder, planned.count
        trials = count if count is not None else options.search.total_for(enc) or 0
        runs = trials + sum(cost.trainings for cost in _stage_costs(_facts(check, planned, None, 0, trials), 1.0))
        epochs = _first_config(enc, check, width).epochs
        work += (
            runs * epochs * rows * layers * width * (layers if enc == "best-layer" else 1) * (options.search.cv or 1)
        )
    seconds = work * _PRIOR_TRAIN_SECONDS / max(1, options.runtime.workers)
    cached = _cached_keys(check)
    texts = sum(sizes.get(name, 0) for name in _needed_splits(check) if check.cache_keys.get(name) not in cached)
    seconds += texts * params * _PRIOR_EXTRACT_SECONDS
    return seconds > LONG_RUN_SECONDS


def estimate_run(check: RunCheck, *, calibrate: bool = True) -> RunPlan:
    """The :class:`RunPlan` of a checked run; with ``calibrate``, its measured wall-time estimate.

    Reads the cache (never writes it); loads the model only when a split the run
    needs is not cached, to time :data:`EXTRACTION_SAMPLE` texts.
    """
    options, spec = check.options, check.spec

    device = str(resolve_device(spec.device).type)
    splits = check.task_data.splits
    sizes: dict[str, int] = {name: len(splits[name]) for name in ("train", "validation", "test") if name in splits}
    cached_now = _cached_keys(check)
    needed = _needed_splits(check)
    cached = {name: check.cache_keys.get(name) in cached_now for name in needed}
    plan = RunPlan(
        model=check.model,
        task=check.task,
        storage=check.shown_url,
        studies=_study_plans(check),
        split_sizes=sizes,
        cached=cached,
        cache_keys={n: check.cache_keys.get(n, "") for n in needed},
        workers=options.runtime.workers,
        parallel=_parallel(options, device),
        threads=options.runtime.threads,
        device=device,
        final_seeds=options.final.seeds,
    )
    plan.texts_to_embed = sum(len(splits[name].flat_texts()) for name, hit in cached.items() if not hit)
    if options.data.zero_shot_tasks:
        plan.notes.append("zero-shot tasks are not in the estimate: each adds the scoring of its test split")
    if not calibrate:
        return plan
    _calibrate(check, plan, device)
    return plan


def _calibrate(check: RunCheck, plan: RunPlan, device: str) -> None:
    """Time each study's first config on a subset and fill in the plan's wall-time estimates."""

    options = check.options
    started = time.perf_counter()
    previous_threads = torch.get_num_threads()
    if options.runtime.threads is not None:
        torch.set_num_threads(options.runtime.threads)
    try:
        train, validation, how = _calibration_data(check, plan, device)
        timed, cpu = time.perf_counter(), time.process_time()
        for study in plan.studies:
            config = _first_config(study.encoder, check, plan.hidden_size)
            setup, per_epoch = _time_config(config.family, config, train, validation, check, plan, device)
            share = None if options.search.time_limit is None else options.search.time_limit / len(plan.studies)
            _estimate_study(study, options, plan.parallel, setup, per_epoch, share)
        plan.cpu_per_second = (time.process_time() - cpu) / max(1e-9, time.perf_counter() - timed)
    finally:
        torch.set_num_threads(previous_threads)
    plan.seconds = plan.extraction_seconds + sum(s.seconds for s in plan.studies)
    plan.calibration_seconds = time.perf_counter() - started
    plan.calibration = f"{how}, {CALIBRATION_EPOCHS} epochs of each first config in {plan.calibration_seconds:.0f} s"


def _estimate_study(
    study: StudyPlan, options: StudyOptions, parallel: int, setup: float, per_epoch: float, share: float | None
) -> None:
    """A study's trial and total seconds from its first config's setup and per-epoch times; under a time limit
    (its ``share`` of it) how that share splits into the search and each stage."""
    study.trial_seconds = setup + study.epochs * per_epoch
    search_trial = study.trial_seconds
    if options.search.cv:  # each trial trains one model per fold, on (cv - 1) / cv of the training rows
        search_trial = options.search.cv * setup + (options.search.cv - 1) * study.epochs * per_epoch
    if study.trials is None:  # no trial budget: the options' own check made sure of a timeout
        timeout = options.search.timeout
        trial_time = math.inf if timeout is None else timeout
    else:
        waves = math.ceil(study.trials / parallel)
        trial_time = waves * search_trial + (WORKER_START_SECONDS if options.runtime.workers > 1 else 0)
    if study.facts is not None:
        study.stages = _stage_costs(study.facts, study.trial_seconds)
    # a stage that retrains nothing counts its own seconds
    stages = sum(cost.trainings * study.trial_seconds if cost.trainings else cost.seconds for cost in study.stages)
    study.seconds = trial_time + stages
    if share is not None:
        study.time_split = TimeSplit.of(share, study.stages)
        study.seconds = min(study.seconds, share)


def _calibration_data(check: RunCheck, plan: RunPlan, device: str) -> tuple[Dataset, Dataset, str]:
    """Training and validation examples to time epochs on: the cached features, or random ones of their
    shape after timing the extraction of a few texts (which sets ``plan.extraction_seconds``)."""

    tagging = check.task_data.kind == "tagging"
    rows = calibration_counts(
        plan.split_sizes, min(plan.split_sizes["train"], CALIBRATION_SENTENCES if tagging else CALIBRATION_ROWS)
    )
    if plan.cached["train"] and plan.cached["validation"]:
        data = load_study_data(check.spec, with_test=False, progress=False, task_data=check.task_data)
        plan.num_layers, plan.hidden_size = data.num_layers, data.hidden_size
        train, validation = head(data.train, rows["train"]), head(data.validation, rows["validation"])
        if tagging:
            return train, validation, "cached word vectors"
        how = "cached features"
    else:
        layers, width = _time_extraction(check, plan, device)
        plan.num_layers, plan.hidden_size = layers, width
        if tagging:
            timing = "after timing the extraction" if plan.extraction_timed else _UNTIMED_WORDS
            how = f"random word vectors of the model's shape {timing} ({plan.texts_to_embed} sentences)"
            return *random_word_data(check.task_data, rows, layers, width), how
        generator = torch.Generator().manual_seed(0)
        pair = (2,) if check.task_data.kind == "similarity" else ()
        train, validation = (
            (
                torch.randn((rows[name], *pair, layers, width), generator=generator).half(),
                torch.from_numpy(np.asarray(check.task_data.splits[name].labels[: rows[name]])),
            )
            for name in ("train", "validation")
        )
        timing = f"after timing {EXTRACTION_SAMPLE} texts' extraction" if plan.extraction_timed else _UNTIMED
        how = f"random features of the model's shape {timing} ({plan.texts_to_embed} texts to embed)"
    if not plan.cached.get("test", True):
        how += f"; test split to embed ({len(check.task_data.splits['test'])} rows)"
    return train, validation, how


def _time_extraction(check: RunCheck, plan: RunPlan, device: str) -> tuple[int, int]:
    """Load the model, embed a seeded sample of the texts to embed; set ``plan.extraction_seconds``.
    Returns the model's layers and width. A GGUF model not converted yet is not loaded (that would write
    its converted folder): its extraction is estimated instead."""

    if check.spec.source is not None and pending_conversion(check.spec.source):
        return _estimate_extraction(check, plan)
    texts = [text for name, hit in plan.cached.items() if not hit for text in check.task_data.splits[name].flat_texts()]
    sample = random.Random(0).sample(texts, min(EXTRACTION_SAMPLE, len(texts)))
    embedder = LayerEmbedder(check.spec.model_or_source, device=check.spec.device, cache_dir=check.spec.cache_dir)
    try:
        started = time.perf_counter()
        embedder.load()
        loaded = time.perf_counter()
        embedder.embed(sample, progress=False)
        per_text = (time.perf_counter() - loaded) / len(sample)
        plan.extraction_seconds = (loaded - started) + per_text * len(texts)
        return embedder.num_layers, embedder.hidden_size
    finally:
        embedder.unload()


def _time_config(
    encoder: str,
    config: EncoderConfig,
    train: Dataset,
    validation: Dataset,
    check: RunCheck,
    plan: RunPlan,
    device: str,
) -> tuple[float, float]:
    """``(set-up seconds, seconds per epoch on the full splits)`` of one trial of ``config``."""

    if plan.num_layers is None:  # _calibration_data sets it before any config is timed
        raise RuntimeError("the calibration data did not say how many layers the model has")
    last_layer = plan.num_layers - 1
    scale = plan.split_sizes["train"] / rows_of(train)
    task_kind = check.task_data.kind
    num_classes = len(check.task_data.label_names) if task_kind in ("classification", "tagging") else None
    common: dict[str, Any] = dict(
        task_kind=task_kind,
        num_classes=num_classes,
        seed=check.options.search.seed or 0,
        device=check.spec.device,
        recipe=TrainingRecipe(patience=None),
    )
    # an untimed epoch on a few rows first: the first call of an encoder pays one-time imports and set-up
    few = min(rows_of(train), WARM_UP_ROWS)
    warm_up = head(train, few), head(validation, few)
    if encoder == "best-layer":  # one probe per layer: time the last layer's for 1 and for 3 epochs
        assert isinstance(config, BestLayerConfig)
        engine.select_best_layer(dataclasses.replace(config, epochs=1), *warm_up, layers=[last_layer], **common)
        times = []
        for epochs in (1, CALIBRATION_EPOCHS):
            started = time.perf_counter()
            engine.select_best_layer(
                dataclasses.replace(config, epochs=epochs), train, validation, layers=[last_layer], **common
            )
            times.append(time.perf_counter() - started)
        per_epoch = max(0.0, times[1] - times[0]) / (CALIBRATION_EPOCHS - 1)
        return plan.num_layers * max(0.0, times[0] - per_epoch), plan.num_layers * per_epoch * scale
    engine.train_encoder(config.replace(epochs=1), *warm_up, **common)
    stamps: list[float] = []
    started = time.perf_counter()
    engine.train_encoder(
        config.replace(epochs=CALIBRATION_EPOCHS),
        train,
        validation,
        epoch_callback=lambda epoch, value: stamps.append(time.perf_counter()),
        **common,
    )
    per_epoch = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
    return max(0.0, stamps[0] - started - per_epoch), per_epoch * scale


def _estimate_extraction(check: RunCheck, plan: RunPlan) -> tuple[int, int]:
    """The extraction of a model that cannot be loaded without writing, from the model table's size and the
    prior rate per parameter; says so in a note, with what the real run would write. Returns layers and width."""

    assert check.spec.source is not None
    layers, width, params = _dims(check)
    plan.extraction_seconds = plan.texts_to_embed * params * _PRIOR_EXTRACT_SECONDS
    plan.extraction_timed = False
    shape = (
        "the model table" if known_model(check.model) else f"an assumed {layers} layers x {width} (not in the table)"
    )
    written = conversion_bytes(check.spec.source)
    size = f"about {format_bytes(written)}" if written else "float32 weights, about 4 bytes per parameter"
    plan.notes.append(
        f"the model is a GGUF file not converted yet and a dry run writes nothing, so the extraction time is "
        f"estimated from {shape}, not measured; the run itself first dequantises it once into "
        f"{check.spec.source.path} ({size})"
    )
    return layers, width
