"""The fakes of ``ilge_search.testing``: synthetic layer embeddings, made-up tasks, the tiny model, cached
synthetic embeddings under the runner's keys, and the fake study store."""

from __future__ import annotations

import json

import numpy as np
import optuna
import pytest
import torch
from optuna.trial import TrialState
from scipy.stats import spearmanr

from ilge_search.embeddings.cache import EmbeddingCache, load_task_embeddings
from ilge_search.record import FrontMember, Identity, TrialRecord, study_record
from ilge_search.study.data import expected_cache_keys, load_task_data
from ilge_search.tasks.core import load_task
from ilge_search.testing import (
    FakeTrial,
    LayerSignal,
    SyntheticTask,
    add_study,
    cache_text_embeddings,
    classification_data,
    classification_features,
    final_record,
    similarity_data,
    similarity_features,
    split_features,
    write_task,
)

# ----------------------------------------------------------------------------- synthetic features


def test_only_the_signal_layer_carries_the_class():
    labels = np.arange(3000) % 3
    features = classification_features(labels, 4, 32, LayerSignal(layer=1, strength=5.0, seed=3))
    assert features.shape == (3000, 4, 32) and features.dtype == np.float32
    means = np.stack([features[labels == c].mean(axis=0) for c in range(3)])  # (class, layer, feature)
    lengths = np.linalg.norm(means, axis=2)
    assert lengths[:, 1] == pytest.approx([5.0] * 3, rel=0.05)  # the class means, at full length
    assert (lengths[:, [0, 2, 3]] < 0.5).all()  # elsewhere only the noise's sampling error
    # the noise is standard normal everywhere
    assert features[:, 0].std() == pytest.approx(1.0, abs=0.02)
    assert (features[labels == 0, 1] - means[0, 1]).std() == pytest.approx(1.0, abs=0.03)


def test_negative_layers_count_from_the_last_and_out_of_range_is_refused():
    labels = np.arange(600) % 2
    last = classification_features(labels, 3, 8, LayerSignal(layer=-1))
    gaps = [np.linalg.norm(last[labels == 0, i].mean(0) - last[labels == 1, i].mean(0)) for i in range(3)]
    assert np.argmax(gaps) == 2 and gaps[2] > 5
    with pytest.raises(ValueError, match="signal layer 3 is outside the 3 layers"):
        classification_features(labels, 3, 8, LayerSignal(layer=3))
    with pytest.raises(ValueError, match="strength must be above 0"):
        LayerSignal(strength=0)


def test_a_row_keyed_by_its_text_is_the_same_in_every_subset():
    texts = [f"text {i}" for i in range(10)]
    labels = [i % 2 for i in range(10)]
    whole = classification_features(labels, 3, 8, row_keys=texts)
    part = classification_features(labels[7:2:-2], 3, 8, row_keys=texts[7:2:-2])  # rows 7, 5, 3
    np.testing.assert_array_equal(part, whole[[7, 5, 3]])
    assert not np.array_equal(whole[0], whole[2])  # same label, different text: different noise
    with pytest.raises(ValueError, match="one key per row"):
        classification_features(labels, 3, 8, row_keys=texts[:3])


def test_pair_similarity_at_the_signal_layer_rises_with_the_score():
    scores = np.linspace(0, 5, 400)
    pairs = similarity_features(scores, 3, 64, LayerSignal(layer=0))
    assert pairs.shape == (400, 2, 3, 64)

    def cosines(layer):
        a, b = pairs[:, 0, layer], pairs[:, 1, layer]
        return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)

    assert spearmanr(cosines(0), scores).statistic > 0.8
    assert abs(spearmanr(cosines(1), scores).statistic) < 0.2  # noise layers know nothing of the score
    assert abs(spearmanr(cosines(2), scores).statistic) < 0.2


# ----------------------------------------------------------------------------- tasks and the tiny model


def test_written_tasks_load_as_registered_or_custom_tasks(tmp_path):
    write_task(tmp_path / "data" / "trec", SyntheticTask(num_labels=6, sizes=(60, 30, 30)))
    registered = load_task("trec", tmp_path / "data")
    assert registered.spec.metric == "accuracy" and registered.label_names == [f"label_{i}" for i in range(6)]
    assert {name: len(part) for name, part in registered.splits.items()} == {"train": 60, "validation": 30, "test": 30}
    assert np.bincount(registered.splits["train"].labels).tolist() == [10] * 6  # balanced
    texts = [t for part in registered.splits.values() for t in part.texts]
    assert len(set(texts)) == len(texts) == 120  # unique across splits (no test-in-train warning)

    folder = write_task(tmp_path / "my-pairs", SyntheticTask(kind="similarity", sizes=(20, 0, 10)))
    custom = load_task(folder)
    assert custom.name == "my-pairs" and custom.kind == "similarity" and custom.spec.metric == "spearman"
    assert len(custom.splits["test"]) == 10 and "validation" in custom.splits  # carved from train
    scores = custom.splits["train"].labels
    assert scores.min() == 0.0 and scores.max() == 5.0 and np.allclose(scores * 5, np.round(scores * 5))
    with pytest.raises(ValueError, match="sizes"):
        SyntheticTask(sizes=(0, 0, 0))


def test_the_tiny_model_is_a_real_model_folder(tiny_model):
    from ilge_search.embeddings.extraction import LayerEmbedder
    from ilge_search.embeddings.models import resolve_model

    source = resolve_model(tiny_model)
    assert source.revision.startswith("sha256:") and not source.is_alias
    embedder = LayerEmbedder(tiny_model, device="cpu")
    features = embedder.embed(["river stone cloud", "lamp garden violin harbour pencil"], progress=False)
    assert features.shape == (2, 5, 64) and torch.isfinite(features).all()
    from transformers import AutoModel

    assert AutoModel.from_pretrained(tiny_model).num_parameters() < 200_000  # nothing like a language model


# ----------------------------------------------------------------------------- cached embeddings


def test_entries_sit_under_the_runners_keys_and_read_back_without_a_model(synthetic, no_model_loads):
    spec = synthetic.spec("trec", max_train=90, max_eval=60, data_seed=1)
    keys = synthetic.cache("trec", max_train=90, max_eval=60, data_seed=1)
    task = load_task_data(spec)
    fingerprints = {split: task.fingerprint(split) for split in task.splits}
    resolved = EmbeddingCache(synthetic.cache_dir).resolve(synthetic.model)
    from dataclasses import replace

    assert keys == expected_cache_keys(replace(spec, source=resolved), task, fingerprints)
    loaded = load_task_embeddings(synthetic.model, task, cache_dir=synthetic.cache_dir, progress=False)
    assert loaded.cache_keys == keys and all(entry.hit for entry in loaded.splits.values())
    assert (loaded.num_layers, loaded.hidden_size) == (5, 64)
    train = loaded.splits["train"]
    assert torch.equal(train.labels, torch.from_numpy(task.splits["train"].labels))
    expected = split_features(task, "train", 5, 64, synthetic.signal)
    assert torch.equal(train.features, torch.from_numpy(expected).half())  # stored as float16, as extracted
    assert train.meta["synthetic"] == {"layer": -1, "strength": 6.0, "seed": 0}


def test_zero_shot_tasks_and_similarity_pairs_are_cached_too(synthetic, no_model_loads):
    synthetic.cache("stsb", max_eval=40, zero_shot_tasks=["sick_r"])
    pairs = load_task_embeddings(
        synthetic.model, load_task_data(synthetic.spec("stsb", max_eval=40)), cache_dir=synthetic.cache_dir
    )
    assert pairs.splits["test"].features.shape == (40, 2, 5, 64)
    zero_shot = load_task_data(synthetic.spec("sick_r", max_eval=40))
    test = load_task_embeddings(synthetic.model, zero_shot, splits=["test"], cache_dir=synthetic.cache_dir)
    assert test.splits["test"].hit and test.splits["test"].features.shape == (40, 2, 5, 64)


def test_texts_get_the_rows_they_have_in_their_task(synthetic, no_model_loads):
    task = load_task_data(synthetic.spec("trec"))
    texts = task.splits["test"].texts[:5][::-1]
    cache_text_embeddings(synthetic.model, texts, [task], cache_dir=synthetic.cache_dir)
    features = EmbeddingCache(synthetic.cache_dir).get_or_extract_texts(synthetic.model, texts, progress=False)
    rows = split_features(task, "test", 5, 64, synthetic.signal)[:5][::-1]
    assert torch.equal(features, torch.from_numpy(np.ascontiguousarray(rows)).half())
    with pytest.raises(ValueError, match="occur in none of the given tasks"):
        cache_text_embeddings(synthetic.model, ["never seen"], [task], cache_dir=synthetic.cache_dir)


def test_a_corrupted_synthetic_entry_fails_its_checksum_like_an_extracted_one(synthetic, tmp_path):
    from ilge_search.testing import SyntheticSetup

    setup = SyntheticSetup(synthetic.model, synthetic.data_dir, tmp_path / "cache")
    key = setup.cache("sst2")["train"]
    entry = tmp_path / "cache" / "embeddings" / f"{key}.safetensors"
    meta = json.loads(entry.with_suffix(".json").read_text())
    assert meta["file_size"] == entry.stat().st_size and meta["task"] == "sst2" and meta["split"] == "train"
    data = bytearray(entry.read_bytes())
    data[-1] ^= 0xFF
    entry.write_bytes(bytes(data))
    from ilge_search.embeddings.cache import CacheCorruptError

    with pytest.raises(CacheCorruptError, match="checksum"):
        EmbeddingCache(tmp_path / "cache")._read(key)


# ----------------------------------------------------------------------------- the fake study store


def test_a_fake_study_reads_back_as_the_runner_would_leave_it():
    storage = optuna.storages.InMemoryStorage()
    identity = Identity(model="minilm-l6", task="trec", encoder="cayley", max_train=500, cv=5)
    trials = [
        FakeTrial(0.80, recommended=True, params={"lr": 1e-3, "conv_type": "gcn"}, record=TrialRecord(params=10)),
        FakeTrial(0.84, params={"lr": 1e-2, "conv_type": "gat"}, record=TrialRecord(fold_scores=[0.8, 0.88])),
        FakeTrial(None, state=TrialState.PRUNED, params={"lr": 1e-5, "conv_type": "gcn"}, intermediate={1: 0.3}),
    ]
    final = final_record([0.70, 0.74], trial=1, select="one-se", search_gain=0.02)
    study = add_study(
        storage, identity, data=classification_data(split_sizes={"validation": 400}), trials=trials, final=final
    )

    assert study.study_name == "minilm-l6:trec:cayley:train500:cv5"
    record = study_record(optuna.load_study(study_name=study.study_name, storage=storage))
    assert record.identity == identity and record.ready and record.has_data
    assert record.data.metric == "accuracy" and record.data.n_validation == 400
    assert record.final.test_mean == pytest.approx(0.72) and record.final.test_std == pytest.approx(0.0283, abs=1e-4)
    assert record.final.seeds == [1000, 1001] and record.final.search_gain == 0.02
    assert set(record.by_rule) == {"one-se"} and record.by_rule["one-se"].trial == 1
    stored = study.trials
    assert [t.state for t in stored] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED]
    assert stored[0].user_attrs == {"val_metric": 0.80, "num_trainable_params": 10, "recommended": True}
    assert stored[1].user_attrs["fold_scores"] == [0.8, 0.88] and stored[2].intermediate_values == {1: 0.3}
    lr = stored[1].distributions["lr"]
    assert (lr.low, lr.high, lr.log) == (1e-5, 1e-2, True)
    assert set(stored[0].distributions["conv_type"].choices) == {"gcn", "gat"}


def test_a_fake_multi_objective_study_has_its_directions_and_front():
    storage = optuna.storages.InMemoryStorage()
    identity = Identity(model="m", task="stsb", encoder="fc", objectives=("score", "params"))
    member = FrontMember(
        trial=0, config={}, values={"spearman": 0.8, "params": 50.0}, params=50, latency_ms=None, val_score=0.8,
        test_mean=0.7, test_std=0.0, test_scores=[0.7], val_scores=[0.8], artifacts={}, artifact_seed=None,
    )  # fmt: skip
    front = final_record([0.7], select="front", front=[member], front_k=1, front_size=1)
    study = add_study(storage, identity, data=similarity_data(), trials=[FakeTrial([0.8, 50])], final=front)
    assert study.directions == [optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE]
    assert study.metric_names == ["spearman", "params"]
    record = study_record(study)
    assert record.final.front == [member] and record.by_rule == {}  # a front is not one rule's evaluation
    with pytest.raises(ValueError, match="at least one test score"):
        final_record([])


def test_an_entry_of_another_signal_is_refused_and_the_same_one_is_kept(synthetic, tmp_path):
    import dataclasses

    setup = dataclasses.replace(synthetic, cache_dir=tmp_path / "cache")
    keys = setup.cache("sst2")
    written = (tmp_path / "cache" / "embeddings" / f"{keys['train']}.safetensors").stat().st_mtime_ns
    assert setup.cache("sst2") == keys  # the same signal again: nothing rewritten
    assert (tmp_path / "cache" / "embeddings" / f"{keys['train']}.safetensors").stat().st_mtime_ns == written
    with pytest.raises(ValueError, match=r"holds features of another signal .*; give this signal its own cache_dir"):
        setup.cache("sst2", signal=LayerSignal(layer=0))
    with pytest.raises(ValueError, match="cache_dir"):
        from ilge_search.testing import cache_study_embeddings

        cache_study_embeddings(dataclasses.replace(setup.spec("sst2"), cache_dir=None))


def test_refused_model_loads_raise_inside_the_block_and_work_again_after_it(tiny_model):
    import transformers

    from ilge_search.embeddings.extraction import LayerEmbedder
    from ilge_search.testing import refuse_model_loads

    with refuse_model_loads():
        with pytest.raises(AssertionError, match="a model or tokenizer was loaded"):
            LayerEmbedder(tiny_model, device="cpu").embed(["river stone"], progress=False)
        with pytest.raises(AssertionError, match="a model or tokenizer was loaded"):
            transformers.AutoTokenizer.from_pretrained(tiny_model)
    assert LayerEmbedder(tiny_model, device="cpu").embed(["river stone"], progress=False).shape == (1, 5, 64)
