"""Devices this machine lacks and model folders that are not usable models: one line, before any load."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
import torch
from announced_skips import skipped_where
from click.testing import CliRunner
from reliability_helpers import labelled, one_line_error, write_task

from ilge_search.cli import cli
from ilge_search.embeddings.cache import EmbeddingCache, ExtractionSettings, load_task_embeddings
from ilge_search.embeddings.models import (
    ModelLoadError,
    load_config,
    load_model_and_tokenizer,
    model_reference_kind,
    resolve_device,
    resolve_model,
)
from ilge_search.encoders.configs import MLPLastConfig
from ilge_search.engine import train_encoder
from ilge_search.use.classifier import ILGEClassifier

CUDA = torch.cuda.is_available()
MPS = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
MISSING_DEVICES = [d for d, present in (("cuda", CUDA), ("cuda:0", CUDA), ("mps", MPS)) if not present] + ["cuda:99"]


# ----------------------------------------------------------------------------- devices


@pytest.mark.parametrize("device", MISSING_DEVICES)
def test_a_device_this_machine_lacks_is_refused_at_every_entrance_before_any_load(tmp_path, device, no_model_loads):
    pattern = rf"device '{device}' (is not available|does not exist)"
    with pytest.raises(ValueError, match=pattern):
        resolve_device(device)
    task = write_task(tmp_path / "task", {"train": labelled(30, ["a", "b"]), "test": labelled(6, ["a", "b"], 60)})
    with pytest.raises(ValueError, match=pattern):  # the cache entrance: embed, run, sweep
        load_task_embeddings(
            "minilm-l6", task, cache_dir=tmp_path / "cache", progress=False, settings=ExtractionSettings(device=device)
        )
    with pytest.raises(ValueError, match=pattern):  # texts, as the classifier embeds them
        EmbeddingCache(tmp_path / "cache").get_or_extract_texts(
            "minilm-l6", ["a text"], settings=ExtractionSettings(device=device)
        )
    features = torch.randn(40, 3, 8)
    with pytest.raises(ValueError, match=pattern):  # the estimator, before training
        ILGEClassifier(config=MLPLastConfig(hidden_dim=4), device=device).fit_embeddings(features, np.arange(40) % 2)
    with pytest.raises(ValueError, match=pattern):  # the engine, before a model is built
        train_encoder(
            MLPLastConfig(hidden_dim=4),
            (features, torch.arange(40) % 2),
            (features, torch.arange(40) % 2),
            task_kind="classification",
            num_classes=2,
            device=device,
        )
    assert not (tmp_path / "cache" / "embeddings").exists() or not any((tmp_path / "cache" / "embeddings").iterdir())


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "tpu"])
def test_an_unknown_device_name_is_refused(device):
    with pytest.raises(ValueError, match=rf"device '{device}'"):
        resolve_device(device)


@pytest.mark.parametrize(
    "device, message",
    [
        pytest.param(
            "cuda",
            f"device 'cuda' is not available: this torch is built without CUDA (torch "
            f"{torch.__version__}); use --device cpu or auto",
            marks=skipped_where(
                CUDA or torch.version.cuda is not None,
                "torch built with CUDA: no no-CUDA message to check",
            ),
        ),
        ("gpu", "unknown device 'gpu'; use auto, cpu, cuda, cuda:N or mps"),
    ],
)
def test_embed_and_run_with_a_missing_device_fail_in_one_line_before_any_trial(
    tmp_path, no_model_loads, device, message
):
    task = write_task(tmp_path / "task", {"train": labelled(30, ["a", "b"]), "test": labelled(6, ["a", "b"], 60)})
    db = tmp_path / "s.db"
    for command in (
        ["embed", "--model", "minilm-l6", "--task", str(task)],
        [
            "run",
            "--model",
            "minilm-l6",
            "--task",
            str(task),
            "--storage",
            f"sqlite:///{db}",
            "--n-trials",
            "1",
            "--final-seeds",
            "0",
        ],
    ):
        result = CliRunner().invoke(
            cli, [*command, "--cache-dir", str(tmp_path / "cache"), "--device", device, "--quiet"]
        )
        assert one_line_error(result) == f"Error: {message}"
    if db.exists():  # no trial was started (before: trial 0 failed with a traceback)
        with sqlite3.connect(db) as conn:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            assert "trials" not in tables or conn.execute("SELECT COUNT(*) FROM trials").fetchone()[0] == 0


def test_cpu_and_auto_still_resolve():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type in ("cpu", "cuda", "mps")


# ----------------------------------------------------------------------------- unusable model folders


def _model_folder(path: Path, config, weights: bool = True, vocab: bool = False) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    if weights:
        (path / "model.safetensors").write_bytes(b"\0" * 64)
    if vocab:
        (path / "vocab.txt").write_text("[PAD]\n[UNK]\nthe\n")
    return path


@pytest.mark.parametrize(
    "config, weights, reason",
    [
        ('{"model_type": "bert", ', True, r"its config.json cannot be read as JSON \(Expecting"),
        ({}, True, 'its config.json has no "model_type"'),
        (["bert"], True, 'its config.json has no "model_type"'),
        ({"model_type": "bert", "hidden_size": 32}, False, r"it has no weights file \(\*.safetensors, \*.bin \.\.\.\)"),
    ],
)
def test_a_folder_that_is_not_a_usable_model_is_refused_when_resolved(
    tmp_path, no_model_loads, config, weights, reason
):
    folder = _model_folder(tmp_path / "my-model", config, weights)
    with pytest.raises(ModelLoadError, match=rf"^{folder} is not a usable model: {reason}") as caught:
        resolve_model(str(folder), tmp_path / "cache")
    assert "\n" not in str(caught.value) and "save_pretrained" in str(caught.value)
    task = write_task(tmp_path / "task", {"train": labelled(30, ["a", "b"]), "test": labelled(6, ["a", "b"], 60)})
    result = CliRunner().invoke(
        cli,
        [
            "embed",
            "--model",
            str(folder),
            "--task",
            str(task),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--device",
            "cpu",
            "--quiet",
        ],
    )
    assert one_line_error(result).startswith(f"Error: {folder} is not a usable model: ")


def test_config_values_transformers_rejects_are_one_line_before_any_weights_load(tmp_path, no_model_loads):
    folder = _model_folder(tmp_path / "odd-llama", {"model_type": "llama", "hidden_size": 8}, vocab=True)  # 32 heads
    with pytest.raises(
        ModelLoadError,
        match=rf"^{folder} is not a usable model: .*hidden size \(8\) is not a "
        r"multiple of the number of attention heads \(32\)",
    ) as caught:
        load_config(str(folder), tmp_path / "cache")
    assert "\n" not in str(caught.value)


def test_a_folder_without_tokenizer_files_says_so_instead_of_a_sentencepiece_error(tmp_path):
    folder = _model_folder(
        tmp_path / "no-tokenizer",
        {
            "model_type": "llama",
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "vocab_size": 100,
        },
    )
    with pytest.raises(ModelLoadError) as caught:
        load_model_and_tokenizer(str(folder), "cpu", cache_dir=tmp_path / "cache")
    message = str(caught.value)
    assert message.startswith(f"{folder} is not a usable model: it has no tokenizer files (tokenizer.json, ")
    assert "\n" not in message


def test_a_folder_with_config_and_weights_but_no_vocabulary_is_refused_before_any_load(tmp_path, no_model_loads):
    """Before: transformers built a tokenizer of its 5 special tokens, every word was [UNK], and `run`, `embed`
    and `predict --base-model` ran to the end on meaningless embeddings."""
    folder = _model_folder(tmp_path / "no-vocab", {"model_type": "bert", "hidden_size": 32})
    (folder / "tokenizer_config.json").write_text('{"do_lower_case": true}')  # settings, but no vocabulary
    with pytest.raises(ModelLoadError, match=r"it has no tokenizer files \(tokenizer.json, vocab.txt, "):
        resolve_model(str(folder), tmp_path / "cache")
    task = write_task(tmp_path / "task", {"train": labelled(30, ["a", "b"]), "test": labelled(6, ["a", "b"], 60)})
    common = ["--model", str(folder), "--task", str(task), "--cache-dir", str(tmp_path / "cache"), "--device", "cpu"]
    for command in (["embed", *common], ["run", *common, "--storage", f"sqlite:///{tmp_path / 's.db'}"]):
        line = one_line_error(CliRunner().invoke(cli, [*command, "--quiet"]))
        assert line.startswith(f"Error: {folder} is not a usable model: it has no tokenizer files"), line
    assert not (tmp_path / "s.db").exists()


def test_a_tokenizer_that_reads_a_sample_sentence_as_unknown_tokens_only_is_refused(tmp_path, tiny_model):
    import shutil

    folder = tmp_path / "unk-only"
    shutil.copytree(tiny_model, folder)
    vocab = json.loads((folder / "tokenizer.json").read_text())
    vocab["model"]["vocab"] = {token: i for i, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])}
    (folder / "tokenizer.json").write_text(json.dumps(vocab))
    with pytest.raises(ModelLoadError, match=r"its tokenizer reads the sample sentence .* as unknown tokens only"):
        load_model_and_tokenizer(str(folder), "cpu", cache_dir=tmp_path / "cache")
    _model, tokenizer = load_model_and_tokenizer(tiny_model, "cpu", cache_dir=tmp_path / "cache")  # its own: fine
    assert len(tokenizer) > 5


def test_model_reference_kind_is_read_from_the_spelling():
    assert model_reference_kind("minilm-l6") == "alias"
    assert [model_reference_kind(name) for name in ("gpt2", "org/model", "org/model@main")] == ["hub"] * 3
    assert [
        model_reference_kind(name)
        for name in ("/abs/model", "./model", "../model", "~/model", "a/b/c", "a\\b", "org/../x", "bad name")
    ] == ["path"] * 8
