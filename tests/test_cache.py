"""The embedding cache: stored values, keys, hits without a model, corruption, concurrency, ls/rm.

Stored features are float16: they must equal a direct float32 transformers computation
within float16 rounding (rtol 2**-10, atol 1e-5).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from ilge_search.embeddings import cache as cache_module
from ilge_search.embeddings import extraction
from ilge_search.embeddings.cache import (
    FORMAT_VERSION,
    EmbeddingCache,
    ExtractionSettings,
    load_task_embeddings,
    texts_fingerprint,
)
from ilge_search.embeddings.extraction import LayerEmbedder
from ilge_search.embeddings.models import ModelNotFoundError
from ilge_search.tasks.core import TaskError, load_task, subsample

pytestmark = pytest.mark.realmodel
FLOAT16_TOLERANCE = dict(rtol=2**-10, atol=1e-5)


@pytest.fixture(scope="module")
def small_task(data_dir):
    return subsample(load_task("banking77", data_dir), 40, seed=2)


@pytest.fixture(scope="module")
def test_entry(cache_dir, small_task):
    return EmbeddingCache(cache_dir).get_or_extract("minilm-l6", small_task, "test", progress=False)


@pytest.fixture(scope="module")
def scratch():
    """A cache in its own folder whose entries the corruption tests may damage; the model stays loaded."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder, EmbeddingCache(folder) as cache:
        yield cache


def direct_mean_pooling(path, texts):
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        batch = tokenizer(texts, padding=True, truncation=True, max_length=512, return_tensors="pt")
        hidden = torch.stack(model(**batch, output_hidden_states=True).hidden_states, 1)  # (B, L, T, D)
    weights = batch["attention_mask"][:, None, :, None].float()
    return (hidden * weights).sum(2) / weights.sum(2)


def test_stored_features_equal_a_direct_computation(test_entry, small_task):
    assert test_entry.features.shape == (40, 7, 384) and test_entry.features.dtype == torch.float16
    reference = direct_mean_pooling(test_entry.meta["model_path"], small_task["test"].texts)
    torch.testing.assert_close(test_entry.features.float(), reference, **FLOAT16_TOLERANCE)
    assert torch.equal(test_entry.labels, torch.from_numpy(small_task["test"].labels))
    assert test_entry.label_names == small_task.label_names
    meta = test_entry.meta
    assert meta["model"] == "minilm-l6" and meta["model_identity"].startswith("sha256:")
    assert (meta["task"], meta["split"], meta["fingerprint"]) == ("banking77", "test", small_task.fingerprint("test"))
    assert meta["shape"] == [40, 7, 384] and meta["format_version"] == FORMAT_VERSION
    assert test_entry.path.name == f"{test_entry.key}.safetensors" and test_entry.path.is_file()


def test_the_file_is_plain_safetensors(test_entry):
    from safetensors import safe_open

    with safe_open(str(test_entry.path), framework="pt") as handle:
        assert set(handle.keys()) == {"features", "labels"}
        assert handle.metadata()["key"] == test_entry.key
        assert torch.equal(handle.get_tensor("features"), test_entry.features)


def test_a_hit_loads_no_model(test_entry, small_task, cache_dir, no_model_loads):
    again = EmbeddingCache(cache_dir).get_or_extract("minilm-l6", small_task, "test", progress=False)
    assert again.hit and again.key == test_entry.key
    assert torch.equal(again.features, test_entry.features)


def test_keys_hash_every_field_and_skip_defaults(scratch):
    base = dict(model_identity="sha256:abc", task="t", split="train", fingerprint="f")
    key = scratch.key(**base)
    assert len(key) == 24 and key == scratch.key(**base, pooling="mean", max_length=512, storage_dtype="float16")
    variants = [
        dict(base, model_identity="sha256:abd"),
        dict(base, task="u"),
        dict(base, split="test"),
        dict(base, fingerprint="g"),
        dict(base, pooling="last"),
        dict(base, max_length=128),
        dict(base, storage_dtype="float32"),
    ]
    assert len({key} | {scratch.key(**v) for v in variants}) == 1 + len(variants)
    with pytest.raises(TypeError):  # an unhashable field raises instead of producing some key
        scratch.key(**dict(base, fingerprint=object()))
    assert texts_fingerprint(["a", "b"]) != texts_fingerprint(["b", "a"]) != texts_fingerprint(["ab"])


def test_options_and_splits_are_checked_before_the_model(small_task, cache_dir, no_model_loads):
    cache = EmbeddingCache(cache_dir)
    with pytest.raises(ValueError, match="pooling must be one of"):
        cache.get_or_extract("minilm-l6", small_task, "test", settings=ExtractionSettings(pooling="max"))
    with pytest.raises(ValueError, match="storage_dtype must be one of"):
        cache.get_or_extract("minilm-l6", small_task, "test", settings=ExtractionSettings(storage_dtype="int8"))
    with pytest.raises(TaskError, match="has no split 'dev'"):
        cache.get_or_extract("minilm-l6", small_task, "dev")
    with pytest.raises(ModelNotFoundError):
        cache.get_or_extract("./no/such/model", small_task, "test")


def _damage_and_reload(scratch, task, damage):
    first = scratch.get_or_extract("minilm-l6", task, "validation", progress=False)
    damage(first)
    with pytest.warns(UserWarning, match=f"entry {first.key} is corrupt"):
        rebuilt = scratch.get_or_extract("minilm-l6", task, "validation", progress=False)
    assert not rebuilt.hit and rebuilt.key == first.key
    assert torch.equal(rebuilt.features, first.features)
    again = EmbeddingCache(scratch.cache_dir).get_or_extract("minilm-l6", task, "validation", progress=False)
    assert again.hit
    return first


def test_truncated_file_is_detected_and_rebuilt(scratch, small_task):
    def truncate(entry):
        size = entry.path.stat().st_size
        with open(entry.path, "r+b") as handle:
            handle.truncate(size // 2)

    _damage_and_reload(scratch, small_task, truncate)


def test_flipped_byte_fails_the_checksum_and_is_rebuilt(scratch, small_task):
    def flip(entry):
        data = bytearray(entry.path.read_bytes())
        data[-100] ^= 0xFF
        entry.path.write_bytes(bytes(data))
        os.utime(entry.path, ns=(1, 1))

    _damage_and_reload(scratch, small_task, flip)


def test_broken_metadata_and_missing_data_are_rebuilt(scratch, small_task):
    _damage_and_reload(scratch, small_task, lambda e: e.path.with_suffix(".json").write_text("{not json"))
    _damage_and_reload(scratch, small_task, lambda e: e.path.unlink())


def test_a_failed_extraction_leaves_no_entry(scratch, small_task, monkeypatch):
    def overflowing(self, texts, progress=True):
        yield np.arange(len(texts)), torch.full((len(texts), 7, 384), 1e6)

    monkeypatch.setattr(LayerEmbedder, "iter_pooled_batches", overflowing)
    with pytest.raises(ValueError, match=r"not finite after conversion to float16.*storage_dtype='float32'"):
        scratch.get_or_extract(
            "minilm-l6", small_task, "train", progress=False, settings=ExtractionSettings(max_length=64)
        )
    assert not [p.name for p in scratch.embeddings_dir.iterdir() if "tmp" in p.name]
    assert "train" not in {e.split for e in scratch.ls() if e.meta.get("max_length") == 64}


def test_other_storage_dtypes_round_trip(scratch, small_task):
    exact = scratch.get_or_extract(
        "minilm-l6", small_task, "test", progress=False, settings=ExtractionSettings(storage_dtype="float32")
    )
    brain = scratch.get_or_extract(
        "minilm-l6", small_task, "test", progress=False, settings=ExtractionSettings(storage_dtype="bfloat16")
    )
    assert exact.features.dtype == torch.float32 and brain.features.dtype == torch.bfloat16
    assert exact.key != brain.key
    torch.testing.assert_close(brain.features.float(), exact.features, rtol=2**-7, atol=1e-5)


def test_similarity_pairs_are_stored_side_by_side(cache_dir, data_dir):
    task = subsample(load_task("stsb", data_dir), 24, seed=0, splits=["test"])
    entry = EmbeddingCache(cache_dir).get_or_extract("minilm-l6", task, "test", progress=False)
    assert entry.features.shape == (24, 2, 7, 384) and entry.labels.dtype == torch.float32
    assert entry.label_names == [] and entry.meta["kind"] == "similarity"
    pairs = task["test"].pairs
    second = direct_mean_pooling(entry.meta["model_path"], [b for _, b in pairs[:8]])
    torch.testing.assert_close(entry.features[:8, 1].float(), second, **FLOAT16_TOLERANCE)
    first = direct_mean_pooling(entry.meta["model_path"], [a for a, _ in pairs[:8]])
    torch.testing.assert_close(entry.features[:8, 0].float(), first, **FLOAT16_TOLERANCE)


def test_texts_are_cached_by_their_fingerprint(cache_dir, test_entry, small_task, monkeypatch):
    texts = small_task["test"].texts[:12]
    features = EmbeddingCache(cache_dir).get_or_extract_texts("minilm-l6", texts, progress=False)
    torch.testing.assert_close(features.float(), test_entry.features[:12].float(), rtol=2**-9, atol=1e-4)

    def refuse(*args, **kwargs):
        raise AssertionError("model loaded on a hit")

    monkeypatch.setattr(LayerEmbedder, "load", refuse)
    assert torch.equal(EmbeddingCache(cache_dir).get_or_extract_texts("minilm-l6", texts, progress=False), features)
    with pytest.raises(ValueError, match=r"empty or not strings, at positions \[1\]"):
        EmbeddingCache(cache_dir).get_or_extract_texts("minilm-l6", ["ok", ""])


def test_load_task_embeddings_extracts_missing_splits_with_one_model_load(tmp_path, small_task, monkeypatch):
    loads = []
    original = extraction.load_model_and_tokenizer

    def counting(*args, **kwargs):
        loads.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(extraction, "load_model_and_tokenizer", counting)
    small = subsample(small_task, 10, seed=0)
    result = load_task_embeddings("minilm-l6", small, cache_dir=tmp_path, progress=False)
    assert len(loads) == 1 and set(result.splits) == {"train", "validation", "test"}
    assert (result.num_layers, result.hidden_size) == (7, 384) and result.label_names == small.label_names
    assert result.cache_keys == {split: entry.key for split, entry in result.splits.items()}
    assert not any(entry.hit for entry in result.splits.values())
    again = load_task_embeddings("minilm-l6", small, cache_dir=tmp_path, splits=["test"], progress=False)
    assert len(loads) == 1 and again.splits["test"].hit


def _write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_bad_tasks_fail_before_any_model_loads(tmp_path, cache_dir, data_dir, no_model_loads):
    good = [{"text": f"text {i}", "label": "ab"[i % 2]} for i in range(20)]
    with pytest.raises(TaskError, match="unknown task 'bankng77'"):
        load_task_embeddings("minilm-l6", "bankng77", data_dir=data_dir, cache_dir=cache_dir)
    with pytest.raises(TaskError, match=r"no column 'text' \(columns present: sentence, label\)"):
        load_task_embeddings(
            "minilm-l6",
            _write_jsonl(tmp_path / "cols.jsonl", [{"sentence": r["text"], "label": r["label"]} for r in good]),
            cache_dir=cache_dir,
        )
    empty = [dict(r) for r in good]
    empty[4]["text"] = ""
    with pytest.raises(TaskError, match=r"empty text\(s\) at row\(s\) 5"):
        load_task_embeddings("minilm-l6", _write_jsonl(tmp_path / "empty.jsonl", empty), cache_dir=cache_dir)
    _write_jsonl(tmp_path / "unseen" / "train.jsonl", good)
    _write_jsonl(tmp_path / "unseen" / "test.jsonl", [{"text": "x", "label": "c"}])
    with pytest.raises(TaskError, match="does not have: 'c'"):
        load_task_embeddings("minilm-l6", tmp_path / "unseen", cache_dir=cache_dir)
    with pytest.raises(TaskError, match=r"no split\(s\) \['dev'\]"):
        load_task_embeddings("minilm-l6", "banking77", data_dir=data_dir, cache_dir=cache_dir, splits=["dev"])
    with pytest.raises(ModelNotFoundError):
        load_task_embeddings("./missing-model", "banking77", data_dir=data_dir, cache_dir=cache_dir)


def test_ls_and_rm(tmp_path, small_task):
    cache = EmbeddingCache(tmp_path)
    tiny = subsample(small_task, 4, seed=0)
    keys = [cache.get_or_extract("minilm-l6", tiny, split, progress=False).key for split in ("train", "test")]
    cache.unload()
    entries = cache.ls()
    assert sorted(e.key for e in entries) == sorted(keys)
    row = next(e for e in entries if e.key == keys[0])
    assert (row.model, row.task, row.split, row.shape) == ("minilm-l6", "banking77", "train", (4, 7, 384))
    assert row.size_bytes == row.path.stat().st_size > 4 * 7 * 384 * 2
    with pytest.raises(ValueError, match="no cache entry matches 'zzz'"):
        cache.rm("zzz")
    with pytest.raises(ValueError, match="matches 2 entries"):
        cache.rm("")
    assert cache.rm(keys[0][:8]) == [keys[0]]
    assert [e.key for e in cache.ls()] == [keys[1]]
    assert cache.rm(all=True) == [keys[1]] and cache.ls() == []


_WORKER = textwrap.dedent("""
    import json, os, pathlib, sys, time
    cache_dir, task_file, counter, ready_dir, me = sys.argv[1:6]
    import ilge_search.embeddings.extraction as extraction
    from ilge_search.embeddings.cache import EmbeddingCache
    from ilge_search.tasks.core import load_task

    original = extraction.load_model_and_tokenizer

    def counting(*args, **kwargs):
        with open(counter, "a") as handle:
            handle.write(f"{os.getpid()}\\n")
        time.sleep(2.0)  # hold the lock long enough for the other process to queue behind it
        return original(*args, **kwargs)

    extraction.load_model_and_tokenizer = counting
    task = load_task(task_file)
    cache = EmbeddingCache(cache_dir)
    cache.resolve("minilm-l6")
    pathlib.Path(ready_dir, me).touch()
    while len(os.listdir(ready_dir)) < 2:  # start both extractions at the same moment
        time.sleep(0.02)
    entry = cache.get_or_extract("minilm-l6", task, "train", progress=False)
    print(json.dumps({"key": entry.key, "hit": entry.hit, "sum": float(entry.features.double().sum())}))
""")


@pytest.mark.slow  # two processes, each loading the model
def test_two_processes_extract_an_entry_once(tmp_path, small_task):
    rows = [{"text": text, "label": "ab"[i % 2]} for i, text in enumerate(small_task["train"].texts)]
    task_file = _write_jsonl(tmp_path / "task.jsonl", rows)
    counter, ready = tmp_path / "loads.txt", tmp_path / "ready"
    ready.mkdir()
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / "cache"), str(task_file), str(counter), str(ready), name],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for name in ("a", "b")
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert len(counter.read_text().splitlines()) == 1  # the model was loaded (and run) once
    assert sorted(r["hit"] for r in results) == [False, True]
    assert results[0]["key"] == results[1]["key"] and results[0]["sum"] == results[1]["sum"]
    cache = EmbeddingCache(tmp_path / "cache")
    assert [e.key for e in cache.ls()] == [results[0]["key"]]
    assert cache._read(results[0]["key"]) is not None  # size, header and checksum all valid
    assert not [p.name for p in cache.embeddings_dir.iterdir() if "tmp" in p.name]


def test_format_is_versioned():
    assert isinstance(cache_module.FORMAT_VERSION, int) and cache_module.FORMAT_VERSION >= 1
