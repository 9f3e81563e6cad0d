"""Several models in one pass (``engine.train_many``): each model is the one its own ``train_encoder`` run
trains, to 1e-5, with and without dropout; what a pass cannot batch trains one at a time."""

import numpy as np
import pytest
import torch
from announced_skips import skipped_where

from ilge_search.encoders import configs as C
from ilge_search.engine import ModelJob, TrainingRecipe, can_batch, evaluate, train_encoder, train_many
from ilge_search.engine.stacked import AdamSettings, StackedAdam
from ilge_search.testing.synthetic import LayerSignal, classification_features, similarity_features

L, D, CLASSES = 5, 24, 4
TOLERANCE = 1e-5
QUICK = {"hidden_dim": 32, "epochs": 4, "batch_size": 32}


def _split(x, y, n_train=160, n_val=60):
    return (
        (x[:n_train], y[:n_train]),
        (x[n_train : n_train + n_val], y[n_train : n_train + n_val]),
        (
            x[n_train + n_val :],
            y[n_train + n_val :],
        ),
    )


@pytest.fixture(scope="module")
def classes():
    labels = np.random.default_rng(0).integers(0, CLASSES, 280)
    x = torch.from_numpy(classification_features(labels, L, D, LayerSignal(layer=2, strength=4.0))).half()
    return _split(x, torch.from_numpy(labels))


@pytest.fixture(scope="module")
def pairs():
    scores = np.random.default_rng(1).uniform(0, 5, 280)
    x = torch.from_numpy(similarity_features(scores, L, D, LayerSignal(layer=1)))
    return _split(x, torch.from_numpy(scores).float())


def _assert_same_run(alone, batched, test, task_kind="classification"):
    """Same epochs, best epoch, history, weights and test score, to 1e-5."""
    assert type(batched.model) is type(alone.model)
    assert not batched.model.training
    assert (batched.epochs_run, batched.best_epoch) == (alone.epochs_run, alone.best_epoch)
    assert batched.best_val_metric == pytest.approx(alone.best_val_metric, abs=TOLERANCE)
    assert batched.num_trainable_params == alone.num_trainable_params
    for mine, theirs in zip(batched.history, alone.history, strict=True):
        assert mine.keys() == theirs.keys()
        for key in mine:
            assert mine[key] == pytest.approx(theirs[key], abs=TOLERANCE), key
    weights, reference = batched.model.state_dict(), alone.model.state_dict()
    assert weights.keys() == reference.keys()
    for key in weights:
        torch.testing.assert_close(weights[key], reference[key], atol=TOLERANCE, rtol=0)
    scores = evaluate(batched.model, *test, task_kind=task_kind)
    expected = evaluate(alone.model, *test, task_kind=task_kind)
    assert scores == pytest.approx(expected, abs=TOLERANCE)


CONFIGS = {
    "cayley-gin": C.CayleyConfig(**QUICK),
    "cayley-gat": C.CayleyConfig(conv_type="gat", gat_heads=2, **QUICK),
    "cayley-gin-2-layers": C.CayleyConfig(gnn_layers=2, gin_mlp_layers=2, **QUICK),
    "fc-gcn-2-layers": C.FCConfig(conv_type="gcn", gnn_layers=2, **QUICK),
    "deepset": C.DeepSetConfig(**QUICK),
    "mlp-last": C.MLPLastConfig(**QUICK),
    "scalar-mix": C.ScalarMixConfig(epochs=4, batch_size=32),
    "best-layer": C.BestLayerConfig(layer=2, epochs=4, batch_size=32),
}


@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_each_model_of_a_pass_is_its_own_run(classes, name, dropout):
    # with dropout too: on CPU each model's masks are drawn as its own run draws them
    train, val, test = classes
    config = CONFIGS[name].replace(dropout=dropout)
    seeds = [11, 12, 13]
    batched = train_many([ModelJob(config, seed) for seed in seeds], train, val)
    for seed, result in zip(seeds, batched, strict=True):
        _assert_same_run(train_encoder(config, train, val, seed=seed), result, test)


def test_models_of_a_pass_differ_by_seed(classes):
    train, val, _ = classes
    first, second = train_many([ModelJob(CONFIGS["cayley-gin"], seed) for seed in (1, 2)], train, val)
    assert not torch.equal(first.model.head.weight, second.model.head.weight)


def test_sentence_pairs(pairs):
    train, val, test = pairs
    config = C.CayleyConfig(**QUICK, dropout=0.1)
    batched = train_many([ModelJob(config, seed) for seed in (0, 1)], train, val, task_kind="similarity")
    for seed, result in zip((0, 1), batched, strict=True):
        alone = train_encoder(config, train, val, task_kind="similarity", seed=seed)
        _assert_same_run(alone, result, test, task_kind="similarity")


def test_members_with_their_own_rates_stop_on_their_own(classes):
    # one pass, four learning rates, weight decays, dropouts and epoch caps: each stops when its own run
    # stops (patience 1 ends some early) and keeps its own best epoch
    train, val, test = classes
    base = CONFIGS["deepset"].replace(epochs=8)
    configs = [
        base.replace(lr=3e-2, weight_decay=0.0, dropout=0.0),
        base.replace(lr=1e-3, weight_decay=1e-2, dropout=0.2),
        base.replace(lr=1e-4, weight_decay=1e-4, dropout=0.1, epochs=3),
        base.replace(lr=1e-2, weight_decay=1e-3, dropout=0.4),
    ]
    recipe = TrainingRecipe(patience=1, lr_patience=0)
    batched = train_many([ModelJob(config, 5) for config in configs], train, val, recipe=recipe)
    epochs = set()
    for config, result in zip(configs, batched, strict=True):
        _assert_same_run(train_encoder(config, train, val, seed=5, recipe=recipe), result, test)
        epochs.add(result.epochs_run)
    assert len(epochs) > 1  # the models stopped at different epochs


def test_adamw_and_loss_selection(classes):
    train, val, test = classes
    recipe = TrainingRecipe(optimizer="adamw", selection_metric="loss", patience=2, standardize=False)
    configs = [CONFIGS["mlp-last"].replace(weight_decay=wd, lr=lr) for wd, lr in ((0.1, 1e-3), (0.01, 3e-3))]
    batched = train_many([ModelJob(config, 3) for config in configs], train, val, recipe=recipe)
    for config, result in zip(configs, batched, strict=True):
        _assert_same_run(train_encoder(config, train, val, seed=3, recipe=recipe), result, test)


def test_mixed_jobs_keep_their_order_and_group_by_shape(classes):
    train, val, _ = classes
    wide = CONFIGS["deepset"].replace(hidden_dim=48)
    jobs = [
        ModelJob(CONFIGS["deepset"], 0),
        ModelJob(wide, 0),
        ModelJob(CONFIGS["deepset"], 1),
        ModelJob(C.LastLayerConfig(epochs=2), 0),
    ]
    results = train_many(jobs, train, val)
    assert [r.model.aggregator.config for r in results] == [job.config for job in jobs]
    for job, result in zip(jobs, results, strict=True):
        alone = train_encoder(job.config, train, val, seed=job.seed)
        assert len(result.history) == len(alone.history)
        for mine, theirs in zip(result.history, alone.history, strict=True):
            assert mine == pytest.approx(theirs, abs=TOLERANCE)


def test_what_cannot_batch():
    assert can_batch(C.CayleyConfig(), "classification")
    assert can_batch(C.BestLayerConfig(layer=1), "similarity")
    assert not can_batch(C.BestLayerConfig(), "classification")  # its layer is still to choose
    assert not can_batch(C.CayleyConfig(), "tagging")


def test_the_callers_rng_is_left_alone(classes):
    train, val, _ = classes
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    train_many([ModelJob(CONFIGS["mlp-last"].replace(dropout=0.3), seed) for seed in (0, 1)], train, val)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("decoupled", [False, True])
def test_stacked_adam_is_torch_adam_per_row(decoupled):
    generator = torch.Generator().manual_seed(0)
    rows = [torch.randn(3, 5, generator=generator) for _ in range(3)]
    rates, decays = [1e-2, 3e-3, 1e-2], (0.0, 0.1, 0.01)
    stacked = {"w": torch.stack(rows).requires_grad_()}
    adam = StackedAdam(stacked, AdamSettings(decays, decoupled=decoupled))
    alone = [row.clone().requires_grad_() for row in rows]
    optimizer_cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    optimizers = [optimizer_cls([p], lr=lr, weight_decay=wd) for p, lr, wd in zip(alone, rates, decays, strict=True)]
    for _ in range(5):
        grads = torch.randn(3, 3, 5, generator=generator)
        stacked["w"].grad = grads.clone()
        adam.step(rates)
        for p, optimizer, grad in zip(alone, optimizers, grads, strict=True):
            p.grad = grad.clone()
            optimizer.step()
    torch.testing.assert_close(stacked["w"].detach(), torch.stack([p.detach() for p in alone]), atol=1e-6, rtol=0)


def test_shared_sparse_product_outside_vmap_has_the_dense_gradient():
    from ilge_search.engine.many import SharedSparseProduct

    generator = torch.Generator().manual_seed(0)
    adjacency = torch.randn(5, 4, generator=generator).relu()  # bipartite: 4 sources, 5 targets
    x = torch.randn(4, 3, generator=generator, requires_grad=True)
    SharedSparseProduct.apply(adjacency.to_sparse_csr(), x).square().sum().backward()
    expected = torch.autograd.grad((adjacency @ x).square().sum(), x)[0]
    torch.testing.assert_close(x.grad, expected)


ON_CUDA = skipped_where(not torch.cuda.is_available(), "needs a CUDA GPU (benchmarks/gpu.sh runs these on one)")


@ON_CUDA
def test_a_pass_on_cuda_matches_its_own_runs_without_dropout(classes):
    # GPU sums are not bit-reproducible (scatter atomics), hence the wider tolerance
    train, val, _ = classes
    config = CONFIGS["cayley-gin-2-layers"].replace(dropout=0.0)
    batched = train_many([ModelJob(config, seed) for seed in (0, 1, 2)], train, val, device="cuda")
    for seed, result in zip((0, 1, 2), batched, strict=True):
        alone = train_encoder(config, train, val, seed=seed, device="cuda")
        assert next(result.model.parameters()).device.type == "cuda"
        for mine, theirs in zip(result.history, alone.history, strict=True):
            assert mine["train_loss"] == pytest.approx(theirs["train_loss"], abs=1e-4)


@ON_CUDA
def test_a_pass_on_cuda_with_dropout_trains_every_model(classes):
    train, val, test = classes
    config = CONFIGS["cayley-gin"].replace(dropout=0.3, epochs=6)
    results = train_many([ModelJob(config, seed) for seed in range(5)], train, val, device="cuda")
    alone = [train_encoder(config, train, val, seed=seed, device="cuda") for seed in range(5)]
    batched_scores = [evaluate(r.model, *test)["accuracy"] for r in results]
    alone_scores = [evaluate(r.model, *test)["accuracy"] for r in alone]
    # dropout masks differ from the runs of their own on a GPU: the scores agree in distribution
    assert abs(np.mean(batched_scores) - np.mean(alone_scores)) < 0.15


def test_stacked_linear_outside_vmap_is_linear():
    from ilge_search.engine.many import StackedLinear

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, generator=generator, requires_grad=True)
    weight = torch.randn(5, 4, generator=generator, requires_grad=True)
    bias = torch.randn(5, generator=generator, requires_grad=True)
    StackedLinear.apply(x, weight, bias).square().sum().backward()
    mine = [t.grad.clone() for t in (x, weight, bias)]
    expected = torch.autograd.grad(torch.nn.functional.linear(x, weight, bias).square().sum(), (x, weight, bias))
    for got, want in zip(mine, expected, strict=True):
        torch.testing.assert_close(got, want)
