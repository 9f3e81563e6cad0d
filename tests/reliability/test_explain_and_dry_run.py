"""Explain on tagging studies, and a dry run that writes nothing (issue 37, part G).

The attribution's known answer runs on synthetic word vectors (``ilge_search.testing.tagging_data``); the study
paths run on a tiny random BERT and a made-up tagging task, as ``tests/test_tokens_study.py`` does.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from ilge_search import DeepSetConfig
from ilge_search.cli import cli
from ilge_search.engine import train_encoder
from ilge_search.explain import attribute_layers, explain_study
from ilge_search.record import study_record
from ilge_search.storage import open_storage
from ilge_search.study import StudyOptions, run_study
from ilge_search.testing.tagging_data import middle_layer_tags
from ilge_search.testing.tiny_models import tiny_encoder

WORDS = "the a fox dog runs jumps over under , . red big".split()
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
        tagging_study["storage"], tagging_study["study"], cache_dir=tagging_study["cache"], progress=False
    )
    assert result.computed and result.seeds == [1000, 1001] and result.metric == "accuracy"
    assert result.num_layers == 3  # the tiny BERT's embeddings and its two layers
    assert np.asarray(result.ablation).shape == np.asarray(result.gradient_input).shape == (2, 3)
    assert all(0.0 <= score <= 1.0 for score in result.scores)
    assert np.isfinite(result.gradient_input).all()
    stored = study_record(open_storage(tagging_study["storage"]).load_study(tagging_study["study"])).explain
    assert stored is not None and stored.ablation == result.ablation and stored.scores == result.scores
    again = explain_study(tagging_study["storage"], tagging_study["study"], cache_dir=tagging_study["cache"])
    assert not again.computed and again.ablation == result.ablation


def test_the_explain_command_prints_a_tagging_study_layer_table(tagging_study):
    args = ["--cache-dir", tagging_study["cache"], "explain", "--storage", tagging_study["storage"]]
    out = CliRunner().invoke(cli, [*args, "--study", tagging_study["study"], "--format", "csv"])
    assert out.exit_code == 0, out.output
    header, *rows = out.output.strip().splitlines()
    assert header.startswith("layer,ablation_drop_mean") and [row.split(",")[0] for row in rows] == ["0", "1", "2"]
