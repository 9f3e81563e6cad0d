"""The ``ilge-search`` command group and what its commands share.

The group builds one :class:`~ilge_search.settings.Settings`; each subcommand parses its options and calls one library
function. ``--cache-dir``, ``--data-dir`` and ``--device`` are accepted on the group and on each subcommand (the
subcommand's value wins); ``--storage`` is declared once (:func:`storage_option`). A ``ValueError`` from the library
(bad argument, unknown task or model, unreachable storage ...) becomes a one-line click error with exit status 1, in one
place (:class:`IlgeGroup`).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import click

from .._version import __version__
from ..encoders import encoder_families
from ..settings import Settings, default_storage_url

if TYPE_CHECKING:
    from ..study.options import Flag

__all__ = [
    "cli",
    "main",
    "IlgeGroup",
    "location_options",
    "storage_option",
    "StudyOption",
    "study_options",
    "StudyCommand",
    "study_logging",
    "print_results",
    "echo_frame",
    "FORMAT_OPTION",
    "FORMAT_CHOICES",
]

STORAGE_HELP = "Optuna RDB URL of the studies, e.g. sqlite:///studies/ilge.db or postgresql://user@host:5432/db"


class IlgeGroup(click.Group):
    """A click group whose subcommands' ``ValueError`` is a click error: its message, exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc


def _require_storage(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None and not ctx.resilient_parsing:
        raise click.ClickException(
            f"`ilge-search {ctx.info_name}` needs --storage: the Optuna URL of the studies to read, e.g. "
            f"--storage {default_storage_url()}"
        )
    return value


def storage_option(*, required: bool = False, default_text: str | None = None) -> Callable:
    """The ``--storage`` option of every command that reads or writes studies.

    Optional by default (``None``: ``sqlite:///studies/ilge.db``, or what ``default_text`` says); ``required=True`` for
    commands that must be told which storage to read.
    """
    if required:  # a callback, not required=True: click takes default=None as a given value
        return click.option("--storage", default=None, callback=_require_storage, help=STORAGE_HELP + ".  [required]")
    shown = f" [default: {default_text or default_storage_url()}]"
    return click.option("--storage", default=None, help=STORAGE_HELP + "." + shown)


def path_option(*param_decls: str, folder: bool, **attrs: Any) -> Callable:
    """An option naming a folder (``folder``) or a file, unset unless given."""
    kind = click.Path(file_okay=False) if folder else click.Path(dir_okay=False)
    unset = {} if attrs.get("required") else {"default": None}  # click reads default=None as given
    return click.option(*param_decls, type=kind, **unset, **attrs)


def flag(*param_decls: str, **attrs: Any) -> Callable:
    """An on/off option, off unless given."""
    return click.option(*param_decls, is_flag=True, **attrs)


def int_option(*param_decls: str, minimum: int, default: int | None, **attrs: Any) -> Callable:
    """A whole-number option of at least ``minimum``; a set ``default`` shows in the help."""
    return click.option(
        *param_decls, type=click.IntRange(min=minimum), default=default, show_default=default is not None, **attrs
    )


def location_options(func: Callable) -> Callable:
    """Add --cache-dir/--data-dir/--device to a subcommand and pass ``settings``."""

    @path_option(
        "--cache-dir", folder=True, help="Embedding cache (default: $ILGE_SEARCH_CACHE or ~/.cache/ilge-search)."
    )
    @path_option(
        "--data-dir", folder=True, help="Offline task data in the shared JSONL layout (default: $ILGE_SEARCH_DATA)."
    )
    @click.option("--device", default=None, help="auto, cpu, cuda, cuda:1, mps ...")
    @click.pass_obj
    @functools.wraps(func)
    def wrapper(settings: Settings, cache_dir: str | None, data_dir: str | None, device: str | None, **kwargs):
        settings = (settings or Settings()).updated(cache_dir=cache_dir, data_dir=data_dir, device=device)
        return func(settings, **kwargs)

    return wrapper


@click.group(cls=IlgeGroup)
@click.version_option(__version__, prog_name="ilge-search")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None, help="Embedding cache directory.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None, help="Offline task data directory.")
@click.option("--device", default="auto", show_default=True, help="Device for extraction and training.")
@click.pass_context
def cli(ctx: click.Context, cache_dir: str | None, data_dir: str | None, device: str) -> None:
    """ILGE encoders over every layer of a frozen LLM, and Optuna searches over them."""
    from ..progress import on_terminal  # heavy: not loaded for --help

    if not on_terminal():  # the hub's and transformers' own bars redraw with carriage returns: not in a log file
        quiet_model_loading()
    ctx.obj = Settings().updated(cache_dir=cache_dir, data_dir=data_dir, device=device)


def main() -> None:  # console-script entry point
    cli()


class StudyOption(click.Option):
    """An option for a field of :class:`~ilge_search.study.StudyOptions`, made by :func:`study_options` from the
    field's flag: its help is that field's one description (:func:`~ilge_search.study.options.option_help`),
    capitalised, then ``more`` (formatted with ``{default}``, the field's default, for options whose own
    default is unset so that a command can tell whether they were given)."""

    def __init__(self, param_decls: Sequence[str], *, study_field: str, more: str = "", **attrs: Any) -> None:
        self.study_field = study_field
        super().__init__(param_decls, help=study_option_help(study_field, more), **attrs)


def study_option_help(name: str, more: str = "") -> str:
    """The CLI help of the study option ``name``: its description, capitalised, then ``more`` (``{default}``
    in it: the option's default)."""
    from ..study.options import option_default, option_help  # heavy: not loaded for --help

    text = option_help(name)
    default = option_default(name)
    shown = ", ".join(map(str, default)) if isinstance(default, tuple) else str(default)
    return " ".join(part for part in (text[:1].upper() + text[1:], more.format(default=shown)) if part)


class _StudyOptionSlot:
    """Where :func:`study_options` put a command's study options among its params, until first use."""

    def __init__(self, names: tuple[str, ...], overrides: bool) -> None:
        self.names, self.overrides = names, overrides

    def options(self) -> list[click.Option]:
        from ..study.options import COMMAND_LINE_OPTIONS  # heavy: not loaded for --help

        return [_study_click_option(name, self.overrides) for name in self.names or COMMAND_LINE_OPTIONS]


def _click_type(flag: Flag) -> click.ParamType | type | None:
    if flag.choices:
        return click.Choice(flag.choices)
    if flag.folder:
        return click.Path(file_okay=False)
    if flag.minimum is not None and flag.value is float:
        return click.FloatRange(min=flag.minimum, min_open=flag.above_minimum)
    if flag.minimum is not None:
        return click.IntRange(min=int(flag.minimum))
    return None if flag.value is str else flag.value


def _study_click_option(name: str, overrides: bool) -> click.Option:
    """The click option of the study option ``name``, made from its field's :class:`Flag`; with
    ``overrides`` (``sweep``), unset by default and documented as overriding the grid's value."""
    from ..study.options import option_default, option_flag  # heavy: not loaded for --help

    flag = option_flag(name)
    default = None if flag.unset or overrides else option_default(name)
    more = f"Overrides the grid's {name}. {flag.more}".strip() if overrides else flag.more
    return StudyOption(
        (flag.name, name),
        study_field=name,
        more=more,
        type=_click_type(flag),
        default=default,
        show_default=default not in (None, ()),
        multiple=flag.multiple,
    )


def study_options(*names: str, overrides: bool = False) -> Callable[[Callable], Callable]:
    """Add the click options of the study options ``names`` (flat names of
    :data:`~ilge_search.study.options.FLAT_NAMES`; none: every option the command line spells), in this order, to a
    :class:`StudyCommand`: each is made from its field's flag, help and default, on the command's first use, so that
    ``ilge-search --help`` imports no study module."""

    def decorator(func: Callable) -> Callable:
        if not hasattr(func, "__click_params__"):
            func.__click_params__ = []  # type: ignore[attr-defined]
        func.__click_params__.append(_StudyOptionSlot(names, overrides))  # type: ignore[attr-defined]
        return func

    return decorator


class StudyCommand(click.Command):
    """A command with :func:`study_options`: they become click options the first time its params are read
    (to parse, or to show its help)."""

    _params: list[Any]

    @property
    def params(self) -> list[click.Parameter]:
        if any(isinstance(param, _StudyOptionSlot) for param in self._params):
            made = [param.options() if isinstance(param, _StudyOptionSlot) else [param] for param in self._params]
            self._params = [option for options in made for option in options]
        return self._params

    @params.setter
    def params(self, value: list[Any]) -> None:
        self._params = list(value)


# Subcommands are defined below, one block per library entry point.


# the loggers of the study runner and sweeps (ilge_search.study.runner, .sweep ... log through their
# package's logger), of the storage's dead-worker repair, and of the live trial notes
_STUDY_LOGGERS = (
    "ilge_search.study",
    "ilge_search.storage",
    "ilge_search.report.dashboard",
    "ilge_search.defaults.loto",
)


def quiet_model_loading() -> None:
    """No progress bars from transformers and the hub (its "Loading weights" bar): for ``--quiet``, for
    ``predict`` without ``--verbose``, and whenever stderr is not a terminal."""

    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # read when the hub is first imported
    hub = sys.modules.get("huggingface_hub")
    if hub is not None:  # imported already: its switch was read, so turn it off
        hub.utils.disable_progress_bars()
    transformers = sys.modules.get("transformers")
    if transformers is not None:
        transformers.utils.logging.disable_progress_bar()


def study_logging(quiet: bool) -> None:
    """Concise progress lines from the study runner; Optuna's per-trial lines only with warnings."""

    if quiet:
        quiet_model_loading()

    import optuna  # heavy: not loaded for --help

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    for name in _STUDY_LOGGERS:
        log = logging.getLogger(name)
        log.setLevel(logging.WARNING if quiet else logging.INFO)
        if not log.handlers:
            log.addHandler(handler)


def print_results(results) -> None:
    from ..study.results import format_results  # heavy: not loaded for --help

    click.echo(format_results(results))


def echo_frame(frame, fmt: str, empty: str) -> None:
    """A listing as a table, CSV or JSON records (``--format``)."""
    if fmt == "csv":
        click.echo(frame.to_csv(index=False), nl=False)
    elif fmt == "json":
        click.echo(frame.to_json(orient="records", indent=1))
    elif frame.empty:
        click.echo(empty)
    else:
        click.echo(frame.to_string(index=False, float_format=lambda v: f"{v:.4f}", na_rep="-"))


FORMAT_CHOICES = ("table", "csv", "json")  # ilge_search.use.explain.EXPLAIN_FORMATS, and what echo_frame writes
FORMAT_OPTION = click.option("--format", "fmt", type=click.Choice(FORMAT_CHOICES), default="table", show_default=True)

# options several commands declare alike
QUIET_OPTION = click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
OVERWRITE_OPTION = click.option(
    "--force",
    "--overwrite",
    "force",
    is_flag=True,
    help="Replace --out if it exists, git-tracked included (--overwrite is the same flag).",
)
TASK_PATH_OPTION = click.option(
    "--task-path",
    type=click.Path(),
    default=None,
    help="Where the study's custom task file or folder is now, if it moved since the study ran (its content is "
    "checked against the study's) [default: where the study recorded it].",
)
FAMILIES_OPTION = click.option(
    "--family",
    "families",
    multiple=True,
    type=click.Choice(encoder_families()),
    help="Only these families (repeatable) [default: all three].",
)
