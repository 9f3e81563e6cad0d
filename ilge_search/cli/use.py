"""Commands that use a finished study: ``export``, ``predict``, ``explain``."""

from __future__ import annotations

from dataclasses import asdict

import click

from ..settings import Settings
from .group import (
    FORMAT_OPTION,
    OVERWRITE_OPTION,
    QUIET_OPTION,
    TASK_PATH_OPTION,
    cli,
    flag,
    int_option,
    location_options,
    path_option,
    quiet_model_loading,
    storage_option,
)

# ----------------------------------------------------------------------------- export / predict / listings


@cli.command("export")
@storage_option()
@click.option("--study", "study_name", required=True, help="The study to export (see `ilge-search studies`).")
@path_option(
    "--out",
    "out_dir",
    required=True,
    folder=True,
    help="Folder for the model (new or empty): model.safetensors + ilge_classifier.json.",
)
@int_option(
    "--seed",
    minimum=0,
    default=0,
    help="Training seed when the best trial is retrained (a study without a final evaluation, or --retrain).",
)
@click.option("--retrain", is_flag=True, help="Retrain the best trial with --seed even if the study has final weights.")
@int_option(
    "--trial",
    "trial_number",
    minimum=0,
    default=None,
    help="Export this complete trial instead (e.g. one of a multi-objective study's final front: its "
    "final weights; any other trial is retrained with --seed).",
)
@path_option(
    "--artifact-dir",
    folder=True,
    help="Where `run` uploaded the final weights [default: next to a SQLite storage, else studies/artifacts].",
)
@flag(
    "--ensemble",
    help="Export the study's stored ensemble (`ilge-search ensemble` or `run --ensemble K`): all members' "
    "weights and the mix, used like one model.",
)
@flag(
    "--force",
    "--overwrite",
    "force",
    help="Replace an earlier export in --out, git-tracked files included (--overwrite is the same flag).",
)
@TASK_PATH_OPTION
@location_options
def export_command(settings: Settings, storage, **options) -> None:
    """Write a finished study's model as an ILGEClassifier folder, for `ilge-search predict` or ILGEClassifier.load.

    The final evaluation's weights (its best seed by validation); a study without a final evaluation
    gets its best trial retrained once with --seed. A tagging study gives an ILGETagger folder
    (model.safetensors + ilge_tagger.json; ILGETagger.load).
    """
    from ..use.export import ExportOptionsError, ExportRequest, export_study  # heavy: not loaded for --help

    request = ExportRequest(**options, **asdict(settings))
    try:
        result = export_study(storage, request)
    except ExportOptionsError as exc:
        raise click.UsageError(str(exc)) from None
    for line in result.lines:
        click.echo(line)
    for note in result.notes:
        click.echo(note, err=True)


@cli.command("predict")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False))
@path_option(
    "--input",
    "-i",
    "input_path",
    required=True,
    folder=False,
    help="A .jsonl, .csv, .tsv, .parquet or .txt file (plain text: one text per line).",
)
@path_option("--out", "-o", "out_path", folder=False, help="A .jsonl, .csv or .tsv file [default: JSONL on stdout].")
@click.option("--text-col", default=None, help="The text column [default: text].")
@click.option(
    "--text-cols",
    default=None,
    help="Similarity models: the two text columns of each pair, comma-separated [default: sentence1,sentence2].",
)
@click.option(
    "--tokens-col",
    default=None,
    help="Taggers: the JSONL column holding each sentence's list of words [default: tokens]; a .txt input "
    "holds one sentence per line, split on whitespace.",
)
@click.option("--proba", is_flag=True, help="Add each class's probability (classifiers).")
@int_option(
    "--chunk-rows",
    minimum=1,
    default=512,
    help="Rows read, embedded and written at a time (memory does not grow with the file).",
)
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True, help="Texts per LLM batch.")
@click.option(
    "--base-model",
    default=None,
    help="The frozen model to embed with, instead of the recorded one (needed when that is a local "
    "folder outside MODEL_DIR).",
)
@click.option(
    "--force",
    "--overwrite",
    "force",
    is_flag=True,
    help="Replace --out if it exists, git-tracked included; also use a model folder whose files differ from "
    "the digest its export recorded (with a warning).",
)
@QUIET_OPTION
@click.option("--verbose", is_flag=True, help="Also the model loading's own progress bars (transformers, the hub).")
@location_options
def predict_command(
    settings: Settings,
    model_dir: str,
    input_path: str,
    out_path: str | None,
    text_col: str | None,
    text_cols: str | None,
    tokens_col: str | None,
    proba: bool,
    chunk_rows: int,
    batch_size: int,
    base_model: str | None,
    force: bool,
    quiet: bool,
    verbose: bool,
) -> None:
    """Label every row of a file with an exported model (`ilge-search export`) or a saved ILGEClassifier.

    One output row per input row, in order: the row number, the text(s), and the label (with --proba the
    class probabilities) or, for a similarity model, the score. A tagger (an exported tagging study) reads
    JSONL rows with a list of words, or plain text with one sentence per line, and writes one tag per word:
    JSONL {"row", "tokens", "tags"}, or CSV/TSV with one line per word.
    """
    from ..use.predict import PredictInput, PredictOptions, PredictOutput, predict_file  # heavy: not loaded for --help
    from ..use.predict_tags import is_tagger_folder, predict_tags_file  # heavy: not loaded for --help

    if quiet or not verbose:  # the rows' own bar says how far it is; the weights' bar only adds noise
        quiet_model_loading()
    pair_cols = [c.strip() for c in text_cols.split(",")] if text_cols else None
    run = predict_tags_file if is_tagger_folder(model_dir) else predict_file
    summary = run(
        model_dir,
        PredictInput(input_path, text_col=text_col, text_cols=pair_cols, tokens_col=tokens_col),
        PredictOutput(out_path, proba=proba, overwrite=force),
        options=PredictOptions(
            chunk_rows=chunk_rows,
            batch_size=batch_size,
            cache_dir=settings.cache_dir,
            device=settings.device,
            base_model=base_model,
            progress=not quiet,
            force=force,
        ),
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
@FORMAT_OPTION
@path_option("--out", "out_path", folder=False, help="Write the table, CSV or JSON to this file [default: stdout].")
@OVERWRITE_OPTION
@click.option("--recompute", is_flag=True, help="Compute again even if the study stores a current result.")
@int_option(
    "--threads",
    minimum=1,
    default=None,
    help="Torch CPU threads while retraining [default: unchanged].",
)
@QUIET_OPTION
@TASK_PATH_OPTION
@location_options
def explain_command(
    settings: Settings,
    storage,
    study_name: str,
    fmt: str,
    out_path: str | None,
    force: bool,
    recompute: bool,
    threads: int | None,
    quiet: bool,
    task_path: str | None,
) -> None:
    """Which LLM layers a study's final model uses: per layer, the validation score lost when the layer is
    replaced by its training mean and the gradient x input (mean +- std over the final seeds), next to a
    linear probe's score on that layer.

    The final configuration is retrained once per final seed; the result is stored on the study (the report
    draws it) and reused until the study's final evaluation changes.
    """
    from ..files import check_output_path, write_output_text  # heavy: not loaded for --help
    from ..study.retraining import TrainingSetup  # heavy: not loaded for --help
    from ..use.explain import explain_study, format_explanation  # heavy: not loaded for --help

    if out_path is not None:  # before the retraining: a refused --out costs nothing
        check_output_path(out_path, force=force)
    result = explain_study(
        storage,
        study_name,
        recompute=recompute,
        setup=TrainingSetup(
            settings.data_dir, settings.cache_dir, settings.device, threads, progress=not quiet, task_path=task_path
        ),
    )
    text = format_explanation(result, fmt)
    if out_path is None:
        click.echo(text, nl=False)
        return
    write_output_text(out_path, text)
    click.echo(f"wrote {result.num_layers} layers of study {result.study} to {out_path}")
