"""From a study to a model in use: `ilge-search export` / `ILGEClassifier.from_study`, then `ilge-search predict`.

Small studies on the synthetic setup (TREC and STS-B, 240 training and 100 validation/test rows, at most 6
epochs; no model loads) are run once per module; the exported models are checked against the scores the
studies stored (their test texts get the cached rows they were scored on), and `predict` against
`ILGEClassifier.predict` on the same texts (new texts go through the tiny model itself).
"""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from ilge_search import ILGEClassifier, run_study
from ilge_search.cli import cli
from ilge_search.engine import spearman
from ilge_search.study import StudyOptions
from ilge_search.study.data import DataSpec, load_task_data
from ilge_search.study.export import StudyExport
from ilge_search.testing import cache_text_embeddings, refuse_model_loads
from ilge_search.use.classifier import clear_embedding_memo

DATA = dict(max_train=240, max_eval=100)
SMALL = dict(**DATA, max_epochs=6)
SUFFIX = "train240:eval100:ep6"


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def studies(tmp_path_factory, synthetic):
    """One storage with a TREC Cayley study (2 final seeds), a TREC last-layer study without a final
    evaluation, and an STS-B Cayley study (1 final seed)."""
    folder = tmp_path_factory.mktemp("export")
    url = f"sqlite:///{folder / 'studies.db'}"
    for task in ("trec", "stsb"):
        synthetic.cache(task, **DATA)
    common = dict(
        data_dir=synthetic.data_dir, cache_dir=synthetic.cache_dir, device="cpu", threads=1, progress=False, **SMALL
    )
    common["ensemble"] = 0  # the ensemble's export is tests/test_ensemble.py's
    with refuse_model_loads():
        for task, encoder, flat in (
            ("trec", "cayley", dict(n_trials=3, final_seeds=2)),
            ("trec", "last-layer", dict(n_trials=2, final_seeds=0)),
            ("stsb", "cayley", dict(n_trials=2, final_seeds=1)),
        ):
            run_study(synthetic.model, task, encoder, storage=url, options=StudyOptions.from_flat(**flat, **common))
    model = synthetic.model
    return {
        "url": url,
        "folder": folder,
        "data_dir": synthetic.data_dir,
        "cache_dir": synthetic.cache_dir,
        "model": model,
        "trec-cayley": f"{model}:trec:cayley:{SUFFIX}",
        "trec-last": f"{model}:trec:last-layer:{SUFFIX}",
        "stsb-cayley": f"{model}:stsb:cayley:{SUFFIX}",
    }


def _study(studies, name):
    import optuna

    return optuna.load_study(study_name=name, storage=studies["url"])


def _test_split(studies, task):
    """The study's task data and its test split; the test texts' rows cached as texts, so a classifier
    scoring them sees the features the study scored."""
    data = load_task_data(DataSpec(model=studies["model"], task=task, data_dir=str(studies["data_dir"]), **DATA))
    test = data.splits["test"]
    cache_text_embeddings(studies["model"], test.flat_texts(), [data], cache_dir=studies["cache_dir"])
    return data, test


def _load(studies, folder):
    """An exported classifier; its base model is the tiny model's folder, which a classifier folder does not
    follow on its own (it lies outside), so it is passed explicitly, as a user would."""
    return ILGEClassifier.load(folder, cache_dir=studies["cache_dir"], device="cpu", base_model=studies["model"])


def _predict(studies, folder, *args):
    """``ilge-search predict`` of an exported classifier with the tiny model as its base model."""
    return invoke("--cache-dir", studies["cache_dir"], "predict", folder, *args, "--base-model", studies["model"])


def _export(studies, name, out, *extra):
    result = invoke(
        "--cache-dir",
        studies["cache_dir"],
        "--data-dir",
        studies["data_dir"],
        "--device",
        "cpu",
        "export",
        "--storage",
        studies["url"],
        "--study",
        name,
        "--out",
        out,
        *extra,
    )
    assert result.exit_code == 0, result.output
    return result


# ----------------------------------------------------------------------------- export


def test_export_load_score_reproduces_the_stored_final_score(studies, tmp_path):
    out = tmp_path / "trec-cayley"
    result = _export(studies, studies["trec-cayley"], out)
    assert "final evaluation model of trial" in result.output
    # the model card (README.md) beside the two files ILGEClassifier.load reads
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "ilge_classifier.json", "model.safetensors"]

    attrs = _study(studies, studies["trec-cayley"]).user_attrs
    seed = attrs["final_artifact_seed"]
    stored = attrs["final_test_scores"][attrs["final_seeds"].index(seed)]
    meta = json.loads((out / "ilge_classifier.json").read_text())
    provenance = meta["provenance"]
    assert provenance["study"] == studies["trec-cayley"] and provenance["trial"] == attrs["final_trial"]
    assert provenance["seed"] == seed and provenance["test_score"] == stored
    assert provenance["storage"] == studies["url"] and provenance["source"] == "final evaluation"
    assert provenance["ilge_search_version"] == ilge_version()
    assert meta["base_model"] == studies["model"] and meta["token_pooling"] == "mean"
    assert meta["classes"] == attrs["label_names"] and meta["config"] == attrs["final_config"]

    clear_embedding_memo()  # texts go through the embedding cache, as any new text would
    clf = _load(studies, out)
    task, test = _test_split(studies, "trec")
    names = np.asarray(task.label_names)
    accuracy = clf.score(test.texts, names[test.labels])
    assert abs(accuracy - stored) <= 1e-6, (accuracy, stored)
    # the same through the study's cached features, and from_study in Python without a folder
    from ilge_search.embeddings.cache import load_task_embeddings

    features = load_task_embeddings(
        studies["model"], task, cache_dir=studies["cache_dir"], splits=["test"], progress=False
    )["test"].features
    direct = ILGEClassifier.from_study(
        studies["url"], studies["trec-cayley"], cache_dir=studies["cache_dir"], device="cpu"
    )
    assert abs(direct.score_embeddings(features, names[test.labels]) - stored) <= 1e-6
    assert direct.provenance_["seed"] == seed and set(direct.classes_) == set(names)


def test_from_study_takes_its_settings_once_and_refuses_an_unknown_one(studies):
    by_keyword = ILGEClassifier.from_study(studies["url"], studies["trec-cayley"], device="cpu")
    given = ILGEClassifier.from_study(studies["url"], studies["trec-cayley"], export=StudyExport(device="cpu"))
    stamped = ("exported_at",)  # the clock, a second apart when the two exports straddle one
    unstamped = [{k: v for k, v in c.provenance_.items() if k not in stamped} for c in (by_keyword, given)]
    assert unstamped[0] == unstamped[1] and set(by_keyword.provenance_) == set(given.provenance_)
    with pytest.raises(TypeError, match="unknown export setting 'devcie'; the settings are seed, retrain"):
        ILGEClassifier.from_study(studies["url"], studies["trec-cayley"], devcie="cpu")


def test_retraining_the_best_trial_with_the_final_seed_gives_the_final_weights(studies):
    attrs = _study(studies, studies["trec-cayley"]).user_attrs
    final = ILGEClassifier.from_study(studies["url"], studies["trec-cayley"], device="cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the study ran: CPU results are bit-identical for the same thread count
    try:
        retrained = ILGEClassifier.from_study(
            studies["url"],
            studies["trec-cayley"],
            seed=attrs["final_artifact_seed"],
            retrain=True,
            data_dir=studies["data_dir"],
            cache_dir=studies["cache_dir"],
            device="cpu",
        )
    finally:
        torch.set_num_threads(threads)
    assert retrained.provenance_["source"] == "retrained" and retrained.provenance_["test_score"] is None
    a, b = final.model_.state_dict(), retrained.model_.state_dict()
    assert a.keys() == b.keys() and "standardizer.mean" in a  # standardiser buffers included
    for key in a:  # the final seeds trained in one pass: the same model, up to the order of float sums
        torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=0)


def test_a_study_without_final_evaluation_exports_its_best_trial_retrained(studies, tmp_path):
    study = _study(studies, studies["trec-last"])
    assert "final_test_mean" not in study.user_attrs
    out = tmp_path / "last"
    result = _export(studies, studies["trec-last"], out, "--seed", 7)
    assert "retrained model of trial" in result.output
    clf = _load(studies, out)
    assert clf.provenance_["seed"] == 7 and clf.provenance_["trial"] == study.best_trial.number
    assert clf.config_.to_dict() == study.best_trial.user_attrs["config"]
    task, test = _test_split(studies, "trec")
    accuracy = clf.score(test.texts, np.asarray(task.label_names)[test.labels])
    assert 0.3 < accuracy <= 1.0  # 6 classes: chance is about 0.17
    # the same folder again: refused, then replaced with --overwrite
    again = invoke("export", "--storage", studies["url"], "--study", studies["trec-last"], "--out", out)
    assert again.exit_code == 1 and "--overwrite" in again.output


def test_export_errors_are_one_line_before_any_work(studies_url_only, tmp_path, no_model_loads):
    url = studies_url_only
    result = invoke("export", "--storage", url, "--study", "nope", "--out", tmp_path / "x")
    assert result.exit_code == 1 and "no study 'nope'" in result.output and "Traceback" not in result.output
    result = invoke("export", "--storage", f"sqlite:///{tmp_path / 'none.db'}", "--study", "a", "--out", tmp_path / "z")
    assert result.exit_code == 1 and "no study storage" in result.output
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    result = invoke("export", "--storage", url, "--study", "empty", "--out", full, "--overwrite")
    assert result.exit_code == 1 and "not an exported model" in result.output
    assert (full / "notes.txt").read_text() == "mine"
    result = invoke("export", "--storage", url, "--study", "empty", "--out", tmp_path / "y")
    assert result.exit_code == 1 and "no complete trial" in result.output


@pytest.fixture()
def studies_url_only(tmp_path):
    """A storage holding one study with no trial (no model needed)."""
    import optuna

    url = f"sqlite:///{tmp_path / 'empty.db'}"
    study = optuna.create_study(study_name="empty", storage=url)
    for key, value in {"model": "minilm-l6", "task": "trec", "task_kind": "classification"}.items():
        study.set_user_attr(key, value)
    return url


@pytest.mark.postgres
def test_export_from_postgres_hides_the_password(studies, postgres_url, tmp_path):
    import optuna

    with_password = postgres_url.replace("postgres@", "postgres:s3cret-pw@")  # trust auth ignores it
    optuna.copy_study(from_study_name=studies["trec-cayley"], from_storage=studies["url"], to_storage=with_password)
    out = tmp_path / "pg"
    result = invoke(
        "export",
        "--storage",
        with_password,
        "--study",
        studies["trec-cayley"],
        "--out",
        out,
        "--artifact-dir",
        studies["folder"] / "artifacts",
    )
    assert result.exit_code == 0, result.output
    text = (out / "ilge_classifier.json").read_text()
    assert "s3cret-pw" not in text and "s3cret-pw" not in result.output
    assert json.loads(text)["provenance"]["storage"] == with_password.replace("s3cret-pw", "***")


def ilge_version():
    from ilge_search import __version__

    return __version__


# ----------------------------------------------------------------------------- predict


@pytest.fixture(scope="module")
def exported(studies, tmp_path_factory):
    out = tmp_path_factory.mktemp("models") / "trec"
    _export(studies, studies["trec-cayley"], out)
    return out


def _rows(path):
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines()]
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle, delimiter="\t" if path.suffix == ".tsv" else ","))


def test_predict_labels_a_200_row_file_in_order(studies, exported, tmp_path):
    import pandas as pd

    texts = [
        json.loads(line)["text"] for line in (studies["data_dir"] / "trec" / "train.jsonl").read_text().splitlines()
    ][-200:]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    out = tmp_path / "out.jsonl"
    result = _predict(
        studies,
        exported,
        "--input",
        source,
        "--out",
        out,
        "--proba",
        "--chunk-rows",
        64,
        "--device",
        "cpu",
        "--quiet",
    )
    assert result.exit_code == 0, result.output
    assert "wrote 200 rows" in result.output
    rows = _rows(out)
    assert len(rows) == 200 and [r["row"] for r in rows] == list(range(1, 201))
    assert [r["text"] for r in rows] == texts

    clear_embedding_memo()
    clf = _load(studies, exported)
    expected = clf.predict(texts)
    assert [r["label"] for r in rows] == expected.tolist()
    probabilities = np.array([[r["proba"][str(c)] for c in clf.classes_] for r in rows])
    assert np.allclose(probabilities.sum(axis=1), 1.0)
    assert np.allclose(probabilities, clf.predict_proba(texts), atol=1e-3)

    # the same texts as CSV, TSV, Parquet and plain text give the same labels
    pd.DataFrame({"question": texts}).to_csv(tmp_path / "in.csv", index=False)
    pd.DataFrame({"question": texts}).to_parquet(tmp_path / "in.parquet")
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    for name, extra in (
        ("in.csv", ["--text-col", "question"]),
        ("in.parquet", ["--text-col", "question"]),
        ("in.txt", []),
    ):
        target = tmp_path / f"{name}.out.csv"
        result = _predict(
            studies,
            exported,
            "-i",
            tmp_path / name,
            "-o",
            target,
            *extra,
            "--device",
            "cpu",
            "-q",
        )
        assert result.exit_code == 0, (name, result.output)
        table = _rows(target)
        assert len(table) == 200 and [r["label"] for r in table] == expected.tolist(), name
        assert table[0].keys() == {"row", "question" if name != "in.txt" else "text", "label"}
    stdout = _predict(studies, exported, "-i", tmp_path / "in.txt", "-q")
    assert [json.loads(line)["label"] for line in stdout.output.splitlines()] == expected.tolist()


def test_predict_streams_chunks_through_the_embedding_cache(studies, exported, tmp_path, monkeypatch):
    from ilge_search.embeddings.cache import EmbeddingCache
    from ilge_search.use import classifier
    from ilge_search.use.predict import PredictInput, PredictOptions, PredictOutput, predict_file

    texts = [f"What is the capital of country number {i} ?" for i in range(130)]
    source = tmp_path / "q.txt"
    source.write_text("\n".join(texts))
    calls = []
    real = EmbeddingCache.get_or_extract_texts

    def spy(self, model, chunk, **kwargs):
        calls.append(len(chunk))
        return real(self, model, chunk, **kwargs)

    monkeypatch.setattr(EmbeddingCache, "get_or_extract_texts", spy)
    clear_embedding_memo()
    summary = predict_file(
        exported,
        PredictInput(source),
        PredictOutput(tmp_path / "q.jsonl"),
        options=PredictOptions(
            chunk_rows=40, cache_dir=studies["cache_dir"], device="cpu", progress=False, base_model=studies["model"]
        ),
    )
    assert summary.rows == 130 and calls == [40, 40, 40, 10]  # never more than one chunk in memory
    assert classifier._EMBEDDING_MEMO == {}  # nothing kept per text in the process
    assert len(_rows(tmp_path / "q.jsonl")) == 130
    # a rerun finds every chunk in the cache: no model is loaded
    monkeypatch.setattr(
        "ilge_search.embeddings.extraction.LayerEmbedder.load", lambda self: pytest.fail("model loaded")
    )
    again = predict_file(
        exported,
        PredictInput(source),
        PredictOutput(tmp_path / "q2.jsonl"),
        options=PredictOptions(
            chunk_rows=40, cache_dir=studies["cache_dir"], device="cpu", progress=False, base_model=studies["model"]
        ),
    )
    assert again.rows == 130 and _rows(tmp_path / "q2.jsonl") == _rows(tmp_path / "q.jsonl")


def test_predict_errors_are_one_line_before_the_model_loads(studies, exported, tmp_path, no_model_loads):
    def run(*args):
        result = _predict(studies, exported, *args)
        assert result.exit_code != 0 and "Traceback" not in result.output
        return result.output.strip().splitlines()[-1]

    good = tmp_path / "in.jsonl"
    good.write_text('{"text": "Who wrote Hamlet ?"}\n{"text": "Where is Oslo ?"}\n')
    assert "has no column 'question'" in run("-i", good, "--text-col", "question")
    assert "not --text-cols" in run("-i", good, "--text-cols", "a,b")
    (tmp_path / "empty.jsonl").write_text("\n")
    assert "has no rows" in run("-i", tmp_path / "empty.jsonl")
    (tmp_path / "empty.csv").write_text("")
    assert "is empty" in run("-i", tmp_path / "empty.csv")
    (tmp_path / "blank.csv").write_text('text\nWho wrote Hamlet ?\n""\nWhere is Oslo ?\n')
    assert "row 2, column 'text', is empty" in run("-i", tmp_path / "blank.csv")
    (tmp_path / "blank.txt").write_text("Who wrote Hamlet ?\n\nWhere is Oslo ?\n")
    assert "line 2 is empty" in run("-i", tmp_path / "blank.txt")
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\nnot json\n')
    assert "line 2 is not valid JSON" in run("-i", tmp_path / "bad.jsonl")
    (tmp_path / "in.xlsx").write_text("x")
    assert "unsupported input file type '.xlsx'" in run("-i", tmp_path / "in.xlsx")
    assert "does not exist" in run("-i", tmp_path / "missing.jsonl")
    assert "unsupported output file type '.parquet'" in run("-i", good, "-o", tmp_path / "o.parquet")
    kept = tmp_path / "kept.csv"
    kept.write_text("mine")
    assert "--force" in run("-i", good, "-o", kept)
    assert kept.read_text() == "mine"
    assert "--out is the input file" in run("-i", good, "-o", good, "--overwrite")
    assert "not a saved ILGEClassifier" in _predict(studies, tmp_path, "-i", good).output


def test_a_similarity_study_exports_a_pair_scorer(studies, tmp_path):
    out = tmp_path / "stsb"
    _export(studies, studies["stsb-cayley"], out)
    attrs = _study(studies, studies["stsb-cayley"]).user_attrs
    stored = attrs["final_test_scores"][0]
    clear_embedding_memo()
    clf = _load(studies, out)
    assert clf.task_kind_ == "similarity" and clf.score_range_ == (0.0, 5.0)
    task, test = _test_split(studies, "stsb")
    scores = clf.predict(test.pairs)
    assert scores.shape == (len(test.pairs),) and scores.dtype == np.float64
    assert abs(clf.score(test.pairs, test.labels) - stored) <= 1e-6, (clf.score(test.pairs, test.labels), stored)
    assert abs(spearman(scores, test.labels) - stored) <= 1e-6
    with pytest.raises(ValueError, match="similarity model gives scores"):
        clf.predict_proba(test.pairs[:2])
    with pytest.raises(ValueError, match=r"pairs\[0\] must be a \(sentence_a, sentence_b\) pair"):
        clf.predict(["just one text"])

    pairs, gold = test.pairs[:48], test.labels[:48]
    source = tmp_path / "pairs.csv"
    with open(source, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["a", "b", "gold"])
        writer.writerows([(a, b, g) for (a, b), g in zip(pairs, gold, strict=True)])
    for start in range(0, 48, 16):  # what predict asks the cache for, chunk by chunk
        chunk = [text for pair in pairs[start : start + 16] for text in pair]
        cache_text_embeddings(studies["model"], chunk, [task], cache_dir=studies["cache_dir"])
    target = tmp_path / "scores.jsonl"
    result = _predict(
        studies,
        out,
        "-i",
        source,
        "-o",
        target,
        "--text-cols",
        "a,b",
        "--chunk-rows",
        16,
        "-q",
    )
    assert result.exit_code == 0, result.output
    rows = _rows(target)
    assert len(rows) == 48 and [(r["a"], r["b"]) for r in rows] == [tuple(p) for p in pairs]
    assert np.allclose([r["score"] for r in rows], scores[:48], atol=1e-3)
    assert "--text-cols a,b, not --text-col" in _predict(studies, out, "-i", source, "--text-col", "a").output
    assert "has no column 'sentence1'" in _predict(studies, out, "-i", source).output
    assert "--proba is for classifiers" in _predict(studies, out, "-i", source, "--text-cols", "a,b", "--proba").output
