"""Reports from stored studies: paper-style result tables and figures, and regenerated defaults.

Modules, low to high:

- :mod:`~ilge_search.report.document`: the one Markdown/LaTeX/HTML document renderer;
- :mod:`~ilge_search.report.data`: reading a storage into one record per study;
- :mod:`~ilge_search.report.paper_results`: the published numbers, matched to our studies;
- :mod:`~ilge_search.report.tables`: pandas aggregation (results, gains, summary) and table rows;
- :mod:`~ilge_search.report.notes`: the report's prose;
- :mod:`~ilge_search.report.figures`: matplotlib figures and fANOVA importances;
- :mod:`~ilge_search.report.fewshot`: few-shot curves (score against examples per label), table and figures;
- :mod:`~ilge_search.report.defaults_rule`: the rule that turns studies into ``recommended_config`` defaults;
- :mod:`~ilge_search.report.loto`: :func:`~ilge_search.report.loto.leave_one_task_out`, regenerated defaults
  against the built-in ones on each task they never saw, stored on the studies;
- :mod:`~ilge_search.report.build`: :func:`build_report`, which writes the report;
- :mod:`~ilge_search.report.recommend`: :func:`~ilge_search.report.recommend.recommend_defaults`,
  the ``recommended_config`` defaults (the user's file, or the shipped one on request, under the
  leave-one-task-out shipping rule) and their page.

pandas, matplotlib and Optuna are imported only inside the functions that use them.
"""

from __future__ import annotations

from .build import MANIFEST_NAME, ReportResult, build_report
from .data import METHOD_LABELS, METHODS
from .document import MISSING
from .tables import collect_results

__all__ = ["METHODS", "METHOD_LABELS", "MISSING", "MANIFEST_NAME", "ReportResult", "build_report", "collect_results"]
