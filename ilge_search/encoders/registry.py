"""The encoder registry: one :class:`EncoderSpec` per family, and the lookups every layer above reads.

A family is a config class (``configs``), a module builder, a search space, a built-in starting
config, a report label and the task kinds it serves. :func:`register_encoder` adds one (it also
enters the config class in :data:`ilge_search.encoders.configs.FAMILY_INDEX`, so stored configs of it read
back); ``build_aggregator``, ``suggest_config``, ``recommended_config``, the report's method lists
and the CLI's encoder choices all look families up here, so a family defined outside the package
runs through a study, its final evaluation, ensembles, export, predict and the report unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from .configs import (
    FAMILY_INDEX,
    TASK_KINDS,
    EncoderConfig,
    FamilyEntry,
    FamilyNames,
    FieldValues,
    index_family,
    unindex_family,
)

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
    "report_methods",
    "report_labels",
    "BUILTIN_STARTS",
    "LATE_RANK",
]

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

    def __post_init__(self) -> None:
        if self.config_class.family != self.name:
            raise ValueError(
                f"spec {self.name!r} names config class {self.config_class.__name__} of family "
                f"{self.config_class.family!r}; the two must agree"
            )
        self.entry()  # role and kinds checked once, by the config layer

    def entry(self) -> FamilyEntry:
        return FamilyEntry(self.config_class, self.role, tuple(self.kinds))

    @property
    def report_label(self) -> str:
        return self.label or self.name


_SPECS: dict[str, EncoderSpec] = {}


def register_encoder(spec: EncoderSpec) -> EncoderSpec:
    """Register ``spec`` (the same spec again is a no-op); returns it, so it can decorate a module-level name."""
    known = _SPECS.get(spec.name)
    if known is not None and known != spec:
        raise ValueError(f"encoder family {spec.name!r} is already registered")
    index_family(spec.entry())
    _SPECS[spec.name] = spec
    return spec


def unregister_encoder(name: str) -> None:
    """Remove a family registered with :func:`register_encoder` (a test's toy family, say)."""
    _SPECS.pop(name, None)
    unindex_family(name)


def encoder_spec(name: str) -> EncoderSpec:
    try:
        return _SPECS[name]
    except KeyError:
        raise ValueError(f"no encoder is registered for family {name!r}; known: {list(_SPECS)}") from None


def encoder_specs() -> tuple[EncoderSpec, ...]:
    """Every registered spec, in registration order."""
    return tuple(_SPECS[name] for name in FAMILY_INDEX if name in _SPECS)


def report_methods(kind: str) -> FamilyNames:
    """The families serving ``kind`` in report order (live: a family registered later shows)."""

    def names() -> tuple[str, ...]:
        specs = [spec for spec in encoder_specs() if kind in spec.kinds]
        return tuple(spec.name for spec in sorted(specs, key=lambda spec: spec.report_rank))

    return FamilyNames(names)


class _Labels(Mapping[str, str]):
    """``{family: report label}`` of the families serving one task kind, in report order, live."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.methods = report_methods(kind)

    def __getitem__(self, family: str) -> str:
        if family not in self.methods:
            raise KeyError(family)
        spec = _SPECS[family]
        return (spec.token_label if self.kind == "token" else None) or spec.report_label

    def __iter__(self) -> Iterator[str]:
        return iter(self.methods)

    def __len__(self) -> int:
        return len(self.methods)

    def __repr__(self) -> str:
        return repr(dict(self))


def report_labels(kind: str) -> Mapping[str, str]:
    """``{family: label}`` for the report's tables of ``kind`` (``"token"``: the tagging report's names)."""
    return _Labels(kind)


class _Starts(Mapping[str, Mapping[str, FieldValues]]):
    """``{family: {bucket: {field: value}}}`` of the registered specs' starts, live."""

    def __getitem__(self, family: str) -> Mapping[str, FieldValues]:
        return encoder_spec(family).start if family in _SPECS else _missing(family)

    def __iter__(self) -> Iterator[str]:
        return iter([spec.name for spec in encoder_specs()])

    def __len__(self) -> int:
        return len(_SPECS)


def _missing(family: str) -> Mapping[str, FieldValues]:
    raise KeyError(family)


BUILTIN_STARTS: Mapping[str, Mapping[str, FieldValues]] = _Starts()
