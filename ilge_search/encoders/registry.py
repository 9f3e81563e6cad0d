"""The encoder registry: one :class:`EncoderSpec` per family, and the lookups every layer above reads.

A family is a config class (``configs``), a module builder, a search space, a built-in starting
config, a report label, its role, the task kinds it serves and whether its models train several in
one pass. :func:`register_encoder` adds one; reading a stored config (:func:`config_from_dict`),
``build_aggregator``, ``suggest_config``, ``recommended_config``, the report's method lists and the
CLI's encoder choices all look families up here, each time they are asked, so a family defined outside
the package runs through a study, its final evaluation, ensembles, export, predict and the report unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ..validation import check_choice
from .configs import EncoderConfig, FieldValues

if TYPE_CHECKING:  # the registry loads without torch: the CLI's help and tuning's names read it
    from optuna.distributions import CategoricalChoiceType

    from ..nn import LayerEncoder

__all__ = [
    "EncoderSpec",
    "Picker",
    "Suggests",
    "register_encoder",
    "unregister_encoder",
    "encoder_spec",
    "encoder_specs",
    "encoder_families",
    "baseline_families",
    "tagger_families",
    "all_families",
    "config_classes",
    "config_class_for",
    "config_from_dict",
    "report_methods",
    "report_labels",
    "builtin_start",
    "FAMILY_ROLES",
    "TASK_KINDS",
    "LATE_RANK",
]

FAMILY_ROLES = ("ilge", "baseline")  # an ILGE encoder searched over layers, or a reference baseline
TASK_KINDS = ("sentence", "token")  # one vector per text (or pair), or one per word of a tagging task
LATE_RANK = 100  # a family registered without a report rank shows after the built-in ones

# (config of the family, num_layers, hidden_in) -> module; each builder takes its own family's config class
ModuleBuilder = Callable[..., "LayerEncoder"]


class Suggests(Protocol):
    """What a search space asks of a trial: an Optuna ``Trial``, ``FrozenTrial`` or ``FixedTrial``, or a
    stand-in answering with stored values."""

    def suggest_categorical(self, name: str, choices: Sequence[CategoricalChoiceType]) -> CategoricalChoiceType: ...

    def suggest_int(self, name: str, low: int, high: int) -> int: ...

    def suggest_float(self, name: str, low: float, high: float, *, log: bool = False) -> float: ...


class Picker:
    """The values of one sampled config: a fixed value wins over the trial's suggestion.

    A search space calls ``categorical``/``integer``/``real`` in a fixed order; each returns the
    value (fixed or suggested), so conditional parameters can follow earlier ones.
    """

    def __init__(self, trial: Suggests, fixed: Mapping[str, object]) -> None:
        self.trial = trial  # a FrozenTrial answers with its stored values
        self.values: FieldValues = dict(fixed)

    def categorical(self, name: str, choices: Sequence[CategoricalChoiceType]) -> CategoricalChoiceType:
        if name not in self.values:
            self.values[name] = self.trial.suggest_categorical(name, choices)
        return self.values[name]

    def integer(self, name: str, low: int, high: int) -> int:
        if name not in self.values:
            self.values[name] = self.trial.suggest_int(name, low, high)
        return self.values[name]

    def real(self, name: str, low: float, high: float, *, log: bool = False) -> float:
        if name not in self.values:
            self.values[name] = self.trial.suggest_float(name, low, high, log=log)
        return self.values[name]


def _no_search(pick: Picker) -> None:
    """Only the training fields every family searches (``suggest_config`` adds them)."""


@dataclass(frozen=True)
class EncoderSpec:
    """Everything the library needs to know of one encoder family.

    Attributes:
        name: the family name (``config_class.family``), as ``--encoder`` takes it.
        config_class: its :class:`~ilge_search.encoders.configs.EncoderConfig` dataclass.
        build: ``(config, num_layers, hidden_in) -> module`` mapping ``(N, L, D)`` to ``(N, out_dim)``;
            the module has ``num_layers``, ``hidden_in``, ``out_dim`` and ``reset_parameters()``
            (:class:`~ilge_search.nn.LayerEncoder`).
        search: samples the family's own fields through a :class:`Picker`; ``lr`` and
            ``weight_decay`` are searched for every family after it.
        start: the built-in starting config, ``{"small"|"large": {field: value}}`` over the class defaults.
        label: the report's name for it.
        role: ``"ilge"`` or ``"baseline"``.
        kinds: the task kinds it serves (``"sentence"``, ``"token"``).
        report_rank: its column in the report's tables, left to right.
        token_label: the tagging report's name, when it differs from ``label``.
        batched: whether models of it may train several in one vmapped pass
            (:func:`ilge_search.engine.train_many`): its module draws random numbers only in dropout,
            which a pass replays.
    """

    name: str
    config_class: type[EncoderConfig]
    build: ModuleBuilder
    search: Callable[[Picker], None] = _no_search
    start: Mapping[str, FieldValues] = field(default_factory=dict)
    label: str = ""
    role: str = "ilge"
    kinds: tuple[str, ...] = TASK_KINDS
    report_rank: int = LATE_RANK
    token_label: str | None = None
    batched: bool = False

    def __post_init__(self) -> None:
        if not self.name or self.config_class.family != self.name:
            raise ValueError(
                f"spec {self.name!r} names config class {self.config_class.__name__} of family "
                f"{self.config_class.family!r}; the two must agree"
            )
        check_choice("role", self.role, FAMILY_ROLES)
        if not self.kinds or set(self.kinds) - set(TASK_KINDS):
            raise ValueError(f"kinds must be a non-empty subset of {list(TASK_KINDS)}, got {self.kinds!r}")

    @property
    def report_label(self) -> str:
        return self.label or self.name


# every family, in registration order: the built-ins (builtin.py), then those registered later
_SPECS: dict[str, EncoderSpec] = {}


def register_encoder(spec: EncoderSpec) -> EncoderSpec:
    """Register ``spec`` (the same spec again is a no-op); returns it, so it can decorate a module-level name."""
    known = _SPECS.get(spec.name)
    if known is not None and known != spec:
        raise ValueError(f"encoder family {spec.name!r} is already registered")
    _SPECS[spec.name] = spec
    return spec


def unregister_encoder(name: str) -> None:
    """Remove a family registered with :func:`register_encoder` (a test's toy family, say)."""
    _SPECS.pop(name, None)


def encoder_spec(name: str) -> EncoderSpec:
    try:
        return _SPECS[name]
    except KeyError:
        raise ValueError(f"no encoder is registered for family {name!r}; known: {list(_SPECS)}") from None


def encoder_specs() -> tuple[EncoderSpec, ...]:
    """Every registered spec, in registration order."""
    return tuple(_SPECS.values())


def _names(keep: Callable[[EncoderSpec], bool]) -> tuple[str, ...]:
    return tuple(spec.name for spec in _SPECS.values() if keep(spec))


def encoder_families() -> tuple[str, ...]:
    """The ILGE families of sentence tasks, in registration order."""
    return _names(lambda spec: spec.role == "ilge" and "sentence" in spec.kinds)


def baseline_families() -> tuple[str, ...]:
    return _names(lambda spec: spec.role == "baseline")


def tagger_families() -> tuple[str, ...]:
    """The families of tagging studies only."""
    return _names(lambda spec: "sentence" not in spec.kinds)


def all_families() -> tuple[str, ...]:
    """Every family, the ILGE encoders first, then the baselines and the tagging-only families."""
    return encoder_families() + baseline_families() + tagger_families()


def config_classes() -> dict[str, type[EncoderConfig]]:
    """``{family: config class}`` of every registered family."""
    return {name: spec.config_class for name, spec in _SPECS.items()}


def config_class_for(family: str) -> type[EncoderConfig]:
    try:
        return _SPECS[family].config_class
    except KeyError:
        raise ValueError(f"unknown family {family!r}; expected one of {sorted(_SPECS)}") from None


def config_from_dict(data: Mapping[str, object]) -> EncoderConfig:
    """Rebuild a config from :meth:`EncoderConfig.to_dict` output."""
    fields: FieldValues = dict(data)
    family = fields.pop("family", None)
    if family is None:
        raise ValueError("config dictionary has no 'family' key; expected the output of to_dict()")
    cls = config_class_for(str(family))
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(fields) - known
    if unknown:
        raise ValueError(f"unknown fields for {cls.__name__}: {sorted(unknown)}; allowed: {sorted(known)}")
    return cls(**fields)


def report_methods(kind: str) -> tuple[str, ...]:
    """The families serving ``kind`` in report order."""
    specs = sorted((spec for spec in _SPECS.values() if kind in spec.kinds), key=lambda spec: spec.report_rank)
    return tuple(spec.name for spec in specs)


def report_labels(kind: str) -> dict[str, str]:
    """``{family: label}`` for the report's tables of ``kind`` (``"token"``: the tagging report's names)."""
    token = kind == "token"
    return {name: (token and _SPECS[name].token_label) or _SPECS[name].report_label for name in report_methods(kind)}


def builtin_start(family: str, bucket: str) -> FieldValues:
    """The registered starting config of ``family`` for a model-size ``bucket`` (empty if it has none)."""
    spec = _SPECS.get(family)
    return dict(spec.start.get(bucket, {})) if spec is not None else {}
