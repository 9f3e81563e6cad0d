"""Study throughput: trials on cached embeddings against re-extracting them in every trial.

What it measures, all in one run on the same data and the same trials:

1. ``cached, cold``: ``run_study`` with an empty cache: one extraction, then N trials.
2. ``cached, warm, 1 worker``: the same N-trial study again (new storage), cache already filled.
3. ``cached, warm, 2 workers``: the same, with ``workers=2`` on one SQLite file.
4. ``naive``: the trials of (2) replayed the way a classifier without a cache works: every
   trial extracts the train and validation embeddings with the LLM, then trains the same config.

Pruning and the final evaluation are off so every variant does the same training work.
It prints wall times, the naive / cached ratio and trials per minute.

    python benchmarks/bench_study.py --data-dir ../shared/datasets            # minilm-l6, trec
    python benchmarks/bench_study.py --model smollm2-135m --trials 6 --max-train 500
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import optuna

from ilge_search.embeddings.cache import ExtractionSettings
from ilge_search.study import StudyOptions


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minilm-l6")
    parser.add_argument("--task", default="trec")
    parser.add_argument("--encoder", default="deepset")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--max-train", type=int, default=1000)
    parser.add_argument("--max-eval", type=int, default=300)
    parser.add_argument("--max-epochs", type=int, default=5)
    parser.add_argument("--data-dir", default=os.environ.get("ILGE_SEARCH_DATA", "../shared/datasets"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads of the single-process runs (2-worker runs use cpus // 2 each)",
    )
    return parser.parse_args()


def timed_study(args, root: Path, label: str, cache_dir: Path, workers: int = 1) -> tuple:
    from ilge_search.study import run_study

    url = f"sqlite:///{root / (label + '.db')}"
    started = time.perf_counter()
    result = run_study(
        args.model,
        args.task,
        args.encoder,
        storage=url,
        options=StudyOptions.from_flat(
            n_trials=args.trials,
            workers=workers,
            final_seeds=0,
            pruner="none",
            seed=0,
            max_train=args.max_train,
            max_eval=args.max_eval,
            max_epochs=args.max_epochs,
            data_dir=args.data_dir,
            cache_dir=cache_dir,
            device=args.device,
            progress=False,
        ),
    )[0]
    seconds = time.perf_counter() - started
    assert result.n_finished == args.trials, result
    return seconds, optuna.load_study(study_name=result.study_name, storage=url)


def naive_replay(args, study: optuna.Study, cache_dir: Path) -> float:
    """Each trial: extract train + validation with the LLM (no cache), then train the trial's config."""
    from ilge_search.embeddings.extraction import extract_layer_embeddings
    from ilge_search.encoders import config_from_dict
    from ilge_search.engine import train_encoder
    from ilge_search.study.data import DataSpec, load_task_data

    spec = DataSpec(
        model=args.model, task=args.task, max_train=args.max_train, max_eval=args.max_eval, data_dir=args.data_dir
    )
    task = load_task_data(spec)  # the study's exact subset
    if task.kind != "classification":
        raise SystemExit("the naive replay covers classification tasks")
    train, val = task.splits["train"], task.splits["validation"]
    started = time.perf_counter()
    for trial in study.trials:
        features = extract_layer_embeddings(
            args.model,
            list(train.texts) + list(val.texts),
            cache_dir=cache_dir,
            progress=False,
            settings=ExtractionSettings(device=args.device),
        )
        n = len(train.texts)
        train_encoder(
            config_from_dict(trial.user_attrs["config"]),
            (features[:n], train.labels),
            (features[n:], val.labels),
            task_kind="classification",
            num_classes=task.num_labels,
            seed=0,
            device=args.device,
        )
    return time.perf_counter() - started


def main() -> None:
    args = parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-study-") as tmp:
        root, cache_dir = Path(tmp), Path(tmp) / "cache"
        cold, _ = timed_study(args, root, "cold", cache_dir)
        warm, warm_study = timed_study(args, root, "warm", cache_dir)
        two, _ = timed_study(args, root, "two", cache_dir, workers=2)
        naive = naive_replay(args, warm_study, cache_dir)
    train_seconds = sum(t.user_attrs["seconds"] for t in warm_study.trials)
    n = args.trials
    print(
        f"{args.model} / {args.task} / {args.encoder}: {n} trials, train {args.max_train}, "
        f"validation {args.max_eval}, <= {args.max_epochs} epochs, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{'variant':<34}{'wall s':>9}{'trials/min':>12}{'naive / this':>14}")
    for label, seconds in (
        ("naive (re-extract every trial)", naive),
        ("cached, cold (one extraction)", cold),
        ("cached, warm, 1 worker", warm),
        ("cached, warm, 2 workers", two),
    ):
        print(f"{label:<34}{seconds:>9.1f}{60 * n / seconds:>12.1f}{naive / seconds:>14.2f}")
    print(f"(training alone, summed over the warm trials: {train_seconds:.1f} s)")


if __name__ == "__main__":
    main()
