#!/usr/bin/env bash
# The measurement of issue 28: ensembles of the selection searches' trials (reports/selection.db, Cayley,
# 10 trials, 3 final seeds, no cv), K in {1, 3, 5, 10}. Resumable: rerun it; a study whose ensemble
# evaluation is current is skipped, and backfilled validation predictions are kept as they are made.
# Order: MiniLM at 500 texts first, then SmolLM2 at 500, then both at 2,000.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${ILGE_SEARCH_DATA:-../shared/datasets}"
DB=reports/ensembles.db
# never modify the committed selection storage in place: work on a copy (made once)
[ -f "$DB" ] || cp reports/selection.db "$DB"
for setting in train500 train2000; do
  for model in minilm-l6 smollm2-135m; do
    for task in trec emotion sst2; do
      study="$model:$task:cayley:$setting:eval400:ep10"
      echo "== $(date +%H:%M:%S) $study"
      ilge-search ensemble --storage "sqlite:///$DB" --study "$study" --size 3 --also 1 --also 5 --also 10 \
        --data-dir "$DATA" --quiet 2>&1 || echo "   failed: $study"
    done
  done
done
# stsb: the selection storage has no similarity search, so one is run here with the selection grid's
# settings (10 trials, one-se, 3 final seeds), then ensembled like the others
for model in minilm-l6 smollm2-135m; do
  echo "== $(date +%H:%M:%S) $model stsb search"
  ilge-search --data-dir "$DATA" run --model "$model" --task stsb --encoder cayley --storage "sqlite:///$DB" \
    --seed 0 --final-seeds 3 --workers 1 --threads 1 --max-epochs 10 --max-train 500 --max-eval 400 \
    --total-trials 10 --select one-se --quiet
  study="$model:stsb:cayley:train500:eval400:ep10"
  ilge-search ensemble --storage "sqlite:///$DB" --study "$study" --size 3 --also 1 --also 5 --also 10 \
    --data-dir "$DATA" --quiet 2>&1 || echo "   failed: $study"
done
python -c "import sys; from pathlib import Path; from ilge_search.report.ensembles import write_ensemble_page as w; \
print(w(sys.argv[1], Path(sys.argv[2]), force=True))" "sqlite:///$DB" reports/ensembles
