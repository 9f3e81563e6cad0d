"""``ILGETagger``: fit on words and tags, predict one tag per word, score, save and load.

The tests that only need *a* model use a tiny random BERT (``ilge_search.testing.tiny_models``);
the round trip on a real model (MiniLM-L6, a few UD English-EWT sentences) is marked ``realmodel``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

import ilge_search
from ilge_search import BestLayerConfig, CayleyConfig, ILGETagger, LastLayerConfig
from ilge_search.tasks.core import load_task, subsample
from ilge_search.testing.tiny_models import CORPUS, tiny_encoder

SENTENCES = [line.split() for line in CORPUS]
TAGS = [["P" if not word.isalnum() else ("L" if len(word) > 3 else "S") for word in words] for words in SENTENCES]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(tiny_encoder(tmp_path_factory.mktemp("tiny") / "encoder"))


@pytest.fixture()
def make(tiny, tmp_path):
    def build(**params) -> ILGETagger:
        options = dict(base_model=tiny, config=LastLayerConfig(epochs=3), cache_dir=tmp_path / "cache", device="cpu")
        options.update(params)
        return ILGETagger(**options)

    return build


def test_fit_predict_score(make):
    tagger = make()
    assert tagger.fit(SENTENCES, TAGS, SENTENCES[:3], TAGS[:3]) is tagger
    assert tagger.classes_.tolist() == ["L", "P", "S"]
    predicted = tagger.predict(SENTENCES[:2])
    assert [len(tags) for tags in predicted] == [len(s) for s in SENTENCES[:2]]
    assert all(tag in {"L", "P", "S"} and isinstance(tag, str) for tags in predicted for tag in tags)
    flat_gold = np.array([t for tags in TAGS for t in tags])
    flat_predicted = np.array([t for tags in tagger.predict(SENTENCES) for t in tags])
    assert tagger.score(SENTENCES, TAGS) == pytest.approx(float((flat_gold == flat_predicted).mean()))
    assert (tagger.num_layers_, tagger.hidden_size_) == (3, 32)
    assert tagger.best_val_score_ == max(row["val_accuracy"] for row in tagger.history_)


def test_integer_tags_and_a_held_out_validation_split(make):
    ints = [[{"L": 2, "P": 0, "S": 1}[t] for t in tags] for tags in TAGS]
    tagger = make(config="mean-layers", val_fraction=0.25).fit(SENTENCES, ints)
    assert tagger.classes_.tolist() == [0, 1, 2]
    assert all(isinstance(tag, int) for tags in tagger.predict(SENTENCES[:2]) for tag in tags)


def test_best_layer_and_cayley(make):
    best = make(config=BestLayerConfig(epochs=2)).fit(SENTENCES, TAGS, SENTENCES[:2], TAGS[:2])
    assert best.best_layer_ in range(3) and len(best.layer_scores_) == 3
    assert best.config_.layer == best.best_layer_
    cayley = make(config=CayleyConfig(hidden_dim=16, epochs=2)).fit(SENTENCES, TAGS, SENTENCES[:2], TAGS[:2])
    assert not cayley.model_.per_word and len(cayley.predict([["one", "word"]])[0]) == 2


def test_the_estimator_follows_scikit_learn(make):
    tagger = make(random_state=7, word_pooling="mean")
    copy = clone(tagger)
    assert copy.get_params() == tagger.get_params() and not hasattr(copy, "model_")
    with pytest.raises(NotFittedError, match="call fit"):
        tagger.predict(SENTENCES[:1])
    assert ilge_search.ILGETagger is ILGETagger


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda t: t.fit("The cat sat", [["D", "N", "V"]]), "not one string"),
        (lambda t: t.fit([["a", "b"]], [["X"]]), r"tags\[0\] has 1 tags for 2 words; give exactly one tag per word"),
        (lambda t: t.fit([["a", ""]], [["X", "Y"]]), r"sentences\[0\]\[1\] is ''"),
        (lambda t: t.fit([["a"], ["b"]], [["X"], [1]]), "all strings or all integers"),
        (lambda t: t.fit([["a"]] * 4, [["X"]] * 4), "at least 2 distinct tags"),
        (lambda t: t.fit([["a"]], [["X"]]), "too few to hold out"),
        (lambda t: t.fit(SENTENCES, TAGS, SENTENCES[:1], None), "pass both val_sentences and val_tags"),
        (lambda t: t.fit(SENTENCES, TAGS, [["new"]], [["Q"]]), r"val_tags contain 1 tag\(s\) not seen in training"),
        (lambda t: t.set_params(word_pooling="last").fit(SENTENCES, TAGS), "unknown word_pooling 'last'"),
        (lambda t: t.set_params(base_model=None).fit(SENTENCES, TAGS), "base_model must be a model name"),
    ],
)
def test_bad_input_is_one_clear_line(make, call, message):
    with pytest.raises(ValueError, match=message):
        call(make())


def test_save_and_load_round_trip(make, tmp_path):
    tagger = make(config=CayleyConfig(hidden_dim=16, epochs=2)).fit(SENTENCES, TAGS, SENTENCES[:2], TAGS[:2])
    folder = tagger.save(tmp_path / "saved")
    assert sorted(p.name for p in folder.iterdir()) == ["ilge_tagger.json", "model.safetensors"]
    meta = json.loads((folder / "ilge_tagger.json").read_text())
    assert (meta["format"], meta["word_pooling"], meta["classes"]) == ("ilge-search-tagger", "first", ["L", "P", "S"])
    with pytest.raises(ValueError, match="a local path outside that folder, which is not followed"):
        ILGETagger.load(folder, cache_dir=tmp_path / "cache", device="cpu")
    back = ILGETagger.load(folder, cache_dir=tmp_path / "cache", device="cpu", base_model=tagger.base_model)
    assert back.predict(SENTENCES) == tagger.predict(SENTENCES)
    assert back.config_ == tagger.config_ and back.classes_.tolist() == tagger.classes_.tolist()
    tagger.save(folder)  # its own earlier save may be replaced


def test_save_never_replaces_files_it_did_not_write(make, tmp_path):
    tagger = make().fit(SENTENCES, TAGS, SENTENCES[:2], TAGS[:2])
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "model.safetensors").write_bytes(b"someone else's weights")
    with pytest.raises(ValueError, match=r"already holds model.safetensors, not written by ILGETagger.save"):
        tagger.save(foreign)
    assert (foreign / "model.safetensors").read_bytes() == b"someone else's weights"
    other_record = tmp_path / "record"
    other_record.mkdir()
    (other_record / "ilge_tagger.json").write_text('{"format": "ilge-search-classifier"}')
    with pytest.raises(ValueError, match=r"not written by ILGETagger.save"):
        tagger.save(other_record)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is not a folder"):
        tagger.save(tmp_path / "file")
    with pytest.raises(ValueError, match="is not a saved ILGETagger"):
        ILGETagger.load(foreign)


@pytest.mark.realmodel
@pytest.mark.slow
def test_round_trip_on_minilm_and_ud_ewt(data_dir, cache_dir, tmp_path):
    """A real model and real data: a tagger fitted on 60 UD English-EWT sentences predicts one tag per word
    of unseen sentences, well above the most frequent tag's share, and predicts the same after save and load."""
    task = subsample(load_task("ud_ewt_pos", data_dir), 60, seed=0)

    def tags(part):
        offsets = part.word_offsets
        return [[task.label_names[i] for i in part.labels[offsets[k] : offsets[k + 1]]] for k in range(len(part))]

    train = task["train"]
    seen = {tag for row in tags(train) for tag in row}

    def known(part):  # sentences whose tags all occur in train: rare tags (X, SYM) may not
        rows = [(words, row) for words, row in zip(part.sentences, tags(part), strict=True) if set(row) <= seen]
        return [words for words, _ in rows], [row for _, row in rows]

    (val_sentences, val_tags), (test_sentences, test_tags) = known(task["validation"]), known(task["test"])
    tagger = ILGETagger("minilm-l6", config=BestLayerConfig(epochs=15), cache_dir=cache_dir, device="cpu")
    tagger.fit(train.sentences, tags(train), val_sentences[:30], val_tags[:30])
    predicted = tagger.predict(test_sentences)
    assert [len(p) for p in predicted] == [len(s) for s in test_sentences]
    gold = [t for row in test_tags for t in row]
    majority = max(gold.count(tag) for tag in set(gold)) / len(gold)
    accuracy = tagger.score(test_sentences, test_tags)
    assert accuracy > majority + 0.3, (accuracy, majority)
    back = ILGETagger.load(tagger.save(tmp_path / "tagger"), cache_dir=cache_dir, device="cpu")
    assert back.predict(test_sentences) == predicted
