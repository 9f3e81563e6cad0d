"""``portfolio``: the cross-task matrix of whole configurations, the default and portfolio chosen from it;
``shipping-check``: its left-out checks retrained in the setting that ships."""

from __future__ import annotations

import click

from ..encoders import encoder_families
from ..settings import Settings
from .group import FORMAT_OPTION, QUIET_OPTION, cli, flag, int_option, location_options, storage_option, study_logging

SIZE_BUCKETS = ("small", "large")  # ilge_search.tuning.MODEL_SIZE_HINTS (tests/test_cli_choices.py checks)

# what Ctrl-C keeps, as `run` says it: a cell in training gives up its claim (FAIL), so a rerun trains it again
CELLS_INTERRUPTED = (
    "interrupted: stored cells are kept and the cells in training are marked FAIL; rerun the same command to "
    "resume (it trains only the missing cells)"
)


def _update_shipped(storage: str, request, options: dict) -> None:
    """``--update-shipped``: the shipped portfolio file's entry written from the stored matrix."""
    from ..defaults.shipped_portfolio import (
        update_shipped_portfolio,  # heavy: not loaded for --help
    )

    if options["dry_run"]:
        raise click.UsageError("--update-shipped trains nothing and writes one file; drop --dry-run")
    path, result, members = update_shipped_portfolio(storage, request, note=options["note"], force=options["force"])
    names = ", ".join(result.candidates[i].name for i in result.order if result.candidates[i].config in members)
    click.echo(
        f"wrote {len(members)} {request.family} ({request.bucket}) warm-start members ({names}) to {path}, chosen "
        f"on validation over {len(result.problems)} problems of {result.storage}"
    )


def _one_family(ctx: click.Context, param: click.Parameter, value: tuple) -> str:
    """``--family`` once: each family has its own matrix, so a repeated one is refused, not silently the last."""
    if len(value) > 1:
        raise click.ClickException(
            f"--family was given {len(value)} times ({', '.join(value)}); each family has its own matrix: "
            "run `ilge-search portfolio` once per family"
        )
    return value[0] if value else "cayley"


# the options of both commands
_FAMILY = click.option(
    "--family",
    type=click.Choice(encoder_families()),
    multiple=True,
    callback=_one_family,
    help="ILGE family (once per run).  [default: cayley]",
)
_BUCKET = click.option(
    "--bucket", type=click.Choice(SIZE_BUCKETS), default="small", show_default=True, help="Model size."
)
_WORKERS = int_option("--workers", minimum=1, default=1, help="Training processes.")
_THREADS = int_option("--threads", minimum=1, default=None, help="Torch CPU threads per process.")
_DRY_RUN = flag("--dry-run", help="Count the missing cells and estimate their time; create nothing.")


@cli.command("portfolio")
@storage_option(required=True)
@_FAMILY
@_BUCKET
@click.option("--top-k", type=click.IntRange(min=0), default=3, show_default=True, help="Top trials per problem.")
@click.option("--size", type=click.IntRange(min=1), default=4, show_default=True, help="Portfolio members.")
@click.option("--seeds", type=click.IntRange(min=1), default=3, show_default=True, help="Training seeds per cell.")
@click.option("--max-epochs", type=click.IntRange(min=1), default=None, help="Epoch cap [default: each study's].")
@click.option("--exclude-task", "exclude_tasks", multiple=True, help="Leave this task's problems out (repeatable).")
@click.option("--exclude-model", "exclude_models", multiple=True, help="Leave this model's problems out (repeatable).")
@click.option("--check", is_flag=True, help="Also the left-out checks (leave one task / model out), on test.")
@_WORKERS
@_THREADS
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Also draw the matrix (PNG) here.")
@flag(
    "--force",
    help="Replace an existing --plot file (git-tracked ones included); with --update-shipped, replace a shipped "
    "portfolio chosen from more evidence (problems, models, tasks, seeds, texts, epochs).",
)
@_DRY_RUN
@flag(
    "--update-shipped",
    help="Write this matrix's warm-start members (--size of them) into the package's own "
    "ilge_search/data/portfolio.json instead (maintainers); trains nothing: every cell must be stored.",
)
@click.option("--note", default="", help="With --update-shipped: a sentence kept in the file's provenance.")
@FORMAT_OPTION
@QUIET_OPTION
@location_options
def portfolio_command(settings: Settings, storage: str, fmt: str, quiet: bool, **options) -> None:
    """Train whole candidate configurations on every problem; choose a default and a portfolio on validation.

    Problems are the family's matched, full-subset, score-only studies of the size bucket; candidates the
    built-in defaults, the marginal rule's and each problem's top trials. Cells are stored in the storage: a
    rerun trains only what is missing, and processes on one storage share the work.
    """
    from ..defaults.portfolio import PortfolioRequest, TrainingSetup  # heavy: not loaded for --help
    from ..report.portfolio import PORTFOLIO_RUN_OPTIONS, PortfolioRun, run_portfolio  # heavy: not loaded for --help

    study_logging(quiet)
    request = PortfolioRequest(
        family=options["family"],
        bucket=options["bucket"],
        top_k=options["top_k"],
        size=options["size"],
        seeds=options["seeds"],
        max_epochs=options["max_epochs"],
        exclude_tasks=tuple(options["exclude_tasks"]),
        exclude_models=tuple(options["exclude_models"]),
    )
    if options["update_shipped"]:
        _update_shipped(storage, request, options)
        return
    setup = TrainingSetup(settings.data_dir, settings.cache_dir, settings.device, options["threads"], not quiet)
    run = PortfolioRun(**{name: options[name] for name in PORTFOLIO_RUN_OPTIONS}, fmt=fmt)
    click.echo(run_portfolio(storage, request, setup, run))


@cli.command("shipping-check")
@storage_option(required=True)
@_FAMILY
@_BUCKET
@_WORKERS
@_THREADS
@_DRY_RUN
@FORMAT_OPTION
@QUIET_OPTION
@location_options
def shipping_check_command(settings: Settings, storage: str, fmt: str, quiet: bool, **options) -> None:
    """Retrain a stored matrix's left-out checks in the setting that ships, for the shipping rule.

    On each held-out problem of the matrix that `ilge-search portfolio` stored (chosen from every problem), the
    portfolio default chosen without it and the built-in defaults are trained with the configuration's own epochs
    and early stopping, the matrix's seeds and the same data; the choice stays on the matrix's validation scores.
    The cells go into their own study of the storage, named with their epochs; a rerun trains only what is missing,
    and `recommend --method portfolio` decides with them once every cell is stored.
    """
    from ..defaults.portfolio import TrainingSetup  # heavy: not loaded for --help
    from ..defaults.shipping_check import ShippingCheckRequest, shipping_check  # heavy: not loaded for --help
    from ..report.portfolio import shipping_check_text  # heavy: not loaded for --help

    study_logging(quiet)
    request = ShippingCheckRequest(family=options["family"], bucket=options["bucket"])
    setup = TrainingSetup(settings.data_dir, settings.cache_dir, settings.device, options["threads"], not quiet)
    try:
        check = shipping_check(storage, request, setup, workers=options["workers"], dry_run=options["dry_run"])
    except KeyboardInterrupt:
        click.echo(CELLS_INTERRUPTED, err=True)
        raise SystemExit(130) from None
    click.echo(shipping_check_text(check, fmt, dry_run=options["dry_run"]))
