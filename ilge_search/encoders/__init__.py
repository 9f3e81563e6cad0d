"""Encoder families: the registry (:mod:`.registry`) and the built-in families (:mod:`.builtin`).

Adding a family is one :func:`register_encoder` call with an :class:`EncoderSpec`; see
ARCHITECTURE.md, "Adding an encoder family".
"""

from __future__ import annotations

from . import builtin as builtin
from .registry import (
    BUILTIN_STARTS,
    EncoderSpec,
    Picker,
    encoder_spec,
    encoder_specs,
    register_encoder,
    report_labels,
    report_methods,
    unregister_encoder,
)

__all__ = [
    "BUILTIN_STARTS",
    "EncoderSpec",
    "Picker",
    "encoder_spec",
    "encoder_specs",
    "register_encoder",
    "report_labels",
    "report_methods",
    "unregister_encoder",
]
