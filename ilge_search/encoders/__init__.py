"""Encoder families: the registry (:mod:`.registry`) and the built-in families (:mod:`.builtin`).

Adding a family is one :func:`register_encoder` call with an :class:`EncoderSpec`; see
ARCHITECTURE.md, "Adding an encoder family".
"""

from __future__ import annotations

from . import builtin as builtin
from .registry import (
    EncoderSpec,
    Picker,
    all_families,
    baseline_families,
    builtin_start,
    config_class_for,
    config_classes,
    config_from_dict,
    encoder_families,
    encoder_spec,
    encoder_specs,
    register_encoder,
    report_labels,
    report_methods,
    tagger_families,
    unregister_encoder,
)

__all__ = [
    "EncoderSpec",
    "Picker",
    "all_families",
    "baseline_families",
    "builtin_start",
    "config_class_for",
    "config_classes",
    "config_from_dict",
    "encoder_families",
    "encoder_spec",
    "encoder_specs",
    "register_encoder",
    "report_labels",
    "report_methods",
    "tagger_families",
    "unregister_encoder",
]
