#!/usr/bin/env bash
# The measurement of issue 39: one auto study per problem (studies/auto.toml: both offline models, the six
# tasks of studies/offline.toml at 500 texts, 24 trials each), against the per-method studies of
# reports/offline.db and the Cayley ensembles of reports/ensembles.db. Resumable: rerun it; finished
# studies are kept and the rest topped up to their budget.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${ILGE_SEARCH_DATA:-../shared/datasets}"
ilge-search --data-dir "$DATA" sweep studies/auto.toml
python -c "import sys; from pathlib import Path; from ilge_search.report.auto import write_auto_page as w; \
print(w(sys.argv[1], sys.argv[2:], Path('reports/auto'), force=True))" \
  sqlite:///reports/auto.db sqlite:///reports/offline.db sqlite:///reports/ensembles.db
