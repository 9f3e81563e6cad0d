"""Commands that use a finished study: ``export``, ``predict``, ``explain``."""

from __future__ import annotations

from typing import Any

import click

from ..settings import Settings
from .group import FORMAT_OPTION, cli, location_options, quiet_model_loading, storage_option

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
@click.option(
    "--ensemble",
    is_flag=True,
    help="Export the study's stored ensemble (`ilge-search ensemble` or `run --ensemble K`): all members' "
    "weights and the mix, used like one model.",
)
@click.option(
    "--force",
    "--overwrite",
    "force",
    is_flag=True,
    help="Replace an earlier export in --out, git-tracked files included (--overwrite is the same flag).",
)
@click.option(
    "--task-path",
    type=click.Path(),
    default=None,
    help="Where the study's custom task file or folder is now, if it moved since the study ran (its content is "
    "checked against the study's) [default: where the study recorded it].",
)
@location_options
def export_command(
    settings: Settings,
    storage,
    study_name: str,
    out_dir: str,
    seed: int,
    retrain: bool,
    trial_number: int | None,
    artifact_dir,
    ensemble: bool,
    force: bool,
    task_path: str | None,
) -> None:
    """Write a finished study's model as an ILGEClassifier folder, for `ilge-search predict` or ILGEClassifier.load.

    The final evaluation's weights (its best seed by validation); a study without a final evaluation
    gets its best trial retrained once with --seed. A tagging study gives an ILGETagger folder
    (model.safetensors + ilge_tagger.json; ILGETagger.load).
    """
    from ..classifier import ILGEClassifier, check_save_folder
    from ..files import check_output_folder
    from ..study.export import study_task_kind

    check_output_folder(out_dir, force=force)  # before the study is read: a refused --out costs nothing
    check_card_path(out_dir, force=force)
    tagging = study_task_kind(storage, study_name) == "tagging"
    if ensemble and (tagging or retrain or trial_number is not None):
        raise click.UsageError("--ensemble exports the stored ensemble of a sequence study; drop --retrain and --trial")
    if tagging:
        from ..tagger import ILGETagger, check_tagger_folder

        check_tagger_folder(out_dir)
        model_class: Any = ILGETagger
    else:
        check_save_folder(out_dir, overwrite=force)  # before any work: a refused --out costs nothing
        model_class = ILGEClassifier
    if ensemble:
        clf = ILGEClassifier.from_study_ensemble(
            storage, study_name, artifact_dir=artifact_dir, cache_dir=settings.cache_dir, device=settings.device
        )
    else:
        clf = model_class.from_study(
            storage,
            study_name,
            seed=seed,
            retrain=retrain,
            artifact_dir=artifact_dir,
            data_dir=settings.data_dir,
            cache_dir=settings.cache_dir,
            device=settings.device,
            trial=trial_number,
            task_path=task_path,
        )
    if tagging:
        clf.save(out_dir)  # an ILGETagger replaces only its own earlier save
    else:
        clf.save(out_dir, overwrite=force)
    write_card(out_dir, clf, tagging)
    p = clf.provenance_
    if ensemble:
        members = ", ".join(f"trial {n} x{c}" for n, c in p["members"].items())
        test = "" if p.get("test_score") is None else f" (test {p['metric']} {p['test_score']:.4f})"
        click.echo(
            f"exported the ensemble of study {p['study']} to {out_dir}: {p.get('picks') or 'members'}: {members}, "
            f"seed {p['seed']}{test}"
        )
    else:
        test = "" if p.get("test_score") is None else f", test {p['test_score']:.4f}"
        click.echo(
            f"exported study {p['study']} to {out_dir}: {p['source']} model of trial {p['trial']}, seed {p['seed']} "
            f"(validation {p['metric']} {p['val_score']:.4f}{test}); base model {clf.base_model}"
        )
    click.echo(seed_line(p))
    if ensemble:
        return
    if p.get("selected_trial_now", p["trial"]) != p["trial"]:
        click.echo(
            f"note: the study's selected trial is now {p['selected_trial_now']}; rerun its final evaluation "
            "(`ilge-search run ... --n-trials 0`) or pass --retrain to export that one",
            err=True,
        )


def check_card_path(out_dir: str, *, force: bool) -> None:
    """Refuse, before any work, a README.md in ``out_dir`` that no export wrote (a card is replaced; a README
    someone wrote only with --force)."""
    from pathlib import Path

    from ..study.card import CARD_FILE, is_model_card

    card = Path(out_dir).expanduser() / CARD_FILE
    if force or not card.is_file():
        return
    try:
        ours = is_model_card(card.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        ours = False
    if not ours:
        raise ValueError(
            f"{card} exists and is not a model card an export wrote; pass another --out, or --force to replace it"
        )


def write_card(out_dir: str, clf: Any, tagging: bool) -> None:
    """Write the export's model card (README.md with the Hugging Face metadata block) beside the weights."""
    from pathlib import Path

    from ..files import write_output_text
    from ..models import canonical_model_name
    from ..study.card import CARD_FILE, ExportedModel, model_card

    model = ExportedModel(
        task_kind="tagging" if tagging else getattr(clf, "task_kind_", "classification"),
        base_model=canonical_model_name(clf.base_model) or str(clf.base_model),
        labels=[str(label) for label in getattr(clf, "classes_", [])],
        loader="ILGETagger" if tagging else "ILGEClassifier",
        provenance=clf.provenance_,
    )
    write_output_text(Path(out_dir).expanduser() / CARD_FILE, model_card(model))


def seed_line(p: dict[str, Any]) -> str:
    """Which seed the export took and why, beside the test mean over the final seeds that the tables show."""
    line = f"seed {p['seed']}: {p.get('seed_rule') or 'as stored'}"
    if p.get("final_seeds"):
        line += f" among the final seeds {p['final_seeds']}"
    if p.get("test_mean") is not None:
        line += f"; the study's tables show the test mean over them, {p['test_mean']:.4f}"
    return line


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
@click.option(
    "--tokens-col",
    default=None,
    help="Taggers: the JSONL column holding each sentence's list of words [default: tokens]; a .txt input "
    "holds one sentence per line, split on whitespace.",
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
@click.option(
    "--force",
    "--overwrite",
    "force",
    is_flag=True,
    help="Replace --out if it exists, git-tracked included (--overwrite is the same flag).",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
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
    from ..predict import PredictInput, PredictOptions, PredictOutput, predict_file
    from ..predict_tags import is_tagger_folder, predict_tags_file

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
@click.option(
    "--out",
    "out_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the table, CSV or JSON to this file [default: stdout].",
)
@click.option(
    "--force",
    "--overwrite",
    "force",
    is_flag=True,
    help="Replace --out if it exists, git-tracked included (--overwrite is the same flag).",
)
@click.option("--recompute", is_flag=True, help="Compute again even if the study stores a current result.")
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=None,
    help="Torch CPU threads while retraining [default: unchanged].",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.option(
    "--task-path",
    type=click.Path(),
    default=None,
    help="Where the study's custom task file or folder is now, if it moved since the study ran (its content is "
    "checked against the study's) [default: where the study recorded it].",
)
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
    from ..explain import explain_study, format_explanation
    from ..files import check_output_path, write_output_text
    from ..study.retraining import TrainingSetup

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
