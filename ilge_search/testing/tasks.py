"""Small made-up tasks written as JSONL files, in a custom task folder or a data dir's shared layout.

Their texts are unique word sequences from :data:`VOCABULARY` (the tiny
model's whole vocabulary, so it tokenizes them without unknown words); labels
are balanced. A task written under a registered name in a data dir
(``write_task(data_dir / "trec", ...)``) is read as that registered task, with
its metric and kind; anywhere else the folder is a custom task named after it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["VOCABULARY", "SyntheticTask", "write_task"]

VOCABULARY: tuple[str, ...] = tuple(
    [
        "river",
        "stone",
        "cloud",
        "lamp",
        "garden",
        "violin",
        "harbour",
        "pencil",
        "meadow",
        "copper",
        "lantern",
        "orchard",
        "candle",
        "forest",
        "marble",
        "saddle",
        "pepper",
        "island",
        "ribbon",
        "thunder",
        "velvet",
        "anchor",
        "basket",
        "cedar",
        "falcon",
        "glacier",
        "hammer",
        "ivory",
        "jasmine",
        "kettle",
        "lemon",
        "mirror",
        "nutmeg",
        "olive",
        "parrot",
        "quartz",
        "raven",
        "silver",
        "tulip",
        "umbrella",
        "walnut",
        "yarrow",
        "zephyr",
        "amber",
        "bramble",
        "cobalt",
        "dune",
        "ember",
        "fern",
        "granite",
        "heron",
        "indigo",
        "juniper",
        "kelp",
        "lilac",
        "maple",
        "nectar",
        "onyx",
        "pebble",
        "quill",
        "rustle",
    ]
)
SPLIT_NAMES = ("train", "validation", "test")


@dataclass(frozen=True)
class SyntheticTask:
    """What to write: ``kind`` (``classification`` or ``similarity``), ``num_labels`` classes named
    ``label_0`` ... (classification), ``sizes`` of the train, validation and test splits (0 leaves a split
    out: a zero-shot task has only test), ``seed`` for the texts and scores, and ``words`` per text."""

    kind: str = "classification"
    num_labels: int = 3
    sizes: tuple[int, int, int] = (90, 45, 45)
    seed: int = 0
    words: int = 6

    def __post_init__(self) -> None:
        if self.kind not in ("classification", "similarity"):
            raise ValueError(f"kind must be 'classification' or 'similarity', got {self.kind!r}")
        if self.kind == "classification" and self.num_labels < 2:
            raise ValueError(f"a classification task needs 2 or more labels, got {self.num_labels}")
        if len(self.sizes) != 3 or min(self.sizes) < 0 or sum(self.sizes) == 0:
            raise ValueError(f"sizes must be (train, validation, test), none below 0, got {self.sizes}")

    @property
    def label_names(self) -> list[str]:
        return [f"label_{index}" for index in range(self.num_labels)]


def _unique_texts(count: int, start: int, words: int, rng: np.random.Generator) -> list[str]:
    """``count`` texts; the first three words spell the text's number, so no two texts are equal."""
    base = len(VOCABULARY)
    texts = []
    for number in range(start, start + count):
        digits = [VOCABULARY[(number // base**power) % base] for power in (2, 1, 0)]
        filler = [VOCABULARY[index] for index in rng.integers(0, base, max(0, words - 3))]
        texts.append(" ".join(digits + filler))
    return texts


def _rows(task: SyntheticTask, count: int, start: int, rng: np.random.Generator) -> list[dict]:
    if task.kind == "classification":
        texts = _unique_texts(count, start, task.words, rng)
        labels = [task.label_names[(start + index) % task.num_labels] for index in range(count)]
        return [{"text": text, "label": label} for text, label in zip(texts, labels, strict=True)]
    sentences = _unique_texts(2 * count, 2 * start, task.words, rng)
    # steps of 0.2 from 0 to 5, both ends in every split: the scale a model derives from its training scores
    scores = np.round(0.2 * rng.integers(0, 26, count), 1)
    scores[: min(2, count)] = [0.0, 5.0][: min(2, count)]
    return [
        {"sentence1": sentences[2 * index], "sentence2": sentences[2 * index + 1], "score": float(scores[index])}
        for index in range(count)
    ]


def write_task(folder: str | os.PathLike[str], task: SyntheticTask | None = None) -> Path:
    """Write ``task``'s splits as ``<split>.jsonl`` into ``folder`` (created) and return the folder."""
    task = task or SyntheticTask()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(task.seed)
    start = 0
    for split, size in zip(SPLIT_NAMES, task.sizes, strict=True):
        if size == 0:
            continue
        rows = _rows(task, size, start, rng)
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        start += size
    return folder
