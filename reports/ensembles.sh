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
python -m ilge_search.report.ensembles "sqlite:///$DB" reports/ensembles
