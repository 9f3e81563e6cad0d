#!/usr/bin/env bash
# The transfer measurement (docs/transfer.md): the Cayley cross-task matrix on a copy of the committed
# offline storage (both offline models x 6 tasks, 500 training texts; banking77 1155), the portfolio
# chosen from it, and the left-out checks. Resumable: a rerun trains only the cells not stored yet.
# Usage: reports/transfer.sh [extra portfolio options]; ILGE_SEARCH_CACHE / ILGE_SEARCH_DATA as for run.
set -euo pipefail
cd "$(dirname "$0")/.."
DB=reports/transfer.db
[ -f "$DB" ] || cp reports/offline.db "$DB"   # never write into the committed offline.db
STORAGE="sqlite:///$DB"
COMMON=(--storage "$STORAGE" --family cayley --top-k 1 --seeds 3 --size 4 --check)
ilge-search portfolio "${COMMON[@]}" --dry-run
ilge-search portfolio "${COMMON[@]}" --workers "${WORKERS:-2}" --threads 1 "$@"
ilge-search portfolio "${COMMON[@]}" --quiet --format json > reports/transfer_cayley.json
