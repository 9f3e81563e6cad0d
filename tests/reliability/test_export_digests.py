"""An exported folder checks itself: a save records the sha256 of its weights, of its classes in order and of an
ensemble's members and counts, and a load (the API and `predict`) refuses a folder whose files disagree with it in
one line naming the file; an ensemble's mix weights must be a mixture that its counts give.

The classifiers are fitted on random (N, L, D) features shaped like minilm-l6's hidden states (no LLM)."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from reliability_helpers import one_line_error
from safetensors.torch import load_file, save_file

from ilge_search import ILGETagger, LastLayerConfig
from ilge_search.cli import cli
from ilge_search.encoders.configs import DeepSetConfig
from ilge_search.engine.ensemble import EnsembleModel
from ilge_search.testing.tiny_models import CORPUS, tiny_encoder
from ilge_search.use.classifier import META_FILE, ILGEClassifier
from ilge_search.use.saved import FolderMismatch

CONFIG = DeepSetConfig(hidden_dim=8, epochs=2)
WEIGHTS = "model.safetensors"


@pytest.fixture(scope="module")
def ensemble_folder(tmp_path_factory) -> Path:
    """A two-member ensemble classifier over the labels "neg" and "pos", saved as `export --ensemble` writes it
    (counts 2 and 1)."""
    rng = np.random.default_rng(0)
    features = torch.tensor(rng.normal(size=(40, 7, 384)), dtype=torch.float32)
    labels = np.where(np.arange(40) % 2, "pos", "neg")
    clf = ILGEClassifier(base_model="minilm-l6", config=CONFIG, device="cpu").fit_embeddings(features, labels)
    members = [clf.model_, copy.deepcopy(clf.model_)]
    description = [{"trial": i, "count": c, "config": CONFIG.to_dict()} for i, c in enumerate((2, 1))]
    clf.model_ = EnsembleModel(members, [2, 1], description)
    return clf.save(tmp_path_factory.mktemp("ensemble") / "clf")


def _copy(folder: Path, target: Path, meta_name: str = META_FILE, edit=None, mix=None) -> Path:
    """A copy of ``folder`` with its JSON edited by ``edit`` and its ensemble's ``mix`` tensor replaced."""
    target.mkdir()
    for source in folder.iterdir():
        (target / source.name).write_bytes(source.read_bytes())
    meta = json.loads((target / meta_name).read_text())
    if edit is not None:
        edit(meta)
    (target / meta_name).write_text(json.dumps(meta))
    if mix is not None:
        state = load_file(str(target / WEIGHTS))
        state["mix"] = torch.tensor(mix, dtype=torch.float64)
        save_file(state, str(target / WEIGHTS))
    return target


def _refused(folder: Path, error=FolderMismatch, **load) -> str:
    with pytest.raises(error) as caught:
        ILGEClassifier.load(folder, device="cpu", **load)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_save_records_the_digest_of_its_weights_classes_and_members(ensemble_folder):
    digest = json.loads((ensemble_folder / META_FILE).read_text())["digest"]
    assert set(digest) == {"weights", "classes", "ensemble"} and all(len(value) == 64 for value in digest.values())
    assert ILGEClassifier.load(ensemble_folder, device="cpu").classes_.tolist() == ["neg", "pos"]


def test_a_changed_member_count_is_refused_naming_the_file(tmp_path, ensemble_folder):
    def edit(meta):
        meta["ensemble"][1]["count"] = 5  # before: accepted and ignored, the mix tensor decided

    message = _refused(_copy(ensemble_folder, tmp_path / "clf", edit=edit))
    assert message.startswith(f"{tmp_path / 'clf' / META_FILE}: the ensemble's members or counts differ")


def test_reordered_classes_are_refused_instead_of_relabelling_every_prediction(tmp_path, ensemble_folder):
    def reorder(meta):
        meta["classes"] = meta["classes"][::-1]

    message = _refused(_copy(ensemble_folder, tmp_path / "clf", edit=reorder))
    assert message.startswith(f"{tmp_path / 'clf' / META_FILE}: the classes (or their order) differ")
    assert "use it anyway with `predict --force` (load(..., force=True))" in message


def test_an_export_without_a_digest_still_loads_and_its_counts_must_match_its_mix(tmp_path, ensemble_folder):
    def older(meta):
        del meta["digest"]

    assert ILGEClassifier.load(_copy(ensemble_folder, tmp_path / "old", edit=older), device="cpu").n_members_ == 2

    def older_recounted(meta):
        older(meta)
        meta["ensemble"][1]["count"] = 5

    message = _refused(_copy(ensemble_folder, tmp_path / "clf", edit=older_recounted))
    assert message.startswith(f"{tmp_path / 'clf' / WEIGHTS}: the ensemble's mix weights do not match the member")


@pytest.mark.parametrize("mix", [[1.5, -0.5], [0.5, 0.25], [2.0, 1.0]])
def test_mix_weights_must_be_non_negative_and_sum_to_one_even_with_force(tmp_path, ensemble_folder, mix):
    # before: accepted, giving probabilities like 2e-301
    folder = _copy(ensemble_folder, tmp_path / "clf", mix=mix)
    for force in (False, True):
        message = _refused(folder, ValueError, force=force)
        assert message.startswith(f"{folder / WEIGHTS}: the ensemble's mix weights")
        assert "are not non-negative and summing to 1" in message


def test_force_uses_a_changed_folder_with_a_warning(tmp_path, ensemble_folder, caplog):
    def reorder(meta):
        meta["classes"] = meta["classes"][::-1]

    folder = _copy(ensemble_folder, tmp_path / "clf", edit=reorder)
    with caplog.at_level(logging.WARNING):
        assert ILGEClassifier.load(folder, device="cpu", force=True).classes_.tolist() == ["pos", "neg"]
    assert any("the classes (or their order) differ" in record.getMessage() for record in caplog.records)


def test_predict_refuses_a_folder_with_swapped_weights_before_any_model_loads(
    tmp_path, ensemble_folder, no_model_loads
):
    folder = _copy(ensemble_folder, tmp_path / "clf", mix=[1 / 3, 2 / 3])  # a mixture, but not the saved one
    texts = tmp_path / "texts.txt"
    texts.write_text("a first text\na second text\n")
    cache = tmp_path / "cache"
    result = CliRunner().invoke(cli, ["predict", str(folder), "--input", str(texts), "--cache-dir", str(cache)])
    message = one_line_error(result)
    assert f"{folder / WEIGHTS}: the weights differ from those saved with {META_FILE}" in message
    assert not (cache / "embeddings").exists()


@pytest.fixture(scope="module")
def tagger_folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tagger")
    sentences = [line.split() for line in CORPUS]
    tags = [["L" if len(word) > 3 else "S" for word in words] for words in sentences]
    options = dict(config=LastLayerConfig(epochs=2), cache_dir=root / "cache", device="cpu")
    tagger = ILGETagger(base_model=str(tiny_encoder(root / "encoder")), **options).fit(sentences, tags)
    return tagger.save(root / "tagger")


def test_a_tagger_with_reordered_tags_is_refused(tmp_path, tagger_folder):
    def reorder(meta):
        meta["classes"] = meta["classes"][::-1]

    folder = _copy(tagger_folder, tmp_path / "tagger", "ilge_tagger.json", edit=reorder)
    where = dict(device="cpu", base_model=tagger_folder.parent / "encoder")
    with pytest.raises(FolderMismatch, match=r"the classes \(or their order\) differ from those saved with"):
        ILGETagger.load(folder, **where)
    assert ILGETagger.load(folder, force=True, **where).classes_.tolist() == ["S", "L"]
