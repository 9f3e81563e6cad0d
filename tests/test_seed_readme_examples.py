"""The published ``ilge`` README's aggregator and tuning examples, unchanged except the import.

Only the names the README leaves to the reader are defined here, small: the
training data ``X``/``y`` and the ``MyModel``/``train_and_eval`` of the Optuna
example. Model sizes come from the built-in table (Qwen3-8B-Base: 37 x 4096).
"""

import math

import pytest
import torch


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


def _training_data():
    X = torch.randn(8, 37, 4096)  # (N, num_layers, hidden_in) for Qwen3-8B-Base
    y = torch.randint(0, 6, (8,))
    return X, y


@pytest.mark.slow  # 50 epochs at Qwen3-8B's size (37 layers x 4096)
def test_build_aggregator_example():
    X, y = _training_data()

    # --- README example (import changed from ilge) ---
    import torch
    import torch.nn as nn

    from ilge_search import CayleyConfig, build_aggregator, hidden_size_for, num_layers_for

    name, num_classes = "Qwen/Qwen3-8B-Base", 6
    agg = build_aggregator(
        CayleyConfig(),
        num_layers=num_layers_for(name),  # 37 for Qwen3-8B
        hidden_in=hidden_size_for(name),
    )  # 4096
    head = nn.Linear(agg.out_dim, num_classes)  # your own task head

    # X: per-sample layer embeddings, shape (N, num_layers, hidden_in). y: (N,) labels.
    # Produce X from the frozen LLM's hidden states, mean-pooled over tokens, e.g.:
    #   out = llm(**tokenizer(texts, ...), output_hidden_states=True)
    #   X = torch.stack(out.hidden_states, dim=1).mean(dim=2)   # (N, num_layers, hidden_in)

    opt = torch.optim.Adam(list(agg.parameters()) + list(head.parameters()), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(50):  # your training loop  # noqa: B007 (as published)
        logits = head(agg(X))  # (N, num_classes)
        loss = loss_fn(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    # --- end of example ---

    assert (agg.num_layers, agg.hidden_in, agg.out_dim) == (37, 4096, 256)
    assert logits.shape == (8, 6)
    assert loss.item() < 0.5 * math.log(6)  # it trained: well below chance-level cross-entropy


def test_build_per_token_aggregator_example():
    # --- README example (import changed from ilge) ---
    import torch

    from ilge_search import CayleyConfig, build_per_token_aggregator, hidden_size_for, num_layers_for

    name = "Qwen/Qwen3-8B-Base"
    L, D = num_layers_for(name), hidden_size_for(name)  # 37, 4096

    # x: all hidden states of a short sequence, (batch, seq_len, num_layers, hidden_in)
    x = torch.randn(4, 16, L, D)

    # Sequence-level output: one vector per sequence (e.g. short-text classification)
    agg = build_per_token_aggregator(
        CayleyConfig(conv_type="gcn"),
        num_layers=L,
        hidden_in=D,
        output_mode="sequence",
    )
    y = agg(x)  # (4, 256) -> (batch, out_dim)
    # --- (checked before the example reuses the names) ---
    assert (L, D) == (37, 4096)
    assert y.shape == (4, 256) and agg.out_dim == 256

    # Per-token output: one vector per token (e.g. token- or residue-level tasks)
    agg = build_per_token_aggregator(
        CayleyConfig(conv_type="gcn", gnn_layers=2),
        num_layers=L,
        hidden_in=D,
        output_mode="per_token",
    )
    y = agg(x)  # (4, 16, 256) -> (batch, seq_len, out_dim)
    # --- end of example ---

    assert y.shape == (4, 16, 256)


def test_recommended_config_example(monkeypatch, tmp_path):
    # the seed documents its own defaults: read them with no regenerated defaults file in the package
    from ilge_search import tuning

    monkeypatch.setattr(tuning, "RECOMMENDED_DEFAULTS_PATH", tmp_path / "absent.json")
    # --- README example (import changed from ilge.tuning) ---
    from ilge_search.tuning import recommended_config

    cfg = recommended_config("cayley")  # lr=1e-3 (small models)
    # --- end ---
    assert cfg.lr == 1e-3
    cfg = recommended_config("cayley", model_size_hint="large")  # lr=1e-4 (>3B models)
    assert cfg.lr == 1e-4
    cfg = recommended_config("deepset")  # DeepSet defaults
    assert type(cfg).__name__ == "DeepSetConfig"


def test_suggest_config_example():
    import optuna
    from torch import nn

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    class MyModel(nn.Module):
        def __init__(self, agg):
            super().__init__()
            self.agg = agg
            self.head = nn.Linear(agg.out_dim, 6)

    def train_and_eval(model):  # stand-in: a deterministic score of the architecture
        return sum(p.numel() for p in model.parameters()) / 1e6

    # --- README example (imports changed from ilge) ---
    import optuna

    from ilge_search import build_aggregator, hidden_size_for, num_layers_for
    from ilge_search.tuning import suggest_config

    name = "Qwen/Qwen3-8B-Base"

    def objective(trial):
        cfg = suggest_config(trial, "cayley")  # samples conv_type, hidden_dim, gnn_layers, etc.
        agg = build_aggregator(cfg, num_layers=num_layers_for(name), hidden_in=hidden_size_for(name))
        model = MyModel(agg)
        return train_and_eval(model)

    study = optuna.create_study(direction="minimize")
    study.optimize(objective, n_trials=100)
    best_cfg = suggest_config(study.best_trial, "cayley")
    # --- end of example ---

    assert len(study.trials) == 100
    assert best_cfg.hidden_dim == 128  # the smallest architecture wins this stand-in objective
    assert build_aggregator(best_cfg, 37, 4096).out_dim == best_cfg.hidden_dim
