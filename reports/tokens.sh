#!/usr/bin/env bash
# Token-level studies on UD English-EWT POS tagging (issue 30): every method's final token accuracy on test.
# Resumable: each study is capped at --total-trials, so a rerun adds no trial and skips a current final
# evaluation; a study cut off mid-way resumes where it stopped. Storage: $STORAGE, default reports/tokens.db
# (+ artifacts); the 2,000-sentence measurement uses STORAGE=reports/tokens2000.db.
#   bash reports/tokens.sh [model ...]      (default: minilm-l6, then smollm2-135m)
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR=${DATA_DIR:-../shared/datasets}
TRAIN=${TRAIN:-300}      # training sentences (seeded draw)
EVAL=${EVAL:-150}        # validation and test sentences each (seeded draws)
TRIALS=${TRIALS:-1}      # trials per study: 1 = the starting (recommended) configuration, no search
EPOCHS=${EPOCHS:-4}      # epoch cap of every training run
SEEDS=${SEEDS:-3}        # final seeds, each scored once on test
STORAGE=${STORAGE:-reports/tokens.db}
THREADS=${THREADS:-2}     # torch threads of each run
ENCODERS=${ENCODERS:-"last-layer mlp-last cayley-word cayley best-layer"}
MODELS=("$@")
[ ${#MODELS[@]} -gt 0 ] || MODELS=(minilm-l6 smollm2-135m)
for model in "${MODELS[@]}"; do
  for encoder in $ENCODERS; do
    ilge-search --data-dir "$DATA_DIR" run --model "$model" --task ud_ewt_pos --encoder "$encoder" \
      --storage "sqlite:///$STORAGE" --max-train "$TRAIN" --max-eval "$EVAL" \
      --total-trials "$TRIALS" --max-epochs "$EPOCHS" --final-seeds "$SEEDS" --threads "$THREADS" --quiet
  done
done
