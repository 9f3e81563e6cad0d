"""Test accuracy of every encoder family and layer baseline on small task subsets.

Every model is trained by the one engine on the same cached embeddings; the
best-layer baseline picks its layer on the validation split. Prints one table
per task (mean and spread over seeds) and, with ``--csv``, writes the raw rows.

    python benchmarks/baseline_accuracy.py --data-dir ../shared/datasets --cache-dir /tmp/ilge-cache \\
        --tasks banking77 emotion --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import time

import pandas as pd

from ilge_search.embeddings.cache import ExtractionSettings

FAMILIES = ("cayley", "fc", "deepset", "last-layer", "best-layer", "mean-layers", "scalar-mix", "mlp-last")
# (train examples per class, validation examples, test examples)
SUBSETS = {"banking77": (20, 770, 770), "emotion": (100, 600, 1000)}


def run(args: argparse.Namespace) -> pd.DataFrame:
    from ilge_search.embeddings.cache import load_task_embeddings
    from ilge_search.encoders import config_class_for
    from ilge_search.encoders.configs import BestLayerConfig
    from ilge_search.engine import evaluate, select_best_layer, train_encoder
    from ilge_search.tasks.core import few_shot, load_task, subsample

    rows = []
    for task_name in args.tasks:
        shots, n_val, n_test = SUBSETS[task_name]
        shots = args.shots or shots
        task = few_shot(load_task(task_name, data_dir=args.data_dir), shots, seed=0)
        task = subsample(task, n=n_val, seed=0, splits=["validation"])
        task = subsample(task, n=n_test, seed=0, splits=["test"])
        emb = load_task_embeddings(
            args.model,
            task,
            cache_dir=args.cache_dir,
            splits=["train", "validation", "test"],
            settings=ExtractionSettings(max_length=args.max_length),
        )
        train, val, test = (emb.splits[s] for s in ("train", "validation", "test"))
        print(
            f"{task_name}: train {len(train.labels)}, validation {len(val.labels)}, test {len(test.labels)}, "
            f"{emb.num_layers} layers x {emb.hidden_size}"
        )
        for family in args.families:
            config = config_class_for(family)()
            for seed in args.seeds:
                started = time.perf_counter()
                kwargs = dict(num_classes=len(emb.label_names), seed=seed)
                data = ((train.features, train.labels), (val.features, val.labels))
                layer = None
                if isinstance(config, BestLayerConfig):
                    layer, result, _ = select_best_layer(config, *data, **kwargs)
                else:
                    result = train_encoder(config, *data, **kwargs)
                metrics = evaluate(result.model, test.features, test.labels)
                rows.append(
                    {
                        "task": task_name,
                        "family": family,
                        "seed": seed,
                        "layer": layer,
                        "val_accuracy": result.best_val_metric,
                        "test_accuracy": metrics["accuracy"],
                        "test_macro_f1": metrics["macro_f1"],
                        "best_epoch": result.best_epoch,
                        "params": result.num_trainable_params,
                        "seconds": time.perf_counter() - started,
                    }
                )
                print(
                    f"  {family:12s} seed {seed}: val {result.best_val_metric:.4f}  test {metrics['accuracy']:.4f}"
                    f"  ({rows[-1]['seconds']:.1f} s{'' if layer is None else f', layer {layer}'})"
                )
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--model", default="minilm-l6")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--tasks", nargs="+", default=list(SUBSETS), choices=list(SUBSETS))
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--shots", type=int, default=None, help="override training examples per class")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (1 is fastest on a busy machine)")
    parser.add_argument("--csv", default=None, help="write the per-seed rows here")
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    frame = run(args)
    if args.csv:
        frame.to_csv(args.csv, index=False)
    summary = frame.groupby(["task", "family"], sort=False).agg(
        test_accuracy=("test_accuracy", "mean"),
        test_std=("test_accuracy", "std"),
        val_accuracy=("val_accuracy", "mean"),
        test_macro_f1=("test_macro_f1", "mean"),
        params=("params", "first"),
        seconds=("seconds", "mean"),
    )
    print(summary.round(4).to_string())


if __name__ == "__main__":
    main()
