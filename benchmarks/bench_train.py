"""Training speed: the engine against the textbook per-sample PyTorch Geometric path.

Both paths train the same model (the default Cayley GIN encoder plus a linear
head, cross-entropy, Adam, batch size 64) on the same cached banking77
embeddings of minilm-l6, in the same run:

- engine: :func:`ilge_search.engine.train_encoder`. Features stay one float16
  tensor; a batch is an index slice upcast on its own, and the batched Cayley
  graph is built once per batch size.
- textbook: one ``torch_geometric.data.Data`` per sample (layer nodes plus
  zero virtual nodes, the Cayley ``edge_index``), ``torch_geometric.loader.DataLoader``
  collating a ``Batch`` every step, ``GINConv`` over the batch's ``edge_index`` and
  ``global_mean_pool`` over the real nodes.

Before timing, the script checks that both paths compute the same function on
a batch (the textbook model shares the engine model's weights). It prints
epochs per second for each path and their ratio (goal: >= 2x).

    python benchmarks/bench_train.py --data-dir ../shared/datasets --cache-dir /tmp/ilge-cache
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from ilge_search.embeddings.cache import ExtractionSettings


def textbook_data_list(features: torch.Tensor, labels: torch.Tensor, edge_index: torch.Tensor, num_nodes: int):
    from torch_geometric.data import Data

    num_layers = features.shape[1]
    real = torch.zeros(num_nodes, dtype=torch.bool)
    real[:num_layers] = True
    data_list = []
    for x, y in zip(features, labels, strict=True):
        padded = torch.zeros(num_nodes, x.shape[-1])
        padded[:num_layers] = x.float()
        data_list.append(Data(x=padded, edge_index=edge_index, y=y.view(1), real=real))
    return data_list


class TextbookGIN(nn.Module):
    """The Cayley GIN encoder written the textbook way, sharing the engine model's modules."""

    def __init__(self, encoder: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.input_proj, self.convs, self.drop = encoder.gnn.input_proj, encoder.gnn.convs, encoder.gnn.drop
        self.head = head

    def forward(self, batch) -> torch.Tensor:
        from torch_geometric.nn import global_mean_pool

        h = self.input_proj(batch.x) * batch.real.unsqueeze(-1)  # virtual nodes start at zero
        for conv in self.convs:
            h = self.drop(torch.relu(conv(h, batch.edge_index)))
        pooled = global_mean_pool(h[batch.real], batch.batch[batch.real])  # real layer nodes only
        return self.head(pooled)


def find_encoder(module: nn.Module) -> nn.Module:
    for sub in module.modules():
        if hasattr(sub, "gnn") and hasattr(sub, "edge_index"):
            return sub
    raise RuntimeError("no GNN encoder found in the engine model")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--model", default="minilm-l6")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--train-size", type=int, default=3000, help="training examples (banking77 subset)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from torch_geometric.loader import DataLoader

    from ilge_search.embeddings.cache import load_task_embeddings
    from ilge_search.encoders.configs import CayleyConfig
    from ilge_search.engine import TrainingRecipe, build_model, train_encoder
    from ilge_search.tasks.core import load_task, subsample

    task = subsample(load_task("banking77", data_dir=args.data_dir), n=args.train_size, seed=0, splits=["train"])
    emb = load_task_embeddings(
        args.model,
        task,
        cache_dir=args.cache_dir,
        splits=["train"],
        settings=ExtractionSettings(max_length=args.max_length),
    )
    features, labels = emb.splits["train"].features, emb.splits["train"].labels
    n_val = len(labels) // 10
    train, val = (features[n_val:], labels[n_val:]), (features[:n_val], labels[:n_val])
    config = CayleyConfig(epochs=args.epochs)
    num_classes = 77
    print(
        f"{args.model}: train {tuple(train[0].shape)} {train[0].dtype}, val {n_val}, "
        f"batch {config.batch_size}, {args.epochs} epochs, {torch.get_num_threads()} threads"
    )

    # --- the engine (validation every epoch included, as in real use)
    train_encoder(
        config.replace(epochs=1), train, val, num_classes=num_classes, recipe=TrainingRecipe(patience=None)
    )  # warm-up
    started = time.perf_counter()
    train_encoder(config, train, val, num_classes=num_classes, recipe=TrainingRecipe(patience=None))
    engine_eps = args.epochs / (time.perf_counter() - started)

    # --- the textbook per-sample path, same model and recipe
    torch.manual_seed(0)
    model = build_model(config, features.shape[1], features.shape[2], "classification", num_classes)
    encoder = find_encoder(model.aggregator)
    textbook = TextbookGIN(encoder, model.head)
    edge_index, num_nodes = encoder.edge_index, encoder.num_nodes

    build_started = time.perf_counter()
    train_list = textbook_data_list(*train, edge_index, num_nodes)
    val_list = textbook_data_list(*val, edge_index, num_nodes)
    build_seconds = time.perf_counter() - build_started

    # same function: the textbook forward equals the engine forward on one batch
    model.eval()
    with torch.no_grad():
        batch = next(iter(DataLoader(val_list, batch_size=64)))
        torch.testing.assert_close(textbook(batch), model(val[0][:64].float()), rtol=1e-4, atol=1e-4)

    optimizer = torch.optim.Adam(textbook.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    loader = DataLoader(train_list, batch_size=config.batch_size, shuffle=True)
    val_loader = DataLoader(val_list, batch_size=1024)

    def textbook_epoch() -> None:
        textbook.train()
        for batch in loader:
            loss = nn.functional.cross_entropy(textbook(batch), batch.y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        textbook.eval()
        with torch.no_grad():
            correct = sum(int((textbook(b).argmax(1) == b.y).sum()) for b in val_loader)
        assert 0 <= correct <= len(val_list)

    textbook_epoch()  # warm-up
    started = time.perf_counter()
    for _ in range(args.epochs):
        textbook_epoch()
    textbook_eps = args.epochs / (time.perf_counter() - started)

    print(f"engine    {engine_eps:8.3f} epochs/s")
    n_objects = len(train_list) + len(val_list)
    print(f"textbook  {textbook_eps:8.3f} epochs/s  (+ {build_seconds:.1f} s once to build {n_objects} Data objects)")
    print(f"ratio     {engine_eps / textbook_eps:8.2f}x  (goal >= 2x)")


if __name__ == "__main__":
    main()
