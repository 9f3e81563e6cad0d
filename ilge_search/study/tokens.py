"""What studies of tagging tasks need beyond the sequence path: their checks and the dry run's calibration data.

A tagging study's arrays are word entries (``(word features, sentence offsets)``, one tag id per word);
its split sizes and caps count sentences. Everything else -- trials, pruning, selection rules, final
seeds, workers -- is the same code as for a sequence task.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..encoders import tagger_families

if TYPE_CHECKING:  # pragma: no cover
    from ..engine.core import Dataset
    from ..engine.metrics import ArrayLike
    from ..tasks.core import TaskData
    from .options import StudyOptions
    from .shapes import Features

__all__ = [
    "CALIBRATION_SENTENCES",
    "check_tagging_options",
    "rows_of",
    "head",
    "calibration_counts",
    "random_word_data",
]

CALIBRATION_SENTENCES = 128  # training sentences a dry run times a tagging config on (scaled to the split)


def check_tagging_options(task_data: TaskData, encoders: Sequence[str], options: StudyOptions) -> None:
    """What a tagging study cannot do, and the tagging-only encoders on other tasks: one line each."""

    if task_data.kind != "tagging":
        wrong = [name for name in encoders if name in tagger_families()]
        if wrong:
            raise ValueError(
                f"{', '.join(wrong)} reads each word of a tagging task; {task_data.name!r} is a "
                f"{task_data.kind} task: use cayley instead"
            )
        return
    if options.search.cv:
        raise ValueError(
            f"--cv folds texts by label; {task_data.name!r} tags words: drop --cv (trials are scored on validation)"
        )
    if options.final.protocol != "matched":
        raise ValueError(
            f"the paper protocol reads out one vector per text; {task_data.name!r} tags words: drop --protocol paper"
        )


def _is_words(pair: Dataset) -> bool:
    features = pair[0]
    return isinstance(features, tuple) or hasattr(features, "offsets")


def _parts(features: Features) -> tuple[Features, ArrayLike]:
    return (features.features, features.offsets) if hasattr(features, "offsets") else features


def rows_of(pair: Dataset) -> int:
    """Examples in a ``(features, labels)`` pair: sentences of a tagging set, else rows."""
    if _is_words(pair):
        return len(_parts(pair[0])[1]) - 1
    return len(pair[1])


def head(pair: Dataset, count: int) -> Dataset:
    """The first ``count`` examples (sentences of a tagging set) of a ``(features, labels)`` pair."""
    if not _is_words(pair):
        return pair[0][:count], pair[1][:count]
    features, offsets = _parts(pair[0])
    count = min(count, len(offsets) - 1)
    end = int(offsets[count])
    return (features[:end], offsets[: count + 1]), pair[1][:end]


def calibration_counts(split_sizes: Mapping[str, int], train: int) -> dict[str, int]:
    """Examples a dry run times epochs on: ``train`` training ones and the same share of validation."""
    validation = split_sizes["validation"]
    fraction = train / max(1, split_sizes["train"])
    return {"train": train, "validation": max(1, min(validation, round(validation * fraction)))}


def random_word_data(
    task_data: TaskData, counts: Mapping[str, int], layers: int, width: int
) -> tuple[Dataset, Dataset]:
    """Random word vectors of the model's shape with the task's own sentence lengths, to time epochs on."""

    generator = torch.Generator().manual_seed(0)
    parts = {}
    for name, count in counts.items():
        split = task_data.splits[name]
        offsets = np.asarray(split.word_offsets[: count + 1], dtype=np.int64)
        words = int(offsets[-1])
        features = torch.randn((words, layers, width), generator=generator).half()
        parts[name] = ((features, offsets), torch.from_numpy(np.asarray(split.labels[:words], dtype=np.int64)))
    return parts["train"], parts["validation"]
