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

    @click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
                  help="Embedding cache (default: $ILGE_SEARCH_CACHE or ~/.cache/ilge-search).")
    @click.option("--data-dir", type=click.Path(file_okay=False), default=None,
                  help="Offline task data in the shared JSONL layout (default: $ILGE_SEARCH_DATA).")
    @click.option("--device", default=None, help="auto, cpu, cuda, cuda:1, mps ...")
    @click.pass_obj
    @functools.wraps(func)
    def wrapper(settings: Settings, cache_dir: Optional[str], data_dir: Optional[str],
                device: Optional[str], **kwargs):
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
_STUDY_LOGGERS = ("ilge_search.study", "ilge_search.storage", "ilge_search.dashboard")


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


_ENCODER_HELP = "Encoder family or baseline; repeat it, or 'all' (cayley, fc, deepset and the five baselines)."


@cli.command("run")
@click.option("--model", "-m", required=True, help="Model alias (minilm-l6, smollm2-135m), local folder or HF id.")
@click.option("--task", "-t", required=True,
              help="Registered task name (banking77, trec, stsb ...) or a CSV/TSV/JSONL/Parquet task file or folder.")
@click.option("--encoder", "-e", "encoders", multiple=True, default=("cayley",), show_default=True,
              help=_ENCODER_HELP)
@click.option("--n-trials", type=click.IntRange(min=0), default=None,
              help="Trials to add to each study in this run (split across workers) "
                   "[default: 20; with --total-trials: until the cap].")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds per study after which no new trial starts.")
@click.option("--total-trials", type=click.IntRange(min=1), default=None,
              help="Cap on each study's complete + pruned + running trials, shared by every process and node "
                   "on the storage.")
@storage_option()
@click.option("--study-name", default=None, help="Study name (one encoder only) [default: model:task:encoder].")
@click.option("--sampler", type=click.Choice(list(SAMPLERS)), default="tpe", show_default=True)
@click.option("--pruner", type=click.Choice(list(PRUNERS)), default="median", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds the sampler and every trial's training.")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Parallel worker processes on the same storage.")
@click.option("--final-seeds", type=click.IntRange(min=0), default=3, show_default=True,
              help="Retrain the best config with this many seeds and score each on test once (0: skip).")
@click.option("--shots", type=click.IntRange(min=1), default=None, help="Training examples per label (few-shot).")
@click.option("--max-train", type=click.IntRange(min=1), default=None,
              help="Cap on training examples (seeded, stratified).")
@click.option("--max-eval", type=click.IntRange(min=1), default=None,
              help="Cap on validation and test examples each (seeded, stratified; for quick runs).")
@click.option("--max-epochs", type=click.IntRange(min=1), default=None, help="Cap on every config's epochs.")
@click.option("--zero-shot", "zero_shot_tasks", multiple=True,
              help="Similarity task to also score each final model on (repeatable; similarity studies only).")
@click.option("--artifact-dir", type=click.Path(file_okay=False), default=None,
              help="Artifact store for the best weights [default: next to a SQLite file, else studies/artifacts].")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Torch CPU threads per process [default: unchanged; cpus/workers per worker]. "
                   "The encoders are small: on a CPU, 1 thread per worker and --workers = cores is usually fastest.")
@click.option("--heartbeat-interval", type=click.IntRange(min=1), default=60, show_default=True,
              help="Seconds between trial heartbeats; a trial silent for twice as long is failed and retried.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars or log lines; only the result table.")
@location_options
def run_command(settings: Settings, model: str, task: str, encoders, n_trials: Optional[int], timeout, total_trials,
                storage, study_name,
                sampler: str, pruner: str, seed: int, workers: int, final_seeds: int, shots, max_train, max_eval,
                max_epochs, zero_shot_tasks, artifact_dir, threads, heartbeat_interval: int, quiet: bool) -> None:
    """Search encoder hyperparameters with Optuna on a model's cached task embeddings.

    Rerunning the same command resumes each study and adds --n-trials trials.
    """
    from .study import StudyOptions, run_study

    _study_logging(quiet)
    if n_trials is None and total_trials is None:
        n_trials = 20
    options = StudyOptions(n_trials=n_trials, timeout=timeout, total_trials=total_trials, study_name=study_name,
                           sampler=sampler, pruner=pruner, seed=seed, workers=workers, final_seeds=final_seeds,
                           shots=shots, max_train=max_train, max_eval=max_eval, max_epochs=max_epochs,
                           zero_shot_tasks=tuple(zero_shot_tasks), data_dir=settings.data_dir,
                           cache_dir=settings.cache_dir, device=settings.device, artifact_dir=artifact_dir,
                           threads=threads, heartbeat_interval=heartbeat_interval, show_progress=not quiet)
    try:
        results = run_study(model, task, list(encoders), storage=storage, options=options)
    except KeyboardInterrupt:
        click.echo("interrupted: the running trial is marked FAIL, finished trials are stored; "
                   "rerun the same command to resume", err=True)
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
@click.option("--dry-run", is_flag=True, help="Only show each study's budget and what is left to run.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars or log lines.")
@location_options
def sweep_command(settings: Settings, grid: str, storage, workers, threads, models, tasks, encoders, artifact_dir,
                  dry_run: bool, quiet: bool) -> None:
    """Run a TOML grid of models x tasks x encoders up to its trial budgets (resumable)."""
    from .study import plan_sweep, run_sweep

    _study_logging(quiet)
    if dry_run:
        click.echo(plan_sweep(grid, storage=storage).to_string(index=False))
        return
    try:
        results = run_sweep(grid, storage=storage, workers=workers, threads=threads, models=models, tasks=tasks,
                            encoders=encoders, data_dir=settings.data_dir, cache_dir=settings.cache_dir,
                            device=settings.device, artifact_dir=artifact_dir, show_progress=not quiet)
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

    frame = list_studies(storage)
    if fmt == "csv":
        click.echo(frame.to_csv(index=False), nl=False)
    elif fmt == "json":
        click.echo(frame.to_json(orient="records", indent=1))
    elif frame.empty:
        click.echo("no studies in this storage")
    else:
        click.echo(frame.to_string(index=False, float_format=lambda v: f"{v:.4f}", na_rep="-"))


# ---------------------------------------------------------------- embed / cache (extraction)

_POOLING_CHOICES = ["mean", "last", "first", "mean_including_padding"]  # = extraction.POOLINGS (kept import-free)


@cli.command("embed")
@click.option("--model", required=True, help="Alias (minilm-l6, smollm2-135m), local model folder or HF id.")
@click.option("--task", required=True, help="Registered task name, or a CSV/TSV/JSONL/Parquet file or folder.")
@click.option("--pooling", type=click.Choice(_POOLING_CHOICES), default="mean", show_default=True,
              help="How each layer's tokens become one vector.")
@click.option("--max-length", type=click.IntRange(min=1), default=512, show_default=True, help="Tokens per text.")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True, help="Texts per batch.")
@click.option("--split", "splits", multiple=True, help="Only these splits (repeatable) [default: all].")
@click.option("--storage-dtype", type=click.Choice(["float16", "bfloat16", "float32"]), default="float16",
              show_default=True)
@click.option("--text-col", default=None, help="Custom task: the text column.")
@click.option("--label-col", default=None, help="Custom task: the label column.")
@click.option("--text-cols", default=None, help="Custom pair task: two text columns, comma-separated.")
@click.option("--score-col", default=None, help="Custom pair task: the score column.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@location_options
def embed_command(settings: Settings, model: str, task: str, pooling: str, max_length: int, batch_size: int,
                  splits, storage_dtype: str, text_col, label_col, text_cols, score_col, quiet: bool) -> None:
    """Extract (or find in the cache) every layer's pooled embeddings of a task's splits."""
    from .cache import embed_task

    pair_cols = [c.strip() for c in text_cols.split(",")] if text_cols else None
    # an unknown task or model, bad columns or texts raise ValueError before anything is loaded
    result = embed_task(model, task, data_dir=settings.data_dir, cache_dir=settings.cache_dir,
                        splits=list(splits) or None, text_col=text_col, label_col=label_col,
                        text_cols=pair_cols, score_col=score_col, pooling=pooling, max_length=max_length,
                        batch_size=batch_size, device=settings.device, storage_dtype=storage_dtype,
                        progress=not quiet)
    click.echo(f"{result.model} / {result.task.name}: {result.num_layers} layers x {result.hidden_size}")
    for split, entry in result.splits.items():
        status = "cache hit" if entry.hit else "extracted"
        shape = "x".join(map(str, entry.features.shape))
        click.echo(f"  {split:<10} {status:<9} key {entry.key}  features {shape} {str(entry.features.dtype)[6:]}"
                   f"  labels {tuple(entry.labels.shape)}  {entry.seconds:.2f}s  {entry.path}")


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
    rows += [(e.key, e.model, e.task, e.split, "x".join(map(str, e.shape)), f"{e.size_bytes / 2**20:.1f}",
              e.created) for e in entries]
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
    click.echo(f"removed {len(removed)} entr{'y' if len(removed) == 1 else 'ies'}"
               + (f": {', '.join(removed)}" if 0 < len(removed) <= 5 else ""))


# ----------------------------------------------------------------------------- dashboard


@cli.command("dashboard")
@storage_option()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to listen on. The dashboard has no login: keep loopback unless the network is trusted.")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="TCP port (0 picks a free one).")
@click.option("--artifact-dir", type=click.Path(file_okay=False), default=None,
              help="Artifact store to serve [default: the one `run` uploads to for this storage].")
@click.option("--log-requests", is_flag=True, help="Print one line per HTTP request.")
def dashboard_command(storage, host: str, port: int, artifact_dir, log_requests: bool) -> None:
    """Browse studies, trial notes and artifacts (weights, figures) in optuna-dashboard."""
    from .dashboard import serve_dashboard

    serve_dashboard(storage, host=host, port=port, artifact_dir=artifact_dir, log_requests=log_requests,
                    echo=click.echo)


# ----------------------------------------------------------------------------- report / recommend


@cli.command("report")
@storage_option(required=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="reports", show_default=True,
              help="Folder for report.md, report.tex, index.html, the CSVs and figures/.")
@click.option("--no-figures", is_flag=True, help="Tables only: no PNGs and no importances (faster).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def report_command(storage: str, out_dir: str, no_figures: bool, quiet: bool) -> None:
    """Paper-style tables (Markdown, LaTeX, CSV) and an HTML page with figures from every study."""
    from .report import build_report

    result = build_report(storage, out_dir, figures=not no_figures, show_progress=not quiet)
    counts = result.results.groupby("model")["mean"].count()
    for model, table in result.tables.items():
        click.echo(f"{model}: {len(table)} tasks, {int(counts.get(model, 0))} cells with test scores")
    click.echo(f"wrote {', '.join(str(p) for p in result.files.values())} and {len(result.figures)} figures")


@cli.command("recommend")
@storage_option(required=True)
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Defaults file to write [default: the package's ilge_search/data/recommended_defaults.json, "
                   "read by recommended_config].")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), default="reports/defaults.md",
              show_default=True, help="The 'Defaults by model size' Markdown page.")
@click.option("--family", "families", multiple=True, type=click.Choice(["cayley", "fc", "deepset"]),
              help="Only these families (repeatable) [default: all three].")
def recommend_command(storage: str, out_path: Optional[str], report_path: str, families) -> None:
    """Derive recommended defaults per family and model size from the studies' validation scores."""
    from .report.recommend import DEFAULT_FAMILIES, recommend_defaults
    from .tuning import RECOMMENDED_DEFAULTS_PATH

    data = recommend_defaults(storage, out_path, report_path, families=list(families) or DEFAULT_FAMILIES)
    for family, buckets in data["families"].items():
        for bucket, values in buckets.items():
            click.echo(f"{family:<8} {bucket:<6} " + ", ".join(f"{k}={v}" for k, v in values.items()))
    click.echo(f"wrote {out_path or RECOMMENDED_DEFAULTS_PATH} and {report_path}")
