"""Synthetic embeddings written into the embedding cache under the keys the real pipeline computes.

With every split a study needs already cached, ``run_study``, ``export``, ``explain``, ``loto`` and the
report run their real code and never load a model. The features are those of
:mod:`ilge_search.testing.synthetic`, so the right answers are known; an entry is in the cache's own
format and its record says ``"synthetic"`` with the signal it carries.

Usage::

    spec = DataSpec(model=str(model_dir), task="trec", max_train=60, data_dir=str(data_dir),
                    cache_dir=str(cache_dir))
    cache_study_embeddings(spec, LayerSignal(layer=2))
    run_study(spec.model, "trec", "cayley", ...)  # reads the entries written above
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from ..embeddings import extraction
from ..embeddings.cache import EmbeddingCache, ExtractionSettings, texts_fingerprint
from ..embeddings.entry_file import STORAGE_DTYPES, EntryRecord
from ..embeddings.extraction import LayerEmbedder
from ..embeddings.models import ModelSource, load_config
from ..files import temp_name
from ..study.data import DataSpec, load_task_data
from ..tasks.core import TaskData
from .synthetic import LayerSignal, classification_features, similarity_features

__all__ = [
    "EntryFormat",
    "SyntheticSetup",
    "split_features",
    "write_split_embeddings",
    "cache_study_embeddings",
    "cache_text_embeddings",
    "refuse_model_loads",
]

PathLike = str | os.PathLike[str]
_TEXTS_TASK = "<texts>"  # the task name the cache files arbitrary texts under
_INHERITED = object()


@dataclasses.dataclass(frozen=True)
class EntryFormat:
    """The extraction options an entry is keyed by (the cache's defaults unless a test needs others)."""

    pooling: str = "mean"
    max_length: int = 512
    storage_dtype: str = "float16"

    def settings(self) -> ExtractionSettings:
        return ExtractionSettings(self.pooling, self.max_length, device="cpu", storage_dtype=self.storage_dtype)

    def key(self, cache: EmbeddingCache, model_identity: str, task: str, split: str, fingerprint: str) -> str:
        return cache.sequence_key(model_identity, (task, split, fingerprint), self.settings())


@contextmanager
def refuse_model_loads() -> Iterator[None]:
    """Within this block any attempt to load a model or tokenizer raises ``AssertionError``: proof that the
    cache answered every lookup (the ``no_model_loads`` fixture of the tests is this block)."""
    import transformers  # heavy: transformers loads in seconds

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model or tokenizer was loaded")

    targets = [
        (extraction, "load_model_and_tokenizer"),
        (LayerEmbedder, "load"),
        (transformers.AutoModel, "from_pretrained"),
        (transformers.AutoTokenizer, "from_pretrained"),
    ]
    # what each owner defines itself (an inherited attribute is restored by deleting the override)
    saved = [(owner, name, vars(owner).get(name, _INHERITED)) for owner, name in targets]
    try:
        for owner, name in targets:
            setattr(owner, name, refuse)
        yield
    finally:
        for owner, name, value in saved:
            if value is _INHERITED:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


def _model_shape(source: ModelSource, cache_dir: PathLike | None) -> tuple[int, int]:
    """(hidden states, hidden size) from the model's config, read without loading weights."""

    config = load_config(source, cache_dir)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(config.num_hidden_layers) + 1, int(config.hidden_size)


def split_features(task: TaskData, split: str, num_layers: int, hidden_size: int, signal: LayerSignal) -> np.ndarray:
    """The synthetic features of one split: ``(N, L, D)``, or ``(N, 2, L, D)`` for sentence pairs; each row's
    noise keyed by its text(s), so a subset of the split has the same rows."""
    part = task.split(split)
    if task.kind == "classification":
        return classification_features(part.labels, num_layers, hidden_size, signal, row_keys=part.texts)
    keys = [f"{first}\x00{second}" for first, second in part.pairs or []]
    return similarity_features(part.labels, num_layers, hidden_size, signal, row_keys=keys)


def _written_before(cache: EmbeddingCache, key: str, meta: dict) -> bool:
    """Whether the entry ``key`` holds these synthetic features already. Its key says nothing of the signal,
    so an entry of another signal is refused rather than replaced under the tests that read it."""
    try:
        stored = json.loads((cache.embeddings_dir / f"{key}.json").read_text())
    except (OSError, ValueError):
        return False
    if stored.get("synthetic") != meta["synthetic"]:
        raise ValueError(
            f"cache entry {key} ({meta['task']} {meta['split']}) holds features of another signal "
            f"({stored.get('synthetic')}); give this signal its own cache_dir"
        )
    return True


def _write_entry(cache: EmbeddingCache, key: str, features: np.ndarray, labels: np.ndarray | None, meta: dict) -> None:
    """One committed entry: the safetensors file first, its JSON record (the commit marker) last."""

    if _written_before(cache, key, meta):
        return
    _, _, torch_dtype = STORAGE_DTYPES[meta["storage_dtype"]]
    tensors = {"features": torch.from_numpy(features).to(torch_dtype).contiguous()}
    if labels is not None:
        tensors["labels"] = torch.from_numpy(np.ascontiguousarray(labels))
    cache.embeddings_dir.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(cache.entry_paths(key)[0])
    save_file(tensors, str(tmp), metadata={"format": "pt", "key": key})
    shape = features.shape
    meta.update(shape=list(shape), num_layers=shape[-2], hidden_size=shape[-1], num_examples=shape[0])
    cache.commit_entry(key, tmp, meta)


def _base_meta(
    cache: EmbeddingCache,
    key: str,
    source: ModelSource,
    where: tuple[str, str, str],
    fmt: EntryFormat,
    signal: LayerSignal,
) -> EntryRecord:
    meta = cache.entry_meta(key, source, where, fmt.settings())
    meta["synthetic"] = dataclasses.asdict(signal)
    return meta


def write_split_embeddings(
    model: PathLike | ModelSource,
    task: TaskData,
    *,
    cache_dir: PathLike,
    signal: LayerSignal | None = None,
    splits: Iterable[str] | None = None,
    fmt: EntryFormat | None = None,
) -> dict[str, str]:
    """Cache synthetic features of ``task``'s ``splits`` (default: all) for ``model`` exactly where
    :meth:`~ilge_search.embeddings.cache.EmbeddingCache.get_or_extract` looks them up; returns split -> key.

    The features have the model's shape (read from its config), so nothing downstream can tell them
    from extracted ones but their numbers.
    """
    signal, fmt = signal or LayerSignal(), fmt or EntryFormat()
    cache = EmbeddingCache(cache_dir)
    source = cache.resolve(model)
    num_layers, hidden_size = _model_shape(source, cache_dir)
    keys = {}
    for split in splits or list(task.splits):
        fingerprint = task.fingerprint(split)
        key = fmt.key(cache, source.identity, task.name, split, fingerprint)
        part = task.split(split)
        labels = part.labels.astype(np.int64 if task.kind == "classification" else np.float32)
        meta = _base_meta(cache, key, source, (task.name, split, fingerprint), fmt, signal)
        meta.update(
            kind=task.kind, task_source=task.source, label_names=task.label_names, labels_dtype=str(labels.dtype)
        )
        _write_entry(cache, key, split_features(task, split, num_layers, hidden_size, signal), labels, meta)
        keys[split] = key
    return keys


def cache_study_embeddings(
    spec: DataSpec,
    signal: LayerSignal | None = None,
    *,
    splits: Sequence[str] = ("train", "validation", "test"),
    zero_shot_tasks: Sequence[str] = (),
) -> dict[str, str]:
    """Cache what a study with the data options of ``spec`` reads: its task after the same few-shot and
    subsampling draws the runner makes (``load_task_data``), and the test split of each zero-shot task
    (loaded as the runner loads them: ``max_eval`` applies, the training options do not).

    Returns split -> key for the study's task (the study records these as ``cache_keys``).
    """
    if spec.cache_dir is None:
        raise ValueError("give the DataSpec a cache_dir: synthetic entries never go to the user's own cache")
    model = spec.model_or_source
    keys = write_split_embeddings(model, load_task_data(spec), cache_dir=spec.cache_dir, signal=signal, splits=splits)
    for name in zero_shot_tasks:
        zero_shot = load_task_data(dataclasses.replace(spec, task=name, shots=None, max_train=None))
        write_split_embeddings(model, zero_shot, cache_dir=spec.cache_dir, signal=signal, splits=["test"])
    return keys


def _rows_by_text(tasks: Iterable[TaskData], num_layers: int, hidden_size: int, signal: LayerSignal) -> dict:
    """text -> its ``(L, D)`` row, for every text of every split of ``tasks``."""
    rows: dict[str, np.ndarray] = {}
    for task in tasks:
        for split in task.splits:
            features = split_features(task, split, num_layers, hidden_size, signal)
            flat = features.reshape(-1, num_layers, hidden_size)  # pairs: row 2i + s is sentence s of pair i
            rows.update(zip(task.split(split).flat_texts(), flat, strict=True))
    return rows


def cache_text_embeddings(
    model: PathLike | ModelSource,
    texts: Sequence[str],
    tasks: Sequence[TaskData],
    *,
    cache_dir: PathLike,
    signal: LayerSignal | None = None,
    fmt: EntryFormat | None = None,
) -> str:
    """Cache the features of ``texts``, in this order, where
    :meth:`~ilge_search.embeddings.cache.EmbeddingCache.get_or_extract_texts` looks them up (what a classifier or
    ``predict`` asks for); returns the key. Each text must occur in one of ``tasks`` and gets the row it
    has there (the same signal must be given), so a model trained on those tasks' cached features
    predicts these texts as it scored them."""
    signal, fmt = signal or LayerSignal(), fmt or EntryFormat()
    cache = EmbeddingCache(cache_dir)
    source = cache.resolve(model)
    num_layers, hidden_size = _model_shape(source, cache_dir)
    rows = _rows_by_text(tasks, num_layers, hidden_size, signal)
    unknown = [text for text in texts if text not in rows]
    if unknown:
        raise ValueError(f"{len(unknown)} text(s) occur in none of the given tasks, e.g. {unknown[0]!r}")
    fingerprint = texts_fingerprint(list(texts))
    key = fmt.key(cache, source.identity, _TEXTS_TASK, "texts", fingerprint)
    meta = _base_meta(cache, key, source, (_TEXTS_TASK, "texts", fingerprint), fmt, signal)
    meta.update(kind="texts", label_names=[])
    _write_entry(cache, key, np.stack([rows[text] for text in texts]), None, meta)
    return key


@dataclasses.dataclass(frozen=True)
class SyntheticSetup:
    """A model, a data dir and an embedding cache that together answer every lookup of a test's studies.

    :meth:`cache` writes the entries a study with the given data options reads; pass the same ``model``,
    ``data_dir`` and ``cache_dir`` to ``run_study`` (or the CLI) and it loads no model.
    """

    model: str
    data_dir: Path
    cache_dir: Path
    signal: LayerSignal = dataclasses.field(default_factory=LayerSignal)

    def spec(self, task: str, **data_options: Any) -> DataSpec:
        """The :class:`~ilge_search.study.data.DataSpec` of ``task`` with ``data_options`` (``shots``,
        ``max_train``, ``max_eval``, ``data_seed``) in this setup."""
        return DataSpec(
            model=self.model, task=task, data_dir=str(self.data_dir), cache_dir=str(self.cache_dir), **data_options
        )

    def cache(
        self,
        task: str,
        *,
        signal: LayerSignal | None = None,
        zero_shot_tasks: Sequence[str] = (),
        **data_options: Any,
    ) -> dict[str, str]:
        """Cache what a study of ``task`` with ``data_options`` reads (see :func:`cache_study_embeddings`);
        ``signal`` overrides the setup's."""
        spec = self.spec(task, **data_options)
        return cache_study_embeddings(spec, signal or self.signal, zero_shot_tasks=zero_shot_tasks)
