"""The one embedding cache: pooled layer embeddings stored once per model, task and split.

A sequence entry's key (:meth:`~ilge_search.embeddings.store.EntryStore.key`) covers the model's weights
identity, task, split, the split's data fingerprint, pooling, max_length and storage dtype. Its file
(``features`` and ``labels``) is written through a memmap, batch by batch, under the protocol of
:mod:`ilge_search.embeddings.store`: allocated in full before the model loads (a read-only or full disk is
one :class:`~ilge_search.files.DiskError` line and leaves no temporary file), committed atomically, and
extracted once under a per-entry lock.

Layout under the cache dir::

    embeddings/<key>.safetensors   features (N, L, D) or (N, 2, L, D); labels (N,)
    embeddings/<key>.json          metadata (model, revision, task, split, shapes, checksum ...)
    locks/<key>.lock
    models/                        converted GGUF models and memoised weight hashes
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np
import torch

from .._version import __version__
from ..tasks.columns import TaskColumns
from ..tasks.core import TaskData, TaskError, load_task
from .entry_file import STORAGE_DTYPES, CacheCorruptError, EntryRecord, parse_safetensors, storable
from .extraction import ExtractionSettings, LayerEmbedder, check_texts
from .models import ModelSource, resolve_model
from .store import FORMAT_VERSION, CacheEntry, EntryLayout, EntryStore

__all__ = [
    "FORMAT_VERSION",
    "STORAGE_DTYPES",
    "EmbeddingCache",
    "CachedEmbeddings",
    "CacheEntry",
    "TaskEmbeddings",
    "CacheCorruptError",
    "load_task_embeddings",
    "ExtractionSettings",
    "TaskColumns",
    "texts_fingerprint",
]

PathLike = str | os.PathLike
_TEXTS_TASK = "<texts>"
_USUAL_COLUMNS = TaskColumns()  # every column option left to load_task
_DEFAULT_EXTRACTION = ExtractionSettings()


@dataclass
class CachedEmbeddings:
    """One split's embeddings.

    Attributes:
        features: (N, L, D), or (N, 2, L, D) for sentence pairs; in the storage dtype (float16
            by default), on CPU.
        labels: (N,) int64 label ids, or float32 scores for similarity.
        label_names: id -> name (empty for similarity).
        meta: the entry's JSON record (model, revision, task, split, shapes, timings ...).
        key: the cache key. path: the safetensors file.
        hit: True if read from the cache, False if extracted by this call.
        seconds: how long this call took (reading or extracting).
    """

    features: torch.Tensor
    labels: torch.Tensor
    label_names: list[str]
    meta: EntryRecord
    key: str
    path: Path
    hit: bool = False
    seconds: float = 0.0

    @property
    def num_layers(self) -> int:
        return int(self.features.shape[-2])

    @property
    def hidden_size(self) -> int:
        return int(self.features.shape[-1])


E = TypeVar("E", bound=CachedEmbeddings)


@dataclass
class TaskEmbeddings(Generic[E]):
    """Every requested split of one task for one model (see :func:`load_task_embeddings`)."""

    task: TaskData
    splits: dict[str, E]
    num_layers: int
    hidden_size: int
    label_names: list[str]
    cache_keys: dict[str, str]
    model: str = ""

    def __getitem__(self, split: str) -> E:
        return self.splits[split]

    @classmethod
    def gather(
        cls, task: TaskData, splits: Sequence[str] | None, source: ModelSource, entry: Callable[[str], E]
    ) -> TaskEmbeddings[E]:
        """``entry(split)`` of each of ``splits`` (default: all of the task's), unknown splits refused first."""
        wanted = list(splits) if splits else list(task.splits)
        unknown = [split for split in wanted if split not in task.splits]
        if unknown:
            raise TaskError(f"task {task.name!r} has no split(s) {unknown}; it has {list(task.splits)}")
        got = {split: entry(split) for split in wanted}
        first = next(iter(got.values()))
        keys = {split: found.key for split, found in got.items()}
        return cls(task, got, first.num_layers, first.hidden_size, list(task.label_names), keys, source.name)


def texts_fingerprint(texts: Sequence[str]) -> str:
    """sha256 over the texts in order (what :meth:`EmbeddingCache.get_or_extract_texts` keys on)."""
    digest = hashlib.sha256(f"{len(texts)}\n".encode())
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(f"texts must be strings, got {type(text).__name__}")
        digest.update(text.encode("utf-8"))
        digest.update(b"\x00")
    return digest.hexdigest()


@dataclass(frozen=True)
class TextJob:
    """The texts of one sequence entry (pairs interleaved), their labels (or None) and whether to show progress."""

    texts: list[str]
    pairs: bool
    labels: np.ndarray | None
    progress: bool


class EmbeddingCache(EntryStore):
    """The embedding cache (``cache_dir`` and ``verify`` as :class:`~ilge_search.embeddings.store.EntryStore`
    takes them). A model is loaded only when an entry is missing; it stays loaded for further misses (other
    splits) until :meth:`unload`. Use as a context manager to unload on exit."""

    def __init__(self, cache_dir: PathLike | None = None, *, verify: bool = True) -> None:
        super().__init__(cache_dir, verify=verify)
        self._embedders: dict[tuple, LayerEmbedder] = {}
        self._sources: dict[str, ModelSource] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(cache_dir={str(self.cache_dir)!r})"

    def __enter__(self) -> EmbeddingCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unload()

    def sequence_key(self, model_identity: str, where: tuple[str, str, str], settings: ExtractionSettings) -> str:
        """The key of the sequence entry of ``where`` = (task, split, fingerprint)."""
        task, split, fingerprint = where
        return self.key(
            model_identity=model_identity,
            task=task,
            split=split,
            fingerprint=fingerprint,
            pooling=settings.pooling,
            max_length=settings.max_length,
            storage_dtype=settings.storage_dtype,
        )

    def resolve(self, model: str | PathLike | ModelSource) -> ModelSource:
        """The model's source and weights identity (memoised; never loads or converts weights)."""
        if isinstance(model, ModelSource):
            return model
        name = os.fspath(model)
        if name not in self._sources:
            self._sources[name] = resolve_model(name, self.cache_dir, materialize=False)
        return self._sources[name]

    def _read(self, key: str) -> CachedEmbeddings | None:
        """The committed entry, None if there is none; raises CacheCorruptError if it is damaged."""
        record = self.committed_record(key)
        if record is None:
            return None
        meta, stat = record
        data_path = self.entry_paths(key)[0]
        expected_size = stat.st_size
        # Read into owned memory (not an mmap: a file truncated or replaced later must not
        # crash tensors handed out earlier); the checksum runs over the same buffer.
        buffer = bytearray(expected_size)
        with open(data_path, "rb") as handle:
            if handle.readinto(buffer) != expected_size:
                raise CacheCorruptError(f"{data_path.name} changed size while being read")
        self.verify_file(data_path, meta, stat, buffer)
        tensors = parse_safetensors(buffer, data_path.name)
        features = tensors.get("features")
        if features is None or list(features.shape) != list(meta.get("shape", [])):
            raise CacheCorruptError(
                f"{data_path.name}: features shape "
                f"{None if features is None else list(features.shape)} != {meta.get('shape')}"
            )
        labels = tensors.get("labels", torch.empty(0))
        return CachedEmbeddings(
            features=features,
            labels=labels,
            label_names=list(meta.get("label_names", [])),
            meta=meta,
            key=key,
            path=data_path,
            hit=True,
        )

    def embedder(self, source: ModelSource, settings: ExtractionSettings) -> LayerEmbedder:
        """One loaded model per source and settings, reused by every entry extracted through this cache."""
        slot = (source.identity, settings.pooling, settings.max_length, settings.batch_size, settings.device)
        if slot not in self._embedders:
            s = settings
            embedder = LayerEmbedder(source, s.pooling, s.max_length, s.batch_size, s.device, cache_dir=self.cache_dir)
            self._embedders[slot] = embedder
        return self._embedders[slot]

    def _extract_texts(
        self, key: str, embedder: LayerEmbedder, texts: TextJob, storage_dtype: str, meta: EntryRecord
    ) -> None:
        """One sequence entry: each text's pooled layers; pairs: row 2i+s is sentence s of pair i."""
        num_layers, hidden = embedder.num_layers, embedder.hidden_size  # from the config, no weights
        n_rows = len(texts.texts) // 2 if texts.pairs else len(texts.texts)
        shape = (n_rows, 2, num_layers, hidden) if texts.pairs else (n_rows, num_layers, hidden)

        def fill(features: np.memmap) -> None:
            rows = features.reshape(len(texts.texts), num_layers, hidden)
            for indices, pooled in embedder.iter_pooled_batches(texts.texts, progress=texts.progress):
                rows[indices] = storable(pooled, storage_dtype)

        def describe(seconds: float, size: int) -> dict[str, object]:
            return {"num_examples": n_rows, "texts_per_second": round(len(texts.texts) / max(seconds, 1e-9), 2)}

        after = () if texts.labels is None else (("labels", texts.labels),)
        self.write_entry(EntryLayout(key, shape, storage_dtype, after, describe), embedder, fill, meta)

    def entry_meta(
        self,
        key: str,
        source: ModelSource,
        where: tuple[str, str, str],
        settings: ExtractionSettings,
    ) -> EntryRecord:
        """The JSON record of a new entry for ``where`` = (task, split, fingerprint) before extraction: what it
        holds and which versions made it."""
        import transformers  # heavy: transformers takes seconds to load

        task, split, fingerprint = where

        return {
            "key": key,
            "format_version": FORMAT_VERSION,
            "model": source.name,
            "model_identity": source.identity,
            "model_path": source.path,
            "task": task,
            "split": split,
            "fingerprint": fingerprint,
            "pooling": settings.pooling,
            "max_length": settings.max_length,
            "storage_dtype": settings.storage_dtype,
            "device": settings.device,
            "versions": {
                "ilge_search": __version__,
                "torch": torch.__version__,
                "transformers": transformers.__version__,
            },
        }

    def get_or_extract(
        self,
        model: str | PathLike | ModelSource,
        task_data_or_name: PathLike | TaskData,
        split: str,
        *,
        settings: ExtractionSettings = _DEFAULT_EXTRACTION,
        data_dir: PathLike | None = None,
        progress: bool = True,
    ) -> CachedEmbeddings:
        """The split's embeddings: read from the cache, or extracted once (under a lock) and stored.

        ``task_data_or_name`` is a :class:`~ilge_search.tasks.core.TaskData` or anything
        :func:`~ilge_search.tasks.core.load_task` accepts. Options, task and model are checked
        before any model is loaded. Similarity tasks give features (N, 2, L, D).
        """
        settings.check()
        task = load_task(task_data_or_name, data_dir)
        if task.kind == "tagging":
            raise TaskError(
                f"{task.name!r} is a tagging task: its words are cached one vector per word by "
                f"ilge_search.embeddings.word_cache.get_or_extract_words, not one per text"
            )
        part = task.split(split)
        source = self.resolve(model)
        where = (task.name, split, task.fingerprint(split))
        key = self.sequence_key(source.identity, where, settings)
        meta = self.entry_meta(key, source, where, settings)
        meta.update(
            kind=task.kind, task_source=task.source, label_names=task.label_names, labels_dtype=str(part.labels.dtype)
        )
        labels = part.labels.astype(np.int64 if task.kind == "classification" else np.float32)
        pairs = task.kind == "similarity"

        def build() -> None:
            embedder = self.embedder(source, settings)
            job = TextJob(part.flat_texts(), pairs, labels, progress)
            self._extract_texts(key, embedder, job, settings.storage_dtype, meta)

        return self.get_or_build(key, self._read, build, progress)

    def get_or_extract_texts(
        self,
        model: str | PathLike | ModelSource,
        texts: Sequence[str],
        *,
        settings: ExtractionSettings = _DEFAULT_EXTRACTION,
        progress: bool = True,
    ) -> torch.Tensor:
        """(N, L, D) embeddings of arbitrary texts in the storage dtype, cached by a fingerprint
        of the texts, so the same texts never go through the model twice."""
        settings.check()
        texts = check_texts(texts)
        source = self.resolve(model)
        where = (_TEXTS_TASK, "texts", texts_fingerprint(texts))
        key = self.sequence_key(source.identity, where, settings)
        meta = self.entry_meta(key, source, where, settings)
        meta.update(kind="texts", label_names=[])

        def build() -> None:
            embedder = self.embedder(source, settings)
            self._extract_texts(key, embedder, TextJob(texts, False, None, progress), settings.storage_dtype, meta)

        return self.get_or_build(key, self._read, build, progress).features

    def unload(self) -> None:
        """Release every model this cache loaded for extraction."""
        for embedder in self._embedders.values():
            embedder.unload()
        self._embedders.clear()


def load_task_embeddings(
    model: str | PathLike | ModelSource,
    task: PathLike | TaskData,
    *,
    data_dir: PathLike | None = None,
    cache_dir: PathLike | None = None,
    splits: Sequence[str] | None = None,
    columns: TaskColumns = _USUAL_COLUMNS,
    settings: ExtractionSettings = _DEFAULT_EXTRACTION,
    progress: bool = True,
) -> TaskEmbeddings:
    """Every requested split of a task (default: all of its splits) for one model (what ``ilge-search embed`` runs).

    The task (read with ``columns`` unless it is a loaded :class:`~ilge_search.tasks.core.TaskData`), settings
    and model name are validated first; missing splits are then extracted with one model load, which is released
    before returning.
    """
    settings.check()
    task_data = load_task(task, data_dir, columns=columns)
    with EmbeddingCache(cache_dir) as cache:
        source = cache.resolve(model)

        def entry(split: str) -> CachedEmbeddings:
            return cache.get_or_extract(source, task_data, split, settings=settings, progress=progress)

        return TaskEmbeddings.gather(task_data, splits, source, entry)
