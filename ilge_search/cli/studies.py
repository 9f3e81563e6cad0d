"""Commands that run and list studies: ``run``, ``sweep``, ``studies``."""

from __future__ import annotations

from typing import Optional

import click

from ..settings import Settings
from ..tuning import PRUNERS, SAMPLERS
from .group import cli, echo_frame, location_options, print_results, storage_option, study_logging

_SELECT_CHOICES = ("best", "one-se")
_CV_HELP = (
    "Score each trial on K stratified folds of the training data (mean over folds) instead of the "
    "validation split; a :cvK study of its own."
)
_SELECT_HELP = (
    "Trial the final evaluation retrains: 'best' (best objective) or 'one-se' (fewest parameters "
    "within one standard error of the best; the start configuration wins ties) [default: one-se]."
)

# = protocol.PROTOCOLS (kept import-free)
_PROTOCOL_CHOICES = ("matched", "paper")
_PROTOCOL_HELP = (
    "How final scores are measured: 'matched' (each method trained with its head on the same data) "
    "or 'paper' (MTEB's logistic-regression readout of the vectors on a few examples per label, "
    "cosine Spearman for similarity; parameter-free baselines untrained); a :paper study of its own."
)
_SPL_HELP = "The paper protocol's training examples per label [default: the MTEB task's own (Emotion 16), else 8]."

_ENCODER_HELP = "Encoder family or baseline; repeat it, or 'all' (cayley, fc, deepset and the five baselines)."
_OBJECTIVE_HELP = (
    "What each trial optimises; repeat it: 'score' (maximised), 'params' (trainable parameters) and "
    "'latency' (forward ms per 1,000 samples on this device), minimised. Several make a "
    "multi-objective study (its own :obj-... study; no pruning; its Pareto front is retrained) "
    "[default: score]."
)
_FRONT_HELP = (
    "Multi-objective studies: retrain at most this many Pareto-front trials with the final seeds, spread "
    "along the front from the best score to the smallest [default: 5]."
)


@cli.command("run")
@click.option("--model", "-m", required=True, help="Model alias (minilm-l6, smollm2-135m), local folder or HF id.")
@click.option(
    "--task",
    "-t",
    required=True,
    help="Registered task name (banking77, trec, stsb ...) or a CSV/TSV/JSONL/Parquet task file or folder.",
)
@click.option("--encoder", "-e", "encoders", multiple=True, default=("cayley",), show_default=True, help=_ENCODER_HELP)
@click.option(
    "--n-trials",
    type=click.IntRange(min=0),
    default=None,
    help="Trials to add to each study in this run (split across workers) "
    "[default: 20; with --total-trials: until the cap].",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds per study after which no new trial starts.",
)
@click.option(
    "--total-trials",
    type=click.IntRange(min=1),
    default=None,
    help="Cap on each study's complete + pruned + running trials, shared by every process and node on the storage.",
)
@storage_option()
@click.option("--study-name", default=None, help="Study name (one encoder only) [default: model:task:encoder].")
@click.option("--sampler", type=click.Choice(list(SAMPLERS)), default="tpe", show_default=True)
@click.option("--pruner", type=click.Choice(list(PRUNERS)), default="median", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds the sampler and every trial's training.")
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Parallel worker processes on the same storage.",
)
@click.option(
    "--final-seeds",
    type=click.IntRange(min=0),
    default=3,
    show_default=True,
    help="Retrain the best config with this many seeds and score each on test once (0: skip).",
)
@click.option("--shots", type=click.IntRange(min=1), default=None, help="Training examples per label (few-shot).")
@click.option(
    "--max-train", type=click.IntRange(min=1), default=None, help="Cap on training examples (seeded, stratified)."
)
@click.option(
    "--max-eval",
    type=click.IntRange(min=1),
    default=None,
    help="Cap on validation and test examples each (seeded, stratified; for quick runs).",
)
@click.option("--max-epochs", type=click.IntRange(min=1), default=None, help="Cap on every config's epochs.")
@click.option("--cv", type=click.IntRange(min=2), default=None, help=_CV_HELP)
@click.option("--select", type=click.Choice(list(_SELECT_CHOICES)), default=None, help=_SELECT_HELP)
@click.option("--objective", "objectives", multiple=True, help=_OBJECTIVE_HELP)
@click.option("--final-front", type=click.IntRange(min=1), default=None, help=_FRONT_HELP)
@click.option(
    "--protocol", type=click.Choice(list(_PROTOCOL_CHOICES)), default="matched", show_default=True, help=_PROTOCOL_HELP
)
@click.option("--samples-per-label", type=click.IntRange(min=1), default=None, help=_SPL_HELP)
@click.option(
    "--zero-shot",
    "zero_shot_tasks",
    multiple=True,
    help="Similarity task to also score each final model on (repeatable; similarity studies only).",
)
@click.option(
    "--artifact-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Artifact store for the best weights [default: next to a SQLite file, else studies/artifacts].",
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=None,
    help="Torch CPU threads per process [default: unchanged; cpus/workers per worker]. "
    "The encoders are small: on a CPU, 1 thread per worker and --workers = cores is usually fastest.",
)
@click.option(
    "--heartbeat-interval",
    type=click.IntRange(min=1),
    default=60,
    show_default=True,
    help="Seconds between trial heartbeats; a trial silent for twice as long is failed and retried.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the plan (studies, trials, data sizes, epochs, workers, what is cached) and its wall time "
    "estimated from a few measured epochs, then exit: nothing is created or written.",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bars or log lines; only the result table.")
@location_options
def run_command(
    settings: Settings,
    model: str,
    task: str,
    encoders,
    n_trials: Optional[int],
    timeout,
    total_trials,
    storage,
    study_name,
    sampler: str,
    pruner: str,
    seed: int,
    workers: int,
    final_seeds: int,
    shots,
    max_train,
    max_eval,
    max_epochs,
    cv,
    select,
    objectives,
    final_front,
    protocol: str,
    samples_per_label,
    zero_shot_tasks,
    artifact_dir,
    threads,
    heartbeat_interval: int,
    dry_run: bool,
    quiet: bool,
) -> None:
    """Search encoder hyperparameters with Optuna on a model's cached task embeddings.

    Rerunning the same command resumes each study and adds --n-trials trials.
    """
    from ..objectives import check_objectives
    from ..study import StudyOptions, run_study

    objectives = check_objectives(objectives or None)
    if len(objectives) > 1 and select:
        raise click.UsageError(
            "--select picks one trial; a study with several objectives retrains its Pareto "
            "front instead (--final-front K): drop --select"
        )
    if len(objectives) == 1 and final_front is not None:
        raise click.UsageError(
            "--final-front is for studies with several objectives; add e.g. --objective score "
            "--objective params, or drop --final-front"
        )
    study_logging(quiet)
    if n_trials is None and total_trials is None:
        n_trials = 20
    options = StudyOptions.from_flat(
        n_trials=n_trials,
        timeout=timeout,
        total_trials=total_trials,
        study_name=study_name,
        sampler=sampler,
        pruner=pruner,
        seed=seed,
        workers=workers,
        final_seeds=final_seeds,
        shots=shots,
        max_train=max_train,
        max_eval=max_eval,
        max_epochs=max_epochs,
        cv=cv,
        **({"select": select} if select else {}),
        objectives=objectives,
        **({"final_front": final_front} if final_front else {}),
        protocol=protocol,
        samples_per_label=samples_per_label,
        zero_shot_tasks=tuple(zero_shot_tasks),
        data_dir=settings.data_dir,
        cache_dir=settings.cache_dir,
        device=settings.device,
        artifact_dir=artifact_dir,
        threads=threads,
        heartbeat_interval=heartbeat_interval,
        progress=not quiet,
    )
    if dry_run:
        from ..study import plan_run

        click.echo(plan_run(model, task, list(encoders), storage=storage, options=options).describe())
        return
    try:
        results = run_study(model, task, list(encoders), storage=storage, options=options)
    except KeyboardInterrupt:
        click.echo(
            "interrupted: the running trial is marked FAIL, finished trials are stored; "
            "rerun the same command to resume",
            err=True,
        )
        raise SystemExit(130) from None
    print_results(results)


@cli.command("sweep")
@click.argument("grid", type=click.Path(exists=True, dir_okay=False))
@storage_option(default_text="the grid's storage, else sqlite:///studies/ilge.db")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Overrides the grid's workers.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="Overrides the grid's threads.")
@click.option("--model", "models", multiple=True, help="Run only this model (repeatable).")
@click.option("--task", "tasks", multiple=True, help="Run only this task (repeatable).")
@click.option("--encoder", "encoders", multiple=True, help="Run only this encoder (repeatable).")
@click.option("--artifact-dir", type=click.Path(file_okay=False), default=None, help="Artifact store folder.")
@click.option("--cv", type=click.IntRange(min=2), default=None, help=_CV_HELP + " Overrides the grid's cv.")
@click.option(
    "--select",
    type=click.Choice(list(_SELECT_CHOICES)),
    default=None,
    help=_SELECT_HELP + " Overrides the grid's select.",
)
@click.option(
    "--protocol",
    type=click.Choice(list(_PROTOCOL_CHOICES)),
    default=None,
    help=_PROTOCOL_HELP + " Overrides the grid's protocol.",
)
@click.option(
    "--samples-per-label", type=click.IntRange(min=1), default=None, help=_SPL_HELP + " Overrides the grid's."
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Show each study's budget and what is left to run, and each run's plan and estimated wall time "
    "(as `run --dry-run`), then exit.",
)
@click.option(
    "--estimate/--no-estimate",
    default=True,
    show_default=True,
    help="With --dry-run: measure each run's wall time (needs the task data; a few seconds per encoder).",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bars or log lines.")
@location_options
def sweep_command(
    settings: Settings,
    grid: str,
    storage,
    workers,
    threads,
    models,
    tasks,
    encoders,
    artifact_dir,
    cv,
    select,
    protocol,
    samples_per_label,
    dry_run: bool,
    estimate: bool,
    quiet: bool,
) -> None:
    """Run a TOML grid of models x tasks x encoders up to its trial budgets (resumable)."""
    from ..study import SweepFilter, SweepOverrides, plan_sweep, run_sweep
    from ..study.plan import format_seconds

    study_logging(quiet)
    overrides = SweepOverrides(
        cv=cv, protocol=protocol, samples_per_label=samples_per_label, select=select, workers=workers, threads=threads
    )
    only = SweepFilter(models=models, tasks=tasks, encoders=encoders)
    if dry_run:
        from ..study import estimate_sweep

        click.echo(plan_sweep(grid, storage=storage, overrides=overrides).to_string(index=False))
        if not estimate:
            return
        plans = estimate_sweep(
            grid,
            storage=storage,
            only=only,
            overrides=overrides,
            data_dir=settings.data_dir,
            cache_dir=settings.cache_dir,
            device=settings.device,
        )
        for plan in plans:
            click.echo("")
            click.echo(plan.describe())
        click.echo(f"\nsweep total: estimated wall time {format_seconds(sum(p.seconds for p in plans))}")
        return
    try:
        results = run_sweep(
            grid,
            storage=storage,
            only=only,
            overrides=overrides,
            data_dir=settings.data_dir,
            cache_dir=settings.cache_dir,
            device=settings.device,
            artifact_dir=artifact_dir,
            progress=not quiet,
        )
    except KeyboardInterrupt:
        click.echo("interrupted: finished trials are stored; rerun the same command to resume", err=True)
        raise SystemExit(130) from None
    print_results(results)


@cli.command("studies")
@storage_option()
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True)
def studies_command(storage, fmt: str) -> None:
    """List the studies in a storage: trials, best validation value, final test mean +- std."""
    from ..study import list_studies

    echo_frame(list_studies(storage), fmt, empty="no studies in this storage")
