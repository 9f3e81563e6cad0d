"""Configuration dataclasses for every encoder family and layer baseline.

Each config carries two kinds of fields: the architecture of the aggregator
(``hidden_dim``, ``conv_type``...) and the training recipe used by the single
training engine (``lr``, ``weight_decay``, ``batch_size``, ``epochs``).
Invalid values raise :class:`ValueError` naming the field and what is allowed.

A config class names its ``family``; the family's registered spec (:mod:`.registry`) makes a
stored dictionary (an Optuna trial, a saved classifier) the exact config again
(:func:`~ilge_search.encoders.registry.config_from_dict`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from ..validation import check_choice, check_int

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
    "FieldValues",
]

# a config's fields by name, JSON-serialisable: what to_dict gives, a search samples, a start or a defaults file
# holds
FieldValues = dict[str, Any]

CONV_TYPES = ("gin", "gcn", "gat")
POOLINGS = ("mean", "sum")


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
        check_choice("conv_type", self.conv_type, CONV_TYPES)
        check_choice("pooling", self.pooling, POOLINGS)
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
        check_choice("pooling", self.pooling, POOLINGS)


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
