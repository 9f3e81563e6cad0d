#!/usr/bin/env bash
# The warm-start measurement of issue 27 (docs/transfer.md#measuring-warm-starts): Cayley searches on both
# offline models x trec/sst2/emotion at 500 and 2,000 training texts (eval 400, epochs capped at 10, 3 final
# seeds 1000-1002, sampler seed 0, --select best, as studies/selection.toml; no ensemble: what a warm start
# buys the selected trial), cold vs --warm-start 2 and 4, of 8 and of 16 trials, and the best single layer
# of each setting; then reports/warmstart.md.
#
# Storages (both fresh; the committed ones are only read):
#   reports/warmstart.db     the 8-trial searches, the best-layer studies, and the Cayley portfolio study copied
#                            once from a scratch copy of reports/transfer.db, where `ilge-search portfolio`
#                            (no exclusions, the options of reports/transfer.sh) stored its choice and, per task,
#                            the warm-start order chosen without that task's problems (it trains nothing: the
#                            driver stops first if a cell of that matrix is missing; run STAGE=full
#                            reports/transfer.sh then);
#   reports/warmstart-16.db  each 8-trial search copied once, when it is done, and resumed to 16 trials. A study's
#                            name does not say its budget, so the 8-trial result is its own study (its final
#                            evaluation after 8 trials), and the 16-trial search continues the same 8 trials.
# Resumable: rerun it; budgets are totals, finished studies and current final evaluations are kept.
# Order, cheapest first: 500 texts before 2,000, MiniLM-L6 before SmolLM2-135M, trec, sst2, emotion; per setting
# the best layer, then cold, warm 2, warm 4 at 8 trials, then the same three resumed to 16.
# Usage: [WORKERS=1] [THREADS=1] [SIZES="500 2000"] [MODELS="minilm-l6 smollm2-135m"] [TASKS="trec sst2 emotion"]
# reports/warmstart.sh;
# ILGE_SEARCH_CACHE / ILGE_SEARCH_DATA as for run. Two drivers may share the work on 2 cores, one per model
# (MODELS=minilm-l6 and MODELS=smollm2-135m) or one per task (TASKS=...), once the first run has created
# reports/warmstart.db.
# The starting configuration of every search is the built-in Cayley defaults (BUILTIN_RECOMMENDED), as when
# the measurement ran, also now that the package ships a regenerated default: a user defaults file pins it.
set -euo pipefail
cd "$(dirname "$0")/.."
scratch="$(mktemp -d)"   # the pinned defaults file and, once, a copy of the matrix
trap 'rm -rf "$scratch"' EXIT
python -c "import dataclasses, json, sys; from ilge_search.tuning import BUILTIN_RECOMMENDED as b, \
DEFAULTS_FORMAT_VERSION as v, config_class_for as c; small = dataclasses.asdict(c('cayley')(**b['cayley']['small'])); \
json.dump({'format_version': v, 'metadata': {}, 'families': {'cayley': {'small': small}}}, open(sys.argv[1], 'w'))" \
  "$scratch/builtin.json"
export ILGE_SEARCH_DEFAULTS="$scratch/builtin.json"
DATA="${ILGE_SEARCH_DATA:-../shared/datasets}"
DB8=reports/warmstart.db
DB16=reports/warmstart-16.db
PORTFOLIO=(--family cayley --top-k 1 --seeds 3 --size 4)   # as reports/transfer.sh, without its exclusions
RUN=(--data-dir "$DATA" --max-eval 400 --max-epochs 10 --final-seeds 3 --seed 0 --select best --ensemble 0
     --workers "${WORKERS:-1}" --threads "${THREADS:-1}" --quiet)

if [ ! -f "$DB8" ]; then
  cp reports/transfer.db "$scratch/matrix.db"
  plan="$(ilge-search portfolio --storage "sqlite:///$scratch/matrix.db" "${PORTFOLIO[@]}" --dry-run)"
  echo "$plan"
  case "$plan" in *", 0 of the matrix missing;"*) ;; *)
    echo "the matrix of reports/transfer.db is not complete: run STAGE=full reports/transfer.sh first" >&2; exit 1;; esac
  ilge-search portfolio --storage "sqlite:///$scratch/matrix.db" "${PORTFOLIO[@]}" --quiet > /dev/null
  python -c "import sys; from ilge_search.defaults.transfer import copy_portfolio as c; c(sys.argv[1], sys.argv[2])" \
    "sqlite:///$scratch/matrix.db" "sqlite:///$scratch/warmstart.db"
  mv "$scratch/warmstart.db" "$DB8"   # whole or not at all: a rerun never warm-starts from the shipped file
fi

copy_to_16() {
  python -c "import sys; from ilge_search.storage import open_storage as o, copy_study_once as c; \
c(o(sys.argv[1]), o(sys.argv[2]), sys.argv[3])" "sqlite:///$DB8" "sqlite:///$DB16" "$1"
}
copy_to_16 "ilge-portfolio:cayley:small"   # a resumed warm study checks its portfolio as a new one would

for size in ${SIZES:-500 2000}; do
  for model in ${MODELS:-minilm-l6 smollm2-135m}; do
    for task in ${TASKS:-trec sst2 emotion}; do
      setting="$model:$task:cayley:train$size:eval400:ep10"
      here=(--model "$model" --task "$task" --max-train "$size" "${RUN[@]}")
      echo "== $(date +%H:%M:%S) $setting: best layer, then cold, warm 2, warm 4 (8 trials)"
      ilge-search run --storage "sqlite:///$DB8" "${here[@]}" --encoder best-layer --total-trials 1 \
        || echo "   failed: best layer of $setting"
      done8=()
      for warm in 0 2 4; do
        if ilge-search run --storage "sqlite:///$DB8" "${here[@]}" --encoder cayley --warm-start "$warm" \
            --total-trials 8; then done8+=("$warm"); else echo "   failed: warm $warm, 8 trials, $setting"; fi
      done
      echo "== $(date +%H:%M:%S) $setting: those done resumed to 16 trials (${done8[*]:-none})"
      for warm in "${done8[@]}"; do   # only a whole 8-trial search is copied, so 16 continues its 8 trials
        name="$setting"; [ "$warm" = 0 ] || name="$setting:warm$warm"
        copy_to_16 "$name" || { echo "   not copied: $name"; continue; }
        ilge-search run --storage "sqlite:///$DB16" "${here[@]}" --encoder cayley --warm-start "$warm" \
          --total-trials 16 || echo "   failed: warm $warm, 16 trials, $setting"
      done
    done
  done
done
python -c "import sys; from ilge_search.report.warmstart import write_warmstart_page as w; \
print(w(sys.argv[1:3], sys.argv[3], force=True))" "sqlite:///$DB8" "sqlite:///$DB16" reports/warmstart.md
