"""How ``recommended_config`` defaults are derived from stored studies, and checked on tasks they never saw.

Low to high: stored studies read as problems (:mod:`.problems`), the marginal rule over them (:mod:`.rule`)
written as a defaults file under the shipping rule (:mod:`.recommend`), leave one task out (:mod:`.loto`),
and the cross-task matrix with its portfolio (:mod:`.choice`, :mod:`.portfolio`, :mod:`.transfer`,
:mod:`.shipped_portfolio`). :mod:`ilge_search.report` only reads what this package stored.
Nothing here is imported eagerly: Optuna, pandas and torch load on first use.
"""
