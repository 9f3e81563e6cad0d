"""Commands that run and list studies: ``run``, ``sweep``, ``studies``."""

from __future__ import annotations

import click

from ..configs import BASELINE_FAMILIES, ENCODER_FAMILIES, TAGGER_FAMILIES
from ..settings import Settings
from ..tuning import PRUNERS, SAMPLERS
from .group import (
    FORMAT_OPTION,
    cli,
    echo_frame,
    location_options,
    print_results,
    storage_option,
    study_logging,
    study_option,
)

# the choices of options whose library constant lives in a module that imports numpy or the study runner:
# copied here so that `ilge-search --help` stays fast (tests/test_cli_choices.py checks they are equal)
SELECT_CHOICES = ("best", "one-se")  # ilge_search.study.selection.SELECTION_RULES
PROTOCOL_CHOICES = ("matched", "paper")  # ilge_search.protocol.PROTOCOLS
WORD_POOLINGS = ("first", "mean")  # ilge_search.words.WORD_POOLINGS

_ENCODER_HELP = (
    "Encoder family or baseline; repeat it, or 'all' "
    f"({', '.join(ENCODER_FAMILIES)} and the baselines {', '.join(BASELINE_FAMILIES)}; for a tagging task also "
    f"{', '.join(TAGGER_FAMILIES)}: the Cayley graph over each word's own layers)."
)


def _checked_objectives(objectives, select, final_front) -> tuple:
    """The run's objectives, refusing --select with several and --final-front with one."""
    from ..objectives import check_objectives

    checked = check_objectives(objectives or None)
    if len(checked) > 1 and select:
        raise click.UsageError(
            "--select picks one trial; a study with several objectives retrains its Pareto "
            "front instead (--final-front K): drop --select"
        )
    if len(checked) == 1 and final_front is not None:
        raise click.UsageError(
            "--final-front is for studies with several objectives; add e.g. --objective score "
            "--objective params, or drop --final-front"
        )
    return tuple(checked)


def _columns(text_col, label_col, text_cols, score_col, tokens_col, tags_col) -> dict:
    """The custom task's column options, as the study options name them."""
    sequence = dict(text_col=text_col, label_col=label_col, text_cols=text_cols, score_col=score_col)
    return sequence | dict(tokens_col=tokens_col, tags_col=tags_col)


@cli.command("run")
@click.option("--model", "-m", required=True, help="Model alias (minilm-l6, smollm2-135m), local folder or HF id.")
@click.option(
    "--task",
    "-t",
    required=True,
    help="Registered task name (banking77, trec, stsb ...) or a CSV/TSV/JSONL/Parquet task file or folder.",
)
@click.option("--encoder", "-e", "encoders", multiple=True, default=("cayley",), show_default=True, help=_ENCODER_HELP)
@study_option(
    "--n-trials",
    type=click.IntRange(min=0),
    default=None,
    field="n_trials",
    more="[default: {default}; with --total-trials: until the cap]",
)
@study_option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None, field="timeout")
@study_option("--total-trials", type=click.IntRange(min=1), default=None, field="total_trials")
@storage_option()
@study_option("--study-name", default=None, field="study_name")
@study_option("--sampler", type=click.Choice(SAMPLERS), default="tpe", show_default=True, field="sampler")
@study_option("--pruner", type=click.Choice(PRUNERS), default="median", show_default=True, field="pruner")
@study_option("--seed", type=int, default=0, show_default=True, field="seed")
@study_option("--workers", type=click.IntRange(min=1), default=1, show_default=True, field="workers")
@study_option("--final-seeds", type=click.IntRange(min=0), default=3, show_default=True, field="final_seeds")
@study_option("--shots", type=click.IntRange(min=1), default=None, field="shots")
@study_option("--max-train", type=click.IntRange(min=1), default=None, field="max_train")
@study_option("--max-eval", type=click.IntRange(min=1), default=None, field="max_eval")
@study_option("--max-epochs", type=click.IntRange(min=1), default=None, field="max_epochs")
@study_option(
    "--word-pooling", type=click.Choice(WORD_POOLINGS), default="first", show_default=True, field="word_pooling"
)
@study_option("--cv", type=click.IntRange(min=2), default=None, field="cv")
@study_option("--warm-start", type=click.IntRange(min=0), default=0, show_default=True, field="warm_start")
@study_option(
    "--select",
    type=click.Choice(SELECT_CHOICES),
    default=None,
    field="select",
    more="[default: {default}]",
)
@study_option(
    "--objective",
    "objectives",
    multiple=True,
    field="objectives",
    more="Repeat it. [default: {default}]",
)
@study_option(
    "--final-front",
    type=click.IntRange(min=1),
    default=None,
    field="final_front",
    more="[default: {default}]",
)
@study_option(
    "--protocol", type=click.Choice(PROTOCOL_CHOICES), default=PROTOCOL_CHOICES[0], show_default=True, field="protocol"
)
@study_option("--samples-per-label", type=click.IntRange(min=1), default=None, field="samples_per_label")
@study_option("--ensemble", type=click.IntRange(min=0), default=None, field="ensemble")
@study_option("--zero-shot", "zero_shot_tasks", multiple=True, field="zero_shot_tasks", more="Repeat it.")
@study_option("--artifact-dir", type=click.Path(file_okay=False), default=None, field="artifact_dir")
@study_option("--threads", type=click.IntRange(min=1), default=None, field="threads")
@study_option("--text-col", default=None, field="text_col")
@study_option("--label-col", default=None, field="label_col")
@study_option("--text-cols", default=None, field="text_cols")
@study_option("--score-col", default=None, field="score_col")
@study_option("--tokens-col", default=None, field="tokens_col")
@study_option("--tags-col", default=None, field="tags_col")
@study_option(
    "--heartbeat-interval",
    type=click.IntRange(min=1),
    default=60,
    show_default=True,
    field="heartbeat_interval",
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
    n_trials: int | None,
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
    word_pooling: str,
    cv,
    warm_start: int,
    select,
    objectives,
    final_front,
    protocol: str,
    samples_per_label,
    ensemble,
    zero_shot_tasks,
    artifact_dir,
    threads,
    text_col,
    label_col,
    text_cols,
    score_col,
    tokens_col,
    tags_col,
    heartbeat_interval: int,
    dry_run: bool,
    quiet: bool,
) -> None:
    """Search encoder hyperparameters with Optuna on a model's cached task embeddings.

    Rerunning the same command resumes each study and adds --n-trials trials.
    """
    from ..study import StudyOptions, run_study

    objectives = _checked_objectives(objectives, select, final_front)
    study_logging(quiet)
    options = StudyOptions.from_flat(
        n_trials=20 if n_trials is None and total_trials is None else n_trials,
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
        word_pooling=word_pooling,
        cv=cv,
        warm_start=warm_start,
        **({"select": select} if select else {}),
        objectives=objectives,
        **({"final_front": final_front} if final_front else {}),
        protocol=protocol,
        samples_per_label=samples_per_label,
        **({"ensemble": ensemble} if ensemble is not None else {}),
        zero_shot_tasks=tuple(zero_shot_tasks),
        data_dir=settings.data_dir,
        cache_dir=settings.cache_dir,
        device=settings.device,
        artifact_dir=artifact_dir,
        threads=threads,
        **_columns(text_col, label_col, text_cols, score_col, tokens_col, tags_col),
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
@study_option(
    "--workers", type=click.IntRange(min=1), default=None, field="workers", more="Overrides the grid's workers."
)
@study_option(
    "--threads", type=click.IntRange(min=1), default=None, field="threads", more="Overrides the grid's threads."
)
@click.option("--model", "models", multiple=True, help="Run only this model (repeatable).")
@click.option("--task", "tasks", multiple=True, help="Run only this task (repeatable).")
@click.option("--encoder", "encoders", multiple=True, help="Run only this encoder (repeatable).")
@study_option("--artifact-dir", type=click.Path(file_okay=False), default=None, field="artifact_dir")
@study_option("--cv", type=click.IntRange(min=2), default=None, field="cv", more="Overrides the grid's cv.")
@study_option(
    "--select",
    type=click.Choice(SELECT_CHOICES),
    default=None,
    field="select",
    more="Overrides the grid's select. [default: {default}]",
)
@study_option(
    "--protocol",
    type=click.Choice(PROTOCOL_CHOICES),
    default=None,
    field="protocol",
    more="Overrides the grid's protocol.",
)
@study_option(
    "--samples-per-label",
    type=click.IntRange(min=1),
    default=None,
    field="samples_per_label",
    more="Overrides the grid's.",
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
@FORMAT_OPTION
def studies_command(storage, fmt: str) -> None:
    """List the studies in a storage: trials, best validation value, final test mean +- std."""
    from ..study import list_studies

    echo_frame(list_studies(storage), fmt, empty="no studies in this storage")


@cli.command("ensemble")
@storage_option()
@click.option("--study", "study_name", required=True, help="The study (see `ilge-search studies`).")
@click.option(
    "--size", "-k", type=click.IntRange(min=1), required=True, help="Ensemble size K: greedy picks, with replacement."
)
@click.option(
    "--also",
    "sizes",
    type=click.IntRange(min=1),
    multiple=True,
    help="Score these sizes too (repeatable; one selection gives every size up to the largest).",
)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="The study's training seed (run --seed): retrains trials that stored no validation predictions.",
)
@study_option("--artifact-dir", type=click.Path(file_okay=False), default=None, field="artifact_dir")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars or log lines; only the result table.")
@location_options
def ensemble_command(settings: Settings, storage, study_name: str, size: int, sizes, seed: int, artifact_dir, quiet):
    """Select an ensemble of a study's trials on validation and score it on test beside the selected trial.

    Greedy forward selection with replacement (Caruana et al., 2004) over the complete trials' validation
    predictions (trials stored without them are retrained once with --seed to make them); the members are
    retrained with the final evaluation's seeds and scored on test, next to the selected trial, the starting
    configuration and the best single layer, with the same seeds. `export --ensemble` writes the result.
    """
    from ..study.ensemble import ensemble_study, format_ensemble

    study_logging(quiet)
    record = ensemble_study(
        storage,
        study_name,
        size,
        sizes=sizes,
        seed=seed,
        data_dir=settings.data_dir,
        cache_dir=settings.cache_dir,
        device=settings.device,
        artifact_dir=artifact_dir,
        progress=not quiet,
    )
    click.echo(format_ensemble(record))
