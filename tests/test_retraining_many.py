"""``train_seeds`` and ``train_configs`` train the seeds a pass can take together in one, the same models as
one at a time; what a pass cannot take still trains one seed after another."""

import numpy as np
import pytest
import torch

import ilge_search.engine as engine
from ilge_search.encoders import configs as C
from ilge_search.study.data import StudyData
from ilge_search.study.retraining import train_configs, train_seeds
from ilge_search.testing.synthetic import LayerSignal, classification_features

L, D = 5, 16
SEEDS = [1000, 1001, 1002]


@pytest.fixture(scope="module")
def data():
    labels = np.random.default_rng(0).integers(0, 3, 200)
    x = torch.from_numpy(classification_features(labels, L, D, LayerSignal(layer=1, strength=4.0))).half()
    y = torch.from_numpy(labels)
    return StudyData(
        task_kind="classification",
        metric="accuracy",
        train=(x[:120], y[:120]),
        validation=(x[120:160], y[120:160]),
        test=(x[160:], y[160:]),
        num_layers=L,
        hidden_size=D,
        num_classes=3,
        label_names=["a", "b", "c"],
        split_sizes={"train": 120, "validation": 40, "test": 40},
        cache_keys={},
    )


def _same(first, second):
    assert (first.seed, first.epochs_run) == (second.seed, second.epochs_run)
    assert first.val_score == pytest.approx(second.val_score, abs=1e-5)
    for key, value in first.model.state_dict().items():
        torch.testing.assert_close(value, second.model.state_dict()[key], atol=1e-5, rtol=0)


def test_train_seeds_in_one_pass_trains_the_models_of_one_at_a_time(data, monkeypatch):
    config = C.CayleyConfig(hidden_dim=16, epochs=3, batch_size=32)
    passes = []
    real = engine.train_many
    monkeypatch.setattr(engine, "train_many", lambda jobs, *a, **k: passes.append(len(jobs)) or real(jobs, *a, **k))
    batched = list(train_seeds(data, config, SEEDS, device="cpu", batched=True))
    assert passes == [3]
    alone = list(train_seeds(data, config, SEEDS, device="cpu", batched=False))
    assert passes == [3]
    for first, second in zip(batched, alone, strict=True):
        _same(first, second)


def test_reused_seeds_are_not_trained_again(data):
    config = C.DeepSetConfig(hidden_dim=16, epochs=2, batch_size=32)
    [kept] = train_seeds(data, config, [1001], device="cpu")
    out = list(train_seeds(data, config, SEEDS, device="cpu", reuse={1001: (kept.model, 1.5)}, batched=True))
    assert [t.seed for t in out] == SEEDS
    assert out[1].model is kept.model and out[1].best_val_metric is None and out[1].seconds == 1.5


def test_train_configs_groups_same_shaped_configs(data, monkeypatch):
    base = C.DeepSetConfig(hidden_dim=16, epochs=2, batch_size=32)
    configs = [base, base.replace(lr=3e-3, dropout=0.3), base.replace(hidden_dim=24)]
    groups = []
    from ilge_search.engine import many

    class Counting(many._Pass):  # counts the models of each pass
        def __init__(self, jobs, *args, **kwargs):
            groups.append(len(jobs))
            super().__init__(jobs, *args, **kwargs)

    monkeypatch.setattr(many, "_Pass", Counting)
    trained = train_configs(data, configs, SEEDS[:2], device="cpu", batched=True)
    assert sorted(groups) == [2, 4]  # the two same-shaped configs' 4 models together, the wider one apart
    assert [[t.seed for t in seeds] for seeds in trained] == [SEEDS[:2]] * 3
    for config, seeds in zip(configs, trained, strict=True):
        for trained_seed in seeds:
            [alone] = train_seeds(data, config, [trained_seed.seed], device="cpu")
            _same(trained_seed, alone)


def test_seeds_go_in_one_pass_unless_asked_not_to(data, monkeypatch):
    passes = []
    real = engine.train_many

    def counted(jobs, *args, **kwargs):
        passes.append(len(jobs))
        return real(jobs, *args, **kwargs)

    monkeypatch.setattr(engine, "train_many", counted)
    config = C.DeepSetConfig(hidden_dim=16, epochs=1, batch_size=32)
    assert [t.seed for t in train_seeds(data, config, SEEDS, device="cpu")] == SEEDS
    assert [[t.seed for t in s] for s in train_configs(data, [config], SEEDS, device="cpu")] == [SEEDS]
    assert passes == [len(SEEDS)] * 2  # the default, on a CPU too: a pass trains the models of one at a time
    assert [t.seed for t in train_seeds(data, config, SEEDS, device="cpu", batched=False)] == SEEDS
    assert passes == [len(SEEDS)] * 2
