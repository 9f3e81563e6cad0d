#!/usr/bin/env bash
# The transfer measurement (docs/transfer.md): the Cayley cross-task matrix on a copy of the committed
# offline storage, the default and portfolio chosen from it, and the left-out checks.
# Stage 1 (what fits a shared, overloaded 2-core machine in about an hour): the minilm-l6 problems of the
# five tasks with 500 training texts (banking77, 1155 texts and 77 classes, is the slowest; it joins in stage 2).
# Stage 2 (STAGE=full): both offline models x 6 tasks; it reuses every stored cell of stage 1 whose
# configuration is still a candidate. Resumable: a rerun trains only the cells not stored yet.
# FAMILY=fc or FAMILY=deepset: that family's matrix over the same 12 problems in one stage (both are cheaper
# than Cayley's: the dry runs estimated 32 and 14 minutes on one process), into reports/transfer_FAMILY.json.
# Usage: [FAMILY=cayley|fc|deepset] [STAGE=full] [WORKERS=2] reports/transfer.sh; ILGE_SEARCH_CACHE /
# ILGE_SEARCH_DATA as for run.
set -euo pipefail
cd "$(dirname "$0")/.."
DB=reports/transfer.db
[ -f "$DB" ] || cp reports/offline.db "$DB"   # never write into the committed offline.db
FAMILY="${FAMILY:-cayley}"
COMMON=(--storage "sqlite:///$DB" --family "$FAMILY" --top-k 1 --seeds 3 --size 4 --check)
if [ "$FAMILY" != cayley ] || [ "${STAGE:-minilm}" = full ]; then OUT="reports/transfer_$FAMILY.json"; else
  COMMON+=(--exclude-model smollm2-135m --exclude-task banking77); OUT=reports/transfer_cayley_stage1.json; fi
ilge-search portfolio "${COMMON[@]}" --dry-run
ilge-search portfolio "${COMMON[@]}" --workers "${WORKERS:-2}" --threads 1
ilge-search portfolio "${COMMON[@]}" --quiet --format json > "$OUT"
