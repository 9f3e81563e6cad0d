"""An exported model folder (``ilge-search export``, ``ILGEClassifier.save``, ``ILGETagger.save``) is checked as a
whole when read: the config, sizes, classes and an ensemble's members and counts, before any weights or base
model load and before any input is embedded, in one line naming the file. Other files beside the two a load
reads (a ``README.md`` model card) are ignored.

The classifiers are fitted on random (N, L, D) features shaped like minilm-l6's hidden states (no LLM)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from reliability_helpers import one_line_error

from ilge_search import ILGETagger, LastLayerConfig
from ilge_search.cli import cli
from ilge_search.encoders.configs import DeepSetConfig
from ilge_search.engine.ensemble import EnsembleModel
from ilge_search.testing.tiny_models import CORPUS, tiny_encoder
from ilge_search.use.classifier import META_FILE, ILGEClassifier

CONFIG = DeepSetConfig(hidden_dim=8, epochs=2)


@pytest.fixture(scope="module")
def ensemble_folder(tmp_path_factory) -> Path:
    """A two-member ensemble classifier saved as `export --ensemble` writes it (counts 2 and 1)."""
    rng = np.random.default_rng(0)
    features = torch.tensor(rng.normal(size=(40, 7, 384)), dtype=torch.float32)
    labels = np.arange(40) % 2
    clf = ILGEClassifier(base_model="minilm-l6", config=CONFIG, device="cpu").fit_embeddings(features, labels)
    members = [clf.model_, copy.deepcopy(clf.model_)]
    description = [{"trial": i, "count": c, "config": CONFIG.to_dict()} for i, c in enumerate((2, 1))]
    clf.model_ = EnsembleModel(members, [2, 1], description)
    return clf.save(tmp_path_factory.mktemp("ensemble") / "clf")


def _copy_with(folder: Path, target: Path, edit) -> Path:
    target.mkdir()
    for name in ("model.safetensors", META_FILE):
        (target / name).write_bytes((folder / name).read_bytes())
    meta = json.loads((target / META_FILE).read_text())
    edit(meta)
    (target / META_FILE).write_text(json.dumps(meta))
    return target


def _set_count(value):
    def edit(meta):
        meta["ensemble"][1]["count"] = value

    return edit


def test_an_unchanged_folder_with_a_model_card_beside_it_loads(tmp_path, ensemble_folder):
    folder = _copy_with(ensemble_folder, tmp_path / "clf", lambda meta: None)
    (folder / "README.md").write_text("# a model card another tool wrote\n")
    assert ILGEClassifier.load(folder, device="cpu").n_members_ == 2


@pytest.mark.parametrize("count", [-1, 0, "abc", None, True])
def test_a_bad_ensemble_member_count_is_refused_naming_the_file_and_member(tmp_path, ensemble_folder, count):
    folder = _copy_with(ensemble_folder, tmp_path / "clf", _set_count(count))
    with pytest.raises(ValueError) as caught:
        ILGEClassifier.load(folder, device="cpu")
    message = str(caught.value)
    assert message.startswith(f"{folder / META_FILE}: ensemble member 2 (deepset): count must be a positive number")
    assert "export or save the model again" in message and "\n" not in message


def test_predict_refuses_a_bad_count_before_any_model_loads_or_text_is_embedded(
    tmp_path, ensemble_folder, no_model_loads
):
    folder = _copy_with(ensemble_folder, tmp_path / "clf", _set_count(-3))
    texts = tmp_path / "texts.txt"
    texts.write_text("a first text\na second text\n")
    cache = tmp_path / "cache"
    result = CliRunner().invoke(cli, ["predict", str(folder), "--input", str(texts), "--cache-dir", str(cache)])
    message = one_line_error(result)
    assert str(folder / META_FILE) in message and "ensemble member 2 (deepset)" in message
    assert not (cache / "embeddings").exists()


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda m: m.update(classes=[0, 1, 1]), "classes lists 1 more than once"),
        (lambda m: m["config"].update(lr=-5), "config: lr must be > 0, got -5"),
        (lambda m: m["ensemble"][0]["config"].update(hidden_dim=-7), "ensemble member 1 (deepset) config: hidden_dim"),
        (lambda m: m.update(num_layers="seven"), "num_layers must be a positive integer, got 'seven'"),
        (lambda m: m.update(ensemble="all of them"), "ensemble must be a non-empty list of members"),
    ],
)
def test_bad_classes_configs_and_sizes_name_the_file(tmp_path, ensemble_folder, edit, expected):
    folder = _copy_with(ensemble_folder, tmp_path / "clf", edit)
    with pytest.raises(ValueError) as caught:
        ILGEClassifier.load(folder, device="cpu")
    assert str(caught.value).startswith(f"{folder / META_FILE}: {expected}"), str(caught.value)


@pytest.fixture(scope="module")
def tagger_folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tagger")
    sentences = [line.split() for line in CORPUS]
    tags = [["L" if len(word) > 3 else "S" for word in words] for words in sentences]
    options = dict(config=LastLayerConfig(epochs=2), cache_dir=root / "cache", device="cpu")
    tagger = ILGETagger(base_model=str(tiny_encoder(root / "encoder")), **options).fit(sentences, tags)
    return tagger.save(root / "tagger")


def test_a_tagger_config_error_has_the_classifiers_one_line_form(tmp_path, tagger_folder, ensemble_folder):
    tagger_meta = "ilge_tagger.json"
    tagger = _copy_with_files(tagger_folder, tmp_path / "tagger", tagger_meta, lambda m: m["config"].update(lr=-5))
    classifier = _copy_with(ensemble_folder, tmp_path / "clf", lambda m: m["config"].update(lr=-5))
    with pytest.raises(ValueError) as from_tagger:
        ILGETagger.load(tagger, device="cpu")
    with pytest.raises(ValueError) as from_classifier:
        ILGEClassifier.load(classifier, device="cpu")
    tail = ": config: lr must be > 0, got -5; the file is corrupt: export or save the model again"
    assert str(from_tagger.value) == f"{tagger / tagger_meta}{tail}"
    assert str(from_classifier.value) == f"{classifier / META_FILE}{tail}"


def test_a_tagger_with_repeated_tags_is_refused(tmp_path, tagger_folder):
    def repeat(meta):
        meta["classes"] = [*meta["classes"], meta["classes"][0]]

    folder = _copy_with_files(tagger_folder, tmp_path / "tagger", "ilge_tagger.json", repeat)
    with pytest.raises(ValueError, match="more than once; the file is corrupt"):
        ILGETagger.load(folder, device="cpu")


def _copy_with_files(folder: Path, target: Path, meta_name: str, edit) -> Path:
    target.mkdir()
    for source in folder.iterdir():
        if source.is_file():
            (target / source.name).write_bytes(source.read_bytes())
    meta = json.loads((target / meta_name).read_text())
    edit(meta)
    (target / meta_name).write_text(json.dumps(meta))
    return target
