"""The task registry: how each named task is found and read (:class:`TaskSpec`, :data:`TASKS`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .files import TaskError

__all__ = ["KINDS", "SPLITS", "TASKS", "TaskSpec", "get_task_spec", "list_tasks"]

SPLITS = ("train", "validation", "test")
KINDS = ("classification", "similarity", "tagging")


@dataclass(frozen=True)
class TaskSpec:
    """How to find and read one task.

    Attributes:
        name: registry name (``banking77``); custom tasks use the file or folder stem.
        kind: ``classification``, ``similarity`` (sentence pairs with a score) or ``tagging``
            (sentences of words, one tag per word).
        metric: ``accuracy`` (of texts, or of words for tagging) or ``spearman`` (of the cosine similarity).
        hf_dataset / hf_config: Hugging Face dataset id and config for online users.
        text_col / label_col: classification columns of the online source.
        text_cols / score_col: similarity columns of the online source.
        tokens_col / tags_col: tagging columns (a list of words and a list of tags per row).
        local_name: folder under the data dir (``sick`` for ``sick_r``); None for online-only.
        splits: the splits the source provides.
        zero_shot_of: evaluated zero-shot with the encoder trained on this task (``stsb``).
        description: one line for listings.
    """

    name: str
    kind: str
    metric: str
    hf_dataset: str | None = None
    hf_config: str | None = None
    text_col: str = "text"
    label_col: str = "label"
    text_cols: tuple[str, str] = ("sentence1", "sentence2")
    score_col: str = "score"
    tokens_col: str = "tokens"
    tags_col: str = "tags"
    local_name: str | None = None
    splits: tuple[str, ...] = SPLITS
    zero_shot_of: str | None = None
    description: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {list(KINDS)}, got {self.kind!r}")


_TEXTS = TaskSpec("", "classification", "accuracy")
# Similarity: trained on STS-B, the rest zero-shot with the STS-B encoder.
_PAIRS = TaskSpec("", "similarity", "spearman", splits=("test",), zero_shot_of="stsb")


def _task(base: TaskSpec, name: str, hf_dataset: str, description: str, **changes: Any) -> TaskSpec:
    """``base`` (:data:`_TEXTS` or :data:`_PAIRS`) as the task ``name`` of the Hugging Face dataset ``hf_dataset``."""
    return replace(base, name=name, hf_dataset=hf_dataset, description=description, **changes)


TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in [
        # The paper's classification tasks (MTEB versions; label_text holds the names).
        _task(
            _TEXTS,
            "banking77",
            "mteb/banking77",
            "banking intents, 77 classes",
            label_col="label_text",
            local_name="banking77",
            splits=("train", "test"),
        ),
        _task(
            _TEXTS,
            "emotion",
            "mteb/emotion",
            "emotion of English tweets (CARER), 6 classes",
            label_col="label_text",
            local_name="emotion",
        ),
        _task(
            _TEXTS,
            "mtop_domain",
            "mteb/mtop_domain",
            "MTOP domains (en), 11 classes",
            hf_config="en",
            label_col="label_text",
        ),
        _task(
            _TEXTS,
            "mtop_intent",
            "mteb/mtop_intent",
            "MTOP intents (en), 113 classes",
            hf_config="en",
            label_col="label_text",
        ),
        _task(
            _TEXTS,
            "poem_sentiment",
            "google-research-datasets/poem_sentiment",
            "sentiment of poem verses",
            text_col="verse_text",
        ),
        # More classification tasks with local copies.
        _task(
            _TEXTS,
            "trec",
            "CogComp/trec",
            "question type (coarse), 6 classes",
            label_col="coarse_label",
            local_name="trec",
            splits=("train", "test"),
        ),
        _task(
            _TEXTS, "sst2", "SetFit/sst2", "binary movie-review sentiment", label_col="label_text", local_name="sst2"
        ),
        _task(
            _TEXTS,
            "tweeteval_emotion",
            "cardiffnlp/tweet_eval",
            "TweetEval emotion, 4 classes",
            hf_config="emotion",
            local_name="tweeteval_emotion",
        ),
        _task(
            _PAIRS,
            "stsb",
            "mteb/stsbenchmark-sts",
            "STS benchmark, scores 0-5",
            local_name="stsb",
            splits=SPLITS,
            zero_shot_of=None,
        ),
        _task(_PAIRS, "sts12", "mteb/sts12-sts", "SemEval STS 2012, zero-shot", splits=("train", "test")),
        *(
            _task(_PAIRS, f"sts{year}", f"mteb/sts{year}-sts", f"SemEval STS 20{year}, zero-shot")
            for year in (13, 14, 15, 16)
        ),
        _task(_PAIRS, "biosses", "mteb/biosses-sts", "biomedical sentence similarity, zero-shot"),
        _task(_PAIRS, "sick_r", "mteb/sickr-sts", "SICK relatedness, zero-shot", local_name="sick"),
        # Token tasks: one tag per word; read from the data dir only (no download source).
        TaskSpec(
            name="ud_ewt_pos",
            kind="tagging",
            metric="accuracy",
            local_name="ud_ewt_pos",
            description="part-of-speech tags (UPOS) of UD English-EWT words, 17 tags",
        ),
    ]
}


def list_tasks() -> list[str]:
    """Registered task names, sorted."""
    return sorted(TASKS)


def get_task_spec(name: str) -> TaskSpec:
    """The registered spec; unknown names raise :class:`TaskError` listing the known ones."""
    key = name.strip().lower().replace("-", "_")
    if key in TASKS:
        return TASKS[key]
    raise TaskError(
        f"unknown task {name!r}. Known tasks: {', '.join(list_tasks())}. "
        f"For your own data pass a path to a CSV/TSV/JSONL/Parquet file or a folder of "
        f"split files (train/validation/test) with --text-col/--label-col."
    )
