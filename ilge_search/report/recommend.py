"""Regenerate the ``recommended_config`` defaults from stored studies.

:func:`recommend_defaults` reads every study of an encoder family (``cayley``,
``fc``, ``deepset``) in a storage, groups them by family and model-size bucket,
and derives one configuration per group with the rule below. It writes a
defaults file that :func:`ilge_search.tuning.recommended_config` reads (schema
in :mod:`ilge_search.tuning`) and a Markdown page with the "Defaults by model
size" table and the evidence behind every value.

Where it writes: by default the user's defaults file
(:func:`ilge_search.settings.user_defaults_path`: ``$ILGE_SEARCH_DEFAULTS``,
else ``~/.config/ilge-search/recommended_defaults.json``), which
``recommended_config`` reads over the shipped defaults, and the Markdown page
next to it (same name, ``.md``). The package's own
``ilge_search/data/recommended_defaults.json`` is rewritten only with
``update_shipped=True`` (``ilge-search recommend --update-shipped``), for the
maintainers who regenerate the shipped defaults from the committed studies.

Size buckets
------------
``small`` holds models up to 3B parameters, ``large`` those above
(:func:`ilge_search.models.model_size_bucket`). The issue fixes the ends (up
to ~1B: small; above 3B: large); models between 1B and 3B
(Pythia-1b/1.4b/2.8b, Gemma2-2B, Qwen3-1.7B) go to ``small`` because that is
the bucket the study runner already uses for them (its proxy: hidden size above
3000 means large), so their studies started from the small defaults and the
regenerated small defaults are what their next studies start from. The
parameter count comes from the model table :data:`ilge_search.models.MODELS`
(the models of the paper and the two offline models); for other models the
runner's hidden-size proxy decides, read from the study's ``hidden_size`` user attr.

The rule
--------
Every study is one *problem* (a model, task and data setting). Within a
problem, every complete trial gets its normalised rank of validation score,
``q = (rank - 1) / (n - 1)`` with rank 1 the worst, ties sharing their average
rank, so ``q`` is 1 for the problem's best trial and 0 for its worst; pruned
trials count as tied below every complete trial (the pruner judged them worse),
failed ones are ignored. A problem needs two such trials, one of them complete.
Ranks make problems of different difficulty and metric comparable.

Values are compared per hyperparameter, on *levels*: categorical and integer
values as they are; log-scale floats (``lr``, ``weight_decay``) snapped to the
nearest of 1 and 3 x 10^k (in log space); other floats (``dropout``) to the
nearest of six evenly spaced levels of their range (0, 0.1, ..., 0.5). For each level its score is
the mean over problems of the mean ``q`` of that problem's trials at the level.
Among the levels seen in at least half the problems of the group (coverage),
the highest score wins; ties go to the larger coverage, then more trials, then
the built-in default's value, then the smallest level. Parameters that exist
only under a choice (``gin_mlp_layers`` for GIN, ``gat_heads`` for GAT) are
decided after it, from the trials that made the same choice, and only when it
is the chosen one. Training fields outside the search space (``epochs``,
``batch_size``) are not touched.

This ranks each hyperparameter by how the trials that used each value fared
across tasks. TPE trials almost never repeat an exact configuration across
studies, so a rule over whole configurations could only rank the one config
every study evaluates (the enqueued default); ``defaults.md`` still shows its
mean normalised rank per group for comparison. Validation scores only; test
scores are never read.
"""

from __future__ import annotations

import datetime
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .._version import __version__
from ..configs import CONFIG_CLASSES, config_class_for
from ..models import model_size_bucket
from ..objectives import study_objectives
from ..protocol import protocol_of
from ..settings import user_defaults_path
from ..storage import hide_password
from ..study.identity import IDENTITY_KEYS, PROTOCOL_KEYS
from ..tuning import BUILTIN_RECOMMENDED, DEFAULTS_FORMAT_VERSION, load_recommended_defaults
from .data import open_report_storage
from .document import MISSING, Cell, Document, plural, write_atomic

__all__ = ["DEFAULT_FAMILIES", "NEXT_TO_DEFAULTS", "recommend_defaults", "defaults_targets", "RecommendedValue",
           "normalised_ranks"]

PathLike = Union[str, os.PathLike]

DEFAULT_FAMILIES: Tuple[str, ...] = ("cayley", "fc", "deepset")
# search-space parameters that exist only under one choice of another: name -> (parent, value)
_CONDITIONAL = {"gin_mlp_layers": ("conv_type", "gin"), "gat_heads": ("conv_type", "gat")}
_MIN_COVERAGE = 0.5
NEXT_TO_DEFAULTS = "next-to-defaults"  # report_path default: the defaults file's name with .md


# ----------------------------------------------------------------------------- the rule


def normalised_ranks(values: Sequence[Optional[float]], maximize: bool = True) -> List[float]:
    """``q`` in [0, 1] per trial (1 = best); ``None`` marks a pruned trial, tied below
    every complete one. Ties share their average rank."""
    n = len(values)
    if n < 2:
        raise ValueError("normalised ranks need at least two trials")
    sign = 1.0 if maximize else -1.0
    keys = [-math.inf if v is None else sign * float(v) for v in values]
    order = sorted(range(n), key=lambda i: keys[i])
    ranks = [0.0] * n
    start = 0
    while start < n:
        end = start
        while end + 1 < n and keys[order[end + 1]] == keys[order[start]]:
            end += 1
        average = (start + end) / 2 + 1  # 1-based rank, 1 = worst
        for position in range(start, end + 1):
            ranks[order[position]] = average
        start = end + 1
    return [(r - 1) / (n - 1) for r in ranks]


def _log_grid(low: float, high: float) -> List[float]:
    grid = {low, high}
    for exponent in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1):
        for mantissa in (1, 3):
            value = float(f"{mantissa}e{exponent}")
            if low <= value <= high:
                grid.add(value)
    return sorted(grid)


def _level(value: Any, distribution: Any) -> Any:
    """The level a parameter value is compared at (see the module docstring)."""
    from optuna.distributions import FloatDistribution

    if isinstance(distribution, FloatDistribution):
        low, high = float(distribution.low), float(distribution.high)
        if distribution.log:
            return min(_log_grid(low, high), key=lambda g: abs(math.log10(g) - math.log10(float(value))))
        grid = [round(low + i * (high - low) / 5, 10) for i in range(6)]
        return min(grid, key=lambda g: abs(g - float(value)))
    return value


@dataclass
class _Trial:
    params: Dict[str, Any]  # levels
    q: float


@dataclass
class _Problem:
    study: str
    model: str
    task: str
    trials: List[_Trial]
    default_q: Optional[float]  # the enqueued recommended config's normalised rank


@dataclass
class RecommendedValue:
    """One chosen value with its evidence (what ``defaults.md`` shows)."""

    param: str
    value: Any
    score: float  # mean over problems of the mean normalised rank at this level
    coverage: int  # problems with a trial at this level
    problems: int  # problems the level was eligible in
    trials: int
    runner_up: Optional[Tuple[Any, float, int]] = None  # (value, score, coverage)
    levels: Dict[Any, Tuple[float, int, int]] = field(default_factory=dict)  # level -> (score, coverage, trials)


def _choose(param: str, problems: Sequence[_Problem], condition: Optional[Tuple[str, Any]],
            builtin: Any) -> Optional[RecommendedValue]:
    per_level: Dict[Any, List[float]] = {}
    trial_counts: Dict[Any, int] = {}
    eligible = 0
    for problem in problems:
        trials = [t for t in problem.trials if param in t.params
                  and (condition is None or t.params.get(condition[0]) == condition[1])]
        if not trials:
            continue
        eligible += 1
        by_level: Dict[Any, List[float]] = {}
        for trial in trials:
            by_level.setdefault(trial.params[param], []).append(trial.q)
        for level, qs in by_level.items():
            per_level.setdefault(level, []).append(sum(qs) / len(qs))
            trial_counts[level] = trial_counts.get(level, 0) + len(qs)
    if not per_level:
        return None
    levels = {level: (sum(means) / len(means), len(means), trial_counts[level]) for level, means in per_level.items()}
    needed = max(1, math.ceil(_MIN_COVERAGE * eligible))
    candidates = [level for level, (_, coverage, _) in levels.items() if coverage >= needed]

    def preference(level: Any) -> Tuple:
        score, coverage, count = levels[level]
        return (-score, -coverage, -count, level != builtin, _sort_key(level))

    ranked = sorted(candidates, key=preference)
    best = ranked[0]
    runner = ranked[1] if len(ranked) > 1 else None
    score, coverage, count = levels[best]
    return RecommendedValue(param=param, value=best, score=score, coverage=coverage, problems=eligible, trials=count,
                            runner_up=None if runner is None else (runner, levels[runner][0], levels[runner][1]),
                            levels=levels)


def _sort_key(level: Any) -> Tuple:
    return (0, float(level), "") if isinstance(level, (int, float)) and not isinstance(level, bool) else (1, 0.0,
                                                                                                       str(level))


def _recommend_group(family: str, bucket: str, problems: Sequence[_Problem]) -> Tuple[Dict[str, Any],
                                                                                      List[RecommendedValue]]:
    cls = config_class_for(family)
    builtin = {**{f: getattr(cls(), f) for f in cls.__dataclass_fields__},
               **BUILTIN_RECOMMENDED.get(family, {}).get(bucket, {})}
    names: List[str] = []
    for problem in problems:
        for trial in problem.trials:
            names += [p for p in trial.params if p not in names]
    unconditional = [p for p in names if p not in _CONDITIONAL]
    # parents first, so their children are decided under the chosen value
    order = sorted(unconditional, key=lambda p: (p not in {parent for parent, _ in _CONDITIONAL.values()}, p))
    values: Dict[str, Any] = {}
    evidence: List[RecommendedValue] = []
    for param in order:
        chosen = _choose(param, problems, None, builtin.get(param))
        if chosen is not None:
            values[param] = chosen.value
            evidence.append(chosen)
    for param in [p for p in names if p in _CONDITIONAL]:
        parent, active = _CONDITIONAL[param]
        if values.get(parent) != active:
            continue
        chosen = _choose(param, problems, (parent, active), builtin.get(param))
        if chosen is not None:
            values[param] = chosen.value
            evidence.append(chosen)
    unknown = set(values) - set(cls.__dataclass_fields__)
    if unknown:
        raise ValueError(f"{family} studies have parameters that are not {cls.__name__} fields: {sorted(unknown)}")
    cls(**values)  # a combination the config rejects is a bug in the rule, not something to write
    return values, evidence


# ----------------------------------------------------------------------------- reading studies


def _problems(storage_url: str, families: Sequence[str]) -> Tuple[Dict[Tuple[str, str], List[_Problem]], List[str]]:
    import optuna
    from optuna.trial import TrialState

    storage = open_report_storage(storage_url)
    groups: Dict[Tuple[str, str], List[_Problem]] = {}
    skipped: List[str] = []
    summaries = optuna.get_all_study_summaries(storage.rdb, include_best_trial=False)
    # a paper-protocol study searches exactly what its matched sibling searches: one problem, counted once
    matched = {_search_key(s.user_attrs) for s in summaries if protocol_of(s.user_attrs) == "matched"}
    for summary in summaries:
        attrs = summary.user_attrs
        name = summary.study_name
        family = attrs.get("encoder")
        if family not in families or not attrs.get("model"):
            continue
        if protocol_of(attrs) != "matched" and _search_key(attrs) in matched:
            skipped.append(f"{name}: the same search as its matched-protocol study, counted once")
            continue
        try:
            bucket = model_size_bucket(attrs["model"], attrs.get("hidden_size"))
        except ValueError as exc:
            skipped.append(f"{name}: {exc}")
            continue
        if len(study_objectives(attrs)) > 1:  # its sampler traded score for size: not a score-only search
            skipped.append(f"{name}: a multi-objective study ({'+'.join(study_objectives(attrs))}); defaults come "
                           "from studies of the score alone")
            continue
        study = optuna.load_study(study_name=name, storage=storage.rdb)
        maximize = study.direction != optuna.study.StudyDirection.MINIMIZE
        trials = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
                  if t.params and (t.state == TrialState.PRUNED or (t.value is not None and math.isfinite(t.value)))]
        if len(trials) < 2 or not any(t.state == TrialState.COMPLETE for t in trials):
            skipped.append(f"{name}: needs 2 complete or pruned trials, one of them complete; has {len(trials)}")
            continue
        qs = normalised_ranks([t.value if t.state == TrialState.COMPLETE else None for t in trials], maximize)
        scored = [_Trial({p: _level(v, t.distributions[p]) for p, v in t.params.items()}, q)
                  for t, q in zip(trials, qs, strict=True)]
        default_q = next((q for t, q in zip(trials, qs, strict=True) if t.user_attrs.get("recommended")), None)
        groups.setdefault((family, bucket), []).append(
            _Problem(study=name, model=str(attrs["model"]), task=str(attrs.get("task", "")), trials=scored,
                     default_q=default_q))
    return groups, skipped


def _search_key(attrs: Mapping[str, Any]) -> Tuple:
    """What a study searches: its identity without the protocol (trials are the same under both)."""
    return tuple(str(attrs.get(key)) for key in IDENTITY_KEYS if key not in PROTOCOL_KEYS)


# ----------------------------------------------------------------------------- outputs


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _markdown(data: Mapping[str, Any], evidence: Mapping[Tuple[str, str], List[RecommendedValue]],
              groups: Mapping[Tuple[str, str], List[_Problem]], families: Sequence[str]) -> str:
    meta = data["metadata"]
    doc = Document()
    doc.heading(1, "Defaults by model size")
    doc.paragraph(f"Generated {meta['generated']} by ilge-search {meta['ilge_search_version']} with "
                  f"`ilge-search recommend --storage {meta['source']}`. `recommended_config(family, model_size_hint)` "
                  "reads these values from `ilge_search/data/recommended_defaults.json`; a family or bucket without "
                  "studies keeps the built-in default (marked *built-in*).")
    rows = []
    for family in families:
        cells = [Cell(family)]
        for bucket in ("small", "large"):
            values = data["families"].get(family, {}).get(bucket)
            if values:
                cells.append(Cell(", ".join(f"{k}={_format(v)}" for k, v in values.items())))
            else:
                builtin = BUILTIN_RECOMMENDED.get(family, {}).get(bucket, {})
                cells.append(Cell("*built-in*: " + ", ".join(f"{k}={_format(v)}" for k, v in builtin.items())))
        rows.append(cells)
    doc.table(["family", "small (up to 3B parameters)", "large (above 3B)"], rows)
    doc.heading(2, "Rule")
    doc.paragraph(meta["rule"])
    doc.heading(2, "Evidence")
    for (family, bucket), chosen in sorted(evidence.items()):
        problems = groups[(family, bucket)]
        defaults = [p.default_q for p in problems if p.default_q is not None]
        doc.heading(3, f"{family}, {bucket}")
        doc.paragraph(f"{plural(len(problems), 'study', 'studies')} ({sum(len(p.trials) for p in problems)} complete "
                      "or pruned trials): " + ", ".join(f"`{p.study}`" for p in problems) + ".")
        if len(problems) < 3:
            doc.paragraph("Weak evidence: fewer than three studies; run more tasks before relying on these values.")
        if defaults:
            doc.paragraph(f"The previous default (each study's enqueued first trial) has mean normalised rank "
                          f"{sum(defaults) / len(defaults):.3f} over {plural(len(defaults), 'study', 'studies')} "
                          "(1 = best trial of every study, 0 = worst).")
        evidence_rows = []
        for item in chosen:
            runner = MISSING if item.runner_up is None else (
                f"{_format(item.runner_up[0])} ({item.runner_up[1]:.3f}, {item.runner_up[2]})")
            evidence_rows.append([Cell(item.param), Cell(_format(item.value)), Cell(f"{item.score:.3f}"),
                                  Cell(f"{item.coverage}/{item.problems}"), Cell(str(item.trials)), Cell(runner)])
        doc.table(["parameter", "value", "score", "studies with it", "trials", "runner-up (score, studies)"],
                  evidence_rows)
    if meta.get("skipped"):
        doc.paragraph("Studies not used:")
        doc.bullets(meta["skipped"])
    return doc.markdown()


_RULE = ("Per study, each complete trial's validation score becomes a normalised rank q in [0, 1] (1 = the study's "
         "best trial; pruned trials tie below every complete one). Per hyperparameter, values are compared on "
         "levels (categorical and integer values as they are; lr and weight_decay snapped to 1 or 3 x 10^k; "
         "dropout to steps of 0.1); a level's score is the mean over studies of the mean q of that study's trials "
         "at the level. Among levels tried in at least half the studies of the family and size bucket, the highest "
         "score wins (ties: more studies, more trials, the built-in value, the smaller level). gin_mlp_layers and "
         "gat_heads are chosen among trials with the chosen conv_type. Validation scores only.")


def defaults_targets(out_path: Optional[PathLike] = None, report_path: Optional[PathLike] = NEXT_TO_DEFAULTS, *,
                     update_shipped: bool = False) -> Tuple[Path, Optional[Path]]:
    """Where :func:`recommend_defaults` writes: (defaults file, Markdown page or ``None``).

    Raises:
        ValueError: ``update_shipped`` together with ``out_path``.
    """
    if update_shipped and out_path is not None:
        raise ValueError("give either out_path (--out) or update_shipped (--update-shipped), not both")
    if update_shipped:
        from ..tuning import RECOMMENDED_DEFAULTS_PATH  # looked up now: tests point it elsewhere

        target = RECOMMENDED_DEFAULTS_PATH
    else:
        target = user_defaults_path(out_path)
    if report_path == NEXT_TO_DEFAULTS:
        # the shipped file's page is reports/defaults.md in the repository, not inside the package
        return target, None if update_shipped else target.with_suffix(".md")
    return target, None if report_path is None else Path(report_path)


def recommend_defaults(storage_url: str, out_path: Optional[PathLike] = None,
                       report_path: Optional[PathLike] = NEXT_TO_DEFAULTS, *,
                       families: Sequence[str] = DEFAULT_FAMILIES, update_shipped: bool = False) -> Dict[str, Any]:
    """Derive recommended defaults per family and model-size bucket from the studies in a storage.

    Args:
        storage_url: an Optuna RDB URL holding ilge-search studies.
        out_path: the defaults file to write (default: the user's file,
            :func:`ilge_search.settings.user_defaults_path`, which
            ``recommended_config`` reads over the shipped defaults).
        report_path: where to write the "Defaults by model size" Markdown page
            (default: next to the defaults file, same name with ``.md``; with
            ``update_shipped``, none unless given); ``None`` skips it.
        families: the encoder families to derive defaults for.
        update_shipped: rewrite the package's own
            ``ilge_search/data/recommended_defaults.json`` instead (maintainers only).

    Returns:
        The written defaults document (``format_version``, ``metadata``, ``families``).

    Raises:
        ValueError: unknown family, both ``out_path`` and ``update_shipped``, the
            storage cannot be opened, no study of ``families`` in it has at least
            two scored trials, or the file cannot be written.
    """
    target, report_target = defaults_targets(out_path, report_path, update_shipped=update_shipped)
    families = list(families)
    unknown = [f for f in families if f not in CONFIG_CLASSES]
    if unknown or not families:
        raise ValueError(f"unknown families {unknown}; choose from {sorted(CONFIG_CLASSES)}")
    groups, skipped = _problems(storage_url, families)
    if not groups:
        raise ValueError(f"no {'/'.join(families)} study with at least two scored trials in "
                         f"{hide_password(storage_url)}" + (f" ({'; '.join(skipped)})" if skipped else "")
                         + "; run studies first (`ilge-search sweep studies/offline.toml`)")
    result: Dict[str, Dict[str, Dict[str, Any]]] = {}
    evidence: Dict[Tuple[str, str], List[RecommendedValue]] = {}
    for (family, bucket), problems in sorted(groups.items()):
        values, chosen = _recommend_group(family, bucket, problems)
        result.setdefault(family, {})[bucket] = values
        evidence[(family, bucket)] = chosen
    data = {
        "format_version": DEFAULTS_FORMAT_VERSION,
        "metadata": {
            "generated": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "source": hide_password(storage_url),
            "ilge_search_version": __version__,
            "rule": _RULE,
            "size_buckets": "small: up to 3B parameters (models of 1B-3B included, as the study runner buckets "
                            "them); large: above 3B",
            "studies": {f"{family}/{bucket}": [p.study for p in problems]
                        for (family, bucket), problems in sorted(groups.items())},
            "skipped": skipped,
        },
        "families": result,
    }
    try:
        write_atomic(target, json.dumps(data, indent=2) + "\n")
        load_recommended_defaults(target)  # what was written must read back
        if report_target is not None:
            write_atomic(report_target, _markdown(data, evidence, groups, families))
    except OSError as exc:  # e.g. a read-only installed package, a full disk
        raise ValueError(f"cannot write {exc.filename or target}: {exc.strerror or exc}; pass another --out "
                         "(out_path)") from exc
    return data
