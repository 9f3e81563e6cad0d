"""The extraction path against a direct transformers computation, pooling semantics, order and errors.

Tolerances: float32 extraction must match the plain transformers reference within
atol=rtol=1e-5 (the only differences are batch composition and summation order).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ilge_search.embeddings.extraction import POOLINGS, LayerEmbedder, extract_layer_embeddings, pool_hidden_states
from ilge_search.tasks.core import load_task, subsample

N_TEXTS = 96


@pytest.fixture(scope="module")
def texts(data_dir):
    task = subsample(load_task("banking77", data_dir), N_TEXTS, seed=1, splits=["test"])
    return task["test"].texts


@pytest.fixture(scope="module")
def minilm_reference(texts, cache_dir):
    """Every pooling computed the plain way: unsorted batches, stacked hidden states, right padding."""
    from transformers import AutoModel, AutoTokenizer

    from ilge_search.embeddings.models import resolve_model

    path = resolve_model("minilm-l6", cache_dir).path
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    out = {pooling: [] for pooling in POOLINGS}
    with torch.no_grad():
        for start in range(0, len(texts), 13):
            batch = tokenizer(
                texts[start : start + 13], padding=True, truncation=True, max_length=512, return_tensors="pt"
            )
            hidden = torch.stack(model(**batch, output_hidden_states=True).hidden_states, dim=1)  # (B, L, T, D)
            mask = batch["attention_mask"]  # (B, T), right padding
            weights = mask[:, None, :, None].float()
            out["mean"].append((hidden * weights).sum(2) / weights.sum(2))
            out["mean_including_padding"].append(hidden.mean(2))
            out["first"].append(hidden[:, :, 0])
            last = mask.sum(1) - 1
            out["last"].append(hidden[torch.arange(len(last)), :, last])
    return {pooling: torch.cat(parts) for pooling, parts in out.items()}


@pytest.mark.realmodel
@pytest.mark.parametrize("pooling", POOLINGS)
def test_pooled_features_equal_direct_transformers(pooling, texts, minilm_reference, cache_dir):
    embedder = LayerEmbedder("minilm-l6", pooling=pooling, batch_size=16, cache_dir=cache_dir)
    features = embedder.embed(texts, progress=False)
    assert features.shape == (N_TEXTS, 7, 384) and features.dtype == torch.float32
    if pooling == "mean_including_padding":
        # Averaging over padding depends on which texts share a batch, so rebuild the
        # reference from the extraction's own (length-sorted) batches.
        reference = torch.empty_like(features)
        with torch.no_grad():
            for indices, _ in embedder.iter_pooled_batches(texts, progress=False):
                batch = embedder._tokenizer([texts[i] for i in indices], padding=True, return_tensors="pt")
                hidden = embedder._model(**batch, output_hidden_states=True).hidden_states
                reference[torch.from_numpy(indices)] = torch.stack(hidden, 1).mean(2)
        torch.testing.assert_close(features, reference, atol=1e-5, rtol=1e-5)
        # With unsorted batches (more padding) the result is different: padding is averaged in.
        assert not torch.allclose(features, minilm_reference[pooling], atol=1e-3)
        return
    torch.testing.assert_close(features, minilm_reference[pooling], atol=1e-5, rtol=1e-5)
    if pooling == "mean":
        # The poolings really differ (the test would notice a pooling that ignores its name).
        assert (features - minilm_reference["first"]).abs().max() > 0.1


@pytest.mark.realmodel
def test_results_come_back_in_input_order(texts, minilm_reference, cache_dir):
    embedder = LayerEmbedder("minilm-l6", batch_size=7, cache_dir=cache_dir)
    reversed_features = embedder.embed(texts[::-1], progress=False)
    torch.testing.assert_close(reversed_features.flip(0), minilm_reference["mean"], atol=1e-5, rtol=1e-5)
    seen, lengths = [], []
    for indices, pooled in embedder.iter_pooled_batches(texts[:40], progress=False):
        assert pooled.shape == (len(indices), 7, 384) and len(indices) <= 7
        seen.extend(indices.tolist())
        lengths.append(max(len(embedder._tokenizer(texts[i])["input_ids"]) for i in indices))
    assert sorted(seen) == list(range(40))  # every text exactly once
    assert lengths == sorted(lengths, reverse=True)  # longest batches first


@pytest.mark.realmodel
def test_max_length_truncates(texts, cache_dir):
    from transformers import AutoModel, AutoTokenizer

    embedder = LayerEmbedder("minilm-l6", pooling="mean", max_length=6, cache_dir=cache_dir)
    features = embedder.embed(texts[:20], progress=False)
    tokenizer = AutoTokenizer.from_pretrained(embedder.source.path)
    model = AutoModel.from_pretrained(embedder.source.path).eval()
    batch = tokenizer(texts[:20], padding=True, truncation=True, max_length=6, return_tensors="pt")
    assert batch["input_ids"].shape[1] == 6
    with torch.no_grad():
        hidden = torch.stack(model(**batch, output_hidden_states=True).hidden_states, 1)
    weights = batch["attention_mask"][:, None, :, None].float()
    torch.testing.assert_close(features, (hidden * weights).sum(2) / weights.sum(2), atol=1e-5, rtol=1e-5)


@pytest.mark.realmodel
def test_one_shot_function_matches_the_embedder(texts, minilm_reference, cache_dir):
    features = extract_layer_embeddings("minilm-l6", texts[:10], cache_dir=cache_dir, progress=False)
    torch.testing.assert_close(features, minilm_reference["mean"][:10], atol=1e-5, rtol=1e-5)


@pytest.mark.realmodel
@pytest.mark.slow  # the first smollm2-135m load of a session dequantises its GGUF weights
def test_last_pooling_is_the_same_under_left_and_right_padding(data_dir, cache_dir):
    """SmolLM2 is a decoder: `last` must find the last real token whichever side is padded."""
    texts = subsample(load_task("banking77", data_dir), 16, seed=5, splits=["test"])["test"].texts
    out = {}
    for side in ("left", "right"):
        embedder = LayerEmbedder("smollm2-135m", pooling="last", batch_size=8, cache_dir=cache_dir, padding_side=side)
        out[side] = embedder.embed(texts, progress=False)
        assert embedder._tokenizer.padding_side == side
        embedder.unload()
    assert out["left"].shape == (16, 31, 576)
    # Activations reach several hundred in this model: compare relative to their size.
    torch.testing.assert_close(out["left"], out["right"], rtol=1e-4, atol=1e-3)
    # ... and both equal the unpadded computation (one text per batch).
    alone = LayerEmbedder("smollm2-135m", pooling="last", batch_size=1, cache_dir=cache_dir).embed(
        texts[:4], progress=False
    )
    torch.testing.assert_close(out["left"][:4], alone, rtol=1e-4, atol=1e-3)
    # The batches really were padded: the texts have different token counts.
    assert len({len(t.split()) for t in texts}) > 3


def test_pool_hidden_states_semantics_on_known_tensors():
    torch.manual_seed(0)
    hidden = [torch.randn(2, 5, 3) for _ in range(4)]  # L=4 layers of (B=2, T=5, D=3)
    right = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    left = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    # Row 0 of the left-padded batch is the right-padded row shifted by two positions.
    shifted = [h.clone() for h in hidden]
    for h, s in zip(hidden, shifted, strict=True):
        s[0, 2:] = h[0, :3]
        s[0, :2] = float("nan")  # whatever sits at padding must not leak into the result
    for pooling in ("mean", "last", "first"):
        a = pool_hidden_states(hidden, right, pooling)
        b = pool_hidden_states(shifted, left, pooling)
        assert a.shape == (2, 4, 3)
        torch.testing.assert_close(a, b)
    expected_last = torch.stack([h[0, 2] for h in hidden])
    torch.testing.assert_close(pool_hidden_states(hidden, right, "last")[0], expected_last)
    torch.testing.assert_close(
        pool_hidden_states(hidden, right, "mean_including_padding")[1], torch.stack([h[1].mean(0) for h in hidden])
    )


def test_bad_input_fails_before_the_model_loads(cache_dir):
    embedder = LayerEmbedder("minilm-l6", cache_dir=cache_dir)
    with pytest.raises(ValueError, match="texts is empty"):
        embedder.embed([])
    with pytest.raises(ValueError, match=r"2 text\(s\) are empty or not strings, at positions \[1, 2\]"):
        embedder.embed(["fine", "  ", None])
    with pytest.raises(TypeError, match="not one string"):
        embedder.embed("one string")
    assert not embedder.is_loaded
    assert (embedder.num_layers, embedder.hidden_size) == (7, 384)  # read from the config only
    assert not embedder.is_loaded
    with pytest.raises(ValueError, match="pooling must be one of"):
        LayerEmbedder("minilm-l6", pooling="max")
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        LayerEmbedder("minilm-l6", batch_size=0)
    assert np.array_equal(POOLINGS, ("mean", "last", "first", "mean_including_padding"))
