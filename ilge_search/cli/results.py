"""Commands that read results back: ``dashboard``, ``report``, ``recommend``, ``loto``."""

from __future__ import annotations

import click

from ..settings import Settings
from .group import (
    FAMILIES_OPTION,
    FORMAT_OPTION,
    QUIET_OPTION,
    cli,
    echo_frame,
    flag,
    int_option,
    location_options,
    path_option,
    storage_option,
    study_logging,
)

RECOMMEND_METHODS = ("marginal", "portfolio")  # ilge_search.defaults.recommend.METHODS

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
@path_option(
    "--artifact-dir", folder=True, help="Artifact store to serve [default: the one `run` uploads to for this storage]."
)
@flag(
    "--allow-remote",
    help="Allow a --host other than loopback (the dashboard has no login: trusted networks only).",
)
@click.option("--log-requests", is_flag=True, help="Print one line per HTTP request.")
def dashboard_command(storage, host: str, port: int, artifact_dir, allow_remote: bool, log_requests: bool) -> None:
    """Browse studies, trial notes and artifacts (weights, figures) in optuna-dashboard."""
    from ..report.dashboard import serve_dashboard  # heavy: not loaded for --help

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


@cli.command("report")
@storage_option(required=True)
@path_option(
    "--out",
    "out_dir",
    folder=True,
    help="Folder for report.md, report.tex, index.html, the CSVs and figures/ [default: beside the storage, "
    "studies/x.db -> studies/x-report/; for a server database <backend>-<host>-<db>-report/ here].",
)
@click.option("--no-figures", is_flag=True, help="Tables only: no PNGs and no importances (faster).")
@flag(
    "--force",
    help="Write into a folder that holds git-tracked files, files no report wrote or another storage's report "
    "(same-named files are replaced, none removed).",
)
@click.option("--quiet", is_flag=True, help="No progress bar.")
def report_command(storage: str, out_dir: str | None, no_figures: bool, force: bool, quiet: bool) -> None:
    """Paper-style tables (Markdown, LaTeX, CSV) and an HTML page with figures from every study.

    The folder records what the report wrote and from which storage (.ilge-report.json); a rerun on the same
    storage replaces only those files. Folders with git-tracked files or another storage's report are refused.
    """
    from ..report import build_report  # heavy: not loaded for --help

    result = build_report(storage, out_dir, figures=not no_figures, progress=not quiet, force=force)
    counts = result.results.groupby("model")["mean"].count()
    for model, table in result.tables.items():
        click.echo(f"{model}: {len(table)} tasks, {int(counts.get(model, 0))} cells with test scores")
    click.echo(f"wrote {', '.join(str(p) for p in result.files.values())} and {len(result.figures)} figures")


@cli.command("recommend")
@storage_option(required=True)
@path_option(
    "--out",
    "out_path",
    folder=False,
    help="Defaults file to write [default: $ILGE_SEARCH_DEFAULTS, else "
    "~/.config/ilge-search/recommended_defaults.json; recommended_config reads it over the "
    "shipped defaults].",
)
@path_option(
    "--report",
    "report_path",
    folder=False,
    help="The 'Defaults by model size' Markdown page [default: next to the defaults file, .md; "
    "none with --update-shipped].",
)
@flag(
    "--update-shipped",
    help="Rewrite the package's own ilge_search/data/recommended_defaults.json (maintainers).",
)
@FAMILIES_OPTION
@click.option(
    "--exclude-task",
    "exclude_tasks",
    multiple=True,
    help="Leave every study of this task out (repeatable): the defaults a task never influenced.",
)
@click.option(
    "--method",
    type=click.Choice(RECOMMEND_METHODS),
    default="marginal",
    show_default=True,
    help="marginal: the per-hyperparameter rule; portfolio: the default `ilge-search portfolio` chose from its "
    "stored matrix (shipped only where it won its left-out checks).",
)
@click.option("--force", is_flag=True, help="Replace an existing defaults file or page (git-tracked ones included).")
def recommend_command(
    storage: str,
    out_path: str | None,
    report_path: str | None,
    update_shipped: bool,
    families,
    exclude_tasks,
    method: str,
    force: bool,
) -> None:
    """Derive recommended defaults per family and model size from the studies' validation scores.

    With --update-shipped, a family's regenerated defaults are shipped only when `ilge-search loto` found
    them better than the built-in ones on average over tasks they never saw. An existing defaults file or
    page (the .md beside --out included) is replaced only with --force.
    """
    from ..defaults.recommend import (  # heavy: not loaded for --help
        DEFAULT_FAMILIES,
        NEXT_TO_DEFAULTS,
        defaults_targets,
    )
    from ..report.defaults_page import recommend_defaults  # heavy: not loaded for --help

    report = report_path or NEXT_TO_DEFAULTS
    target, page = defaults_targets(out_path, report, update_shipped=update_shipped)
    data = recommend_defaults(
        storage,
        out_path,
        report,
        families=list(families) or DEFAULT_FAMILIES,
        update_shipped=update_shipped,
        exclude_tasks=exclude_tasks,
        method=method,
        force=force,
    )
    for family, buckets in data["families"].items():
        for bucket, values in buckets.items():
            click.echo(f"{family:<8} {bucket:<6} " + ", ".join(f"{k}={v}" for k, v in values.items()))
    for group, decision in data["metadata"]["shipping"].items():
        click.echo(f"{group}: {decision}")
    for reason in data["metadata"].get("skipped") or []:
        if "left out" in reason:  # a study that cannot be read as a search of its family: the user should know
            click.echo(f"skipped {reason}", err=True)
    click.echo(f"wrote {target}" + (f" and {page}" if page is not None else ""))


@cli.command("loto")
@storage_option(required=True)
@click.option("--model", "models", multiple=True, help="Only this model (repeatable) [default: every model].")
@click.option("--task", "tasks", multiple=True, help="Leave out only this task (repeatable) [default: each task].")
@FAMILIES_OPTION
@int_option(
    "--final-seeds",
    minimum=1,
    default=3,
    help="Training seeds per configuration (1000, 1001, ... as in `run`).",
)
@click.option("--threads", type=click.IntRange(min=1), default=None, help="Torch CPU threads while training.")
@FORMAT_OPTION
@QUIET_OPTION
@location_options
def loto_command(
    settings: Settings, storage: str, models, tasks, families, final_seeds: int, threads, fmt: str, quiet: bool
) -> None:
    """Leave one task out: do defaults regenerated without a task beat the built-in ones on it?

    For each task, the defaults are regenerated from every other task's studies; they and the built-in
    defaults are trained with no search on the data of the task's study, scored on its test split, and
    stored on that study (a rerun trains only what is missing). `report` and `recommend` show the table.
    """
    from ..defaults.loto import LOTO_FAMILIES, leave_one_task_out  # heavy: not loaded for --help
    from ..report.loto import loto_sentences  # heavy: not loaded for --help
    from ..study.retraining import TrainingSetup  # heavy: not loaded for --help

    study_logging(quiet)
    result = leave_one_task_out(
        storage,
        models=models,
        tasks=tasks,
        families=list(families) or LOTO_FAMILIES,
        final_seeds=final_seeds,
        setup=TrainingSetup(settings.data_dir, settings.cache_dir, settings.device, threads, progress=not quiet),
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
    echo_frame(result.rows[columns], fmt, empty="nothing to evaluate")
    if fmt == "table":
        for sentence in loto_sentences(result):
            click.echo(sentence)
        click.echo(f"trained {result.trained} configurations; the rest were stored")


@cli.command("leaderboard")
@storage_option()
@click.option("--study", "study_name", required=True, help="The auto study's name (`ilge-search studies` lists them).")
@FORMAT_OPTION
def leaderboard_command(storage: str | None, study_name: str, fmt: str) -> None:
    """An auto study's leaderboard: each method's best trial, the selected trial and the ensembles.

    Each row was retrained with the final seeds; its test difference to the best single-layer probe comes with a
    95 % paired bootstrap interval over the same test texts and seeds ('tie': the interval contains 0).
    """
    import pandas as pd  # heavy: not loaded for --help

    from ..study.leaderboard import format_rows, format_table, study_leaderboard  # heavy: not loaded for --help

    record = study_leaderboard(storage, study_name)
    if fmt == "table":
        click.echo(format_table(record))
    else:
        echo_frame(pd.DataFrame(format_rows(record)), fmt, empty="no rows")
