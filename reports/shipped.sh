#!/usr/bin/env bash
# The shipping rule's check of the Cayley portfolio default in the setting that ships (issue 38; docs/statistics.md,
# "The shipping rule"). The committed matrix (study ilge-portfolio:cayley:small of reports/offline.db: both offline
# models x 6 tasks) trained every cell with epochs capped at 10. `ilge-search shipping-check` retrains only what the
# rule compares: on each held-out problem of both left-out checks, the default its fold chose without it (on the
# matrix's validation scores) and the built-in defaults, with the configuration's own 50 epochs and early stopping,
# seeds 1000-1002 and the same data: 102 cells.
#
# Storages:
#   reports/shipped.db    a working copy of reports/offline.db (git-ignored), where the cells are trained into the
#                         study ilge-portfolio:cayley:small:shipping-check:ep50 and nothing else is written;
#   reports/offline.db    once every cell is stored, that one study is copied into it (its other studies are left as
#                         they are), because the shipped defaults and reports/defaults.md come from this storage.
# Then, from reports/offline.db: `recommend --method portfolio --update-shipped` rewrites
# ilge_search/data/recommended_defaults.json by the shipping rule (the built-in defaults unless the portfolio default
# won both checks) and reports/defaults.md, and the table of docs/statistics.md between its shipping-check markers is
# rewritten.
# Resumable: rerun it; only the cells not stored yet train, and the finished study is copied once.
# Usage: [WORKERS=2] [THREADS=1] reports/shipped.sh; ILGE_SEARCH_DATA (default ../shared/datasets) and
# ILGE_SEARCH_CACHE as for run. Embeddings missing from the cache are extracted first (SmolLM2's GGUF converted once).
set -euo pipefail
cd "$(dirname "$0")/.."
DB=reports/shipped.db
STUDY="ilge-portfolio:cayley:small:shipping-check:ep50"
[ -f "$DB" ] || cp reports/offline.db "$DB"   # never train into the committed storage
CHECK=(--storage "sqlite:///$DB" --family cayley --bucket small --data-dir "${ILGE_SEARCH_DATA:-../shared/datasets}")

echo "== $(date +%H:%M:%S) plan"
ilge-search shipping-check "${CHECK[@]}" --dry-run
echo "== $(date +%H:%M:%S) training the missing cells"
ilge-search shipping-check "${CHECK[@]}" --workers "${WORKERS:-2}" --threads "${THREADS:-1}"
plan="$(ilge-search shipping-check "${CHECK[@]}" --dry-run)"
case "$plan" in *", 0 of them missing;"*) ;; *)
  echo "the check is not complete ($plan); rerun reports/shipped.sh (it trains only what is missing)" >&2; exit 1;; esac

echo "== $(date +%H:%M:%S) copying $STUDY into reports/offline.db"
python -c "import sys; from ilge_search.storage import open_storage as o, copy_study_once as c; \
print('copied' if c(o(sys.argv[1]), o(sys.argv[2]), sys.argv[3]) else 'already there')" \
  "sqlite:///$DB" sqlite:///reports/offline.db "$STUDY"

echo "== $(date +%H:%M:%S) the shipping decision, reports/defaults.md and docs/statistics.md"
ilge-search recommend --storage sqlite:///reports/offline.db --method portfolio --update-shipped \
  --report reports/defaults.md --force
python - <<'EOF'
from pathlib import Path

from ilge_search.report.portfolio import between_markers, statistics_table

page = Path("docs/statistics.md")
table = statistics_table("sqlite:///reports/offline.db")
page.write_text(between_markers(page.read_text(encoding="utf-8"), table), encoding="utf-8")
print(f"rewrote the shipping-check table of {page}:\n{table}")
EOF
