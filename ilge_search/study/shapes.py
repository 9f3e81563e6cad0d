"""What studies pass around besides records: layer features and the models training gives."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ..engine.core import ILGEModel
    from ..engine.tokens import TaggerModel

    TrainedModel = ILGEModel | TaggerModel  # what training a configuration gives, for sentences or for words

__all__ = ["Features", "TrainedModel"]

# layer features: (N, L, D) arrays, or a tagging set's words (a word entry, or (word features, sentence offsets))
Features = Any
