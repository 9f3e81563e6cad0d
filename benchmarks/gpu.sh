#!/usr/bin/env bash
# Everything a lent GPU is for, in one command: the suite's device tests, then bench_many and bench_trial
# with --device cuda, then several workers sharing the one GPU (each a bench_many --quick in its own
# process, started together). Run from the repository root with the virtual environment active; output
# goes to stdout and to $OUT (default benchmarks/gpu-results) as one log per step.
#
#   bash benchmarks/gpu.sh [WORKERS]     # WORKERS: processes sharing the GPU at the end (default 4)
set -uo pipefail
WORKERS=${1:-4}
OUT=${OUT:-benchmarks/gpu-results}
mkdir -p "$OUT"
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU'; print(torch.cuda.get_device_name(0))" \
    | tee "$OUT/device.txt" || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$OUT/device.txt"

echo "== device tests"
python -m pytest -q -p no:cacheprovider -k cuda tests/test_engine_many.py 2>&1 | tee "$OUT/tests.txt"

echo "== bench_many --device cuda"
python benchmarks/bench_many.py --device cuda --rounds 3 2>&1 | tee "$OUT/bench_many.txt"

echo "== bench_trial --device cuda"
python benchmarks/bench_trial.py --device cuda 2>&1 | tee "$OUT/bench_trial.txt"

echo "== $WORKERS workers sharing the GPU (bench_many --quick each)"
started=$(date +%s)
for worker in $(seq 1 "$WORKERS"); do
    python benchmarks/bench_many.py --device cuda --quick > "$OUT/shared-$worker.txt" 2>&1 &
done
wait
echo "$WORKERS workers done in $(( $(date +%s) - started )) s" | tee "$OUT/shared.txt"
tail -n 1 "$OUT"/shared-*.txt | tee -a "$OUT/shared.txt"
