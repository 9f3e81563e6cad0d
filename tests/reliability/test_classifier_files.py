"""A saved ILGEClassifier: unusable weights and base-model paths leading elsewhere are refused; file modes match.

The classifiers are fitted on random (N, L, D) features (no LLM), which is all that saving and
loading need.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from ilge_search.encoders.configs import DeepSetConfig
from ilge_search.use.classifier import META_FILE, WEIGHTS_FILE, ILGEClassifier


@pytest.fixture(scope="module")
def fitted() -> ILGEClassifier:
    rng = np.random.default_rng(0)
    features = torch.tensor(rng.normal(size=(60, 3, 8)), dtype=torch.float32)
    labels = np.arange(60) % 2
    features[labels == 1] += 0.5
    config = DeepSetConfig(hidden_dim=8, epochs=3)
    return ILGEClassifier(base_model="minilm-l6", config=config, device="cpu").fit_embeddings(features, labels)


def _edit_meta(folder: Path, **fields) -> None:
    meta = json.loads((folder / META_FILE).read_text())
    meta.update(fields)
    (folder / META_FILE).write_text(json.dumps(meta))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_weights_holding_nan_or_inf_are_refused(tmp_path, fitted, bad):
    folder = fitted.save(tmp_path / "clf")
    state = load_file(str(folder / WEIGHTS_FILE))
    name = sorted(state)[1]
    state[name].view(-1)[0] = bad
    save_file(state, str(folder / WEIGHTS_FILE))
    with pytest.raises(
        ValueError,
        match=rf"model.safetensors holds NaN or infinite values in \['{name}'\]; "
        r"these weights cannot predict anything",
    ):
        ILGEClassifier.load(folder, device="cpu")


@pytest.mark.parametrize(
    "recorded", ["../elsewhere", "./sub/../../elsewhere", "/opt/models/llm", "~/models/llm", "sub/../../../x"]
)
def test_a_recorded_base_model_path_outside_the_folder_is_refused(tmp_path, fitted, recorded):
    folder = fitted.save(tmp_path / "clf")
    _edit_meta(folder, base_model=recorded)
    with pytest.raises(
        ValueError,
        match=rf"records the base model '{recorded}', a local path outside that folder, "
        r"which is not followed; if you trust it, pass it explicitly",
    ):
        ILGEClassifier.load(folder, device="cpu")
    explicit = ILGEClassifier.load(folder, device="cpu", base_model="minilm-l6")  # the caller's choice wins
    assert explicit.base_model == "minilm-l6"


def test_a_symlink_inside_the_folder_that_leads_outside_is_refused(tmp_path, fitted):
    folder = fitted.save(tmp_path / "clf")
    (tmp_path / "outside-model").mkdir()
    (folder / "llm").symlink_to(tmp_path / "outside-model")
    _edit_meta(folder, base_model="./llm")
    with pytest.raises(ValueError, match="a local path outside that folder"):
        ILGEClassifier.load(folder, device="cpu")


@pytest.mark.parametrize("recorded", ["minilm-l6", "sentence-transformers/all-MiniLM-L6-v2", "gpt2@main", None])
def test_aliases_and_hub_ids_are_loaded_as_recorded(tmp_path, fitted, recorded):
    folder = fitted.save(tmp_path / "clf")
    _edit_meta(folder, base_model=recorded)
    assert ILGEClassifier.load(folder, device="cpu").base_model == recorded


def test_a_model_folder_saved_inside_the_classifier_folder_travels_with_it(tmp_path, fitted):
    folder = tmp_path / "clf"
    (folder / "llm").mkdir(parents=True)
    (folder / "llm" / "config.json").write_text("{}")
    clone = ILGEClassifier.load(fitted.save(tmp_path / "first"), device="cpu")
    clone.base_model = str(folder / "llm")
    clone.save(folder)
    assert json.loads((folder / META_FILE).read_text())["base_model"] == "./llm"  # recorded relative
    moved = folder.rename(tmp_path / "moved")
    assert ILGEClassifier.load(moved, device="cpu").base_model == str((moved / "llm").resolve())


def test_a_local_model_folder_outside_is_recorded_absolute_and_needs_to_be_given_again(tmp_path, fitted):
    outside = tmp_path / "models" / "llm"
    outside.mkdir(parents=True)
    clone = ILGEClassifier.load(fitted.save(tmp_path / "first"), device="cpu")
    clone.base_model = str(outside)
    folder = clone.save(tmp_path / "clf")
    assert json.loads((folder / META_FILE).read_text())["base_model"] == str(outside.resolve())
    with pytest.raises(ValueError, match="a local path outside that folder"):
        ILGEClassifier.load(folder, device="cpu")
    assert ILGEClassifier.load(folder, device="cpu", base_model=outside).base_model == str(outside)


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_weights_and_json_are_written_with_the_same_mode_following_the_umask(tmp_path, fitted, umask):
    previous = os.umask(umask)
    try:
        folder = fitted.save(tmp_path / "clf")
    finally:
        os.umask(previous)
    modes = {name: stat.S_IMODE((folder / name).stat().st_mode) for name in (WEIGHTS_FILE, META_FILE)}
    assert modes == {WEIGHTS_FILE: 0o666 & ~umask, META_FILE: 0o666 & ~umask}
    assert sorted(p.name for p in folder.iterdir()) == sorted([WEIGHTS_FILE, META_FILE])  # no temporary file left


def test_a_class_list_cut_to_one_names_the_file(tmp_path, fitted):
    """Before: "classification needs num_classes >= 2", naming neither the folder nor the file."""
    folder = tmp_path / "clf"
    fitted.save(folder)
    meta = json.loads((folder / META_FILE).read_text())
    _edit_meta(folder, classes=meta["classes"][:1])
    with pytest.raises(
        ValueError, match=rf"^{folder / META_FILE}: classes lists 1 label\(s\) and the model needs at least 2"
    ):
        ILGEClassifier.load(folder, device="cpu")


def test_predict_with_a_base_model_of_another_shape_is_refused_before_embedding(tmp_path, fitted, no_model_loads):
    """Before: `predict --base-model smollm2-135m` on a MiniLM classifier embedded for 82 s, then failed on shapes."""
    from click.testing import CliRunner

    from ilge_search.cli import cli

    folder = tmp_path / "clf"
    fitted.save(folder)  # trained on 3 hidden states of 8 features
    texts = tmp_path / "texts.txt"
    texts.write_text("a first text\na second text\n")
    for base in ([], ["--base-model", "smollm2-135m"]):
        result = CliRunner().invoke(
            cli, ["predict", str(folder), "--input", str(texts), "--cache-dir", str(tmp_path / "c"), *base]
        )
        assert result.exit_code == 1, result.output
        shown = "minilm-l6" if not base else "smollm2-135m"
        size = "7 hidden states of 384" if not base else "31 hidden states of 576"
        assert f"the base model {shown} gives {size} features, but the model in {folder} was trained on 3 x 8" in (
            " ".join(result.output.split())
        )
