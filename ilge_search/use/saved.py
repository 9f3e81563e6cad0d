"""The JSON of a saved model folder (``ILGEClassifier.save``, ``ILGETagger.save``, ``ilge-search export``) checked
as a whole when read, before any weights or base model load and before any input is embedded.

Every refusal is one line naming the file and the field (an ensemble member by its 1-based position and
family). Files the folder holds beside the two it reads (a ``README.md`` model card, say) are not looked at.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ..encoders import config_from_dict
from ..encoders.configs import EncoderConfig

__all__ = ["check_saved_fields", "corrupt_file"]

_SIZES = ("num_layers", "hidden_size", "max_length")


def corrupt_file(meta_path: Path, what: str) -> ValueError:
    """The one form of a saved folder's refusal: the file, what is wrong, what to do."""
    return ValueError(f"{meta_path}: {what}; the file is corrupt: export or save the model again")


def _config(value: object, meta_path: Path, field: str) -> EncoderConfig:
    if not isinstance(value, Mapping):
        raise corrupt_file(meta_path, f"{field} must be a configuration object, got {value!r}")
    try:
        return config_from_dict(dict(value))
    except (ValueError, TypeError) as exc:
        raise corrupt_file(meta_path, f"{field}: {exc}") from None


def _count(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _check_ensemble(members: object, meta_path: Path) -> None:
    if not isinstance(members, list) or not members:
        raise corrupt_file(meta_path, "ensemble must be a non-empty list of members")
    for position, member in enumerate(members, start=1):
        config = member.get("config") if isinstance(member, Mapping) else None
        family = config.get("family") if isinstance(config, Mapping) else None
        label = f"ensemble member {position}" + (f" ({family})" if family else "")
        if not isinstance(member, Mapping):
            raise corrupt_file(meta_path, f"{label} must be an object with its config and count")
        _config(config, meta_path, label + " config")
        if not _count(member.get("count")):
            raise corrupt_file(meta_path, f"{label}: count must be a positive number, got {member.get('count')!r}")


def _check_classes(classes: object, meta_path: Path, at_least: int) -> None:
    if not isinstance(classes, list) or not all(isinstance(c, (str, int, float, bool)) for c in classes):
        raise corrupt_file(meta_path, f"classes must be a list of labels, got {classes!r}")
    repeated = sorted({str(c) for c in classes if classes.count(c) > 1})
    if repeated:
        raise corrupt_file(meta_path, f"classes lists {', '.join(repeated)} more than once")
    if len(classes) < at_least:
        raise corrupt_file(meta_path, f"classes lists {len(classes)} label(s) and the model needs at least {at_least}")


def check_saved_fields(meta: Mapping[str, object], meta_path: Path, *, classes_needed: int) -> EncoderConfig:
    """Check every field a load reads (config, sizes, classes, an ensemble's members and counts); the config.

    Raises:
        ValueError: one line naming ``meta_path`` and the first bad field.
    """
    missing = [key for key in ("config", "classes", "base_model", *_SIZES, "random_state") if key not in meta]
    if missing:
        raise corrupt_file(meta_path, f"missing {', '.join(missing)}")
    config = _config(meta["config"], meta_path, "config")
    for key in _SIZES:
        value = meta[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise corrupt_file(meta_path, f"{key} must be a positive integer, got {value!r}")
    if not isinstance(meta["random_state"], int) or isinstance(meta["random_state"], bool):
        raise corrupt_file(meta_path, f"random_state must be an integer, got {meta['random_state']!r}")
    _check_classes(meta["classes"], meta_path, classes_needed)
    if meta.get("ensemble") is not None:
        _check_ensemble(meta["ensemble"], meta_path)
    return config
