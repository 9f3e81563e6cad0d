"""Published ILGE results, kept as data with their source, matched to our studies.

The numbers live in ``ilge_search/data/paper_results.json`` (test accuracy in %, per model, task and method, with their
source). :func:`published_result` matches the names studies use: any model name the model table knows (only its entries
with a ``paper_name``: the paper evaluated the base checkpoints), a task in our spelling or MTEB's, and an encoder.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..embeddings.models import known_model

__all__ = [
    "PAPER_RESULTS_PATH",
    "PublishedResult",
    "load_paper_results",
    "published_result",
    "paper_source",
    "canonical_model",
    "canonical_task",
]

PAPER_RESULTS_PATH = Path(__file__).resolve().parent.parent / "data" / "paper_results.json"
_FORMAT_VERSION = 2


@dataclass(frozen=True)
class PublishedResult:
    """One published cell: ``value`` in % for (``model``, ``task``, ``method``)."""

    model: str
    task: str
    method: str
    value: float
    cross_checked: bool = False


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def canonical_model(model: str) -> str | None:
    """The paper's model id for a study's model name (id, short name, alias or folder), else ``None``.

    Only models the paper evaluated (model-table entries with a ``paper_name``) have one.
    """
    found = known_model(model)
    return found.name if found is not None and found.paper_name else None


@functools.cache
def _load(path: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read the published results {path}: {exc}") from None
    if data.get("format_version") != _FORMAT_VERSION:
        raise ValueError(f"{path}: format_version {data.get('format_version')!r}, expected {_FORMAT_VERSION}")
    tasks: dict[str, str] = {}
    for canonical, info in data["tasks"].items():
        for alias in [canonical, info.get("label", canonical), *info.get("aliases", [])]:
            tasks[_key(alias)] = canonical
    cells: dict[tuple[str, str, str], PublishedResult] = {}
    for record in data["results"]:
        result = PublishedResult(
            record["model"],
            record["task"],
            record["method"],
            float(record["value"]),
            bool(record.get("cross_checked", False)),
        )
        if canonical_model(result.model) != result.model:
            raise ValueError(
                f"{path}: model {result.model!r} is not a paper model of ilge_search.embeddings.models.MODELS "
                "(its canonical name, with a paper_name)"
            )
        cells[(result.model, result.task, result.method)] = result
    return {"raw": data, "tasks": tasks, "cells": cells}


def load_paper_results(path: Path | None = None) -> list[PublishedResult]:
    """Every published cell, in file order."""
    return list(_load(str(path or PAPER_RESULTS_PATH))["cells"].values())


def paper_source(path: Path | None = None) -> dict[str, str]:
    """Where the numbers come from (paper, arXiv id, table, transcription, protocol)."""
    return dict(_load(str(path or PAPER_RESULTS_PATH))["raw"]["source"])


def canonical_task(task: str, path: Path | None = None) -> str | None:
    """The paper's task name for ``task`` (ours or MTEB's spelling), else ``None``."""
    return _load(str(path or PAPER_RESULTS_PATH))["tasks"].get(_key(str(task)))


def published_result(model: str, task: str, method: str, path: Path | None = None) -> PublishedResult | None:
    """The published cell for (model, task, encoder ``method``), or ``None`` when the paper has none."""
    model_id, task_id = canonical_model(model), canonical_task(task, path)
    if model_id is None or task_id is None:
        return None
    return _load(str(path or PAPER_RESULTS_PATH))["cells"].get((model_id, task_id, method))
