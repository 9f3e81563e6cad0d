"""The JSON of a saved model folder (``ILGEClassifier.save``, ``ILGETagger.save``, ``ilge-search export``) checked
as a whole when read, before any weights or base model load and before any input is embedded.

Every refusal is one line naming the file and the field (an ensemble member by its 1-based position and
family). Files the folder holds beside the two it reads (a ``README.md`` model card, say) are not looked at.

A save records a ``digest`` in its JSON: the sha256 of the weights file, of the classes in order and of an
ensemble's members with their counts. A load compares the folder with it, so weights swapped, labels
reordered or counts edited after the save are refused instead of silently relabelling or reweighting every
prediction; a folder saved before digests existed is checked by its fields alone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

import torch

from ..encoders import config_from_dict
from ..encoders.configs import EncoderConfig

__all__ = ["FolderMismatch", "check_digest", "check_mix", "check_saved_fields", "corrupt_file", "folder_digest"]

_SIZES = ("num_layers", "hidden_size", "max_length")
MIX_TOLERANCE = 1e-6  # float64 weights normalised by the save: far below any meaningful change of a count


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


class FolderMismatch(ValueError):
    """A saved folder whose files disagree with the digest or the counts its JSON records (``force`` uses it)."""


def _sha256_of_json(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode("utf-8")).hexdigest()


def folder_digest(weights_path: Path, meta: Mapping[str, object]) -> dict[str, str]:
    """What a save records of its folder: the sha256 of the weights file, the classes in order and an
    ensemble's members with their counts."""
    weights = hashlib.sha256(weights_path.read_bytes()).hexdigest()  # a head's weights: read whole by a load anyway
    digest = {"weights": weights, "classes": _sha256_of_json(meta["classes"])}
    if meta.get("ensemble") is not None:
        digest["ensemble"] = _sha256_of_json(meta["ensemble"])
    return digest


def check_digest(meta: Mapping[str, object], meta_path: Path, weights_path: Path) -> None:
    """Refuse a folder that differs from the digest its JSON records (none recorded: an older save, not checked).

    Raises:
        FolderMismatch: one line naming the file that changed.
    """
    recorded = meta.get("digest")
    if recorded is None:
        return
    if not isinstance(recorded, Mapping):
        raise corrupt_file(meta_path, f"digest must be an object, got {recorded!r}")
    found = folder_digest(weights_path, meta)
    changed = {
        "weights": (weights_path, "the weights differ from those saved with"),
        "classes": (meta_path, "the classes (or their order) differ from those saved with"),
        "ensemble": (meta_path, "the ensemble's members or counts differ from those saved with"),
    }
    for key, (path, what) in changed.items():
        if recorded.get(key) != found.get(key):
            raise FolderMismatch(
                f"{path}: {what} {meta_path.name} (its digest); the folder was changed after it was saved: "
                "export or save the model again, or use it anyway with `predict --force` (load(..., force=True))"
            )


def check_mix(
    state: Mapping[str, torch.Tensor], meta: Mapping[str, object], meta_path: Path, weights_path: Path
) -> None:
    """An ensemble's ``mix`` weights: non-negative, summing to 1, and (a save without a digest) the counts of
    its JSON normalised.

    Raises:
        ValueError: weights that are not a mixture (whatever ``force``).
        FolderMismatch: a mixture that is not the one the counts give.
    """
    members = meta.get("ensemble")
    mix = state.get("mix")
    if not isinstance(members, list) or mix is None:
        return
    weights = mix.double()
    if weights.ndim != 1 or bool((weights < 0).any()) or abs(float(weights.sum()) - 1.0) > MIX_TOLERANCE:
        raise ValueError(
            f"{weights_path}: the ensemble's mix weights {[round(float(w), 6) for w in weights]} are not "
            "non-negative and summing to 1; the file is corrupt: export the ensemble again"
        )
    if meta.get("digest") is not None:  # the digest covers the counts and the weights together
        return
    counts = torch.tensor([float(member["count"]) for member in members], dtype=torch.float64)
    if counts.shape != weights.shape or not torch.allclose(counts / counts.sum(), weights, atol=MIX_TOLERANCE):
        raise FolderMismatch(
            f"{weights_path}: the ensemble's mix weights do not match the member counts in {meta_path.name}; "
            "export the ensemble again, or use the weights as they are with `predict --force` (load(..., force=True))"
        )
