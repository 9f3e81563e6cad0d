"""How ``recommended_config`` defaults are derived from stored studies, and checked on tasks they never saw.

Three parts, low to high:

- *problems* (:mod:`~ilge_search.defaults.problems`): each stored study of an
  ILGE family read as a :class:`~ilge_search.defaults.problems.Problem` (a
  model, task and data setting) whose trials carry their parameters as levels
  and their normalised rank;
- *choosing defaults* (:mod:`~ilge_search.defaults.rule`): the marginal rule
  that turns the problems of a family and model-size bucket into one
  configuration, optionally without some tasks' problems; and
  :mod:`~ilge_search.defaults.recommend`, which writes the result as a
  defaults file under the shipping rule;
- *stored evaluations* (:mod:`~ilge_search.defaults.loto`): leave one task
  out, the regenerated defaults trained against the built-in ones on each task
  they never saw and stored on that task's study
  (:class:`~ilge_search.record.LotoRecord`), read back without training.

:mod:`ilge_search.report` only reads what this package computed and stored:
the report's table of the stored evaluation, and the "Defaults by model size"
page of :func:`~ilge_search.report.defaults_page.recommend_defaults`.
Nothing here is imported eagerly: Optuna, pandas and torch load on first use.
"""
