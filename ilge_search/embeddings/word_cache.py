"""Word entries of the embedding cache: one vector per word, ragged over sentences, memory-mapped.

A word entry holds one split of a tagging task (or a list of sentences) for one model: ``features``
``(num_words, L, D)`` in the storage dtype, ``offsets`` ``(num_sentences + 1,)`` (sentence ``i``'s words
are rows ``offsets[i]:offsets[i + 1]``) and, for a task, one tag id per word in ``labels``. It shares the
entry protocol of :mod:`ilge_search.embeddings.store` with the sequence entries; its key adds
:meth:`WordOptions.key_fields`.

Reading maps ``features`` copy-on-write instead of reading it, so memory stays flat in the number of
sentences; a committed file is never written into again (a rebuild renames a new file over it), so the
mapping stays valid as long as the tensor lives.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..tasks.core import TaskData, TaskError, load_task
from ..tasks.tagging import sentence_offsets
from ..validation import check_choice, check_int
from .cache import CachedEmbeddings, EmbeddingCache, EntryLayout, ExtractionSettings, TaskEmbeddings
from .entry_file import STORAGE_DTYPES, CacheCorruptError, EntryRecord, storable, tensor_spans
from .extraction import LayerEmbedder
from .models import ModelSource, resolve_device
from .words import WORD_POOLINGS, check_sentences

__all__ = [
    "WordOptions",
    "WordEmbeddings",
    "TaskWordEmbeddings",
    "get_or_extract_words",
    "get_or_extract_sentences",
    "load_word_embeddings",
    "sentences_fingerprint",
    "word_entry_key",
]

WORDS_LAYOUT_VERSION = 1  # bump when the alignment of pieces to words or the entry layout changes
_SENTENCES_TASK = "<sentences>"
PathLike = str | os.PathLike


@dataclass(frozen=True)
class WordOptions:
    """How words are extracted and stored; all but ``batch_size`` and ``device`` are part of the key.

    Attributes:
        word_pooling: ``first`` (a word is its first piece) or ``mean`` (the mean of its pieces).
        max_length: pieces per model input; longer sentences are cut into windows.
        window_overlap: pieces of words that neighbouring windows share (context at the cut).
        storage_dtype: ``float16`` (default), ``bfloat16`` or ``float32``.
        batch_size: model inputs (windows) per forward pass.
        device: ``auto``, ``cpu``, ``cuda`` ...
    """

    word_pooling: str = "first"
    max_length: int = 512
    window_overlap: int = 0
    storage_dtype: str = "float16"
    batch_size: int = 32
    device: str = "auto"

    def __post_init__(self) -> None:
        check_choice("word_pooling", self.word_pooling, WORD_POOLINGS)
        check_choice("storage_dtype", self.storage_dtype, tuple(STORAGE_DTYPES))
        check_int("max_length", self.max_length)
        check_int("batch_size", self.batch_size)
        check_int("window_overlap", self.window_overlap, minimum=0)
        if self.window_overlap >= self.max_length:
            raise ValueError(f"window_overlap ({self.window_overlap}) must be below max_length ({self.max_length})")
        resolve_device(self.device)  # a device this machine lacks fails before any task or model work

    def extraction(self) -> ExtractionSettings:
        """The model run these words share with sequence entries (text pooling does not apply to words)."""
        return ExtractionSettings(
            max_length=self.max_length, batch_size=self.batch_size, device=self.device, storage_dtype=self.storage_dtype
        )

    def key_fields(self) -> dict[str, str | int]:
        """What a word entry's key adds to the cache's fields."""
        return {
            "entry": "words",
            "words_layout": WORDS_LAYOUT_VERSION,
            "word_pooling": self.word_pooling,
            "window_overlap": self.window_overlap,
        }


@dataclass
class WordEmbeddings(CachedEmbeddings):
    """One split's (or one list of sentences') word vectors: a cache entry whose ``features`` ``(num_words, L,
    D)`` are memory-mapped from the cache file, ``labels`` ``(num_words,)`` are int64 tag ids (empty for
    sentences without tags) and ``label_names`` the tag names.

    Attributes:
        offsets: ``(num_sentences + 1,)`` int64: sentence ``i`` is ``features[offsets[i]:offsets[i + 1]]``.
    """

    offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))

    @property
    def num_sentences(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_words(self) -> int:
        return int(self.features.shape[0])

    @property
    def lengths(self) -> np.ndarray:
        """Words per sentence."""
        return np.diff(self.offsets)

    def sentence(self, index: int) -> torch.Tensor:
        """``(num_words_of_sentence, L, D)``: one sentence's rows."""
        return self.features[int(self.offsets[index]) : int(self.offsets[index + 1])]


# every requested split of one tagging task for one model (see load_word_embeddings)
TaskWordEmbeddings = TaskEmbeddings[WordEmbeddings]


def sentences_fingerprint(sentences: Sequence[Sequence[str]]) -> str:
    """sha256 over the sentences in order, word by word (what :func:`get_or_extract_sentences` keys on)."""
    digest = hashlib.sha256(f"{len(sentences)}\n".encode())
    for words in sentences:
        digest.update("\x1f".join(words).encode("utf-8"))
        digest.update(b"\x00")
    return digest.hexdigest()


# --------------------------------------------------------------------------- reading


def _check_layout(path: Path, spans: dict, meta: EntryRecord) -> tuple[int, int]:
    """Refuse a file whose tensors do not match its record; return (num_words, num_sentences)."""
    num_words, num_sentences = int(meta.get("num_words", -1)), int(meta.get("num_sentences", -1))
    expected = {
        "features": tuple(meta.get("shape", ())),
        "offsets": (num_sentences + 1,),
        **({"labels": (num_words,)} if meta.get("labelled") else {}),
    }
    found = {name: spans[name][1] for name in spans}
    if found != expected or spans["offsets"][0] != "I64" or spans.get("labels", ("I64",))[0] != "I64":
        raise CacheCorruptError(f"{path.name}: tensors {found} do not match the record {expected}")
    return num_words, num_sentences


def _read_words(cache: EmbeddingCache, key: str) -> WordEmbeddings | None:
    """The committed word entry, None if there is none; raises CacheCorruptError if it is damaged."""
    record = cache.committed_record(key)
    if record is None:
        return None
    meta, stat = record
    path = cache.entry_paths(key)[0]
    cache.verify_file(path, meta, stat)  # read in blocks: memory stays flat
    spans = tensor_spans(path)
    num_words, num_sentences = _check_layout(path, spans, meta)
    code, shape, start = spans["features"]
    dtypes = {stored: (np_dtype, torch_dtype) for stored, np_dtype, torch_dtype in STORAGE_DTYPES.values()}
    if code not in dtypes:
        raise CacheCorruptError(f"{path.name}: features have the unknown dtype {code!r}")
    np_dtype, torch_dtype = dtypes[code]
    features = torch.from_numpy(np.memmap(path, dtype=np_dtype, mode="c", offset=start, shape=shape))
    if torch_dtype == torch.bfloat16:
        features = features.view(torch.bfloat16)  # stored as raw bits: numpy has no bfloat16
    offsets = np.fromfile(path, dtype=np.int64, count=num_sentences + 1, offset=spans["offsets"][2])
    if offsets[0] != 0 or offsets[-1] != num_words or (np.diff(offsets) <= 0).any():
        raise CacheCorruptError(f"{path.name}: sentence offsets are not increasing from 0 to {num_words}")
    labels = (
        torch.from_numpy(np.fromfile(path, dtype=np.int64, count=num_words, offset=spans["labels"][2]))
        if "labels" in spans
        else torch.empty(0, dtype=torch.int64)
    )
    label_names = list(meta.get("label_names", []))
    return WordEmbeddings(features, labels, label_names, meta, key, path, hit=True, offsets=offsets)


# --------------------------------------------------------------------------- writing


@dataclass(frozen=True)
class _WordJob:
    """What one word entry is extracted from: its sentences, their tags (or None) and its new record."""

    key: str
    sentences: list[list[str]]
    labels: np.ndarray | None
    meta: EntryRecord


def _write_words(
    cache: EmbeddingCache, embedder: LayerEmbedder, job: _WordJob, options: WordOptions, progress: bool
) -> None:
    """Stream word vectors into a memmapped safetensors file of known size, then commit it atomically."""
    offsets = sentence_offsets([len(words) for words in job.sentences])
    num_words = int(offsets[-1])
    shape = (num_words, embedder.num_layers, embedder.hidden_size)  # from the config, no weights

    def fill(features: np.memmap) -> None:
        batches = embedder.iter_word_batches(job.sentences, options.word_pooling, options.window_overlap, progress)
        for rows, pooled in batches:
            features[rows] = storable(pooled, options.storage_dtype)

    def describe(seconds: float, size: int) -> dict[str, object]:
        return {
            "num_sentences": len(job.sentences),
            "num_words": num_words,
            "words_per_second": round(num_words / max(seconds, 1e-9), 2),
            "bytes_per_word": round(size / max(num_words, 1), 1),
        }

    after = (("offsets", offsets),) + (() if job.labels is None else (("labels", job.labels),))
    layout = EntryLayout(job.key, shape, options.storage_dtype, after, describe, header={"entry": "words"})
    cache.write_entry(layout, embedder, fill, job.meta)


def _get_or_extract(
    cache: EmbeddingCache, source: ModelSource, job: _WordJob, options: WordOptions, progress: bool
) -> WordEmbeddings:
    def build() -> None:
        embedder = cache.embedder(source, options.extraction())
        _write_words(cache, embedder, job, options, progress)

    return cache.get_or_build(job.key, lambda key: _read_words(cache, key), build, progress)


def word_entry_key(
    cache: EmbeddingCache, source: ModelSource, where: tuple[str, str, str], options: WordOptions
) -> str:
    """The cache key of the word entry of ``where`` = (task, split, fingerprint), computed without reading or
    writing the cache."""
    task, split, fingerprint = where
    return cache.key(
        model_identity=source.identity,
        task=task,
        split=split,
        fingerprint=fingerprint,
        max_length=options.max_length,
        storage_dtype=options.storage_dtype,
        extra=options.key_fields(),
    )


def _new_job(
    cache: EmbeddingCache,
    source: ModelSource,
    where: tuple[str, str, str],
    data: tuple[list[list[str]], np.ndarray | None],
    options: WordOptions,
) -> _WordJob:
    """The key and record of a word entry for ``where`` = (task, split, fingerprint) and ``data`` =
    (sentences, labels or None)."""
    sentences, labels = data
    key = word_entry_key(cache, source, where, options)
    meta = cache.entry_meta(key, source, where, options.extraction())
    del meta["pooling"]  # words are not pooled over a text: word_pooling says how they are made
    meta.update(options.key_fields(), labelled=labels is not None)
    return _WordJob(key, sentences, labels, meta)


# --------------------------------------------------------------------------- public


def get_or_extract_words(
    cache: EmbeddingCache,
    model: str | PathLike | ModelSource,
    task: PathLike | TaskData,
    split: str,
    options: WordOptions = WordOptions(),
    *,
    data_dir: PathLike | None = None,
    progress: bool = True,
) -> WordEmbeddings:
    """One split of a tagging task as word vectors: read from ``cache``, or extracted once (under the
    entry's lock) and stored. ``task`` is a :class:`~ilge_search.tasks.core.TaskData` or anything
    :func:`~ilge_search.tasks.core.load_task` accepts; it, the options and the model are checked first."""
    task_data = load_task(task, data_dir)
    if task_data.kind != "tagging":
        raise TaskError(
            f"{task_data.name!r} is a {task_data.kind} task: word vectors are for tagging tasks; "
            f"use EmbeddingCache.get_or_extract for one vector per text"
        )
    part = task_data.split(split)
    assert part.sentences is not None  # a tagging split always has them
    source = cache.resolve(model)
    job = _new_job(
        cache,
        source,
        (task_data.name, split, task_data.fingerprint(split)),
        (part.sentences, part.labels.astype(np.int64)),
        options,
    )
    job.meta.update(kind="tagging", task_source=task_data.source, label_names=task_data.label_names)
    return _get_or_extract(cache, source, job, options, progress)


def get_or_extract_sentences(
    cache: EmbeddingCache,
    model: str | PathLike | ModelSource,
    sentences: Sequence[Sequence[str]],
    options: WordOptions = WordOptions(),
    *,
    progress: bool = True,
) -> WordEmbeddings:
    """Word vectors of sentences without tags (``labels`` empty), cached by a fingerprint of the
    sentences, so the same sentences never go through the model twice."""
    checked = check_sentences(sentences)
    source = cache.resolve(model)
    fingerprint = sentences_fingerprint(checked)
    job = _new_job(cache, source, (_SENTENCES_TASK, "sentences", fingerprint), (checked, None), options)
    job.meta.update(kind="sentences", label_names=[])
    return _get_or_extract(cache, source, job, options, progress)


def load_word_embeddings(
    model: str | PathLike | ModelSource,
    task: PathLike | TaskData,
    *,
    data_dir: PathLike | None = None,
    cache_dir: PathLike | None = None,
    splits: Sequence[str] | None = None,
    options: WordOptions = WordOptions(),
    progress: bool = True,
) -> TaskWordEmbeddings:
    """Every requested split (default: all) of a tagging task as word vectors, for one model.

    The task, options and model name are checked first; missing splits are then extracted
    with one model load, released before returning.
    """
    task_data = load_task(task, data_dir)
    with EmbeddingCache(cache_dir) as cache:
        source = cache.resolve(model)

        def entry(split: str) -> WordEmbeddings:
            return get_or_extract_words(cache, source, task_data, split, options, progress=progress)

        return TaskEmbeddings.gather(task_data, splits, source, entry)
