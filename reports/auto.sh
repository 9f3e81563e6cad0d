#!/usr/bin/env bash
# The measurement of issue 39, resumable: rerun it after an interruption and it goes on where it stopped.
#
#   1. studies/auto.toml: both offline models x the six tasks at 500 texts, 24 trials each (done: a no-op);
#   2. studies/auto-2000.toml: both models x trec, emotion, sst2 at 2,000 texts, the same budget;
#   3. runs under --time-limit (reports/auto-time.db): four problems with a trial cap (500) far above what the
#      limit allows, so the limit ends the search; a problem whose study already recorded a run under a limit is
#      skipped (a run cut off before its end recorded none, and its rerun resumes the study under a fresh limit);
#   4. studies/auto-tokens.toml: both models on ud_ewt_pos, set up like reports/tokens2000.db (SmolLM2-135M last:
#      its word entries and 31-layer probes are the slowest part of the whole measurement);
#   after every step reports/auto.md is written again from the storages (the committed ones are read, and only
#   reports/auto.db and reports/auto-time.db are written).
#
# Run it in the background from the repository root, with the package's environment active:
#   nohup bash reports/auto.sh > /tmp/auto-measurement.log 2>&1 &
# Settings (environment): STEPS="2 3" runs only those steps, STEPS="" none (the page is still written);
# MODELS="minilm-l6" and TASKS="trec" keep only those models and tasks in every step; DATA (else
# $ILGE_SEARCH_DATA, else ../shared/datasets) is the data folder; AUTO_DB, TIMED_DB and PAGE move the two written
# storages and the page (PAGE is a path without .md), e.g. to try the script on copies under /tmp.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${DATA:-${ILGE_SEARCH_DATA:-../shared/datasets}}"
STEPS="${STEPS-1 2 3 4}"
AUTO_DB="${AUTO_DB:-reports/auto.db}"
TIMED_DB="${TIMED_DB:-reports/auto-time.db}"
PAGE="${PAGE:-reports/auto}"

say() { echo "== $(date '+%F %T') $*"; }

page() {
  say "writing $PAGE.md"
  python -c "import sys; from pathlib import Path; from ilge_search.report.auto import AutoPage, write_auto_page as w; \
print(w(AutoPage(sys.argv[2], sys.argv[3:6], [Path(g) for g in sys.argv[6:9]], sys.argv[9]), Path(sys.argv[1]), \
force=True))" "$PAGE" "sqlite:///$AUTO_DB" sqlite:///reports/offline.db sqlite:///reports/ensembles.db \
    sqlite:///reports/tokens2000.db studies/auto.toml studies/auto-2000.toml studies/auto-tokens.toml \
    "sqlite:///$TIMED_DB"
}

kept() {  # whether MODELS and TASKS keep model $1 and task $2
  [[ -z "${MODELS:-}" || " $MODELS " == *" $1 "* ]] && [[ -z "${TASKS:-}" || " $TASKS " == *" $2 "* ]]
}

grid() {
  say "sweep $1${MODELS:+ (models: $MODELS)}${TASKS:+ (tasks: $TASKS)}"
  local only=() model task
  for model in ${MODELS:-}; do only+=(--model "$model"); done
  for task in ${TASKS:-}; do only+=(--task "$task"); done
  if ilge-search --data-dir "$DATA" sweep "$1" --storage "sqlite:///$AUTO_DB" ${only[@]+"${only[@]}"}; then
    page
  else  # e.g. no study of the grid is left by MODELS and TASKS
    say "the sweep of $1 stopped (exit $?); going on"
  fi
}

# one auto run under a time limit: model, task, training texts, limit
timed() {
  kept "$1" "$2" || return 0
  local name="$1:$2:auto:train$3:eval400:ep10"
  if python -c "import sys; from ilge_search.report.auto_times import has_timed_run as h; \
sys.exit(0 if h(sys.argv[1], sys.argv[2]) else 1)" "sqlite:///$TIMED_DB" "$name"; then
    say "$name: its run under a time limit is recorded; skipped"
    return 0
  fi
  say "$name under --time-limit $4"
  local began=$SECONDS
  if ilge-search --data-dir "$DATA" run --model "$1" --task "$2" --encoder auto --storage "sqlite:///$TIMED_DB" \
    --seed 0 --final-seeds 3 --workers 2 --threads 1 --max-epochs 10 --max-train "$3" --max-eval 400 \
    --time-limit "$4" --total-trials 500 --quiet; then
    say "$name: the command took $((SECONDS - began)) s, its imports included (limit $4)"
  else
    say "$name: the run stopped (exit $?); going on"
  fi
}

for step in $STEPS; do
  case "$step" in
    1) grid studies/auto.toml ;;
    2) grid studies/auto-2000.toml ;;
    3)
      timed minilm-l6 emotion 500 2m
      timed smollm2-135m trec 500 5m
      timed minilm-l6 trec 2000 4m
      timed smollm2-135m trec 2000 25m
      page
      ;;
    4) grid studies/auto-tokens.toml ;;
    *) echo "unknown step $step (steps: 1 2 3 4)" >&2; exit 2 ;;
  esac
done
page
say "done"
