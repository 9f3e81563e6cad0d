"""Reports from stored studies: paper-style result tables and figures, and the regenerated defaults' page.

The report trains nothing and writes nothing to a storage: it reads the studies' records
(:mod:`ilge_search.record`) and what :mod:`ilge_search.defaults` stored. ARCHITECTURE.md lists its modules.
pandas, matplotlib and Optuna are imported only inside the functions that use them.
"""

from __future__ import annotations

from .build import MANIFEST_NAME, ReportResult, build_report
from .data import method_labels, methods
from .document import MISSING
from .tables import collect_results

__all__ = ["methods", "method_labels", "MISSING", "MANIFEST_NAME", "ReportResult", "build_report", "collect_results"]
