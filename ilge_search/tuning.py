"""Hyperparameters: the paper's Optuna search space and zero-search defaults.

:func:`suggest_config` samples a config inside an objective, or rebuilds it
from a finished trial (``study.best_trial``): a :class:`optuna.trial.FrozenTrial`
answers the same ``suggest_*`` calls with its stored values. Parameter names
are the config's field names, so ``study.trials_dataframe()`` columns read
``params_hidden_dim``, ``params_conv_type`` ...

Search space (graph families ``cayley``/``fc``)::

    conv_type       {gin, gcn, gat}
    hidden_dim      {128, 256, 512}
    gnn_layers      1..3
    gin_mlp_layers  1..2            only when conv_type == "gin"
    gat_heads       {2, 4, 8}       only when conv_type == "gat" (all divide every hidden_dim)
    pooling         {mean, sum}
    dropout         [0, 0.5]
    lr              log [1e-5, 1e-2]
    weight_decay    log [1e-6, 1e-2]

``deepset`` replaces the GNN fields with ``hidden_dim``, ``pre_pooling_layers``
0..2 and ``post_pooling_layers`` 0..2; the layer baselines search ``lr`` and
``weight_decay`` only (``mlp-last`` also ``hidden_dim``).

Recommended defaults files
--------------------------
:func:`recommended_config` returns the published package's values by default
(``source="published"``), as code written for ``ilge`` 0.1.0 expects. With
``source="regenerated"`` (what a new study starts from) it merges three layers,
each over the one before:
the built-in defaults of the published package (:func:`~ilge_search.encoders.builtin_start`),
the shipped ``ilge_search/data/recommended_defaults.json`` (regenerated from the
committed study results with ``ilge-search recommend --update-shipped``), and
the user's file (``defaults_path=``, else ``$ILGE_SEARCH_DEFAULTS``, else
``~/.config/ilge-search/recommended_defaults.json``; see
:func:`ilge_search.settings.user_defaults_path`), which ``ilge-search
recommend`` writes by default. A family or bucket missing from a file keeps
the layer below. Schema of both files::

    {
      "format_version": 1,
      "metadata": {"generated": "...", "source": "...", ...},   # free-form provenance
      "families": {
        "<family>": {                      # a registered family (encoders.config_classes())
          "small": {"<field>": value, ...},  # models up to 3B parameters
          "large": {"<field>": value, ...}   # models above 3B parameters
        }
      }
    }

Values override the config class defaults; fields must exist on that
family's config. Families or buckets missing from the file fall back to the
built-in values. The bucket of a model is
:func:`ilge_search.embeddings.models.model_size_bucket` (one threshold,
:data:`ilge_search.embeddings.models.LARGE_MODEL_PARAMS`).

Samplers and pruners
--------------------
:func:`make_sampler` (``tpe``, ``random``, ``gp``) and :func:`make_pruner`
(``median``, ``hyperband``, ``none``) build the Optuna objects a study
searches with; :data:`SAMPLERS` and :data:`PRUNERS` are the names every
caller (``run_study``, sweeps, the CLI) accepts.
"""

from __future__ import annotations

import importlib.util
import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import optuna

from .encoders import Picker, all_families, builtin_start, config_class_for, config_classes, encoder_spec, encoder_specs
from .encoders.configs import EncoderConfig, FieldValues
from .encoders.registry import Suggests
from .settings import user_defaults_path
from .validation import check_choice

if TYPE_CHECKING:
    import optuna

__all__ = [
    "suggest_config",
    "recommended_config",
    "load_recommended_defaults",
    "effective_recommended_defaults",
    "RECOMMENDED_DEFAULTS_PATH",
    "user_defaults_in_use",
    "MODEL_SIZE_HINTS",
    "DEFAULTS_SOURCES",
    "SAMPLERS",
    "PRUNERS",
    "make_sampler",
    "make_pruner",
]

RECOMMENDED_DEFAULTS_PATH = Path(__file__).resolve().parent / "data" / "recommended_defaults.json"
DEFAULTS_FORMAT_VERSION = 1
MODEL_SIZE_HINTS = ("small", "large")
# where recommended_config reads its values: the published package's, or regenerated files over them
DEFAULTS_SOURCES = ("published", "regenerated")


def _check_family(family: str) -> None:
    if family not in config_classes():
        known = list(all_families())
        raise ValueError(f"unknown family {family!r}; expected one of {known}")


def _suggest_fields(trial: Suggests, family: str, fixed: Mapping[str, object]) -> FieldValues:
    pick = Picker(trial, fixed)
    encoder_spec(family).search(pick)  # the family's own fields first, then the training fields every family has
    pick.real("lr", 1e-5, 1e-2, log=True)
    pick.real("weight_decay", 1e-6, 1e-2, log=True)
    return pick.values


def suggest_config(trial: Suggests, family: str, **fixed: object) -> EncoderConfig:
    """Sample (or, from a finished trial, rebuild) a config of ``family`` over the paper's space.

    Args:
        trial: an :class:`optuna.trial.Trial` inside an objective, or a
            :class:`optuna.trial.FrozenTrial` such as ``study.best_trial``.
        family: ``"cayley"``, ``"fc"``, ``"deepset"`` or a layer baseline
            (``"last-layer"``, ``"best-layer"``, ``"mean-layers"``, ``"scalar-mix"``, ``"mlp-last"``).
        **fixed: config fields to hold fixed instead of searching (e.g.
            ``conv_type="gin"``, ``epochs=20``); conditional parameters follow them.

    Returns:
        The config; fields outside the search space keep their class defaults.
    """

    _check_family(family)
    cls = config_class_for(family)
    known = set(cls.__dataclass_fields__)
    unknown = set(fixed) - known
    if unknown:
        raise ValueError(f"unknown fields for {cls.__name__}: {sorted(unknown)}; allowed: {sorted(known)}")
    try:
        values = _suggest_fields(trial, family, fixed)
    except ValueError as exc:
        if isinstance(trial, optuna.trial.FrozenTrial):
            raise ValueError(
                f"trial {trial.number} cannot be read as a {family!r} config ({exc}); "
                f"its parameters are {sorted(trial.params)}"
            ) from None
        raise
    return cls(**values)


def _builtin_copy() -> dict[str, dict[str, FieldValues]]:
    return {spec.name: {bucket: dict(fields) for bucket, fields in spec.start.items()} for spec in encoder_specs()}


def _merge_defaults_file(merged: dict[str, dict[str, FieldValues]], path: Path) -> None:
    """Validate the defaults file ``path`` and merge its values into ``merged`` (in place)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read recommended defaults {path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("families"), dict):
        raise ValueError(
            f"{path} must be a JSON object with a 'families' mapping "
            "({family: {bucket: {field: value}}}); see ilge_search.tuning"
        )
    version = data.get("format_version")
    if version != DEFAULTS_FORMAT_VERSION:
        raise ValueError(f"{path} has format_version {version!r}; this version reads {DEFAULTS_FORMAT_VERSION}")
    for family, buckets in data["families"].items():
        if family not in config_classes():
            raise ValueError(f"{path}: unknown family {family!r}; expected one of {sorted(config_classes())}")
        if not isinstance(buckets, dict):
            raise ValueError(f"{path}: families.{family} must map size buckets to field values")
        fields = set(config_class_for(family).__dataclass_fields__)
        for bucket, values in buckets.items():
            if bucket not in MODEL_SIZE_HINTS or not isinstance(values, dict):
                raise ValueError(
                    f"{path}: families.{family}.{bucket}: buckets are {list(MODEL_SIZE_HINTS)}, "
                    "each a {field: value} object"
                )
            bad = set(values) - fields
            if bad:
                raise ValueError(f"{path}: families.{family}.{bucket} has unknown fields {sorted(bad)}")
            merged.setdefault(family, {}).setdefault(bucket, {}).update(values)
            try:  # the config class's own checks, so that a bad value names this file, not a later run
                config_class_for(family)(**merged[family][bucket])
            except (ValueError, TypeError) as exc:
                raise ValueError(
                    f"{path}: families.{family}.{bucket}: {exc}; fix that value or delete the file"
                ) from None


def load_recommended_defaults(path: str | Path | None = None) -> dict[str, dict[str, FieldValues]]:
    """``{family: {bucket: {field: value}}}`` from one defaults file merged over the built-in values.

    ``path`` defaults to the shipped file (:data:`RECOMMENDED_DEFAULTS_PATH`). A
    missing file means the built-in values; an unreadable or malformed file
    raises :class:`ValueError` naming it. What :func:`recommended_config` uses
    (the user's file too) is :func:`effective_recommended_defaults`.
    """
    merged = _builtin_copy()
    path = Path(path) if path is not None else RECOMMENDED_DEFAULTS_PATH
    if path.is_file():
        _merge_defaults_file(merged, path)
    return merged


def effective_recommended_defaults(
    defaults_path: str | Path | None = None,
) -> dict[str, dict[str, FieldValues]]:
    """The values :func:`recommended_config` uses: built-in < shipped file < user file.

    The user file is ``defaults_path`` (it must exist), else
    ``$ILGE_SEARCH_DEFAULTS`` or ``~/.config/ilge-search/recommended_defaults.json``
    when they exist (:func:`ilge_search.settings.user_defaults_path`).
    """
    merged = load_recommended_defaults()
    user = user_defaults_path(defaults_path)
    if user.is_file():
        _merge_defaults_file(merged, user)
    elif defaults_path is not None:
        raise ValueError(
            f"recommended defaults file {user} does not exist; write it with `ilge-search recommend "
            "--out` or pass another defaults_path"
        )
    return merged


def user_defaults_in_use(defaults_path: str | Path | None = None) -> Path | None:
    """The user defaults file :func:`recommended_config` reads over the shipped one, when there is one."""
    user = user_defaults_path(defaults_path)
    return user if user.is_file() else None


def recommended_config(
    family: str,
    model_size_hint: str = "small",
    *,
    source: str = "published",
    defaults_path: str | Path | None = None,
) -> EncoderConfig:
    """Zero-search defaults for ``family``.

    Args:
        family: any family name (``"cayley"``, ``"fc"``, ``"deepset"`` or a baseline).
        model_size_hint: ``"small"`` for models up to 3B parameters (lr 1e-3),
            ``"large"`` for larger ones (lr 1e-4); see
            :func:`ilge_search.embeddings.models.model_size_bucket`.
        source: ``"published"`` (the default): the published ``ilge`` 0.1.0 package's values
            (:func:`~ilge_search.encoders.builtin_start`), what code written for that package expects;
            ``"regenerated"``: those values with the shipped defaults file and the user's file
            read over them (:func:`effective_recommended_defaults`), the start of new studies.
        defaults_path: with ``source="regenerated"``, a user defaults file (as ``ilge-search
            recommend`` writes) read over the shipped one; default ``$ILGE_SEARCH_DEFAULTS``, else
            ``~/.config/ilge-search/recommended_defaults.json`` when it exists.
    """
    _check_family(family)
    if model_size_hint not in MODEL_SIZE_HINTS:
        raise ValueError(f"model_size_hint must be one of {list(MODEL_SIZE_HINTS)}, got {model_size_hint!r}")
    check_choice("source", source, DEFAULTS_SOURCES)
    if source == "published":
        if defaults_path is not None:
            raise ValueError("defaults_path is read only with source='regenerated'")
        values = builtin_start(family, model_size_hint)
    else:
        values = effective_recommended_defaults(defaults_path).get(family, {}).get(model_size_hint, {})
    return config_class_for(family)(**values)


# ----------------------------------------------------------------------------- samplers and pruners

SAMPLERS = ("tpe", "random", "gp")
PRUNERS = ("median", "hyperband", "none")


def make_sampler(name: str, seed: int | None = None, *, conditional: bool = False) -> optuna.samplers.BaseSampler:
    """``tpe`` (TPESampler), ``random`` or ``gp`` (GPSampler, needs scipy), seeded.

    ``conditional``: the space's parameters depend on an earlier choice (an auto study's method); TPE then
    models them jointly, group by group of parameters sampled together (``multivariate=True, group=True``),
    rather than each alone over every trial.
    """
    check_choice("sampler", name, SAMPLERS)

    with warnings.catch_warnings():  # GPSampler is experimental in some Optuna releases
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.simplefilter("ignore", FutureWarning)
        if name == "tpe":
            if conditional:
                return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True)
            return optuna.samplers.TPESampler(seed=seed)
        if name == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if importlib.util.find_spec("scipy") is None:  # GPSampler's acquisition optimiser
            raise ValueError("the gp sampler needs scipy: pip install scipy")
        return optuna.samplers.GPSampler(seed=seed)


def make_pruner(name: str, max_epochs: int | None = None) -> optuna.pruners.BasePruner:
    """``median`` (the paper's MedianPruner: 5 startup trials, 10 warm-up epochs,
    fewer when ``max_epochs`` is small), ``hyperband`` (resource = epochs) or ``none``.

    A cross-validated trial reports fold ``f``'s epoch ``e`` at step
    ``f * epochs + e`` (:func:`ilge_search.study.folds.cross_validate`): the
    warm-up then covers the first fold's first epochs, and each later step is
    compared only with the other trials' values on the same fold and epoch.
    """
    check_choice("pruner", name, PRUNERS)

    if name == "median":
        warmup = 10 if max_epochs is None else min(10, max(1, max_epochs // 2))
        return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=warmup)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=max_epochs or "auto", reduction_factor=3)
    return optuna.pruners.NopPruner()
