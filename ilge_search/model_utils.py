"""``num_layers`` and ``hidden_in`` of a backbone, without loading its weights.

:func:`num_layers_for` is ``num_hidden_layers + 1`` (the embedding layer's
output is hidden state 0), the number of layer embeddings ILGE aggregates;
:func:`hidden_size_for` is the width of each.

A model is named by any of:

- a Hugging Face id or short name from the built-in table (the models ILGE was
  validated on and the two offline aliases ``minilm-l6`` and ``smollm2-135m``),
  answered without network or disk access;
- a local model folder (its ``config.json`` is read with
  ``AutoConfig.from_pretrained(path, local_files_only=True)``);
- any other id already in the local Hugging Face cache;
- a ``transformers.PretrainedConfig`` or a model object with a ``.config``.

Anything else raises :class:`ValueError` that says to pass a local folder or a config.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Tuple, Union

from .models import MODEL_ALIASES, MODELS, known_model

__all__ = ["num_layers_for", "hidden_size_for", "layer_dims_for", "KNOWN_MODELS"]

# canonical id -> (num_hidden_layers, hidden_size): a view of the one model table, ilge_search.models.MODELS
KNOWN_MODELS: Dict[str, Tuple[int, int]] = {m.name: (m.num_hidden_layers, m.hidden_size) for m in MODELS}


def _dims_from_config(config: Any) -> Tuple[int, int]:
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = getattr(text_config, "num_hidden_layers", None)
    hidden = getattr(text_config, "hidden_size", None)
    if not isinstance(layers, int) or not isinstance(hidden, int):
        raise ValueError(f"{type(config).__name__} has no integer num_hidden_layers/hidden_size; "
                         "pass the config of a transformer language model")
    return layers, hidden


def _unknown(model: Any, reason: str = "") -> ValueError:
    return ValueError(
        f"cannot determine the layer count of {model!r} offline{': ' + reason if reason else ''}. "
        "Pass a local model folder (containing config.json), a transformers PretrainedConfig or a loaded "
        f"model; built-in names: {sorted(KNOWN_MODELS) + sorted(MODEL_ALIASES)}")


def _load_config(path_or_id: str, is_folder: bool) -> Tuple[int, int]:
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path_or_id, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        if is_folder:
            raise ValueError(f"cannot read a model config from folder {path_or_id!r} ({exc}); "
                             "it needs a config.json as written by save_pretrained") from None
        raise _unknown(path_or_id, "not a local folder, not in the built-in table and not in the local "
                       "Hugging Face cache") from None
    return _dims_from_config(config)


def _dims(model: Any) -> Tuple[int, int]:
    """``(num_hidden_layers, hidden_size)``."""
    from transformers import PretrainedConfig

    if isinstance(model, PretrainedConfig):
        return _dims_from_config(model)
    if isinstance(model, os.PathLike):
        path = os.fspath(model)
        if not os.path.isdir(path):
            raise ValueError(f"model folder {path!r} does not exist")
        return _load_config(path, is_folder=True)
    if isinstance(model, str):
        if not model.strip():
            raise ValueError("model name is empty; pass a Hugging Face id, a local folder or a config")
        if os.path.isdir(os.path.expanduser(model)):
            return _load_config(os.path.expanduser(model), is_folder=True)
        known = known_model(model)
        if known is not None:
            return known.num_hidden_layers, known.hidden_size
        return _load_config(model, is_folder=False)
    config = getattr(model, "config", None)
    if isinstance(config, PretrainedConfig):
        return _dims_from_config(config)
    raise ValueError(f"expected a model id, a local folder, a PretrainedConfig or a model object with a "
                     f".config, got {type(model).__name__}")


def layer_dims_for(model: Union[str, "os.PathLike[str]", Any]) -> Tuple[int, int]:
    """``(num_layers_for(model), hidden_size_for(model))`` with one lookup."""
    layers, hidden = _dims(model)
    return layers + 1, hidden


def num_layers_for(model: Union[str, "os.PathLike[str]", Any]) -> int:
    """Hidden states the model returns with ``output_hidden_states=True``: ``num_hidden_layers + 1``."""
    return _dims(model)[0] + 1


def hidden_size_for(model: Union[str, "os.PathLike[str]", Any]) -> int:
    """Width of each hidden state (``hidden_size``)."""
    return _dims(model)[1]
