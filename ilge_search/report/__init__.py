"""Reports from stored studies: paper-style result tables and figures, and the regenerated defaults' page.

The report trains nothing and writes nothing to a storage: it reads the studies'
records (:mod:`ilge_search.record`) and what :mod:`ilge_search.defaults` stored.

Modules, low to high:

- :mod:`~ilge_search.report.document`: the one Markdown/LaTeX/HTML document renderer;
- :mod:`~ilge_search.report.data`: reading a storage into one :class:`~ilge_search.report.data.ReportStudy` per
  study;
- :mod:`~ilge_search.report.paper_results`: the published numbers, matched to our studies;
- :mod:`~ilge_search.report.tables`: pandas aggregation (results, gains, summary) and table rows;
- :mod:`~ilge_search.report.notes`: the report's prose;
- :mod:`~ilge_search.report.figures`: matplotlib figures and fANOVA importances;
- :mod:`~ilge_search.report.fewshot`: few-shot curves (score against examples per label), table and figures;
- :mod:`~ilge_search.report.attributions`, :mod:`~ilge_search.report.pareto`,
  :mod:`~ilge_search.report.protocol_effect`: the stored layer attributions, Pareto fronts and protocol effect;
- :mod:`~ilge_search.report.loto`: the stored leave-one-task-out evaluation as tables and sentences;
- :mod:`~ilge_search.report.sections`: the report's sections (title, anchor, applies, draw, render);
- :mod:`~ilge_search.report.build`: :func:`build_report`, which writes the report;
- :mod:`~ilge_search.report.defaults_page`: :func:`~ilge_search.report.defaults_page.recommend_defaults`,
  which writes the regenerated ``recommended_config`` defaults (the user's file, or the shipped one on
  request, under the leave-one-task-out shipping rule) and their page.

pandas, matplotlib and Optuna are imported only inside the functions that use them.
"""

from __future__ import annotations

from .build import MANIFEST_NAME, ReportResult, build_report
from .data import METHOD_LABELS, METHODS
from .document import MISSING
from .tables import collect_results

__all__ = ["METHODS", "METHOD_LABELS", "MISSING", "MANIFEST_NAME", "ReportResult", "build_report", "collect_results"]
