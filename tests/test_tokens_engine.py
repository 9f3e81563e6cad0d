"""Training taggers on the one engine: sentence batches, per-token encoders, synthetic tasks with known answers."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import optuna
import pytest
import torch

from ilge_search.encoders import config_class_for
from ilge_search.encoders import configs as C
from ilge_search.engine import (
    TAGGING,
    TaggerModel,
    TrainingRecipe,
    build_tagger,
    evaluate,
    predict_logits,
    select_best_layer,
    train_encoder,
)
from ilge_search.engine.tokens import sentence_batches
from ilge_search.testing.tagging_data import middle_layer_tags, neighbour_tags

SMALL_CAYLEY = C.CayleyConfig(hidden_dim=32, epochs=20, batch_size=16)


def _train(config, train, val, seed=0, **options):
    return train_encoder(config, train.data, val.data, task_kind=TAGGING, num_classes=5, seed=seed, **options)


def _accuracy(result, test) -> float:
    return evaluate(result.model, *test.data)["accuracy"]


# ----------------------------------------------------------------------------- batches and the model


def test_batches_hold_sentences_of_one_length_under_the_node_cap():
    lengths = np.random.default_rng(0).integers(1, 30, size=300)
    batches = sentence_batches(
        lengths, batch_size=16, max_nodes=700, num_layers=7, generator=torch.Generator().manual_seed(1)
    )
    assert sorted(np.concatenate(batches).tolist()) == list(range(300))  # every sentence once
    for batch in batches:
        assert len(set(lengths[batch])) == 1 and len(batch) <= 16
        assert len(batch) == 1 or len(batch) * lengths[batch[0]] * 7 <= 700
    for length in set(lengths.tolist()):  # as few batches per length as the two caps allow
        per_batch = max(1, min(16, 700 // (length * 7)))
        count = int((lengths == length).sum())
        assert sum(1 for b in batches if lengths[b[0]] == length) == -(-count // per_batch)
    again = sentence_batches(lengths, 16, 700, 7, torch.Generator().manual_seed(1))
    other = sentence_batches(lengths, 16, 700, 7, torch.Generator().manual_seed(2))
    assert [b.tolist() for b in batches] == [b.tolist() for b in again] != [b.tolist() for b in other]
    in_order = sentence_batches(lengths, 16, 700, 7)
    assert [int(lengths[b[0]]) for b in in_order] == sorted(int(lengths[b[0]]) for b in in_order)


@pytest.mark.parametrize("config", [C.CayleyConfig(hidden_dim=16), C.FCConfig(hidden_dim=16, conv_type="gcn")])
def test_each_sentence_of_a_batch_is_its_own_graph(config):
    """A sentence's outputs are the same alone and in a batch: no padding node, no edge between sentences."""
    torch.manual_seed(0)
    model = build_tagger(config, num_layers=5, hidden_in=8, num_classes=3).eval()
    assert isinstance(model, TaggerModel) and not model.per_word
    batch = torch.randn(4, 6, 5, 8)
    together = model(batch)
    assert together.shape == (4, 6, 3)
    for i in range(4):
        torch.testing.assert_close(model(batch[i : i + 1]), together[i : i + 1], atol=1e-5, rtol=1e-5)
    changed = batch.clone()
    changed[0, 2] += 5.0  # another word of the same sentence: its graph reaches the rest of the sentence
    assert not torch.allclose(model(changed)[0], together[0])
    torch.testing.assert_close(model(changed)[1:], together[1:])


@pytest.mark.parametrize("family", ["last-layer", "mean-layers", "scalar-mix", "mlp-last", "deepset", "cayley-word"])
def test_per_word_encoders_read_each_word_alone(family):
    torch.manual_seed(0)
    model = build_tagger(config_class_for(family)(), num_layers=5, hidden_in=8, num_classes=3).eval()
    assert model.per_word
    batch = torch.randn(2, 6, 5, 8)
    changed = batch.clone()
    changed[0, 2] += 5.0
    out, out_changed = model(batch), model(changed)
    keep = torch.ones(2, 6, dtype=torch.bool)
    keep[0, 2] = False
    torch.testing.assert_close(out_changed[keep], out[keep])


# ----------------------------------------------------------------------------- synthetic tasks


@pytest.mark.slow
def test_a_tag_in_a_middle_layer_is_found_by_cayley_and_missed_by_the_last_layer_probe():
    """The tag is written only into layer 2 of 5 of the same word: the last-layer probe stays at chance
    (about 0.25 on 4 tags), the per-token Cayley encoder reads every layer of the word and beats it
    clearly, and best-layer, which chooses layer 2 on validation, is close to the noise's ceiling."""
    train, val, test = middle_layer_tags(200, seed=0), middle_layer_tags(60, seed=1), middle_layer_tags(100, seed=2)
    last = _accuracy(_train(C.LastLayerConfig(epochs=20), train, val), test)
    cayley = _accuracy(_train(SMALL_CAYLEY.replace(gnn_layers=2), train, val), test)
    per_word = _accuracy(_train(C.CayleyWordConfig(hidden_dim=32, epochs=20, batch_size=16), train, val), test)
    layer, probe, scores = select_best_layer(
        C.BestLayerConfig(epochs=20), train.data, val.data, task_kind=TAGGING, num_classes=5
    )
    assert last < 0.3
    assert cayley > last + 0.25, (cayley, last)
    assert per_word > last + 0.25, (per_word, last)  # the Cayley graph over the word's own layers finds it too
    assert layer == 2 and int(np.argmax(scores)) == 2 and _accuracy(probe, test) > 0.9


def _neighbour_sets():
    """Each word's tag is the type of the word before it (first words: a tag of their own); a word's own
    layers say nothing about it. 200 training, 60 validation and 100 test sentences (4 types + 1 tags)."""
    return neighbour_tags(200, seed=0), neighbour_tags(60, seed=1), neighbour_tags(100, seed=2)


def _majority(test) -> float:
    return float(np.bincount(test.labels.numpy()).max() / len(test.labels))


@pytest.mark.slow
def test_a_tag_of_the_neighbouring_word_is_out_of_reach_of_per_word_encoders():
    """Per-word encoders (last layer, MLP on the last layer) read one word at a time: on the neighbour task
    they stay at the share of the most frequent tag (0.22 here)."""
    train, val, test = _neighbour_sets()
    majority = _majority(test)
    per_word = [
        _accuracy(_train(c, train, val), test)
        for c in (C.LastLayerConfig(epochs=25), C.MLPLastConfig(hidden_dim=32, epochs=25))
    ]
    assert majority == pytest.approx(0.218, abs=0.01)
    assert all(0.15 < score < majority + 0.05 for score in per_word), per_word


@pytest.mark.slow
@pytest.mark.parametrize("graph", ["cayley", "fc"])
def test_the_per_token_graphs_see_the_neighbouring_word_a_little(graph):
    """The per-token graphs see other words but reach little on the neighbour task: FC about 0.33 (every
    (word, layer) node of the sentence, but no word order), Cayley with 3 message-passing layers about 0.30
    (its graph joins a word's nodes to nodes of arbitrary other words, rarely to the word before). A graph
    that joined each word to its neighbours could reach 1.0 here."""
    train, val, test = _neighbour_sets()
    majority = _majority(test)
    if graph == "cayley":
        config = SMALL_CAYLEY.replace(gnn_layers=3, epochs=25)
        margin = 0.05
    else:
        config = C.FCConfig(hidden_dim=32, epochs=25, batch_size=16)
        margin = 0.07
    score = _accuracy(_train(config, train, val), test)
    assert majority + margin < score < 0.5, score


# ----------------------------------------------------------------------------- the loop


def test_training_is_seeded_and_keeps_the_best_epoch():
    train, val = middle_layer_tags(50, seed=0), middle_layer_tags(20, seed=1)
    config = SMALL_CAYLEY.replace(epochs=4)
    first, again, other = (
        _train(config, train, val, seed=3),
        _train(config, train, val, seed=3),
        _train(config, train, val, seed=4),
    )
    assert first.history == again.history and first.history != other.history
    for name, tensor in first.model.state_dict().items():
        torch.testing.assert_close(tensor, again.model.state_dict()[name])
    scores = [row["val_accuracy"] for row in first.history]
    assert first.best_val_metric == max(scores) and scores[first.best_epoch - 1] == max(scores)
    assert evaluate(first.model, *val.data)["accuracy"] == pytest.approx(first.best_val_metric)
    assert set(first.history[0]) == {"epoch", "train_loss", "val_loss", "val_accuracy", "val_macro_f1", "lr"}
    assert not first.model.training and first.model.task_kind == TAGGING


def test_epoch_callback_can_prune_and_patience_stops_early():
    train, val = middle_layer_tags(60, seed=0), middle_layer_tags(20, seed=1)
    seen = []

    def prune_at_two(epoch, metric):
        seen.append((epoch, metric))
        if epoch == 2:
            raise optuna.TrialPruned()

    with pytest.raises(optuna.TrialPruned):
        _train(SMALL_CAYLEY, train, val, epoch_callback=prune_at_two)
    assert [epoch for epoch, _ in seen] == [1, 2]
    stopped = _train(C.LastLayerConfig(epochs=40, lr=1e-5), train, val, recipe=TrainingRecipe(patience=2))
    assert stopped.epochs_run < 40 and stopped.epochs_run - stopped.best_epoch == 2


def test_the_node_cap_only_changes_the_batches():
    train, val = middle_layer_tags(60, seed=0), middle_layer_tags(20, seed=1)
    capped = _train(C.LastLayerConfig(epochs=3), train, val, recipe=TrainingRecipe(max_batch_nodes=50))
    free = _train(C.LastLayerConfig(epochs=3), train, val)
    assert capped.history != free.history  # smaller batches, more steps
    with pytest.raises(ValueError, match="max_batch_nodes must be"):
        _train(C.LastLayerConfig(epochs=1), train, val, recipe=TrainingRecipe(max_batch_nodes=0))


def test_evaluate_and_predict_logits_for_a_tagger():
    train, val, test = middle_layer_tags(60, seed=0), middle_layer_tags(20, seed=1), middle_layer_tags(30, seed=2)
    model = _train(C.LastLayerConfig(epochs=2), train, val).model
    logits = predict_logits(model, (test.features, test.offsets))
    assert logits.shape == (len(test.labels), 5)
    metrics = evaluate(model, (test.features, test.offsets), test.labels)
    assert metrics["accuracy"] == pytest.approx(float((logits.argmax(1) == test.labels).double().mean()))
    assert set(metrics) == {"accuracy", "macro_f1", "loss"}
    entry = SimpleNamespace(features=test.features, offsets=test.offsets)  # what a word cache entry offers
    torch.testing.assert_close(predict_logits(model, entry), logits)
    with pytest.raises(ValueError, match="trained for 'tagging', not 'classification'"):
        evaluate(model, test.features, test.labels, task_kind="classification")


def test_every_family_trains_as_a_tagger():
    train, val = middle_layer_tags(40, seed=0), middle_layer_tags(15, seed=1)
    for family in ("fc", "deepset", "mean-layers", "scalar-mix", "mlp-last"):
        config = config_class_for(family)(epochs=2, batch_size=8)
        result = _train(config, train, val)
        assert result.epochs_run == 2 and 0.0 <= result.best_val_metric <= 1.0, family


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda f, o, y: ((f, o[:-1]), y), r"offsets must rise strictly from 0 to the number of words"),
        (lambda f, o, y: ((f, np.r_[o[:2], o[1:]]), y), r"offsets must rise strictly"),
        (lambda f, o, y: ((f, o), y[:-1]), r"train has \d+ words but labels of shape"),
        (lambda f, o, y: ((f, o), y.float()), "labels must be integer class ids"),
        (lambda f, o, y: ((f[:, :, 0], o), y), r"word features must be a non-empty float tensor \(W, L, D\)"),
        (lambda f, o, y: (f, y), r"must be \(word features \(W, L, D\), sentence offsets"),
        (
            lambda f, o, y: ((torch.where(torch.arange(len(f))[:, None, None] == 3, float("nan"), f), o), y),
            "NaN or inf",
        ),
        (lambda f, o, y: ((f, o), y + 10), r"class ids in \[0, 5\)"),
    ],
)
def test_bad_tagging_data_is_refused_before_training(change, message):
    data, val = middle_layer_tags(20, seed=0), middle_layer_tags(10, seed=1)
    bad = change(data.features, data.offsets, data.labels)
    with pytest.raises(ValueError, match=message):
        train_encoder(C.LastLayerConfig(epochs=1), bad, val.data, task_kind=TAGGING, num_classes=5)


def test_best_layer_needs_its_layer_or_select_best_layer():
    data, val = middle_layer_tags(20, seed=0), middle_layer_tags(10, seed=1)
    with pytest.raises(ValueError, match=r"select_best_layer\(task_kind='tagging'\)"):
        train_encoder(C.BestLayerConfig(), data.data, val.data, task_kind=TAGGING)
    fixed = train_encoder(C.BestLayerConfig(layer=2, epochs=2), data.data, val.data, task_kind=TAGGING)
    assert fixed.model.encoder.encoder.layer == 2
