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
- any config-like object with ``num_hidden_layers`` / ``hidden_size`` (a
  ``transformers.PretrainedConfig``, a ``SimpleNamespace`` ...), or a model whose
  ``.config`` has them (as the published ``ilge`` package accepts).

A name that cannot be resolved raises :class:`ValueError` saying to pass a local
folder or a config; something that is not a model at all (an ``int``, ``None``)
raises :class:`~ilge_search.validation.ArgumentTypeError`, a ``TypeError`` as in
the published package that is also a ``ValueError``.
"""

from __future__ import annotations

import os
from typing import Any

from ..validation import ArgumentTypeError
from .models import MODEL_ALIASES, MODELS, known_model, text_config

__all__ = ["num_layers_for", "hidden_size_for", "layer_dims_for", "KNOWN_MODELS"]

# canonical id -> (num_hidden_layers, hidden_size): a view of the one model table, ilge_search.embeddings.models.MODELS
KNOWN_MODELS: dict[str, tuple[int, int]] = {m.name: (m.num_hidden_layers, m.hidden_size) for m in MODELS}


def _dims_from_config(
    config: object, need: tuple[str, ...] = ("num_hidden_layers", "hidden_size")
) -> tuple[int | None, int | None]:
    """``(num_hidden_layers, hidden_size)`` of a config; the fields in ``need`` must be integers."""
    text = text_config(config)
    values = {name: getattr(text, name, None) for name in ("num_hidden_layers", "hidden_size")}
    for name in need:
        value = values[name]
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(
                f"{type(config).__name__} has no integer {name} (got {value!r}); "
                "pass the config of a transformer language model"
            )
    return values["num_hidden_layers"], values["hidden_size"]


def _config_like(model: object) -> object | None:
    """``model`` itself or its ``.config`` when it has ``num_hidden_layers`` or ``hidden_size``, else ``None``."""
    for candidate in (model, getattr(model, "config", None)):
        if candidate is None:
            continue
        text = text_config(candidate)
        if hasattr(text, "num_hidden_layers") or hasattr(text, "hidden_size"):
            return candidate
    return None


def _unknown(model: object, reason: str = "") -> ValueError:
    return ValueError(
        f"cannot determine the layer count of {model!r} offline{': ' + reason if reason else ''}. "
        "Pass a local model folder (containing config.json), a transformers PretrainedConfig or a loaded "
        f"model; built-in names: {sorted(KNOWN_MODELS) + sorted(MODEL_ALIASES)}"
    )


def _load_config(path_or_id: str, is_folder: bool, trust_remote_code: bool = False) -> tuple[int, int]:
    from transformers import AutoConfig  # heavy: transformers takes seconds to load

    try:
        config = AutoConfig.from_pretrained(path_or_id, local_files_only=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as exc:
        if is_folder:
            raise ValueError(
                f"cannot read a model config from folder {path_or_id!r} ({exc}); "
                "it needs a config.json as written by save_pretrained"
            ) from None
        raise _unknown(
            path_or_id, "not a local folder, not in the built-in table and not in the local Hugging Face cache"
        ) from None
    layers, hidden = _dims_from_config(config)
    assert layers is not None and hidden is not None  # _dims_from_config checked both
    return layers, hidden


def _dims(
    model: Any, trust_remote_code: bool = False, need: tuple[str, ...] = ("num_hidden_layers", "hidden_size")
) -> tuple[Any, Any]:
    """``(num_hidden_layers, hidden_size)``; of a config-like object only the fields in ``need`` must exist."""
    if isinstance(model, os.PathLike):
        path = os.fspath(model)
        if not os.path.isdir(path):
            raise ValueError(f"model folder {path!r} does not exist")
        return _load_config(path, True, trust_remote_code)
    if isinstance(model, str):
        if not model.strip():
            raise ValueError("model name is empty; pass a Hugging Face id, a local folder or a config")
        if os.path.isdir(os.path.expanduser(model)):
            return _load_config(os.path.expanduser(model), True, trust_remote_code)
        known = known_model(model)
        if known is not None:
            return known.num_hidden_layers, known.hidden_size
        return _load_config(model, False, trust_remote_code)
    config = _config_like(model)
    if config is None:
        raise ArgumentTypeError(
            f"expected a model id, a local folder, a config with num_hidden_layers/hidden_size or a model whose "
            f".config has them, got {type(model).__name__}"
        )
    return _dims_from_config(config, need)


def layer_dims_for(model: object, trust_remote_code: bool = False) -> tuple[int, int]:
    """``(num_layers_for(model), hidden_size_for(model))`` with one lookup."""
    layers, hidden = _dims(model, trust_remote_code)
    return layers + 1, hidden


def num_layers_for(model_or_name: object, trust_remote_code: bool = False) -> int:
    """Hidden states the model returns with ``output_hidden_states=True``: ``num_hidden_layers + 1``.

    The ``num_layers`` of ``build_aggregator`` / ``build_per_token_aggregator``.
    ``model_or_name`` is a name, a local folder, a config or a model (see the
    module docstring); ``trust_remote_code`` is passed to ``AutoConfig`` for
    folders and cached ids, as in the published package.
    """
    return _dims(model_or_name, trust_remote_code, need=("num_hidden_layers",))[0] + 1


def hidden_size_for(model_or_name: object, trust_remote_code: bool = False) -> int:
    """Width of each hidden state (``hidden_size``): the ``hidden_in`` of the aggregator factories."""
    return _dims(model_or_name, trust_remote_code, need=("hidden_size",))[1]
