"""Commands about data: ``embed``, ``cache ls|rm``, ``tasks``, ``models``."""

from __future__ import annotations

import click

from ..settings import Settings
from .group import FORMAT_OPTION, cli, echo_frame, location_options, quiet_model_loading

# ---------------------------------------------------------------- embed / cache (extraction)

# the choices whose library constant lives in a module that imports torch: copied here so that
# `ilge-search --help` stays fast (tests/test_cli_choices.py checks they are equal)
POOLING_CHOICES = ("mean", "last", "first", "mean_including_padding")  # ilge_search.embeddings.extraction.POOLINGS
STORAGE_DTYPE_CHOICES = ("float16", "bfloat16", "float32")  # the keys of ilge_search.embeddings.cache.STORAGE_DTYPES


@cli.command("embed")
@click.option("--model", required=True, help="Alias (minilm-l6, smollm2-135m), local model folder or HF id.")
@click.option("--task", required=True, help="Registered task name, or a CSV/TSV/JSONL/Parquet file or folder.")
@click.option(
    "--pooling",
    type=click.Choice(POOLING_CHOICES),
    default="mean",
    show_default=True,
    help="How each layer's tokens become one vector.",
)
@click.option("--max-length", type=click.IntRange(min=1), default=512, show_default=True, help="Tokens per text.")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True, help="Texts per batch.")
@click.option("--split", "splits", multiple=True, help="Only these splits (repeatable) [default: all].")
@click.option("--storage-dtype", type=click.Choice(STORAGE_DTYPE_CHOICES), default="float16", show_default=True)
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
    from ..embeddings.cache import ExtractionSettings, TaskColumns, load_task_embeddings  # heavy: not loaded for --help

    if quiet:
        quiet_model_loading()
    pair_cols = [c.strip() for c in text_cols.split(",")] if text_cols else None
    # an unknown task or model, bad columns or texts raise ValueError before anything is loaded
    result = load_task_embeddings(
        model,
        task,
        data_dir=settings.data_dir,
        cache_dir=settings.cache_dir,
        splits=list(splits) or None,
        columns=TaskColumns(text_col=text_col, label_col=label_col, text_cols=pair_cols, score_col=score_col),
        settings=ExtractionSettings(
            pooling=pooling,
            max_length=max_length,
            batch_size=batch_size,
            device=settings.device,
            storage_dtype=storage_dtype,
        ),
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


def _say_unreadable(cache, listed: set) -> None:
    """One line for the entries whose metadata cannot be read (``ls`` cannot show them)."""
    folder = cache.embeddings_dir
    unreadable = sorted(p.stem for p in folder.glob("*.json") if p.stem not in listed) if folder.is_dir() else []
    if unreadable:
        shown = ", ".join(unreadable[:5]) + (f" and {len(unreadable) - 5} more" if len(unreadable) > 5 else "")
        click.echo(
            f"{len(unreadable)} entr{'y' if len(unreadable) == 1 else 'ies'} with unreadable metadata not listed "
            f"({shown}); remove with `ilge-search cache rm KEY`, or let the next run that needs it rebuild it",
            err=True,
        )


@cache_group.command("ls")
@location_options
def cache_ls_command(settings: Settings) -> None:
    """Show every cache entry: key, model, task, split, shape, size and when it was made."""
    from ..embeddings.cache import EmbeddingCache  # heavy: not loaded for --help

    cache = EmbeddingCache(settings.cache_dir)
    entries = cache.ls()
    _say_unreadable(cache, {e.key for e in entries})
    if not entries:
        click.echo(f"no embedding cache entries in {settings.cache_dir}")
        return
    rows = [("key", "model", "task", "split", "shape", "MB", "created")]
    rows += [(e.key, e.model, e.task, e.split, "x".join(map(str, e.shape)), _size_cell(e), e.created) for e in entries]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    total = sum(e.size_bytes for e in entries) / 2**20
    click.echo(f"{len(entries)} entries, {total:.1f} MB in {settings.cache_dir}")
    _say_damaged([e for e in entries if e.damage])


def _size_cell(entry) -> str:
    return "damaged" if entry.damage else f"{entry.size_bytes / 2**20:.1f}"


def _say_damaged(damaged: list) -> None:
    """One line for the listed entries whose data file is missing or cut: what is wrong and how to clear them."""
    if not damaged:
        return
    shown = "; ".join(f"{e.key}: {e.damage}" for e in damaged[:3]) + (" ..." if len(damaged) > 3 else "")
    keys = " ".join(e.key for e in damaged[:3])
    click.echo(
        f"{len(damaged)} damaged entr{'y' if len(damaged) == 1 else 'ies'} ({shown}); remove with "
        f"`ilge-search cache rm KEY` ({keys}), or let the next run that needs it rebuild it",
        err=True,
    )


@cache_group.command("rm")
@click.argument("key", required=False)
@click.option("--all", "remove_all", is_flag=True, help="Remove every entry (converted models are kept).")
@location_options
def cache_rm_command(settings: Settings, key: str | None, remove_all: bool) -> None:
    """Remove the entry KEY (a unique prefix is enough) or, with --all, every entry."""
    from ..embeddings.cache import EmbeddingCache  # heavy: not loaded for --help

    if (key is None) == (not remove_all):
        raise click.UsageError("give a KEY or --all (one of them)")
    removed = EmbeddingCache(settings.cache_dir).rm(key, all=remove_all)
    click.echo(
        f"removed {len(removed)} entr{'y' if len(removed) == 1 else 'ies'}"
        + (f": {', '.join(removed)}" if 0 < len(removed) <= 5 else "")
    )


@cli.command("tasks")
@FORMAT_OPTION
@location_options
def tasks_command(settings: Settings, fmt: str) -> None:
    """List the registered tasks: kind, classes or score range, splits, where each loads from, and whether
    it is available offline now (its files are in --data-dir, or without one in the shipped examples/data);
    the table ends with a line saying which folder that is."""
    from ..report.catalog import task_catalog  # heavy: not loaded for --help
    from ..settings import data_dir_note  # heavy: not loaded for --help

    echo_frame(task_catalog(settings.data_dir), fmt, empty="no tasks")
    if fmt == "table":  # csv and json stay machine-readable; their `source` column says the same per task
        click.echo(data_dir_note(settings.data_dir))


@cli.command("models")
@FORMAT_OPTION
def models_command(fmt: str) -> None:
    """List the model table and its offline aliases: layers (hidden states, embedding layer included), hidden
    size, parameters, and whether each is available offline now."""
    from ..report.catalog import model_catalog  # heavy: not loaded for --help

    echo_frame(model_catalog(), fmt, empty="no models")
