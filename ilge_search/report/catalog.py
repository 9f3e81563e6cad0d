"""The listings behind ``ilge-search tasks`` and ``ilge-search models``: the registries, and what is usable now.

Each entry says whether it is available offline right now (a task's files in the data folder, a model's
offline package or its config in the local Hugging Face cache); nothing is downloaded and no model loads.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from ..embeddings.models import MODELS, KnownModel
from ..settings import registered_task_dir
from ..tasks.core import TASKS, TaskError, TaskSpec, load_task

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["task_catalog", "model_catalog", "TASK_COLUMNS", "MODEL_COLUMNS"]

PathLike = str | os.PathLike
TASK_COLUMNS = ["task", "kind", "metric", "classes_or_scores", "splits", "source", "offline", "description"]
MODEL_COLUMNS = [
    "model",
    "aliases",
    "layers",
    "hidden_size",
    "parameters",
    "size",
    "paper_name",
    "offline",
    "offline_package",
]


def _hub_source(spec: TaskSpec) -> str:
    if spec.hf_dataset is None:
        return "data dir only"  # no download source: the task loads from --data-dir alone
    return f"hf:{spec.hf_dataset}" + (f" ({spec.hf_config})" if spec.hf_config else "")


def _task_row(spec: TaskSpec, data_dir: PathLike | None) -> dict[str, object]:
    row: dict[str, object] = {
        "task": spec.name,
        "kind": spec.kind,
        "metric": spec.metric,
        "classes_or_scores": None,
        "splits": "/".join(spec.splits),
        "source": _hub_source(spec),
        "offline": False,
        "description": spec.description,
    }
    folder = registered_task_dir(spec.local_name, data_dir)
    if folder is None or spec.local_name is None or not (folder / spec.local_name).is_dir():
        return row  # loads from the hub (needs the network and the `datasets` library)
    try:
        task = load_task(spec.name, data_dir)  # from ``folder``, as every command reads it
    except TaskError as exc:
        row["description"] = f"{spec.description} (local copy unusable: {exc})"
        return row
    if task.kind == "classification":
        row["classes_or_scores"] = f"{task.num_labels} classes"
    elif task.kind == "tagging":
        row["classes_or_scores"] = f"{task.num_labels} tags"
    else:
        low = min(float(part.labels.min()) for part in task.splits.values())
        high = max(float(part.labels.max()) for part in task.splits.values())
        row["classes_or_scores"] = f"scores {low:g}-{high:g}"
    row["splits"] = " / ".join(f"{name} {len(part)}" for name, part in task.splits.items())
    row["source"] = task.source
    row["offline"] = True
    return row


def task_catalog(data_dir: PathLike | None = None) -> pd.DataFrame:
    """One row per registered task (a ``pandas.DataFrame`` with :data:`TASK_COLUMNS`).

    ``data_dir`` (default ``$ILGE_SEARCH_DATA``, else the shipped ``examples/data`` for the tasks it holds, as
    :func:`~ilge_search.settings.registered_task_dir` resolves it for every command) holds local copies in the
    shared layout; a task found there is read to count its classes (tags, or score range) and
    split sizes (sentences for a tagging task), and is ``offline``. Other tasks load from the
    Hugging Face hub, except those whose source is ``data dir only``.
    """

    task_log = logging.getLogger(load_task.__module__)
    quiet, task_log.disabled = task_log.disabled, True  # a listing does not repeat the data warnings of loading
    try:
        rows = [_task_row(spec, data_dir) for spec in TASKS.values()]
    finally:
        task_log.disabled = quiet
    return pd.DataFrame(rows, columns=TASK_COLUMNS)


def _format_params(count: float) -> str:
    return f"{count / 1e9:.2f}B" if count >= 1e9 else f"{count / 1e6:.1f}M"


def _offline_now(model: KnownModel) -> bool:
    if model.offline is not None:
        try:
            spec = importlib.util.find_spec(model.offline.package)  # found without importing it
        except (ImportError, ValueError):
            return False
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        return any((Path(location) / model.offline.relative).exists() for location in locations)
    from huggingface_hub import try_to_load_from_cache  # heavy: the hub client only when asked

    try:
        return isinstance(try_to_load_from_cache(model.name, "config.json"), str)
    except Exception:  # a malformed local cache is "not available", never a crash of a listing
        return False


def model_catalog() -> pd.DataFrame:
    """One row per model of :data:`~ilge_search.embeddings.models.MODELS` (a ``pandas.DataFrame``, MODEL_COLUMNS).

    ``layers`` is ``num_hidden_layers + 1`` (what ``num_layers_for`` returns); ``offline`` says whether it can be used
    without network access now (its offline package is installed, or its config is in the local Hugging Face cache).
    """

    rows: list[dict[str, object]] = []
    for model in MODELS:
        rows.append(
            {
                "model": model.name,
                "aliases": ", ".join(model.aliases),
                "layers": model.num_layers,
                "hidden_size": model.hidden_size,
                "parameters": _format_params(model.num_params),
                "size": model.size_bucket,
                "paper_name": model.paper_name or "",
                "offline": _offline_now(model),
                "offline_package": model.offline.pip_install if model.offline is not None else "",
            }
        )
    return pd.DataFrame(rows, columns=MODEL_COLUMNS)
