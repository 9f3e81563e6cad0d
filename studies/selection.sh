#!/usr/bin/env bash
# The measurement of issue 18, smallest settings first (resumable: rerun it; finished studies are skipped).
# Every study is evaluated under both rules: best first, then one-se (the stored top-level result).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${ILGE_SEARCH_DATA:-../shared/datasets}"
# resume from the committed measurement when this checkout has none of its own (studies/*.db is not committed)
[ -f studies/selection.db ] || cp reports/selection.db studies/selection.db
for grid in studies/selection.toml studies/selection-2000.toml; do
  for model in minilm-l6 smollm2-135m; do
    for cv in "" "--cv 5"; do
      for rule in best one-se; do
        echo "== $(date +%H:%M:%S) $grid $model ${cv:-no-cv} $rule"
        ilge-search sweep "$grid" --model "$model" $cv --select "$rule" --data-dir "$DATA" --quiet
      done
    done
  done
done
cp studies/selection.db reports/selection.db   # the committed measurement
ilge-search report --storage sqlite:///reports/selection.db --out reports/selection --no-figures --force
