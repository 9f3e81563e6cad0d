"""The ``ilge-search`` command line.

The group builds one :class:`~ilge_search.settings.Settings`; each subcommand
parses its options and calls one library function. ``--cache-dir``,
``--data-dir`` and ``--device`` are accepted on the group and on each
subcommand (the subcommand's value wins).
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import click

from ._version import __version__
from .settings import Settings


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


@click.group()
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
