"""Forward+backward throughput of the ILGE aggregators against a textbook PyG implementation.

For every case both sides run in the same process, on the same input, with the
same architecture (input projection, convolutions, ReLU, dropout, pooling over
real nodes) and the same loss; a step is forward + backward (no optimiser).

Textbook baseline: the usual PyTorch Geometric recipe. Each sample is one
``Data`` whose ``x`` holds all graph nodes (the layer embeddings, then zero rows
for the virtual nodes, which are projected like real ones), and every step
collates the batch with ``Batch.from_data_list`` and pools the real nodes with
``global_mean_pool``. DeepSet's baseline is the same recipe without edges.

The two sides alternate in rounds and the median round is reported, so a
background load hits both alike.

    python benchmarks/bench_aggregator.py            # ~1-2 minutes on 2 cores
    python benchmarks/bench_aggregator.py --quick    # a smoke run, a few seconds per case
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch_geometric
from torch import nn
from torch_geometric.data import Batch, Data
from torch_geometric.nn import GATConv, GCNConv, GINConv, global_mean_pool

from ilge_search import CayleyConfig, DeepSetConfig, FCConfig, build_aggregator, build_per_token_aggregator
from ilge_search.encoders.graphs import cayley_graph, fully_connected_graph


class TextbookGNN(nn.Module):
    """Projection of every node, PyG convolutions over a collated Batch, mean over real nodes."""

    def __init__(self, config, hidden_in: int) -> None:
        super().__init__()
        H = config.hidden_dim
        self.proj = nn.Linear(hidden_in, H)
        convs = []
        for _ in range(config.gnn_layers):
            if config.conv_type == "gin":
                convs.append(GINConv(nn.Sequential(nn.Linear(H, H))))
            elif config.conv_type == "gcn":
                convs.append(GCNConv(H, H))
            else:
                convs.append(GATConv(H, H // config.gat_heads, heads=config.gat_heads))
        self.convs = nn.ModuleList(convs)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, batch: Batch) -> torch.Tensor:
        h = self.proj(batch.x)
        for conv in self.convs:
            h = self.drop(torch.relu(conv(h, batch.edge_index)))
        return global_mean_pool(h[batch.real], batch.batch[batch.real])


class TextbookDeepSet(nn.Module):
    """Per-node MLP over a collated Batch (no edges), mean pool, MLP."""

    def __init__(self, config: DeepSetConfig, hidden_in: int) -> None:
        super().__init__()
        H = config.hidden_dim
        self.proj = nn.Linear(hidden_in, H)
        self.pre = nn.ModuleList([nn.Linear(H, H) for _ in range(config.pre_pooling_layers)])
        self.post = nn.ModuleList([nn.Linear(H, H) for _ in range(config.post_pooling_layers)])
        self.drop = nn.Dropout(config.dropout)

    def forward(self, batch: Batch) -> torch.Tensor:
        h = self.drop(torch.relu(self.proj(batch.x)))
        for layer in self.pre:
            h = self.drop(torch.relu(layer(h)))
        h = global_mean_pool(h, batch.batch)
        for layer in self.post:
            h = self.drop(torch.relu(layer(h)))
        return h


def _data_list(nodes: torch.Tensor, graph) -> list[Data]:
    """One Data per sample; ``nodes`` is (N, R, D) real-node features, virtual rows are zeros."""
    _N, R, D = nodes.shape
    virtual = torch.zeros(graph.num_nodes - R, D)
    real = torch.arange(graph.num_nodes) < R
    return [Data(x=torch.cat([sample, virtual]), edge_index=graph.edge_index, real=real) for sample in nodes]


def _step_fn(module: nn.Module, forward: Callable[[], torch.Tensor]) -> Callable[[], None]:
    weights = {}

    def step() -> None:
        out = forward()
        if "w" not in weights:
            weights["w"] = torch.randn(out.shape[-1], generator=torch.Generator().manual_seed(0))
        (out @ weights["w"]).sum().backward()
        module.zero_grad(set_to_none=True)

    return step


def _samples_per_second(step: Callable[[], None], batch: int, iters: int) -> float:
    start = time.perf_counter()
    for _ in range(iters):
        step()
    return batch * iters / (time.perf_counter() - start)


def compare(ours: Callable[[], None], baseline: Callable[[], None], batch: int, rounds: int, iters: int):
    for step in (ours, baseline):  # warm-up: caches, allocator, PyG's generated code
        step()
        step()
    ours_rates, base_rates = [], []
    for _ in range(rounds):
        ours_rates.append(_samples_per_second(ours, batch, iters))
        base_rates.append(_samples_per_second(baseline, batch, iters))
    return statistics.median(ours_rates), statistics.median(base_rates)


def graph_case(config, shape):
    N, L, D = shape
    torch.manual_seed(0)
    x = torch.randn(N, L, D)
    agg = build_aggregator(config, L, D).train()
    graph = cayley_graph(L) if config.family == "cayley" else fully_connected_graph(L)
    data = _data_list(x, graph)
    textbook = TextbookGNN(config, D).train()
    return (_step_fn(agg, lambda: agg(x)), _step_fn(textbook, lambda: textbook(Batch.from_data_list(data))), N)


def deepset_case(config, shape):
    N, L, D = shape
    torch.manual_seed(0)
    x = torch.randn(N, L, D)
    agg = build_aggregator(config, L, D).train()
    data = [Data(x=sample) for sample in x]
    textbook = TextbookDeepSet(config, D).train()
    return (_step_fn(agg, lambda: agg(x)), _step_fn(textbook, lambda: textbook(Batch.from_data_list(data))), N)


def per_token_case(config, shape):
    B, T, L, D = shape
    torch.manual_seed(0)
    x = torch.randn(B, T, L, D)
    agg = build_per_token_aggregator(config, L, D, output_mode="sequence").train()
    data = _data_list(x.reshape(B, T * L, D), cayley_graph(T * L))
    textbook = TextbookGNN(config, D).train()
    return (_step_fn(agg, lambda: agg(x)), _step_fn(textbook, lambda: textbook(Batch.from_data_list(data))), B)


CASES = [
    ("Cayley GIN (default)", graph_case, CayleyConfig(), (64, 25, 1024)),
    ("Cayley GIN (default)", graph_case, CayleyConfig(), (64, 37, 4096)),
    ("Cayley GCN", graph_case, CayleyConfig(conv_type="gcn"), (64, 25, 1024)),
    ("Cayley GAT", graph_case, CayleyConfig(conv_type="gat"), (64, 25, 1024)),
    ("FC GIN", graph_case, FCConfig(), (64, 25, 1024)),
    ("DeepSet", deepset_case, DeepSetConfig(), (64, 25, 1024)),
    ("Per-token Cayley GIN (sequence)", per_token_case, CayleyConfig(), (4, 16, 25, 1024)),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and iterations (smoke run)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rounds, iters = (2, 2) if args.quick else (7, 4)
    print(
        f"torch {torch.__version__}, torch_geometric {torch_geometric.__version__}, "
        f"{torch.get_num_threads()} threads, {rounds} rounds x {iters} steps, median round"
    )
    header = f"{'case':34s} {'input':>17s} {'ours/s':>9s} {'textbook/s':>11s} {'ratio':>6s}"
    print(header)
    print("-" * len(header))
    for name, make, config, shape in CASES:
        ours, baseline, batch = make(config, shape)
        ours_rate, base_rate = compare(ours, baseline, batch, rounds, iters)
        shape_text = "(" + ",".join(map(str, shape)) + ")"
        print(
            f"{name:34s} {shape_text:>17s} {ours_rate:9.0f} {base_rate:11.0f} {ours_rate / base_rate:5.2f}x", flush=True
        )


if __name__ == "__main__":
    main()
