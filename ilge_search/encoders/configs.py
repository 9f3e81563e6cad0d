"""Configuration dataclasses for every encoder family and layer baseline.

Each config carries two kinds of fields: the architecture of the aggregator
(``hidden_dim``, ``conv_type``...) and the training recipe used by the single
training engine (``lr``, ``weight_decay``, ``batch_size``, ``epochs``).
Invalid values raise :class:`ValueError` naming the field and what is allowed.

Configs are registered by ``family`` name, so a stored dictionary (an Optuna
trial, a saved classifier) rebuilds the exact config with :func:`config_from_dict`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, overload

from ..validation import check_int

__all__ = [
    "EncoderConfig",
    "CayleyConfig",
    "CayleyWordConfig",
    "FCConfig",
    "DeepSetConfig",
    "LastLayerConfig",
    "BestLayerConfig",
    "MeanLayersConfig",
    "ScalarMixConfig",
    "MLPLastConfig",
    "CONFIG_CLASSES",
    "ENCODER_FAMILIES",
    "BASELINE_FAMILIES",
    "TAGGER_FAMILIES",
    "ALL_FAMILIES",
    "FAMILY_INDEX",
    "FamilyEntry",
    "FamilyNames",
    "index_family",
    "unindex_family",
    "config_from_dict",
    "config_class_for",
    "FieldValues",
]

# a config's fields by name, JSON-serialisable: what to_dict gives, a search samples, a start or a defaults file
# holds
FieldValues = dict[str, Any]

CONV_TYPES = ("gin", "gcn", "gat")
POOLINGS = ("mean", "sum")


def _check_choice(name: str, value: object, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")


@dataclass
class EncoderConfig:
    """Fields shared by every family: the training recipe of the engine."""

    family: ClassVar[str] = ""

    dropout: float = 0.1
    lr: float = 1e-3
    weight_decay: float = 1e-4
    batch_size: int = 64
    epochs: int = 50

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if not isinstance(self.dropout, (int, float)) or not 0.0 <= float(self.dropout) < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        for name in ("lr", "weight_decay"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ValueError(f"{name} must be a number, got {value!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        check_int("batch_size", self.batch_size)
        check_int("epochs", self.epochs)

    def to_dict(self) -> FieldValues:
        """All fields plus ``family``; round-trips through :func:`config_from_dict`."""
        out: FieldValues = {"family": self.family}
        out.update(dataclasses.asdict(self))
        return out

    def replace(self, **changes: Any) -> EncoderConfig:
        return dataclasses.replace(self, **changes)


@dataclass
class _GraphConfig(EncoderConfig):
    conv_type: str = "gin"
    hidden_dim: int = 256
    gnn_layers: int = 1
    gin_mlp_layers: int = 1
    gat_heads: int = 4
    pooling: str = "mean"

    def validate(self) -> None:
        super().validate()
        _check_choice("conv_type", self.conv_type, CONV_TYPES)
        _check_choice("pooling", self.pooling, POOLINGS)
        check_int("hidden_dim", self.hidden_dim)
        check_int("gnn_layers", self.gnn_layers)
        check_int("gin_mlp_layers", self.gin_mlp_layers)
        check_int("gat_heads", self.gat_heads)
        if self.conv_type == "gat" and self.hidden_dim % self.gat_heads != 0:
            raise ValueError(
                f"hidden_dim ({self.hidden_dim}) must be divisible by gat_heads ({self.gat_heads}) when conv_type='gat'"
            )


@dataclass
class CayleyConfig(_GraphConfig):
    """GNN over the Cayley graph of SL(2, Z_n) (sparse 4-regular expander)."""

    family: ClassVar[str] = "cayley"


@dataclass
class CayleyWordConfig(CayleyConfig):
    """Tagging only: the Cayley GNN over each word's own layer stack (one graph per word, no messages
    between words), where ``cayley`` builds one graph over every (word, layer) node of a sentence."""

    family: ClassVar[str] = "cayley-word"


@dataclass
class FCConfig(_GraphConfig):
    """GNN over the fully connected graph of the layers."""

    family: ClassVar[str] = "fc"


@dataclass
class DeepSetConfig(EncoderConfig):
    """Per-layer MLP, pooling over layers, then an MLP (no layer interaction)."""

    family: ClassVar[str] = "deepset"

    hidden_dim: int = 256
    pre_pooling_layers: int = 1
    post_pooling_layers: int = 1
    pooling: str = "mean"

    def validate(self) -> None:
        super().validate()
        check_int("hidden_dim", self.hidden_dim)
        check_int("pre_pooling_layers", self.pre_pooling_layers, minimum=0)
        check_int("post_pooling_layers", self.post_pooling_layers, minimum=0)
        _check_choice("pooling", self.pooling, POOLINGS)


@dataclass
class _ProbeConfig(EncoderConfig):
    """A linear-probe baseline: no dropout by default."""

    dropout: float = 0.0


@dataclass
class LastLayerConfig(_ProbeConfig):
    """Baseline: linear probe on the last layer (the aggregator returns layer L-1)."""

    family: ClassVar[str] = "last-layer"


@dataclass
class BestLayerConfig(_ProbeConfig):
    """Baseline: linear probe on one layer.

    ``layer=None`` means "choose it": the study runner trains one probe per
    layer and keeps the one with the best *validation* score.
    """

    family: ClassVar[str] = "best-layer"
    layer: int | None = None

    def validate(self) -> None:
        super().validate()
        if self.layer is not None and (isinstance(self.layer, bool) or not isinstance(self.layer, int)):
            raise ValueError(f"layer must be an integer index or None, got {self.layer!r}")


@dataclass
class MeanLayersConfig(_ProbeConfig):
    """Baseline: linear probe on the unweighted mean of all layers."""

    family: ClassVar[str] = "mean-layers"


@dataclass
class ScalarMixConfig(_ProbeConfig):
    """Baseline: ELMo scalar mix, gamma * sum_l softmax(w)_l * h_l, then a linear probe."""

    family: ClassVar[str] = "scalar-mix"


@dataclass
class MLPLastConfig(EncoderConfig):
    """Baseline: an MLP on the last layer."""

    family: ClassVar[str] = "mlp-last"
    hidden_dim: int = 256
    mlp_layers: int = 1

    def validate(self) -> None:
        super().validate()
        check_int("hidden_dim", self.hidden_dim)
        check_int("mlp_layers", self.mlp_layers)


FAMILY_ROLES = ("ilge", "baseline")  # an ILGE encoder searched over layers, or a reference baseline
TASK_KINDS = ("sentence", "token")  # one vector per text (or pair), or one per word of a tagging task


@dataclass(frozen=True)
class FamilyEntry:
    """What the config layer knows of a family: its class, role and the task kinds it serves.

    The rest of a family (its module, search space, start, report label) is its
    :class:`~ilge_search.encoders.EncoderSpec`; this part sits here because reading a stored config
    (:func:`config_from_dict`, saved model folders) must not import torch.
    """

    config_class: type[EncoderConfig]
    role: str
    kinds: tuple[str, ...] = TASK_KINDS

    def __post_init__(self) -> None:
        _check_choice("role", self.role, FAMILY_ROLES)
        if not self.kinds or set(self.kinds) - set(TASK_KINDS):
            raise ValueError(f"kinds must be a non-empty subset of {list(TASK_KINDS)}, got {self.kinds!r}")


# Every family, in registration order: the built-ins here, others added by encoders.register_encoder.
FAMILY_INDEX: dict[str, FamilyEntry] = {
    entry.config_class.family: entry
    for entry in (
        FamilyEntry(CayleyConfig, "ilge", ("sentence", "token")),
        FamilyEntry(CayleyWordConfig, "ilge", ("token",)),
        FamilyEntry(FCConfig, "ilge"),
        FamilyEntry(DeepSetConfig, "ilge"),
        FamilyEntry(LastLayerConfig, "baseline"),
        FamilyEntry(BestLayerConfig, "baseline"),
        FamilyEntry(MeanLayersConfig, "baseline"),
        FamilyEntry(ScalarMixConfig, "baseline"),
        FamilyEntry(MLPLastConfig, "baseline"),
    )
}


def index_family(entry: FamilyEntry) -> None:
    """Add ``entry`` to :data:`FAMILY_INDEX`; the same entry again is a no-op, another class under its name an error."""
    name = entry.config_class.family
    if not name:
        raise ValueError(f"{entry.config_class.__name__} has no family name (a ClassVar[str] 'family')")
    known = FAMILY_INDEX.get(name)
    if known is not None and known != entry:
        raise ValueError(f"family {name!r} is already registered with {known.config_class.__name__}")
    FAMILY_INDEX[name] = entry


def unindex_family(name: str) -> None:
    FAMILY_INDEX.pop(name, None)


class FamilyNames(Sequence[str]):
    """A tuple of family names read afresh on every use, so a family registered later shows in it.

    Compares equal to the tuple it holds; ``+`` and slices give plain tuples.
    """

    def __init__(self, names: Callable[[], tuple[str, ...]]) -> None:
        self._names = names

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[str, ...]: ...

    def __getitem__(self, index: int | slice) -> str | tuple[str, ...]:
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())

    def __add__(self, other: Sequence[str]) -> tuple[str, ...]:
        return self._names() + tuple(other)

    def __radd__(self, other: Sequence[str]) -> tuple[str, ...]:
        return tuple(other) + self._names()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and self._names() == tuple(other)

    def __hash__(self) -> int:
        return hash(self._names())

    def __repr__(self) -> str:
        return repr(self._names())


def _names_where(keep: Callable[[FamilyEntry], bool]) -> FamilyNames:
    return FamilyNames(lambda: tuple(name for name, entry in FAMILY_INDEX.items() if keep(entry)))


class _ConfigClasses(Mapping[str, type[EncoderConfig]]):
    """``{family: config class}`` over :data:`FAMILY_INDEX`, live."""

    def __getitem__(self, family: str) -> type[EncoderConfig]:
        return FAMILY_INDEX[family].config_class

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(FAMILY_INDEX))

    def __len__(self) -> int:
        return len(FAMILY_INDEX)

    def __repr__(self) -> str:
        return repr(dict(self))


CONFIG_CLASSES: Mapping[str, type[EncoderConfig]] = _ConfigClasses()
ENCODER_FAMILIES = _names_where(lambda e: e.role == "ilge" and "sentence" in e.kinds)
BASELINE_FAMILIES = _names_where(lambda e: e.role == "baseline")
TAGGER_FAMILIES = _names_where(lambda e: "sentence" not in e.kinds)  # encoders of tagging studies only
ALL_FAMILIES = FamilyNames(lambda: ENCODER_FAMILIES + BASELINE_FAMILIES + TAGGER_FAMILIES)


def config_class_for(family: str) -> type[EncoderConfig]:
    try:
        return CONFIG_CLASSES[family]
    except KeyError:
        raise ValueError(f"unknown family {family!r}; expected one of {sorted(CONFIG_CLASSES)}") from None


def config_from_dict(data: Mapping[str, object]) -> EncoderConfig:
    """Rebuild a config from :meth:`EncoderConfig.to_dict` output."""
    fields: FieldValues = dict(data)
    family = fields.pop("family", None)
    if family is None:
        raise ValueError("config dictionary has no 'family' key; expected the output of to_dict()")
    cls = config_class_for(family)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(fields) - known
    if unknown:
        raise ValueError(f"unknown fields for {cls.__name__}: {sorted(unknown)}; allowed: {sorted(known)}")
    return cls(**fields)
