"""A loaded task: its splits (:class:`TaskSplit`) and the task as a whole (:class:`TaskData`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .files import TaskError
from .registry import TaskSpec
from .tagging import sentence_offsets

__all__ = ["TaskData", "TaskSplit"]


@dataclass
class TaskSplit:
    """One split: ``texts`` (classification), ``pairs`` (similarity) or ``sentences`` (tagging), and
    ``labels``: int64 label ids, float32 scores for similarity, or for tagging one int64 tag id per word,
    sentence after sentence (sentence ``i``'s tags are ``labels[word_offsets[i]:word_offsets[i + 1]]``).
    Its length is the number of examples: texts, pairs or sentences."""

    name: str
    labels: np.ndarray
    texts: list[str] | None = None
    pairs: list[tuple[str, str]] | None = None
    sentences: list[list[str]] | None = None

    def __len__(self) -> int:
        return len(self.sentences) if self.sentences is not None else len(self.labels)

    @property
    def word_offsets(self) -> np.ndarray:
        """Tagging: ``(num_sentences + 1,)`` where each sentence's words start in ``labels``, then the end."""
        if self.sentences is None:
            raise ValueError(f"split {self.name!r} holds no sentences of words; word offsets are for tagging tasks")
        return sentence_offsets([len(words) for words in self.sentences])

    def flat_texts(self) -> list[str]:
        """The texts to embed: ``texts``, pairs interleaved ``[a0, b0, a1, b1, ...]``, or each sentence's
        words joined by single spaces (the text a tagging model reads)."""
        if self.pairs is not None:
            return [sentence for pair in self.pairs for sentence in pair]
        if self.sentences is not None:
            return [" ".join(words) for words in self.sentences]
        return list(self.texts or [])

    def subset(self, indices: Sequence[int] | np.ndarray) -> TaskSplit:
        """The rows at ``indices`` (in that order)."""
        rows = np.asarray(indices, dtype=np.int64)
        if self.sentences is not None:
            offsets = self.word_offsets
            kept = [self.labels[offsets[i] : offsets[i + 1]] for i in rows]
            labels = np.concatenate(kept) if kept else np.empty(0, dtype=np.int64)
            return TaskSplit(self.name, labels=labels, sentences=[self.sentences[i] for i in rows])
        return TaskSplit(
            name=self.name,
            labels=self.labels[rows],
            texts=[self.texts[i] for i in rows] if self.texts is not None else None,
            pairs=[self.pairs[i] for i in rows] if self.pairs is not None else None,
        )


@dataclass
class TaskData:
    """A loaded task: ``spec``, ``splits`` by name and ``label_names`` (id -> name).

    ``source`` says where it was read from (a folder, a file or ``hf:<dataset>``).
    """

    spec: TaskSpec
    splits: dict[str, TaskSplit]
    label_names: list[str] = field(default_factory=list)
    source: str = ""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

    def __getitem__(self, split: str) -> TaskSplit:
        return self.split(split)

    def split(self, name: str) -> TaskSplit:
        if name not in self.splits:
            raise TaskError(f"task {self.name!r} has no split {name!r}; it has {sorted(self.splits)}")
        return self.splits[name]

    def fingerprint(self, split: str) -> str:
        """sha256 of the split's content: kind, texts (or pairs, or sentences word by word), labels and
        label names."""
        part = self.split(split)
        digest = hashlib.sha256()
        digest.update(json.dumps({"kind": self.kind, "label_names": self.label_names, "n": len(part)}).encode())
        # a tagging sentence's words are kept apart (\x1f): ["New York"] and ["New", "York"] differ
        texts = ["\x1f".join(words) for words in part.sentences] if part.sentences is not None else part.flat_texts()
        for text in texts:
            digest.update(text.encode("utf-8"))
            digest.update(b"\x00")
        labels = part.labels.astype(np.float32 if self.kind == "similarity" else np.int64)
        digest.update(np.ascontiguousarray(labels).tobytes())
        return digest.hexdigest()

    def __repr__(self) -> str:
        sizes = ", ".join(f"{name}={len(part)}" for name, part in self.splits.items())
        return f"TaskData(name={self.name!r}, kind={self.kind!r}, splits=({sizes}), num_labels={self.num_labels})"
