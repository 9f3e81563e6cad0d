"""Tagging studies through the platform (issue 30, phase B): run, identity, checks, dry run, export and predict.

The studies run on a tiny random BERT (``ilge_search.testing.tiny_models``) and a made-up tagging task
whose tags follow the words' spelling, so extraction, trials, final seeds, export and predict all run
for real in seconds, without a real LLM.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from ilge_search.cli import cli
from ilge_search.record import source_record, study_record, trial_record
from ilge_search.storage import open_storage
from ilge_search.study import StudyConflictError, StudyOptions, plan_run, run_study
from ilge_search.testing.tiny_models import tiny_encoder
from ilge_search.use.tagger import ILGETagger

WORDS = ["the", "a", "fox", "dog", "runs", "jumps", "over", "under", "quickly", "slowly", ",", ".", "!", "red", "big"]
TAG_OF = {**dict.fromkeys(["the", "a"], "DET"), **dict.fromkeys([",", ".", "!"], "PUNCT")}
TAG_OF.update(dict.fromkeys(["fox", "dog"], "NOUN"))
TAG_OF.update(dict.fromkeys(["runs", "jumps"], "VERB"))
ENCODERS = ["cayley", "cayley-word", "last-layer"]


def _tag(word: str) -> str:
    return TAG_OF.get(word, "OTHER")


def _sentences(count: int, seed: int) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    return [list(rng.choice(WORDS, size=int(rng.integers(2, 9)))) for _ in range(count)]


def _macro_f1(gold: list[str], predicted: list[str]) -> float:
    """The mean over the tags in ``gold`` or ``predicted`` of each tag's F1, 2tp / (2tp + fp + fn)."""
    tags = sorted(set(gold) | set(predicted))
    tp = {t: sum(g == p == t for g, p in zip(gold, predicted, strict=True)) for t in tags}
    return sum(2 * tp[t] / (gold.count(t) + predicted.count(t)) for t in tags) / len(tags)


def test_the_macro_f1_of_a_known_prediction_set():
    # a: F1 2/3 (one of two found, no false alarm), b: 1/2 (found, two false alarms), c: 0 (missed)
    assert _macro_f1(list("aabc"), list("abbb")) == pytest.approx(7 / 18)


def _task(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for split, (count, seed) in {"train": (32, 0), "validation": (12, 1), "test": (12, 2)}.items():
        rows = [{"tokens": words, "tags": [_tag(w) for w in words]} for words in _sentences(count, seed)]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("tagging-study")
    return {
        "model": str(tiny_encoder(root / "model")),
        "task": str(_task(root / "pos_toy")),
        "cache": str(root / "cache"),
        "storage": f"sqlite:///{root / 'studies.db'}",
    }


def _options(setup, **flat) -> StudyOptions:
    values = dict(n_trials=1, max_epochs=2, final_seeds=2, cache_dir=setup["cache"], progress=False, device="cpu")
    values.update(flat)
    return StudyOptions.from_flat(**values)


@pytest.fixture(scope="module")
def results(setup):
    return run_study(setup["model"], setup["task"], ENCODERS, storage=setup["storage"], options=_options(setup))


def test_every_encoder_runs_trials_and_a_final_evaluation_on_words(setup, results):
    storage = open_storage(setup["storage"])
    assert [r.encoder for r in results] == ENCODERS
    for result in results:
        study = storage.load_study(result.study_name)
        record = study_record(study)
        assert ":pos_toy@" in result.study_name and result.study_name.endswith(f":{result.encoder}:ep2")
        assert record.identity.word_pooling == "first" and record.data.task_kind == "tagging"
        assert record.data.metric == "accuracy" and record.data.label_names == ["DET", "NOUN", "OTHER", "PUNCT", "VERB"]
        assert record.data.split_sizes == {"train": 32, "validation": 12, "test": 12}  # sentences
        final = record.final
        assert final is not None and len(final.test_scores) == 2 and final.seeds == [1000, 1001]
        assert all(0.0 <= score <= 1.0 for score in final.test_scores)
        assert final.test_macro_f1 is not None and len(final.test_macro_f1) == 2
        assert all(0.0 <= score <= 1.0 for score in final.test_macro_f1)
        trials = [trial_record(t) for t in study.trials]
        assert len(trials) == 1 and all(t.latency_ms and t.latency_ms > 0 for t in trials)
        assert all(t.epochs_run and t.epochs_run <= 2 for t in trials)
        assert all(t.val_macro_f1 is not None and 0.0 <= t.val_macro_f1 <= 1.0 for t in trials)
    # the tags follow each word's spelling: reading every layer of a word beats its last layer alone
    scores = {r.encoder: r.test_mean for r in results}
    assert scores["cayley-word"] > scores["last-layer"]


def test_a_final_evaluation_stored_without_macro_f1_is_redone_by_a_rerun(setup, tmp_path):
    import dataclasses

    from ilge_search.record import save_final
    from ilge_search.study.final import final_is_current

    storage = f"sqlite:///{tmp_path / 'older.db'}"
    options = _options(setup, final_seeds=1)
    first = run_study(setup["model"], setup["task"], ["last-layer"], storage=storage, options=options)[0]
    study = open_storage(storage).load_study(first.study_name)
    final = study_record(study).final
    assert final is not None and final.test_macro_f1 is not None
    assert final_is_current(study, [1000], 2, final.select)
    older = dataclasses.replace(final, test_macro_f1=None, test_macro_f1_mean=None)  # as stored before macro-F1
    save_final(study, older)
    assert study_record(study).final.test_macro_f1 is None and not final_is_current(study, [1000], 2, final.select)
    run_study(
        setup["model"],
        setup["task"],
        ["last-layer"],
        storage=storage,
        options=_options(setup, n_trials=0, final_seeds=1),
    )
    again = study_record(open_storage(storage).load_study(first.study_name)).final
    assert again.test_macro_f1 == pytest.approx(final.test_macro_f1) and again.test_scores == pytest.approx(
        final.test_scores
    )


def test_a_rerun_resumes_and_mean_pooled_words_are_another_study(setup, results):
    options = _options(setup, n_trials=0)
    again = run_study(setup["model"], setup["task"], ["last-layer"], storage=setup["storage"], options=options)
    assert again[0].study_name == results[2].study_name and again[0].n_complete == 1
    plan = plan_run(
        setup["model"],
        setup["task"],
        ["last-layer"],
        storage=setup["storage"],
        options=_options(setup, word_pooling="mean"),
        calibrate=False,
    )
    assert plan.studies[0].study_name.endswith(":mean-words") and not plan.studies[0].exists
    clash = _options(setup, word_pooling="mean", study_name=results[2].study_name)
    with pytest.raises(StudyConflictError, match="word_pooling"):
        run_study(setup["model"], setup["task"], ["last-layer"], storage=setup["storage"], options=clash)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(cv=3), "drop --cv"),
        (dict(protocol="paper"), "drop --protocol paper"),
        (dict(shots=4), "--shots needs a classification task"),
    ],
)
def test_what_a_tagging_study_cannot_do_is_one_line_before_any_work(setup, tmp_path, change, message):
    storage = f"sqlite:///{tmp_path / 'none.db'}"
    with pytest.raises(ValueError, match=message):
        run_study(setup["model"], setup["task"], ["cayley"], storage=storage, options=_options(setup, **change))
    assert not open_storage(storage).study_summaries()  # no study was made


def test_cayley_word_is_refused_on_a_text_task(setup, tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    for split in ("train", "test"):
        rows = [{"text": f"text number {i}", "label": "ab"[i % 2]} for i in range(12)]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with pytest.raises(ValueError, match="cayley-word reads each word of a tagging task"):
        plan_run(setup["model"], str(folder), ["cayley-word"], options=_options(setup), calibrate=False)


def test_the_dry_run_times_a_tagging_config_and_writes_nothing(setup, results, tmp_path):
    # `results` ran the studies, so the word entries are in the cache the dry run checks
    storage = f"sqlite:///{tmp_path / 'dry.db'}"
    plan = plan_run(setup["model"], setup["task"], ["cayley"], storage=storage, options=_options(setup))
    assert plan.split_sizes == {"train": 32, "validation": 12, "test": 12}
    assert plan.cached == {"train": True, "validation": True, "test": True}
    assert plan.num_layers == 3 and plan.studies[0].trial_seconds > 0 and "cached word vectors" in plan.calibration
    assert not (tmp_path / "dry.db").exists()


def test_export_then_predict_tags_one_tag_per_word(setup, results, tmp_path):
    study = results[1].study_name  # cayley-word
    runner = CliRunner()
    out = tmp_path / "tagger"
    exported = runner.invoke(
        cli,
        [
            "--cache-dir",
            setup["cache"],
            "--device",
            "cpu",
            "export",
            "--storage",
            setup["storage"],
            "--study",
            study,
            "--out",
            str(out),
        ],
    )
    assert exported.exit_code == 0, exported.output
    # the tiny model's folder lies outside the export: it is followed only when given again
    tagger = ILGETagger.load(out, cache_dir=setup["cache"], device="cpu", base_model=setup["model"])
    assert tagger.provenance_["study"] == study and tagger.provenance_["source"] == "final evaluation"
    card = (out / "README.md").read_text(encoding="utf-8")  # the model card, which load ignores
    assert "pipeline_tag: token-classification" in card and "ILGETagger.load(" in card
    # the exported weights are the final seed's: scoring the test split gives that seed's stored test score
    test = [json.loads(line) for line in Path(setup["task"], "test.jsonl").read_text().splitlines()]
    score = tagger.score([r["tokens"] for r in test], [r["tags"] for r in test])
    assert score == pytest.approx(tagger.provenance_["test_score"], abs=1e-6)
    # and its stored test macro-F1 is that of its tags on the test words, per tag as 2tp / (2tp + fp + fn)
    final = study_record(open_storage(setup["storage"]).load_study(study)).final
    assert final is not None and final.test_macro_f1 is not None and len(final.test_macro_f1) == 2
    assert final.test_macro_f1_mean == pytest.approx(sum(final.test_macro_f1) / 2)
    predicted = [tag for tags in tagger.predict([r["tokens"] for r in test]) for tag in tags]
    gold = [tag for r in test for tag in r["tags"]]
    stored = final.test_macro_f1[final.seeds.index(final.artifact_seed)]
    assert stored == pytest.approx(_macro_f1(gold, predicted), abs=1e-9)

    sentences = [["the", "dog", "runs", "."], ["a", "red", "fox", "jumps", "!"]]
    (tmp_path / "in.txt").write_text("\n".join(" ".join(s) for s in sentences) + "\n", encoding="utf-8")
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"words": s}) + "\n" for s in sentences), encoding="utf-8")
    expected = tagger.predict(sentences)
    base = ["--cache-dir", setup["cache"], "--device", "cpu", "predict", str(out), "-q", "--base-model", setup["model"]]
    as_json = runner.invoke(cli, [*base, "-i", str(tmp_path / "in.jsonl"), "--tokens-col", "words"])
    assert as_json.exit_code == 0, as_json.output
    rows = [json.loads(line) for line in as_json.output.splitlines() if line.startswith("{")]
    assert [r["tokens"] for r in rows] == sentences and [r["tags"] for r in rows] == expected
    as_csv = runner.invoke(cli, [*base, "-i", str(tmp_path / "in.txt"), "-o", str(tmp_path / "tags.csv")])
    assert as_csv.exit_code == 0, as_csv.output
    lines = (tmp_path / "tags.csv").read_text().splitlines()
    assert lines[0] == "row,word,token,tag" and len(lines) == 1 + sum(len(s) for s in sentences)
    assert lines[1:5] == [f"1,{i + 1},{w},{t}" for i, (w, t) in enumerate(zip(sentences[0], expected[0], strict=True))]


@pytest.mark.parametrize(
    ("content", "extra", "message"),
    [
        ("the dog\n\na fox\n", [], "line 2 is blank"),
        ('{"tokens": []}\n', [], "an empty list"),
        ('{"words": ["a"]}\n', [], "no column 'tokens'"),
        ('{"tokens": ["a"]}\n', ["--proba"], "--proba is for classifiers"),
    ],
)
def test_bad_predict_input_is_one_line_before_the_model_loads(setup, results, tmp_path, content, extra, message):
    out = tmp_path / "tagger"
    ILGETagger.from_study(setup["storage"], results[2].study_name, cache_dir=setup["cache"], device="cpu").save(out)
    suffix = ".txt" if not content.startswith("{") else ".jsonl"
    (tmp_path / f"in{suffix}").write_text(content, encoding="utf-8")
    command = ["predict", str(out), "-i", str(tmp_path / f"in{suffix}"), "-q", "--base-model", setup["model"], *extra]
    result = CliRunner().invoke(cli, command)
    assert result.exit_code != 0 and message in result.output and "Traceback" not in result.output


# ----------------------------------------------------------------------------- a custom token file, other columns


def _renamed_task(folder: Path, bad: dict | None = None) -> Path:
    """The toy task with its words in ``words`` and its tags in ``pos``; ``bad``: split -> a row added to it."""
    folder.mkdir(parents=True)
    for split, (count, seed) in {"train": (24, 3), "validation": (8, 4), "test": (8, 5)}.items():
        rows = [{"id": i, "words": w, "pos": [_tag(x) for x in w]} for i, w in enumerate(_sentences(count, seed))]
        rows += [(bad or {})[split]] if split in (bad or {}) else []
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return folder


def _run(setup, task: str, storage: str, *extra: str, encoder: str = "last-layer"):
    command = ["run", "-m", setup["model"], "-t", task, "-e", encoder, "--storage", storage, "-q"]
    command += ["--n-trials", "1", "--max-epochs", "1", "--final-seeds", "1", "--cache-dir", setup["cache"]]
    return CliRunner().invoke(cli, [*command, "--device", "cpu", *extra])


def test_run_reads_a_custom_token_file_by_its_column_options(setup, tmp_path):
    task = _renamed_task(tmp_path / "renamed_toy")
    storage = f"sqlite:///{tmp_path / 'renamed.db'}"
    result = _run(setup, str(task), storage, "--tokens-col", "words", "--tags-col", "pos")
    assert result.exit_code == 0, result.output
    (summary,) = open_storage(storage).study_summaries()
    record = study_record(summary)
    assert record.data.task_kind == "tagging" and record.data.split_sizes == {"train": 24, "validation": 8, "test": 8}
    assert record.data.label_names == ["DET", "NOUN", "OTHER", "PUNCT", "VERB"]
    assert source_record(summary).task_columns == {"tokens_col": "words", "tags_col": "pos"}
    final = record.final
    assert final is not None and final.seeds == [1000] and 0.0 < final.test_scores[0] <= 1.0
    # without the column options the file's lists are pointed at
    again = _run(setup, str(task), storage)
    assert again.exit_code == 1
    assert "has neither the columns tokens/tags nor text (columns present: id, words, pos)" in again.output
    assert "its columns words, pos hold lists: for a token task pass --tokens-col and --tags-col" in again.output


@pytest.mark.parametrize(
    ("bad", "extra", "message"),
    [
        ({}, ["--tokens-col", "word", "--tags-col", "pos"], "has no column 'word' (columns present: id, words, pos). "),
        ({"train": {"words": ["a", "dog"], "pos": ["DET"]}}, [], "row 25: 2 word(s) but 1 tag(s) in column 'pos'"),
        ({"validation": {"words": [], "pos": []}}, [], "row 9: column 'words' is an empty sentence; remove the row"),
        ({"test": {"words": ["oh"], "pos": ["INTJ"]}}, [], "has tag(s) 'INTJ' that the train split does not have"),
        ({}, ["--text-col", "words"], "is a token task (a list of words and a list of tags per row): --text-col"),
    ],
)
def test_a_bad_custom_token_file_is_one_line_before_any_work(setup, tmp_path, bad, extra, message):
    task = _renamed_task(tmp_path / "toy", bad)
    storage = tmp_path / "none.db"
    options = extra or ["--tokens-col", "words", "--tags-col", "pos"]
    result = _run(setup, str(task), f"sqlite:///{storage}", *options)
    assert result.exit_code == 1 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert not storage.exists()  # checked before the storage is created


def test_token_column_options_on_a_text_task_say_to_pass_the_text_options(setup, tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    for split in ("train", "test"):
        rows = [{"text": f"text number {i}", "label": "ab"[i % 2]} for i in range(12)]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    result = _run(setup, str(folder), f"sqlite:///{tmp_path / 'none.db'}", "--tokens-col", "words")
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert "is a classification task: --tokens-col names a token task's columns; pass --text-col/--label-col" in (
        result.output
    )


def test_the_report_shows_token_accuracy_and_macro_f1_in_their_own_columns(setup, results, tmp_path):
    from ilge_search.report import build_report

    build_report(setup["storage"], tmp_path / "report", figures=False, progress=False)
    frame = pd.read_csv(tmp_path / "report" / "tokens.csv").set_index("method")
    for result in results:
        final = study_record(open_storage(setup["storage"]).load_study(result.study_name)).final
        assert final is not None and final.test_macro_f1_mean is not None
        assert frame.loc[result.encoder, "macro_f1"] == pytest.approx(final.test_macro_f1_mean * 100.0)
    text = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    assert "| task | setting | method | token accuracy | macro-F1 |" in text


@pytest.mark.slow  # two spawned worker processes, each importing torch
def test_two_workers_share_a_tagging_study_and_run_each_trial_once(setup, tmp_path):
    url = f"sqlite:///{tmp_path / 'workers.db'}"
    result = _run(setup, setup["task"], url, "--workers", "2", "--n-trials", "4", encoder="cayley-word")
    assert result.exit_code == 0, result.output
    (summary,) = open_storage(url).study_summaries()
    study = open_storage(url).load_study(summary.study_name)
    assert summary.study_name.endswith(":cayley-word:ep1")
    assert sorted(t.number for t in study.trials) == [0, 1, 2, 3]
    assert all(t.state.name in ("COMPLETE", "PRUNED") for t in study.trials)
    configs = [trial_record(t).config for t in study.trials]
    assert sum(bool(trial_record(t).recommended) for t in study.trials) == 1 and all(configs)
    # each worker ran its share, two trials each, in its own process
    pids = [t.user_attrs["ilge_worker"]["pid"] for t in study.trials]
    assert len(set(pids)) == 2 and sorted(pids.count(pid) for pid in set(pids)) == [2, 2]
    final = study_record(study).final
    assert final is not None and final.seeds == [1000] and final.test_macro_f1 is not None


def test_the_classifier_refuses_a_tagging_study_and_names_the_tagger(setup, results):
    from ilge_search.use.classifier import ILGEClassifier

    with pytest.raises(ValueError, match=r"is a tagging study; export it with ILGETagger.from_study$"):
        ILGEClassifier.from_study(setup["storage"], results[2].study_name, cache_dir=setup["cache"], device="cpu")


@pytest.mark.slow  # a two-objective study and its final front (about 10 s on 2 busy cores)
def test_a_multi_objective_tagging_study_keeps_its_top_front_trials_macro_f1(setup, tmp_path):
    url = f"sqlite:///{tmp_path / 'front.db'}"
    result = _run(setup, setup["task"], url, "--objective", "score", "--objective", "params", "--n-trials", "2")
    assert result.exit_code == 0, result.output
    (summary,) = open_storage(url).study_summaries()
    final = study_record(summary).final
    assert final is not None and final.select == "front" and final.trial == final.front[0].trial
    assert final.test_macro_f1 is not None and len(final.test_macro_f1) == 1
    assert final.test_macro_f1_mean == final.test_macro_f1[0] and 0.0 < final.test_macro_f1[0] <= 1.0
