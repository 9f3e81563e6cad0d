"""What studies of tagging tasks need beyond the sequence path: their checks and the dry run's calibration data.

A tagging study's arrays are word entries (``(word features, sentence offsets)``, one tag id per word);
its split sizes and caps count sentences. Everything else -- trials, pruning, selection rules, final
seeds, workers -- is the same code as for a sequence task.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ..engine.core import Dataset
    from ..engine.metrics import ArrayLike
    from ..tasks.core import TaskData
    from .data import Features
    from .options import StudyOptions

__all__ = ["CALIBRATION_SENTENCES", "check_tagging_options", "rows_of", "head", "tagging_calibration_data"]

CALIBRATION_SENTENCES = 128  # training sentences a dry run times a tagging config on (scaled to the split)


def check_tagging_options(task_data: TaskData, encoders: Sequence[str], options: StudyOptions) -> None:
    """What a tagging study cannot do, and the tagging-only encoders on other tasks: one line each."""
    from ..encoders.configs import TAGGER_FAMILIES

    if task_data.kind != "tagging":
        wrong = [name for name in encoders if name in TAGGER_FAMILIES]
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


def tagging_calibration_data(
    check: Any, plan: Any, sentences: int, time_extraction: Callable[[], tuple[int, int]]
) -> tuple[Dataset, Dataset, str]:
    """Training and validation sentences to time epochs on: the first of the cached word entries, or random
    word vectors with the task's own sentence lengths after ``time_extraction`` (which loads the model)."""
    import numpy as np
    import torch

    splits = check.task_data.splits
    fraction = sentences / max(1, plan.split_sizes["train"])
    counts = {
        "train": sentences,
        "validation": max(1, min(plan.split_sizes["validation"], round(plan.split_sizes["validation"] * fraction))),
    }
    if plan.cached["train"] and plan.cached["validation"]:
        from ..embeddings.word_cache import WordOptions, load_word_embeddings

        entries = load_word_embeddings(
            check.spec.model_or_source,
            check.task_data,
            data_dir=check.spec.data_dir,
            cache_dir=check.spec.cache_dir,
            splits=["train", "validation"],
            options=WordOptions(word_pooling=check.spec.word_pooling, device=check.spec.device),
            progress=False,
        )
        plan.num_layers, plan.hidden_size = int(entries.num_layers), int(entries.hidden_size)
        parts = {name: head((entries[name], entries[name].labels), counts[name]) for name in counts}
        return parts["train"], parts["validation"], "cached word vectors"
    layers, width = time_extraction()
    plan.num_layers, plan.hidden_size = layers, width
    generator = torch.Generator().manual_seed(0)
    parts = {}
    for name, count in counts.items():
        split = splits[name]
        offsets = np.asarray(split.word_offsets[: count + 1], dtype=np.int64)
        words = int(offsets[-1])
        features = torch.randn((words, layers, width), generator=generator).half()
        parts[name] = ((features, offsets), torch.from_numpy(np.asarray(split.labels[:words], dtype=np.int64)))
    timing = "after timing the extraction" if plan.extraction_timed else "with the extraction estimated, not timed"
    how = f"random word vectors of the model's shape {timing} ({plan.texts_to_embed} sentences)"
    return parts["train"], parts["validation"], how
