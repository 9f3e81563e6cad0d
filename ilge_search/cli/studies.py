"""Commands that run and list studies: ``run``, ``sweep``, ``studies``."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import click

from ..encoders import baseline_families, encoder_families, tagger_families
from ..settings import Settings
from .group import (
    FORMAT_OPTION,
    StudyCommand,
    cli,
    echo_frame,
    flag,
    int_option,
    location_options,
    print_results,
    storage_option,
    study_logging,
    study_options,
)

if TYPE_CHECKING:
    from ..study.grid import SweepFilter, SweepOverrides

_ENCODER_HELP = (
    "Encoder family or baseline; repeat it, or 'all' "
    f"({', '.join(encoder_families())} and the baselines {', '.join(baseline_families())}; for a tagging task also "
    f"{', '.join(tagger_families())}: the Cayley graph over each word's own layers); or 'auto': one study that "
    "searches the method (--methods) with its settings."
)


def _checked_objectives(objectives, select, final_front) -> tuple:
    """The run's objectives, refusing --select with several and --final-front with one."""
    from ..study.objectives import check_objectives  # heavy: not loaded for --help

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


@cli.command("run", cls=StudyCommand)
@click.option("--model", "-m", required=True, help="Model alias (minilm-l6, smollm2-135m), local folder or HF id.")
@click.option(
    "--task",
    "-t",
    required=True,
    help="Registered task name (banking77, trec, stsb ...) or a CSV/TSV/JSONL/Parquet task file or folder.",
)
@click.option("--encoder", "-e", "encoders", multiple=True, default=("cayley",), show_default=True, help=_ENCODER_HELP)
@storage_option()
@study_options()
@flag(
    "--dry-run",
    help="Print the plan (studies, trials, data sizes, epochs, workers, what is cached) and its wall time "
    "estimated from a few measured epochs, then exit: nothing is created or written.",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bars or log lines; only the result table.")
@location_options
def run_command(
    settings: Settings,
    model: str,
    task: str,
    encoders: tuple[str, ...],
    storage: str | None,
    dry_run: bool,
    quiet: bool,
    **study: Any,
) -> None:
    """Search encoder hyperparameters with Optuna on a model's cached task embeddings.

    Rerunning the same command resumes each study and adds --n-trials trials.
    """
    from ..study.options import from_command_line  # heavy: not loaded for --help
    from ..study.runner import run_study  # heavy: not loaded for --help

    study["objectives"] = _checked_objectives(study["objectives"], study["select"], study["final_front"])
    study_logging(quiet)
    options = from_command_line({**study, **asdict(settings), "progress": not quiet})
    if dry_run:
        from ..study.plan import plan_run  # heavy: not loaded for --help

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
    _print_leaderboards(results)


def _print_leaderboards(results: list) -> None:
    """The leaderboard of each auto study the run made one for, after the result table."""
    from ..study.leaderboard import format_table  # heavy: not loaded for --help

    for result in results:
        if result.leaderboard is not None:
            click.echo(f"\nleaderboard of {result.study_name}:\n{format_table(result.leaderboard)}")


@cli.command("sweep", cls=StudyCommand)
@click.argument("grid", type=click.Path(exists=True, dir_okay=False))
@storage_option(default_text="the grid's storage, else sqlite:///studies/ilge.db")
@study_options("workers", "threads", overrides=True)
@click.option("--model", "models", multiple=True, help="Run only this model (repeatable).")
@click.option("--task", "tasks", multiple=True, help="Run only this task (repeatable).")
@click.option("--encoder", "encoders", multiple=True, help="Run only this encoder (repeatable).")
@study_options("artifact_dir")
@study_options("cv", "select", "protocol", "samples_per_label", overrides=True)
@flag(
    "--dry-run",
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
    storage: str | None,
    models: tuple[str, ...],
    tasks: tuple[str, ...],
    encoders: tuple[str, ...],
    artifact_dir: str | None,
    dry_run: bool,
    estimate: bool,
    quiet: bool,
    **overridden: Any,
) -> None:
    """Run a TOML grid of models x tasks x encoders up to its trial budgets (resumable)."""
    from ..study.grid import SweepFilter, SweepOverrides  # heavy: not loaded for --help
    from ..study.sweep import SweepRuntime, run_sweep  # heavy: not loaded for --help

    study_logging(quiet)
    overrides = SweepOverrides(**overridden)
    only = SweepFilter(models=models, tasks=tasks, encoders=encoders)
    if dry_run:
        _sweep_dry_run(settings, grid, storage, only, overrides, estimate)
        return
    try:
        results = run_sweep(
            grid,
            storage=storage,
            only=only,
            overrides=overrides,
            runtime=SweepRuntime(**asdict(settings), artifact_dir=artifact_dir, progress=not quiet),
        )
    except KeyboardInterrupt:
        click.echo("interrupted: finished trials are stored; rerun the same command to resume", err=True)
        raise SystemExit(130) from None
    print_results(results)


def _sweep_dry_run(
    settings: Settings, grid: str, storage: str | None, only: SweepFilter, overrides: SweepOverrides, estimate: bool
) -> None:
    """Print the grid's budgets and, with ``estimate``, each run's plan and the sweep's estimated wall time."""
    from ..study.plan import format_seconds  # heavy: not loaded for --help
    from ..study.sweep import estimate_sweep, plan_sweep  # heavy: not loaded for --help

    click.echo(plan_sweep(grid, storage=storage, overrides=overrides).to_string(index=False))
    if not estimate:
        return
    plans = estimate_sweep(grid, storage=storage, only=only, overrides=overrides, **asdict(settings))
    for plan in plans:
        click.echo("")
        click.echo(plan.describe())
    click.echo(f"\nsweep total: estimated wall time {format_seconds(sum(p.seconds for p in plans))}")


@cli.command("studies")
@storage_option()
@FORMAT_OPTION
def studies_command(storage, fmt: str) -> None:
    """List the studies in a storage: trials, best validation value, final test mean +- std."""
    from ..study.results import list_studies  # heavy: not loaded for --help

    echo_frame(list_studies(storage), fmt, empty="no studies in this storage")


@cli.command("ensemble", cls=StudyCommand)
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
@int_option(
    "--seed",
    minimum=0,
    default=0,
    help="The study's training seed (run --seed): retrains trials that stored no validation predictions.",
)
@study_options("artifact_dir")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars or log lines; only the result table.")
@location_options
def ensemble_command(settings: Settings, storage, study_name: str, size: int, sizes, seed: int, artifact_dir, quiet):
    """Select an ensemble of a study's trials on validation and score it on test beside the selected trial.

    Greedy forward selection with replacement (Caruana et al., 2004) over the complete trials' validation
    predictions (trials stored without them are retrained once with --seed to make them); the members are
    retrained with the final evaluation's seeds and scored on test, next to the selected trial, the starting
    configuration and the best single layer, with the same seeds. `export --ensemble` writes the result.
    """
    from .ensemble import EnsembleRequest, ensemble_study, format_ensemble  # heavy: numpy, torch, optuna

    study_logging(quiet)
    request = EnsembleRequest(study_name, size, tuple(sizes), seed, artifact_dir, progress=not quiet)
    click.echo(format_ensemble(ensemble_study(storage, request, settings)))
