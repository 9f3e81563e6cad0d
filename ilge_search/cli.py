"""The ``ilge-search`` command line.

The group builds one :class:`~ilge_search.settings.Settings`; each subcommand
parses its options and calls one library function. ``--cache-dir``,
``--data-dir`` and ``--device`` are accepted on the group and on each
subcommand (the subcommand's value wins); ``--storage`` is declared once
(:func:`storage_option`). A ``ValueError`` from the library (bad argument,
unknown task or model, unreachable storage ...) becomes a one-line click error
with exit status 1, in one place (:class:`IlgeGroup`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import click

from ._version import __version__
from .settings import Settings, default_storage_url
from .tuning import PRUNERS, SAMPLERS

__all__ = ["cli", "main", "IlgeGroup", "location_options", "storage_option"]

STORAGE_HELP = "Optuna RDB URL of the studies, e.g. sqlite:///studies/ilge.db or postgresql://user@host:5432/db"


class IlgeGroup(click.Group):
    """A click group whose subcommands' ``ValueError`` is a click error: its message, exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc


def storage_option(*, required: bool = False, default_text: Optional[str] = None) -> Callable:
    """The ``--storage`` option of every command that reads or writes studies.

    Optional by default (``None``: ``sqlite:///studies/ilge.db``, or what
    ``default_text`` says); ``required=True`` for commands that must be told
    which storage to read.
    """
    if required:
        shown = ""
    else:
        shown = f" [default: {default_text or default_storage_url()}]"
    return click.option("--storage", default=None, required=required, help=STORAGE_HELP + "." + shown)


def location_options(func: Callable) -> Callable:
    """Add --cache-dir/--data-dir/--device to a subcommand and pass ``settings``."""

    @click.option(
        "--cache-dir",
        type=click.Path(file_okay=False),
        default=None,
        help="Embedding cache (default: $ILGE_SEARCH_CACHE or ~/.cache/ilge-search).",
    )
    @click.option(
        "--data-dir",
        type=click.Path(file_okay=False),
        default=None,
        help="Offline task data in the shared JSONL layout (default: $ILGE_SEARCH_DATA).",
    )
    @click.option("--device", default=None, help="auto, cpu, cuda, cuda:1, mps ...")
    @click.pass_obj
    @functools.wraps(func)
    def wrapper(settings: Settings, cache_dir: Optional[str], data_dir: Optional[str], device: Optional[str], **kwargs):
        settings = (settings or Settings()).updated(cache_dir=cache_dir, data_dir=data_dir, device=device)
        return func(settings, **kwargs)

    return wrapper


@click.group(cls=IlgeGroup)
@click.version_option(__version__, prog_name="ilge-search")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None, help="Embedding cache directory.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None, help="Offline task data directory.")
@click.option("--device", default="auto", show_default=True, help="Device for extraction and training.")
@click.pass_context
def cli(ctx: click.Context, cache_dir: Optional[str], data_dir: Optional[str], device: str) -> None:
    """ILGE encoders over every layer of a frozen LLM, and Optuna searches over them."""
    ctx.obj = Settings().updated(cache_dir=cache_dir, data_dir=data_dir, device=device)


def main() -> None:  # console-script entry point
    cli()


# Subcommands are defined below, one block per library entry point.


# ----------------------------------------------------------------------------- run / sweep / studies


# the loggers of the study runner and sweeps (ilge_search.study.runner, .sweep ... log through their
# package's logger), of the storage's dead-worker repair, and of the live trial notes
_STUDY_LOGGERS = ("ilge_search.study", "ilge_search.storage", "ilge_search.dashboard", "ilge_search.defaults.loto")


def _study_logging(quiet: bool) -> None:
    """Concise progress lines from the study runner; Optuna's per-trial lines only with warnings."""
    import logging

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    for name in _STUDY_LOGGERS:
        log = logging.getLogger(name)
        log.setLevel(logging.WARNING if quiet else logging.INFO)
        if not log.handlers:
            log.addHandler(handler)


def _print_results(results) -> None:
    from .study import format_results

    click.echo(format_results(results))


# = study.selection.SELECTION_RULES and DEFAULT_SELECT (kept import-free, like the pooling choices below)
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
    from .objectives import check_objectives
    from .study import StudyOptions, run_study

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
    _study_logging(quiet)
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
        from .study import plan_run

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
    _print_results(results)


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
    from .study import SweepFilter, SweepOverrides, plan_sweep, run_sweep
    from .study.plan import format_seconds

    _study_logging(quiet)
    overrides = SweepOverrides(
        cv=cv, protocol=protocol, samples_per_label=samples_per_label, select=select, workers=workers, threads=threads
    )
    only = SweepFilter(models=models, tasks=tasks, encoders=encoders)
    if dry_run:
        from .study import estimate_sweep

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
    _print_results(results)


@cli.command("studies")
@storage_option()
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True)
def studies_command(storage, fmt: str) -> None:
    """List the studies in a storage: trials, best validation value, final test mean +- std."""
    from .study import list_studies

    _echo_frame(list_studies(storage), fmt, empty="no studies in this storage")


def _echo_frame(frame, fmt: str, empty: str) -> None:
    """A listing as a table, CSV or JSON records (``--format``)."""
    if fmt == "csv":
        click.echo(frame.to_csv(index=False), nl=False)
    elif fmt == "json":
        click.echo(frame.to_json(orient="records", indent=1))
    elif frame.empty:
        click.echo(empty)
    else:
        click.echo(frame.to_string(index=False, float_format=lambda v: f"{v:.4f}", na_rep="-"))


# ---------------------------------------------------------------- embed / cache (extraction)

_POOLING_CHOICES = ["mean", "last", "first", "mean_including_padding"]  # = extraction.POOLINGS (kept import-free)


@cli.command("embed")
@click.option("--model", required=True, help="Alias (minilm-l6, smollm2-135m), local model folder or HF id.")
@click.option("--task", required=True, help="Registered task name, or a CSV/TSV/JSONL/Parquet file or folder.")
@click.option(
    "--pooling",
    type=click.Choice(_POOLING_CHOICES),
    default="mean",
    show_default=True,
    help="How each layer's tokens become one vector.",
)
@click.option("--max-length", type=click.IntRange(min=1), default=512, show_default=True, help="Tokens per text.")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True, help="Texts per batch.")
@click.option("--split", "splits", multiple=True, help="Only these splits (repeatable) [default: all].")
@click.option(
    "--storage-dtype", type=click.Choice(["float16", "bfloat16", "float32"]), default="float16", show_default=True
)
@click.option("--text-col", default=None, help="Custom task: the text column.")
@click.option("--label-col", default=None, help="Custom task: the label column.")
@click.option("--text-cols", default=None, help="Custom pair task: two text columns, comma-separated.")
@click.option("--score-col", default=None, help="Custom pair task: the score column.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@location_options
def embed_command(
    settings: Settings,
    model: str,
    task: str,
    pooling: str,
    max_length: int,
    batch_size: int,
    splits,
    storage_dtype: str,
    text_col,
    label_col,
    text_cols,
    score_col,
    quiet: bool,
) -> None:
    """Extract (or find in the cache) every layer's pooled embeddings of a task's splits."""
    from .cache import embed_task

    pair_cols = [c.strip() for c in text_cols.split(",")] if text_cols else None
    # an unknown task or model, bad columns or texts raise ValueError before anything is loaded
    result = embed_task(
        model,
        task,
        data_dir=settings.data_dir,
        cache_dir=settings.cache_dir,
        splits=list(splits) or None,
        text_col=text_col,
        label_col=label_col,
        text_cols=pair_cols,
        score_col=score_col,
        pooling=pooling,
        max_length=max_length,
        batch_size=batch_size,
        device=settings.device,
        storage_dtype=storage_dtype,
        progress=not quiet,
    )
    click.echo(f"{result.model} / {result.task.name}: {result.num_layers} layers x {result.hidden_size}")
    for split, entry in result.splits.items():
        status = "cache hit" if entry.hit else "extracted"
        shape = "x".join(map(str, entry.features.shape))
        click.echo(
            f"  {split:<10} {status:<9} key {entry.key}  features {shape} {str(entry.features.dtype)[6:]}"
            f"  labels {tuple(entry.labels.shape)}  {entry.seconds:.2f}s  {entry.path}"
        )


@cli.group("cache")
def cache_group() -> None:
    """List or remove embedding cache entries."""


@cache_group.command("ls")
@location_options
def cache_ls_command(settings: Settings) -> None:
    """Show every cache entry: key, model, task, split, shape, size and when it was made."""
    from .cache import EmbeddingCache

    entries = EmbeddingCache(settings.cache_dir).ls()
    if not entries:
        click.echo(f"no embedding cache entries in {settings.cache_dir}")
        return
    rows = [("key", "model", "task", "split", "shape", "MB", "created")]
    rows += [
        (e.key, e.model, e.task, e.split, "x".join(map(str, e.shape)), f"{e.size_bytes / 2**20:.1f}", e.created)
        for e in entries
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    total = sum(e.size_bytes for e in entries) / 2**20
    click.echo(f"{len(entries)} entries, {total:.1f} MB in {settings.cache_dir}")


@cache_group.command("rm")
@click.argument("key", required=False)
@click.option("--all", "remove_all", is_flag=True, help="Remove every entry (converted models are kept).")
@location_options
def cache_rm_command(settings: Settings, key: Optional[str], remove_all: bool) -> None:
    """Remove the entry KEY (a unique prefix is enough) or, with --all, every entry."""
    from .cache import EmbeddingCache

    if (key is None) == (not remove_all):
        raise click.UsageError("give a KEY or --all (one of them)")
    removed = EmbeddingCache(settings.cache_dir).rm(key, all=remove_all)
    click.echo(
        f"removed {len(removed)} entr{'y' if len(removed) == 1 else 'ies'}"
        + (f": {', '.join(removed)}" if 0 < len(removed) <= 5 else "")
    )


# ----------------------------------------------------------------------------- dashboard


@cli.command("dashboard")
@storage_option()
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Interface to listen on. The dashboard has no login: anything but loopback needs --allow-remote.",
)
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="TCP port (0 picks a free one)."
)
@click.option(
    "--artifact-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Artifact store to serve [default: the one `run` uploads to for this storage].",
)
@click.option(
    "--allow-remote",
    is_flag=True,
    help="Allow a --host other than loopback (the dashboard has no login: trusted networks only).",
)
@click.option("--log-requests", is_flag=True, help="Print one line per HTTP request.")
def dashboard_command(storage, host: str, port: int, artifact_dir, allow_remote: bool, log_requests: bool) -> None:
    """Browse studies, trial notes and artifacts (weights, figures) in optuna-dashboard."""
    from .dashboard import serve_dashboard

    serve_dashboard(
        storage,
        host=host,
        port=port,
        artifact_dir=artifact_dir,
        allow_remote=allow_remote,
        log_requests=log_requests,
        echo=click.echo,
    )


# ----------------------------------------------------------------------------- report / recommend / loto

_FORMAT_OPTION = click.option(
    "--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True
)


@cli.command("report")
@storage_option(required=True)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default="reports",
    show_default=True,
    help="Folder for report.md, report.tex, index.html, the CSVs and figures/.",
)
@click.option("--no-figures", is_flag=True, help="Tables only: no PNGs and no importances (faster).")
@click.option(
    "--force",
    is_flag=True,
    help="Write into a non-empty folder that no report wrote (same-named files are replaced, none removed).",
)
@click.option("--quiet", is_flag=True, help="No progress bar.")
def report_command(storage: str, out_dir: str, no_figures: bool, force: bool, quiet: bool) -> None:
    """Paper-style tables (Markdown, LaTeX, CSV) and an HTML page with figures from every study.

    The folder records what the report wrote (.ilge-report.json); a rerun replaces only those files.
    """
    from .report import build_report

    result = build_report(storage, out_dir, figures=not no_figures, show_progress=not quiet, force=force)
    counts = result.results.groupby("model")["mean"].count()
    for model, table in result.tables.items():
        click.echo(f"{model}: {len(table)} tasks, {int(counts.get(model, 0))} cells with test scores")
    click.echo(f"wrote {', '.join(str(p) for p in result.files.values())} and {len(result.figures)} figures")


@cli.command("recommend")
@storage_option(required=True)
@click.option(
    "--out",
    "out_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Defaults file to write [default: $ILGE_SEARCH_DEFAULTS, else "
    "~/.config/ilge-search/recommended_defaults.json; recommended_config reads it over the "
    "shipped defaults].",
)
@click.option(
    "--report",
    "report_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="The 'Defaults by model size' Markdown page [default: next to the defaults file, .md; "
    "none with --update-shipped].",
)
@click.option(
    "--update-shipped",
    is_flag=True,
    help="Rewrite the package's own ilge_search/data/recommended_defaults.json (maintainers).",
)
@click.option(
    "--family",
    "families",
    multiple=True,
    type=click.Choice(["cayley", "fc", "deepset"]),
    help="Only these families (repeatable) [default: all three].",
)
@click.option(
    "--exclude-task",
    "exclude_tasks",
    multiple=True,
    help="Leave every study of this task out (repeatable): the defaults a task never influenced.",
)
def recommend_command(
    storage: str, out_path: Optional[str], report_path: Optional[str], update_shipped: bool, families, exclude_tasks
) -> None:
    """Derive recommended defaults per family and model size from the studies' validation scores.

    With --update-shipped, a family's regenerated defaults are shipped only when `ilge-search loto` found
    them better than the built-in ones on average over tasks they never saw.
    """
    from .defaults.recommend import DEFAULT_FAMILIES, NEXT_TO_DEFAULTS, defaults_targets
    from .report.defaults_page import recommend_defaults

    report = report_path or NEXT_TO_DEFAULTS
    target, page = defaults_targets(out_path, report, update_shipped=update_shipped)
    data = recommend_defaults(
        storage,
        out_path,
        report,
        families=list(families) or DEFAULT_FAMILIES,
        update_shipped=update_shipped,
        exclude_tasks=exclude_tasks,
    )
    for family, buckets in data["families"].items():
        for bucket, values in buckets.items():
            click.echo(f"{family:<8} {bucket:<6} " + ", ".join(f"{k}={v}" for k, v in values.items()))
    for group, decision in data["metadata"]["shipping"].items():
        click.echo(f"{group}: {decision}")
    click.echo(f"wrote {target}" + (f" and {page}" if page is not None else ""))


@cli.command("loto")
@storage_option(required=True)
@click.option("--model", "models", multiple=True, help="Only this model (repeatable) [default: every model].")
@click.option("--task", "tasks", multiple=True, help="Leave out only this task (repeatable) [default: each task].")
@click.option(
    "--family",
    "families",
    multiple=True,
    type=click.Choice(["cayley", "fc", "deepset"]),
    help="Only these families (repeatable) [default: all three].",
)
@click.option(
    "--final-seeds",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Training seeds per configuration (1000, 1001, ... as in `run`).",
)
@click.option("--threads", type=click.IntRange(min=1), default=None, help="Torch CPU threads while training.")
@_FORMAT_OPTION
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@location_options
def loto_command(
    settings: Settings, storage: str, models, tasks, families, final_seeds: int, threads, fmt: str, quiet: bool
) -> None:
    """Leave one task out: do defaults regenerated without a task beat the built-in ones on it?

    For each task, the defaults are regenerated from every other task's studies; they and the built-in
    defaults are trained with no search on the data of the task's study, scored on its test split, and
    stored on that study (a rerun trains only what is missing). `report` and `recommend` show the table.
    """
    from .defaults.loto import LOTO_FAMILIES, leave_one_task_out
    from .report.loto import loto_sentences

    _study_logging(quiet)
    result = leave_one_task_out(
        storage,
        models=models,
        tasks=tasks,
        families=list(families) or LOTO_FAMILIES,
        final_seeds=final_seeds,
        data_dir=settings.data_dir,
        cache_dir=settings.cache_dir,
        device=settings.device,
        threads=threads,
        show_progress=not quiet,
    )
    columns = [
        "model",
        "task",
        "family",
        "unit",
        "builtin_mean",
        "builtin_std",
        "regenerated_mean",
        "regenerated_std",
        "difference",
    ]
    _echo_frame(result.rows[columns], fmt, empty="nothing to evaluate")
    if fmt == "table":
        for sentence in loto_sentences(result):
            click.echo(sentence)
        click.echo(f"trained {result.trained} configurations; the rest were stored")


# ----------------------------------------------------------------------------- export / predict / listings


@cli.command("export")
@storage_option()
@click.option("--study", "study_name", required=True, help="The study to export (see `ilge-search studies`).")
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Folder for the model (new or empty): model.safetensors + ilge_classifier.json.",
)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Training seed when the best trial is retrained (a study without a final evaluation, or --retrain).",
)
@click.option("--retrain", is_flag=True, help="Retrain the best trial with --seed even if the study has final weights.")
@click.option(
    "--trial",
    "trial_number",
    type=click.IntRange(min=0),
    default=None,
    help="Export this complete trial instead (e.g. one of a multi-objective study's final front: its "
    "final weights; any other trial is retrained with --seed).",
)
@click.option(
    "--artifact-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where `run` uploaded the final weights [default: next to a SQLite storage, else studies/artifacts].",
)
@click.option("--overwrite", is_flag=True, help="Replace an earlier export in --out.")
@location_options
def export_command(
    settings: Settings,
    storage,
    study_name: str,
    out_dir: str,
    seed: int,
    retrain: bool,
    trial_number: Optional[int],
    artifact_dir,
    overwrite: bool,
) -> None:
    """Write a finished study's model as an ILGEClassifier folder, for `ilge-search predict` or ILGEClassifier.load.

    The final evaluation's weights (its best seed by validation); a study without a final evaluation
    gets its best trial retrained once with --seed.
    """
    from .classifier import ILGEClassifier, check_save_folder

    check_save_folder(out_dir, overwrite=overwrite)  # before any work: a refused --out costs nothing
    clf = ILGEClassifier.from_study(
        storage,
        study_name,
        seed=seed,
        retrain=retrain,
        artifact_dir=artifact_dir,
        data_dir=settings.data_dir,
        cache_dir=settings.cache_dir,
        device=settings.device,
        trial=trial_number,
    )
    clf.save(out_dir, overwrite=overwrite)
    p = clf.provenance_
    test = "" if p.get("test_score") is None else f", test {p['test_score']:.4f}"
    click.echo(
        f"exported study {p['study']} to {out_dir}: {p['source']} model of trial {p['trial']}, seed {p['seed']} "
        f"(validation {p['metric']} {p['val_score']:.4f}{test}); base model {clf.base_model}"
    )
    if p.get("selected_trial_now", p["trial"]) != p["trial"]:
        click.echo(
            f"note: the study's selected trial is now {p['selected_trial_now']}; rerun its final evaluation "
            "(`ilge-search run ... --n-trials 0`) or pass --retrain to export that one",
            err=True,
        )


@cli.command("predict")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--input",
    "-i",
    "input_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="A .jsonl, .csv, .tsv, .parquet or .txt file (plain text: one text per line).",
)
@click.option(
    "--out",
    "-o",
    "out_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="A .jsonl, .csv or .tsv file [default: JSONL on stdout].",
)
@click.option("--text-col", default=None, help="The text column [default: text].")
@click.option(
    "--text-cols",
    default=None,
    help="Similarity models: the two text columns of each pair, comma-separated [default: sentence1,sentence2].",
)
@click.option("--proba", is_flag=True, help="Add each class's probability (classifiers).")
@click.option(
    "--chunk-rows",
    type=click.IntRange(min=1),
    default=512,
    show_default=True,
    help="Rows read, embedded and written at a time (memory does not grow with the file).",
)
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True, help="Texts per LLM batch.")
@click.option(
    "--base-model",
    default=None,
    help="The frozen model to embed with, instead of the recorded one (needed when that is a local "
    "folder outside MODEL_DIR).",
)
@click.option("--overwrite", is_flag=True, help="Replace --out if it exists.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@location_options
def predict_command(
    settings: Settings,
    model_dir: str,
    input_path: str,
    out_path: Optional[str],
    text_col: Optional[str],
    text_cols: Optional[str],
    proba: bool,
    chunk_rows: int,
    batch_size: int,
    base_model: Optional[str],
    overwrite: bool,
    quiet: bool,
) -> None:
    """Label every row of a file with an exported model (`ilge-search export`) or a saved ILGEClassifier.

    One output row per input row, in order: the row number, the text(s), and the label (with --proba the
    class probabilities) or, for a similarity model, the score.
    """
    from .predict import predict_file

    pair_cols = [c.strip() for c in text_cols.split(",")] if text_cols else None
    summary = predict_file(
        model_dir,
        input_path,
        out_path,
        text_col=text_col,
        text_cols=pair_cols,
        proba=proba,
        chunk_rows=chunk_rows,
        batch_size=batch_size,
        cache_dir=settings.cache_dir,
        device=settings.device,
        overwrite=overwrite,
        progress=not quiet,
        base_model=base_model,
    )
    for note in summary.notes:
        click.echo(f"warning: {note}", err=True)
    if summary.out is not None:
        click.echo(f"wrote {summary.rows} rows to {summary.out} in {summary.seconds:.1f}s")


@cli.command("explain")
@storage_option()
@click.option(
    "--study", "study_name", required=True, help="A study with a final evaluation (see `ilge-search studies`)."
)
@_FORMAT_OPTION
@click.option(
    "--out",
    "out_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the table, CSV or JSON to this file [default: stdout].",
)
@click.option("--overwrite", is_flag=True, help="Replace --out if it exists.")
@click.option("--recompute", is_flag=True, help="Compute again even if the study stores a current result.")
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=None,
    help="Torch CPU threads while retraining [default: unchanged].",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@location_options
def explain_command(
    settings: Settings,
    storage,
    study_name: str,
    fmt: str,
    out_path: Optional[str],
    overwrite: bool,
    recompute: bool,
    threads: Optional[int],
    quiet: bool,
) -> None:
    """Which LLM layers a study's final model uses: per layer, the validation score lost when the layer is
    replaced by its training mean and the gradient x input (mean +- std over the final seeds), next to a
    linear probe's score on that layer.

    The final configuration is retrained once per final seed; the result is stored on the study (the report
    draws it) and reused until the study's final evaluation changes.
    """
    from pathlib import Path

    from .explain import explain_study, format_explanation

    if out_path is not None and Path(out_path).exists() and not overwrite:
        raise click.ClickException(f"{out_path} exists; pass another --out, or --overwrite to replace it")
    result = explain_study(
        storage,
        study_name,
        recompute=recompute,
        data_dir=settings.data_dir,
        cache_dir=settings.cache_dir,
        device=settings.device,
        threads=threads,
        show_progress=not quiet,
    )
    text = format_explanation(result, fmt)
    if out_path is None:
        click.echo(text, nl=False)
        return
    Path(out_path).write_text(text, encoding="utf-8")
    click.echo(f"wrote {result.num_layers} layers of study {result.study} to {out_path}")


@cli.command("tasks")
@_FORMAT_OPTION
@location_options
def tasks_command(settings: Settings, fmt: str) -> None:
    """List the registered tasks: kind, classes or score range, splits, where each loads from, and whether
    it is available offline now (its files are in --data-dir)."""
    from .catalog import task_catalog

    _echo_frame(task_catalog(settings.data_dir), fmt, empty="no tasks")


@cli.command("models")
@_FORMAT_OPTION
def models_command(fmt: str) -> None:
    """List the model table and its offline aliases: layers (hidden states, embedding layer included), hidden
    size, parameters, and whether each is available offline now."""
    from .catalog import model_catalog

    _echo_frame(model_catalog(), fmt, empty="no models")
