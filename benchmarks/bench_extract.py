"""Extraction throughput and peak memory: ilge-search's path against a naive one, same run.

    python benchmarks/bench_extract.py            # ~2 min: N = 400 and 1200 banking77 texts
    python benchmarks/bench_extract.py --quick    # ~1 min: N = 150 and 300

Three ways to turn N texts into (N, L, D) pooled layer embeddings with ``minilm-l6``:

* naive   batches in the given order (more padding), every hidden state stacked to
          (B, L, T, D) float32 and kept for all texts, pooled at the end;
* stream  ``LayerEmbedder.iter_pooled_batches``: length-sorted batches, pooled per batch,
          written into a preallocated float16 (N, L, D) array;
* cache   ``EmbeddingCache.get_or_extract`` on a fresh cache: the stream path writing to a
          memmapped safetensors file, plus checksum, atomic commit and reading it back.

Each N runs in its own process: the model is loaded once, one warm-up batch runs, then
``--repeat`` interleaved rounds of stream, cache, naive (the best time per method counts,
so a busy machine slows every method alike). Peak memory, from the first round, is the
rise of the peak RSS (VmHWM, reset through /proc/self/clear_refs) above the RSS before
that extraction. Memory that scales with N beyond the output itself shows as a
growing "peak - output" column.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ilge_search.embeddings.cache import ExtractionSettings

REPO = Path(__file__).resolve().parents[1]


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux)


def _texts(data_dir: str, n: int) -> list:
    import numpy as np

    from ilge_search.tasks.core import load_task

    task = load_task("banking77", data_dir)
    pool = task["train"].texts + task["test"].texts
    order = np.random.default_rng(0).permutation(len(pool))[:n]
    return [pool[i] for i in order]


def _child(n: int, model: str, batch_size: int, data_dir: str, cache_dir: str, repeats: int, threads: int) -> list:
    import numpy as np
    import torch

    from ilge_search.embeddings.cache import EmbeddingCache
    from ilge_search.embeddings.extraction import LayerEmbedder
    from ilge_search.tasks.core import TaskData, TaskSplit, get_task_spec

    torch.set_num_threads(threads)
    texts = _texts(data_dir, n)
    embedder = LayerEmbedder(model, batch_size=batch_size, cache_dir=cache_dir)
    embedder.load()
    tokenizer, net = embedder._tokenizer, embedder._model
    embedder.embed(texts[:batch_size], progress=False)  # warm-up
    num_layers, hidden = embedder.num_layers, embedder.hidden_size

    def naive() -> torch.Tensor:
        stacked, masks = [], []
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                batch = tokenizer(
                    texts[start : start + batch_size],
                    padding=True,
                    truncation=True,
                    max_length=512,
                    return_tensors="pt",
                )
                out = net(**batch, output_hidden_states=True)
                stacked.append(torch.stack(out.hidden_states, 1).float())  # (B, L, T, D) kept for every batch
                masks.append(batch["attention_mask"])
            pooled = []
            for hidden, mask in zip(stacked, masks, strict=True):
                weights = mask[:, None, :, None].float()
                pooled.append((hidden * weights).sum(2) / weights.sum(2))
        return torch.cat(pooled)

    def stream() -> np.ndarray:
        out = np.empty((len(texts), num_layers, hidden), dtype=np.float16)
        for indices, pooled in embedder.iter_pooled_batches(texts, progress=False):
            out[indices] = pooled.to(torch.float16).numpy()
        return out

    def cached() -> torch.Tensor:
        spec = get_task_spec("banking77")
        labels = np.zeros(len(texts), dtype=np.int64)
        task = TaskData(spec=spec, splits={"bench": TaskSplit("bench", labels=labels, texts=texts)}, label_names=["x"])
        with tempfile.TemporaryDirectory(dir=cache_dir) as fresh:
            cache = EmbeddingCache(fresh)
            cache._embedders[(embedder.source.identity, "mean", 512, batch_size, "auto")] = embedder
            entry = cache.get_or_extract(
                embedder.source, task, "bench", progress=False, settings=ExtractionSettings(batch_size=batch_size)
            )
            assert not entry.hit
            return entry.features

    methods = {"stream": stream, "cache": cached, "naive": naive}  # naive last: it leaves the heap grown
    rows = {
        name: {
            "method": name,
            "n": n,
            "seconds": float("inf"),
            "peak_mb": None,
            "output_mb": n * num_layers * hidden * (4 if name == "naive" else 2) / 2**20,
        }
        for name in methods
    }
    for round_ in range(repeats):  # interleaved rounds: a busy machine slows every method alike
        for name, run in methods.items():
            rss_before = _status_kb("VmRSS")
            _reset_peak()
            started = time.perf_counter()
            result = run()
            rows[name]["seconds"] = min(rows[name]["seconds"], time.perf_counter() - started)
            if round_ == 0:  # first round only: later rounds reuse heap that naive grew
                rows[name]["peak_mb"] = (_status_kb("VmHWM") - rss_before) / 1024
            rows[name]["shape"] = list(result.shape)
            del result
    for row in rows.values():
        row["texts_per_s"] = n / row["seconds"]
    return list(rows.values())


def _run_child(args, n: int, cache_dir: str) -> list:
    command = [
        sys.executable,
        __file__,
        "--child",
        str(n),
        "--model",
        args.model,
        "--batch-size",
        str(args.batch_size),
        "--data-dir",
        args.data_dir,
        "--cache-dir",
        cache_dir,
        "--repeat",
        str(args.repeat),
        "--threads",
        str(args.threads),
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    if done.returncode != 0:
        raise SystemExit(f"N={n} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="N = 150 and 300 (about a minute)")
    parser.add_argument("--n", type=int, nargs="+", default=None, help="text counts [400 1200]")
    parser.add_argument("--model", default="minilm-l6")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=2, help="interleaved rounds; the best time counts [2]")
    parser.add_argument("--threads", type=int, default=1, help="torch threads [1: stable numbers on a shared machine]")
    parser.add_argument(
        "--data-dir", default=os.environ.get("ILGE_SEARCH_DATA", str(REPO.parent / "shared" / "datasets"))
    )
    parser.add_argument("--cache-dir", default=None, help="for model conversion and weight hashes [temporary]")
    parser.add_argument("--child", type=int, metavar="N", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(
            json.dumps(
                _child(
                    args.child, args.model, args.batch_size, args.data_dir, args.cache_dir, args.repeat, args.threads
                )
            )
        )
        return
    sizes = args.n or ([150, 300] if args.quick else [400, 1200])
    with tempfile.TemporaryDirectory() as scratch:
        cache_dir = args.cache_dir or scratch
        rows = [row for n in sizes for row in _run_child(args, n, cache_dir)]
    print(
        f"\nbanking77 texts, model {args.model}, batch size {args.batch_size}, torch threads {args.threads}, "
        f"best of {args.repeat}\n"
    )
    print(f"{'method':<7} {'N':>6} {'texts/s':>9} {'vs naive':>9} {'peak MB':>9} {'output MB':>10} {'peak-output':>12}")
    for n in sizes:
        base = next(r for r in rows if r["n"] == n and r["method"] == "naive")
        for row in (r for r in rows if r["n"] == n):
            ratio = row["texts_per_s"] / base["texts_per_s"]
            print(
                f"{row['method']:<7} {n:>6} {row['texts_per_s']:>9.1f} {ratio:>8.2f}x "
                f"{row['peak_mb']:>9.1f} {row['output_mb']:>10.1f} {row['peak_mb'] - row['output_mb']:>12.1f}"
            )
    if len(sizes) > 1:
        small, large = sizes[0], sizes[-1]
        for method in ("naive", "stream", "cache"):
            a = next(r for r in rows if r["n"] == small and r["method"] == method)
            b = next(r for r in rows if r["n"] == large and r["method"] == method)
            print(
                f"{method:<7} peak memory N={large} / N={small}: {b['peak_mb'] / max(a['peak_mb'], 1e-9):.2f}x "
                f"(texts x{large / small:.1f})"
            )


if __name__ == "__main__":
    main()
