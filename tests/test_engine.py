import itertools
import math

import numpy as np
import optuna
import pytest
import torch
from scipy.stats import spearmanr
from sklearn.metrics import f1_score

from ilge_search.embeddings.cache import ExtractionSettings
from ilge_search.encoders import configs as C
from ilge_search.engine import (
    ILGEModel,
    TrainingRecipe,
    evaluate,
    macro_f1,
    pearson,
    predict_logits,
    select_best_layer,
    spearman,
    train_encoder,
)

L, D, K = 5, 16, 4
SMALL_CAYLEY = C.CayleyConfig(hidden_dim=32, epochs=8, batch_size=32, dropout=0.2)


def make_classification(n=480, informative_layer=2, seed=0, noise_labels=False):
    """Class signal in one layer only; the rest is noise."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(K, D, generator=g)
    y = torch.randint(0, K, (n,), generator=g)
    x = torch.randn(n, L, D, generator=g)
    x[:, informative_layer] += 1.5 * centers[y]
    if noise_labels:
        y = torch.randint(0, K, (n,), generator=g)
    return x.half(), y


@pytest.fixture(scope="module")
def data():
    x, y = make_classification()
    return (x[:320], y[:320]), (x[320:], y[320:])


def make_pairs(n=400, seed=0):
    """Sentence pairs whose layer-1 vectors are noisy copies; gold score = their similarity on 0..5."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, D, generator=g)
    b = a + torch.randn(n, D, generator=g) * torch.rand(n, 1, generator=g) * 3
    score = (torch.nn.functional.cosine_similarity(a, b) * 2.5 + 2.5).clamp(0, 5)
    x = torch.randn(n, 2, L, D, generator=g)
    x[:, 0, 1] += 2 * a
    x[:, 1, 1] += 2 * b
    return x.half(), score


def state_equal(m1, m2):
    s1, s2 = m1.state_dict(), m2.state_dict()
    return s1.keys() == s2.keys() and all(torch.equal(s1[k], s2[k]) for k in s1)


# --------------------------------------------------------------------------- determinism


def test_same_seed_gives_identical_metrics_and_weights(data):
    train, val = data
    r1 = train_encoder(SMALL_CAYLEY, train, val, seed=3)
    r2 = train_encoder(SMALL_CAYLEY, train, val, seed=3)
    assert r1.history == r2.history
    assert r1.best_epoch == r2.best_epoch
    assert state_equal(r1.model, r2.model)
    r3 = train_encoder(SMALL_CAYLEY, train, val, seed=4)
    assert not state_equal(r1.model, r3.model)


def test_training_leaves_global_rng_alone(data):
    train, val = data
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    train_encoder(C.ScalarMixConfig(epochs=2), train, val, seed=0)
    assert torch.equal(torch.rand(3), expected)


def test_float16_is_upcast_per_batch_without_changing_results(data):
    (x, y), (xv, yv) = data
    r16 = train_encoder(SMALL_CAYLEY, (x, y), (xv, yv), seed=0)
    r32 = train_encoder(SMALL_CAYLEY, (x.float(), y), (xv.float(), yv), seed=0)
    assert r16.history == r32.history
    assert x.dtype == torch.float16  # the caller's tensor is untouched


# --------------------------------------------------------------------------- training behaviour


@pytest.mark.parametrize(
    "config",
    [
        SMALL_CAYLEY,
        C.FCConfig(hidden_dim=32, epochs=8),
        C.DeepSetConfig(hidden_dim=32, epochs=20, lr=1e-2),
        C.MeanLayersConfig(epochs=20, lr=1e-2),
        C.ScalarMixConfig(epochs=20, lr=1e-2),
    ],
)
def test_learns_a_separable_task(config, data):
    train, val = data
    # The signal here is partly the informative layer's larger norm, which z-scoring removes on purpose.
    result = train_encoder(config, train, val, seed=0, recipe=TrainingRecipe(standardize=False))
    assert result.best_val_metric > 0.8  # chance is 0.25
    assert result.history[result.best_epoch - 1]["val_accuracy"] == result.best_val_metric
    assert set(result.history[0]) == {"epoch", "train_loss", "val_loss", "val_accuracy", "val_macro_f1", "lr"}
    assert result.history[-1]["train_loss"] < result.history[0]["train_loss"]
    assert isinstance(result.model, ILGEModel) and not result.model.training
    assert result.num_trainable_params == sum(p.numel() for p in result.model.parameters())


def test_last_layer_probe_only_sees_the_last_layer(data):
    (x, y), (xv, yv) = data  # the signal is in layer 2
    result = train_encoder(C.LastLayerConfig(epochs=10), (x, y), (xv, yv), seed=0)
    assert result.best_val_metric < 0.5
    assert result.num_trainable_params == D * K + K  # the linear head only


def test_early_stopping_restores_the_best_epoch():
    x, y = make_classification(n=400, noise_labels=True)  # nothing to learn: validation loss soon rises
    config = C.MLPLastConfig(hidden_dim=64, epochs=60, lr=1e-2)
    result = train_encoder(
        config,
        (x[:300], y[:300]),
        (x[300:], y[300:]),
        seed=0,
        recipe=TrainingRecipe(patience=3, selection_metric="loss"),
    )
    losses = [h["val_loss"] for h in result.history]
    assert result.epochs_run < 60
    assert result.best_epoch == int(np.argmin(losses)) + 1
    assert result.epochs_run - result.best_epoch == 3
    assert result.best_val_metric == min(losses)
    restored = evaluate(result.model, x[300:], y[300:])["loss"]
    assert restored == pytest.approx(result.best_val_metric, rel=1e-5)
    assert restored != pytest.approx(losses[-1], rel=1e-3)  # the last epoch's weights were not kept


def test_patience_none_runs_every_epoch(data):
    train, val = data
    result = train_encoder(C.ScalarMixConfig(epochs=6), train, val, recipe=TrainingRecipe(patience=None))
    assert result.epochs_run == 6


def test_lr_is_reduced_on_plateau():
    x, y = make_classification(n=300, noise_labels=True)
    result = train_encoder(
        C.MLPLastConfig(hidden_dim=32, epochs=30, lr=1e-2),
        (x[:200], y[:200]),
        (x[200:], y[200:]),
        recipe=TrainingRecipe(patience=None, lr_patience=1, lr_factor=0.5),
    )
    lrs = [h["lr"] for h in result.history]
    assert lrs[0] == 1e-2
    assert min(lrs) < 1e-2
    assert all(later <= earlier for earlier, later in itertools.pairwise(lrs))


def test_adamw_is_a_different_optimizer(data):
    train, val = data
    config = C.ScalarMixConfig(epochs=3, weight_decay=0.1)
    adam = train_encoder(config, train, val, recipe=TrainingRecipe(optimizer="adam"))
    adamw = train_encoder(config, train, val, recipe=TrainingRecipe(optimizer="adamw"))
    assert adam.history != adamw.history


def test_callback_sees_every_epoch_and_pruning_propagates(data):
    train, val = data
    seen = []
    result = train_encoder(
        C.ScalarMixConfig(epochs=4),
        train,
        val,
        epoch_callback=lambda epoch, metric: seen.append((epoch, metric)),
        recipe=TrainingRecipe(patience=None),
    )
    assert seen == [(h["epoch"], h["val_accuracy"]) for h in result.history]
    assert [epoch for epoch, _ in seen] == [1, 2, 3, 4]

    calls = []

    def prune_at_two(epoch, metric):
        calls.append(epoch)
        if epoch == 2:
            raise optuna.TrialPruned()

    with pytest.raises(optuna.TrialPruned):
        train_encoder(C.ScalarMixConfig(epochs=10), train, val, epoch_callback=prune_at_two)
    assert calls == [1, 2]


def test_similarity_training_improves_spearman():
    x, score = make_pairs()
    train, val = (x[:300], score[:300]), (x[300:], score[300:])
    result = train_encoder(
        C.ScalarMixConfig(epochs=40, lr=1e-2),
        train,
        val,
        task_kind="similarity",
        score_range=(0, 5),
        recipe=TrainingRecipe(standardize=False),
    )  # signal is layer 1's norm, kept here
    first = result.history[0]["val_spearman"]
    assert result.selection_metric == "spearman"
    assert result.best_val_metric > first + 0.05
    assert result.best_val_metric > 0.7
    assert set(result.history[0]) == {"epoch", "train_loss", "val_loss", "val_spearman", "val_pearson", "lr"}
    cosines = predict_logits(result.model, x[300:])
    assert cosines.shape == (100,)
    assert spearman(cosines, score[300:]) == pytest.approx(result.best_val_metric)
    # a shared encoder: swapping the two sentences gives the same similarity
    swapped = predict_logits(result.model, x[300:].flip(1))
    torch.testing.assert_close(swapped, cosines)


def test_similarity_with_a_graph_encoder_and_default_score_range():
    x, score = make_pairs(n=240)
    result = train_encoder(
        C.CayleyConfig(hidden_dim=32, epochs=5), (x[:160], score[:160]), (x[160:], score[160:]), task_kind="similarity"
    )
    assert result.model.score_range == (float(score[:160].min()), float(score[:160].max()))
    assert math.isfinite(result.best_val_metric)
    metrics = evaluate(result.model, x[160:], score[160:])
    assert set(metrics) == {"spearman", "pearson", "loss"}


# --------------------------------------------------------------------------- best layer


def test_select_best_layer_uses_validation(data):
    train, val = data
    layer, result, scores = select_best_layer(C.BestLayerConfig(epochs=20, lr=1e-2), train, val)
    assert layer == 2  # the informative layer
    assert len(scores) == L
    assert scores[2] == max(scores) == result.best_val_metric
    assert result.model.aggregator is not None
    # only the chosen layer matters to the trained probe
    (xv, yv) = val
    scrambled = xv.clone()
    scrambled[:, [0, 1, 3, 4]] = 0
    assert evaluate(result.model, scrambled, yv)["accuracy"] == evaluate(result.model, xv, yv)["accuracy"]


def test_select_best_layer_probe_equals_a_single_training_run(data):
    """The standardiser is fitted once for all probes; each probe must still be the run train_encoder gives."""
    train, val = data
    config = C.BestLayerConfig(epochs=4, lr=1e-2)
    layer, result, scores = select_best_layer(config, train, val, layers=[1, 2], seed=3)
    alone = train_encoder(config.replace(layer=layer), train, val, seed=3)
    assert alone.best_val_metric == result.best_val_metric == max(scores)
    assert alone.history == result.history
    for name, tensor in alone.model.state_dict().items():
        assert torch.equal(tensor, result.model.state_dict()[name]), name


def test_select_best_layer_candidates_and_errors(data):
    train, val = data
    layer, _, scores = select_best_layer(C.BestLayerConfig(epochs=3), train, val, layers=[0, -1])
    assert layer in (0, 4) and len(scores) == 2
    with pytest.raises(ValueError, match="out of range"):
        select_best_layer(C.BestLayerConfig(), train, val, layers=[7])
    with pytest.raises(ValueError, match="BestLayerConfig"):
        select_best_layer(C.LastLayerConfig(), train, val)


# --------------------------------------------------------------------------- input validation


def test_nan_or_inf_features_are_rejected(data):
    (x, y), val = data
    bad = x.clone()
    bad[7, 2, 3] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        train_encoder(SMALL_CAYLEY, (bad, y), val)
    (xv, yv) = val
    bad_val = xv.float().clone()
    bad_val[0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="validation features contain NaN or inf"):
        train_encoder(SMALL_CAYLEY, (x, y), (bad_val, yv))


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda x, y: (x, y[:-1]), "320 feature rows but 319 labels"),
        (lambda x, y: (x[:, :, :8], y), "differ in shape"),
        (lambda x, y: (x[0], y), r"shape \(N, L, D\)"),
        (lambda x, y: (x.long(), y), "floating"),
        (lambda x, y: (x, y.float() + 0.5), "integer class ids"),
        (lambda x, y: (x[:0], y[:0]), "empty"),
    ],
)
def test_bad_training_inputs(data, mutate, message):
    (x, y), val = data
    with pytest.raises(ValueError, match=message):
        train_encoder(SMALL_CAYLEY, mutate(x, y), val)


def test_labels_outside_num_classes(data):
    (x, y), val = data
    with pytest.raises(ValueError, match=r"class ids in \[0, 3\)"):
        train_encoder(SMALL_CAYLEY, (x, y), val, num_classes=3)
    with pytest.raises(ValueError, match=r"\[0, 4\), found values in \[-1"):
        train_encoder(SMALL_CAYLEY, (x, torch.where(y == 0, -1, y)), val, num_classes=4)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"task_kind": "regression"}, "task_kind"),
        ({"recipe": TrainingRecipe(selection_metric="spearman")}, "selection_metric"),
        ({"recipe": TrainingRecipe(optimizer="sgd")}, "optimizer"),
        ({"recipe": TrainingRecipe(patience=0)}, "patience"),
    ],
)
def test_bad_options(data, kwargs, message):
    train, val = data
    with pytest.raises(ValueError, match=message):
        train_encoder(SMALL_CAYLEY, train, val, **kwargs)


def test_an_unknown_training_option_is_refused_not_ignored(data):
    train, val = data
    with pytest.raises(TypeError, match=r"train_encoder\(\) got unexpected keyword arguments: sed"):
        train_encoder(SMALL_CAYLEY, train, val, sed=3)


def test_similarity_needs_pairs(data):
    train, val = data
    with pytest.raises(ValueError, match=r"\(N, 2, L, D\)"):
        train_encoder(SMALL_CAYLEY, train, val, task_kind="similarity")


# --------------------------------------------------------------------------- metrics


def test_spearman_matches_scipy_with_ties():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 5, 200).astype(float)  # many ties
    y = x + rng.normal(0, 2, 200)
    y[:50] = np.round(y[:50])
    assert spearman(x, y) == pytest.approx(spearmanr(x, y).statistic, abs=1e-12)
    assert pearson(x, y) == pytest.approx(np.corrcoef(x, y)[0, 1], abs=1e-12)
    assert spearman(x, np.ones(200)) == 0.0


def test_macro_f1_matches_sklearn():
    rng = np.random.default_rng(0)
    y_true = rng.integers(0, 6, 300)
    y_pred = np.where(rng.random(300) < 0.6, y_true, rng.integers(0, 7, 300))  # class 6 only predicted
    assert macro_f1(y_true, y_pred) == pytest.approx(f1_score(y_true, y_pred, average="macro"), abs=1e-12)


# --------------------------------------------------------------------------- real data


@pytest.mark.realmodel
@pytest.mark.slow
def test_real_banking77_embeddings_minilm(data_dir, cache_dir):
    from ilge_search.embeddings.cache import load_task_embeddings
    from ilge_search.tasks.core import few_shot, load_task, subsample

    task = few_shot(load_task("banking77", data_dir=data_dir), 8, seed=0)  # 616 training texts
    task = subsample(task, n=385, seed=0, splits=["validation", "test"])
    emb = load_task_embeddings(
        "minilm-l6",
        task,
        cache_dir=cache_dir,
        splits=["train", "validation", "test"],
        progress=False,
        settings=ExtractionSettings(max_length=64),
    )
    train, val, test = (emb.splits[s] for s in ("train", "validation", "test"))
    assert train.features.dtype == torch.float16 and train.features.shape[1:] == (7, 384)
    result = train_encoder(
        C.CayleyConfig(epochs=15), (train.features, train.labels), (val.features, val.labels), num_classes=77, seed=0
    )
    test_metrics = evaluate(result.model, test.features, test.labels)
    assert test_metrics["accuracy"] > 0.6, test_metrics  # 77 classes: chance is 0.013
    assert 0 < test_metrics["macro_f1"] <= 1
    assert abs(test_metrics["accuracy"] - result.best_val_metric) < 0.1  # validation tracks test


# --------------------------------------------------------------------------- standardisation


def test_standardizer_statistics_are_stored_and_applied(data):
    (x, y), val = data
    result = train_encoder(C.LastLayerConfig(epochs=2), (x, y), val, seed=0)
    std = result.model.standardizer
    flat = x.double()
    assert torch.allclose(std.mean.double(), flat.mean(0), atol=1e-5)
    assert torch.allclose(std.inv_std.double(), 1 / (flat.std(0, unbiased=False) + 1e-5), rtol=1e-4)
    z = std(x[:8].float())
    expected = (x[:8].double() - flat.mean(0)) / (flat.std(0, unbiased=False) + 1e-5)
    assert torch.allclose(z.double(), expected, atol=1e-3)
    assert {"standardizer.mean", "standardizer.inv_std"} <= set(result.model.state_dict())


def test_standardisation_rescues_massive_activation_dimensions():
    """LLM hidden states have a few dimensions thousands of times larger than the rest (SmolLM2 reaches ~6000)."""
    x, y = make_classification(n=480)
    g = torch.Generator().manual_seed(1)
    x = x.float()
    x[:, :, 0] = 3000.0 + 500.0 * torch.randn(480, L, generator=g)  # one huge, uninformative dimension
    train, val = (x[:320], y[:320]), (x[320:], y[320:])
    raw = train_encoder(SMALL_CAYLEY, train, val, seed=0, recipe=TrainingRecipe(standardize=False))
    scaled = train_encoder(SMALL_CAYLEY, train, val, seed=0)
    assert scaled.best_val_metric > 0.7
    assert scaled.best_val_metric > raw.best_val_metric + 0.2
