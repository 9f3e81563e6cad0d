"""Explain on tagging studies, and a dry run that writes nothing (issue 37, part G).

The attribution's known answer runs on synthetic word vectors (``ilge_search.testing.tagging_data``); the study
paths run on a tiny random BERT and a made-up tagging task, as ``tests/test_tokens_study.py`` does.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from ilge_search import DeepSetConfig
from ilge_search.cli import cli
from ilge_search.embeddings import models, weights
from ilge_search.embeddings.cache import EmbeddingCache
from ilge_search.engine import train_encoder
from ilge_search.record import study_record
from ilge_search.storage import open_storage
from ilge_search.study import StudyOptions, run_study
from ilge_search.study.retraining import TrainingSetup
from ilge_search.testing.tagging_data import middle_layer_tags
from ilge_search.testing.tiny_models import tiny_encoder
from ilge_search.use.explain import attribute_layers, explain_study

WORDS = ["the", "a", "fox", "dog", "runs", "jumps", "over", "under", ",", ".", "red", "big"]
TAG_OF = {"the": "DET", "a": "DET", "fox": "NOUN", "dog": "NOUN", "runs": "VERB", "jumps": "VERB", ",": "PUNCT"}


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _tagging_task(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for split, (count, seed) in {"train": (24, 0), "validation": (10, 1), "test": (10, 2)}.items():
        rng = np.random.default_rng(seed)
        sentences = [list(rng.choice(WORDS, size=int(rng.integers(2, 7)))) for _ in range(count)]
        rows = [{"tokens": words, "tags": [TAG_OF.get(w, "OTHER") for w in words]} for words in sentences]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return folder


# ----------------------------------------------------------------------------- explain on tagging


def test_word_attributions_peak_at_the_only_layer_that_carries_the_tag():
    train, validation = middle_layer_tags(120, seed=0), middle_layer_tags(60, seed=1)
    config = DeepSetConfig(hidden_dim=16, epochs=8, lr=3e-3)
    model = train_encoder(config, train.data, validation.data, task_kind="tagging", num_classes=4, seed=0).model
    score, drops, grads = attribute_layers(model, train.data[0], *validation.data)
    middle = 2  # of 5 layers: middle_layer_tags writes the tag there only
    assert len(drops) == len(grads) == 5
    assert score > 0.6 and drops[middle] > 0.35 and grads[middle] > 0.3
    assert int(np.argmax(drops)) == int(np.argmax(grads)) == middle
    assert all(abs(drops[layer]) < 0.1 and abs(grads[layer]) < 0.05 for layer in range(5) if layer != middle)


@pytest.fixture(scope="module")
def tagging_study(tmp_path_factory):
    root = tmp_path_factory.mktemp("explain-tagging")
    model, task = str(tiny_encoder(root / "model")), str(_tagging_task(root / "pos_toy"))
    storage = f"sqlite:///{root / 'studies.db'}"
    options = StudyOptions.from_flat(
        n_trials=1, max_epochs=2, final_seeds=2, cache_dir=str(root / "cache"), progress=False, device="cpu"
    )
    result = run_study(model, task, ["cayley-word"], storage=storage, options=options)[0]
    return {"storage": storage, "study": result.study_name, "cache": str(root / "cache")}


def test_explain_measures_a_tagging_study_over_word_rows_and_stores_it(tagging_study):
    result = explain_study(
        tagging_study["storage"],
        tagging_study["study"],
        setup=TrainingSetup(cache_dir=tagging_study["cache"], progress=False),
    )
    assert result.computed and result.seeds == [1000, 1001] and result.metric == "accuracy"
    assert result.num_layers == 3  # the tiny BERT's embeddings and its two layers
    assert np.asarray(result.ablation).shape == np.asarray(result.gradient_input).shape == (2, 3)
    assert all(0.0 <= score <= 1.0 for score in result.scores)
    assert np.isfinite(result.gradient_input).all()
    stored = study_record(open_storage(tagging_study["storage"]).load_study(tagging_study["study"])).explain
    assert stored is not None and stored.ablation == result.ablation and stored.scores == result.scores
    again = explain_study(
        tagging_study["storage"], tagging_study["study"], setup=TrainingSetup(cache_dir=tagging_study["cache"])
    )
    assert not again.computed and again.ablation == result.ablation


def test_the_explain_command_prints_a_tagging_study_layer_table(tagging_study):
    args = ["--cache-dir", tagging_study["cache"], "explain", "--storage", tagging_study["storage"]]
    out = CliRunner().invoke(cli, [*args, "--study", tagging_study["study"], "--format", "csv"])
    assert out.exit_code == 0, out.output
    header, *rows = out.output.strip().splitlines()
    assert header.startswith("layer,ablation_drop_mean") and [row.split(",")[0] for row in rows] == ["0", "1", "2"]


# ----------------------------------------------------------------------------- a dry run writes nothing


def _tree(*roots: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``roots`` with its size and modification time (folders included)."""
    found = {}
    for root in roots:
        for path in [root, *root.rglob("*")] if root.exists() else []:
            stat = path.stat()
            found[str(path)] = (stat.st_size if path.is_file() else 0, stat.st_mtime_ns)
    return found


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch):
    """A ``.gguf`` file whose conversion copies a tiny BERT into the cache (and counts the conversions)."""
    tiny = tiny_encoder(tmp_path / "tiny")
    gguf = tmp_path / "weights" / "toy.Q4_1.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF" + bytes(64))
    conversions = []

    def convert(source, target):
        conversions.append(target)
        shutil.copytree(tiny, target)
        (target / "ilge-source.json").write_text(json.dumps({"revision": source.revision}), encoding="utf-8")

    monkeypatch.setattr(models, "_convert_gguf", convert)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # a settings file written there would show in the tree
    monkeypatch.delenv("ILGE_SEARCH_DEFAULTS", raising=False)
    (tmp_path / "home").mkdir()
    return {"gguf": gguf, "conversions": conversions, "task": _tagging_task(tmp_path / "pos_toy")}


def _dry_run(tmp_path, model, encoder="cayley-word"):
    args = ["--cache-dir", str(tmp_path / "cache"), "run", "--model", str(model), "--task", str(tmp_path / "pos_toy")]
    args += ["--storage", f"sqlite:///{tmp_path / 'studies' / 'dry.db'}", "--dry-run", "--encoder", encoder]
    return CliRunner().invoke(cli, [*args, "--n-trials", "1", "--max-epochs", "1", "--final-seeds", "1"])


@pytest.mark.parametrize("encoder", ["cayley-word", "last-layer"])
def test_a_dry_run_of_an_unconverted_gguf_converts_nothing_and_says_what_the_run_would_write(
    tmp_path, fake_gguf, encoder
):
    before = _tree(tmp_path)
    out = _dry_run(tmp_path, fake_gguf["gguf"], encoder)
    assert out.exit_code == 0, out.output
    assert fake_gguf["conversions"] == [] and _tree(tmp_path) == before  # no cache/, no models/, no storage
    assert "extraction estimated, not timed" in out.output
    note = next(line for line in out.output.splitlines() if line.startswith("note: the model is a GGUF file"))
    assert "not measured" in note and str(tmp_path / "cache" / "models" / "toy.Q4_1-") in note
    assert "about 4 bytes per parameter" in note  # a GGUF outside the model table: no size to name


def test_a_dry_run_measures_on_the_converted_copy_when_there_is_one(tmp_path, fake_gguf):
    source = models.resolve_model(str(fake_gguf["gguf"]), tmp_path / "cache")  # a real load converts once
    assert fake_gguf["conversions"] == [Path(source.path)]
    before = _tree(tmp_path)
    out = _dry_run(tmp_path, fake_gguf["gguf"])
    assert out.exit_code == 0, out.output
    assert "(3 layers x 32)" in out.output and "after timing the extraction" in out.output
    assert "GGUF file not converted" not in out.output
    assert len(fake_gguf["conversions"]) == 1 and _tree(tmp_path) == before


def test_checks_and_dry_runs_never_convert_even_when_asked_to_load(tmp_path, fake_gguf):
    source = models.resolve_model(str(fake_gguf["gguf"]), tmp_path / "cache", materialize=False)
    assert models.pending_conversion(source)
    with weights.weights_memo_read_only(), pytest.raises(models.ModelLoadError, match="not converted yet"):
        models.load_model_and_tokenizer(source, "cpu", "auto", tmp_path / "cache")
    assert fake_gguf["conversions"] == [] and not (tmp_path / "cache").exists()


def test_a_dry_run_over_a_warm_cache_and_an_existing_storage_changes_no_file(tagging_study, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    root = Path(tagging_study["cache"]).parent
    before = _tree(root, tmp_path)
    args = ["--cache-dir", tagging_study["cache"], "run", "--model", str(root / "model"), "--task"]
    args += [str(root / "pos_toy"), "--storage", tagging_study["storage"], "--encoder", "cayley-word", "--dry-run"]
    out = CliRunner().invoke(cli, [*args, "--n-trials", "1", "--max-epochs", "2", "--final-seeds", "2"])
    assert out.exit_code == 0, out.output
    assert "resumes with 1 finished trials" in out.output and "cached word vectors" in out.output
    assert _tree(root, tmp_path) == before


def test_a_dry_run_leaves_a_dead_writers_temporary_file_to_the_next_run(tmp_path, fake_gguf):
    embeddings = tmp_path / "cache" / "embeddings"
    embeddings.mkdir(parents=True)
    leftover = embeddings / f".abc.safetensors.tmp-{_dead_pid()}-0123abcd@{socket.gethostname()}"
    leftover.write_bytes(b"half an entry")
    before = _tree(tmp_path)
    assert _dry_run(tmp_path, fake_gguf["gguf"]).exit_code == 0
    assert leftover.exists() and _tree(tmp_path) == before
    EmbeddingCache(tmp_path / "cache")  # outside a dry run the cache removes it, as before
    assert not leftover.exists()


def _dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid
