"""Task registry and loading: the paper's tasks, a few more, and custom files.

Every task loads into a :class:`TaskData`: splits of texts (or sentence pairs, or for a
tagging task sentences of words) with integer label ids (or float scores, or one tag id
per word), label names sorted so that ids are stable, and a content fingerprint per split
for cache keys. Every check (unknown task, missing files or columns, non-UTF-8 bytes,
empty texts, list or dict values, a single label, labels a split has but train lacks; for
tagging the checks of :mod:`ilge_search.tasks.tagging`) runs here, before any model is loaded.

Sources, in order: a registered task read from a local data dir in the shared layout
(``<data_dir>/<task>/{train,validation,test}.jsonl``), a registered task downloaded
with Hugging Face ``datasets`` (no data dir), or a custom task: a folder of split
files or a single CSV / TSV / JSONL / Parquet file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..settings import DATA_ENV, SHIPPED_DATA_DIR, registered_task_dir, resolve_data_dir
from ..validation import check_int
from .files import MAX_ROWS_LISTED, Table, TaskError, find_split_files, hub_unreachable, read_table
from .tagging import (
    TaggedRows,
    check_tagged_rows,
    check_tags_seen_in_train,
    refuse_other_kind_columns,
    sentence_offsets,
)

__all__ = [
    "TaskSpec",
    "TaskSplit",
    "TaskData",
    "TaskError",
    "TASKS",
    "list_tasks",
    "get_task_spec",
    "load_task",
    "subsample",
    "few_shot",
]

PathLike = str | os.PathLike
SPLITS = ("train", "validation", "test")
KINDS = ("classification", "similarity", "tagging")
_NOT_SCALAR = (list, tuple, dict, set, np.ndarray)
log = logging.getLogger(__name__)  # data warnings: one line each (the CLI shows them as they are)


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


def _classification(
    name: str,
    hf: str,
    description: str,
    *,
    config: str | None = None,
    text_col: str = "text",
    label_col: str = "label",
    local: str | None = None,
    splits: tuple[str, ...] = SPLITS,
) -> TaskSpec:
    return TaskSpec(
        name=name,
        kind="classification",
        metric="accuracy",
        hf_dataset=hf,
        hf_config=config,
        text_col=text_col,
        label_col=label_col,
        local_name=local,
        splits=splits,
        description=description,
    )


def _similarity(
    name: str,
    hf: str,
    description: str,
    *,
    local: str | None = None,
    splits: tuple[str, ...] = ("test",),
    zero_shot_of: str | None = "stsb",
) -> TaskSpec:
    return TaskSpec(
        name=name,
        kind="similarity",
        metric="spearman",
        hf_dataset=hf,
        local_name=local,
        splits=splits,
        zero_shot_of=zero_shot_of,
        description=description,
    )


TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in [
        # The paper's classification tasks (MTEB versions; label_text holds the names).
        _classification(
            "banking77",
            "mteb/banking77",
            "banking intents, 77 classes",
            label_col="label_text",
            local="banking77",
            splits=("train", "test"),
        ),
        _classification(
            "emotion",
            "mteb/emotion",
            "emotion of English tweets (CARER), 6 classes",
            label_col="label_text",
            local="emotion",
        ),
        _classification(
            "mtop_domain", "mteb/mtop_domain", "MTOP domains (en), 11 classes", config="en", label_col="label_text"
        ),
        _classification(
            "mtop_intent", "mteb/mtop_intent", "MTOP intents (en), 113 classes", config="en", label_col="label_text"
        ),
        _classification(
            "poem_sentiment",
            "google-research-datasets/poem_sentiment",
            "sentiment of poem verses",
            text_col="verse_text",
        ),
        # More classification tasks with local copies.
        _classification(
            "trec",
            "CogComp/trec",
            "question type (coarse), 6 classes",
            label_col="coarse_label",
            local="trec",
            splits=("train", "test"),
        ),
        _classification("sst2", "SetFit/sst2", "binary movie-review sentiment", label_col="label_text", local="sst2"),
        _classification(
            "tweeteval_emotion",
            "cardiffnlp/tweet_eval",
            "TweetEval emotion, 4 classes",
            config="emotion",
            local="tweeteval_emotion",
        ),
        # Similarity: trained on STS-B, the rest zero-shot with the STS-B encoder.
        _similarity(
            "stsb", "mteb/stsbenchmark-sts", "STS benchmark, scores 0-5", local="stsb", splits=SPLITS, zero_shot_of=None
        ),
        _similarity("sts12", "mteb/sts12-sts", "SemEval STS 2012, zero-shot", splits=("train", "test")),
        _similarity("sts13", "mteb/sts13-sts", "SemEval STS 2013, zero-shot"),
        _similarity("sts14", "mteb/sts14-sts", "SemEval STS 2014, zero-shot"),
        _similarity("sts15", "mteb/sts15-sts", "SemEval STS 2015, zero-shot"),
        _similarity("sts16", "mteb/sts16-sts", "SemEval STS 2016, zero-shot"),
        _similarity("biosses", "mteb/biosses-sts", "biomedical sentence similarity, zero-shot"),
        _similarity("sick_r", "mteb/sickr-sts", "SICK relatedness, zero-shot", local="sick"),
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


# ----------------------------------------------------------------------------- checking columns


def _refuse_non_scalar(table: Table, name: str, values: list, what: str) -> None:
    bad = [i for i, value in enumerate(values) if isinstance(value, _NOT_SCALAR)]
    if bad:
        kinds = sorted({type(values[i]).__name__ for i in bad})
        raise TaskError(
            f"{table.where}: column {name!r} holds {'/'.join(kinds)} values at row(s) {table.rows(bad)}; "
            f"each row needs one {what} (multi-label data is not supported). Use one value per row."
        )


def _check_texts(table: Table, name: str, option: str) -> list[str]:
    values = table.column(name, option)
    _refuse_non_scalar(table, name, values, "text")
    bad = [
        i
        for i, value in enumerate(values)
        if value is None or (isinstance(value, float) and math.isnan(value)) or not str(value).strip()
    ]
    if bad:
        raise TaskError(
            f"{table.where}: column {name!r} has {len(bad)} empty text(s) at row(s) "
            f"{table.rows(bad)}. Remove or fill those rows."
        )
    if values and all(isinstance(v, (int, float, np.number)) and not isinstance(v, bool) for v in values):
        raise TaskError(
            f"{table.where}: column {name!r} holds numbers only (e.g. {values[0]!r}), not texts; name the "
            f"text column with {option}"
        )
    return [str(value) for value in values]


def _check_labels(table: Table, name: str) -> list[str]:
    values = table.column(name, "--label-col")
    _refuse_non_scalar(table, name, values, "label")
    bad = [
        i
        for i, value in enumerate(values)
        if value is None or (isinstance(value, float) and math.isnan(value)) or str(value).strip() == ""
    ]
    if bad:
        raise TaskError(f"{table.where}: column {name!r} has {len(bad)} missing label(s) at row(s) {table.rows(bad)}.")
    # 3 and 3.0 are the same label; keep names readable.
    return [str(int(v)) if isinstance(v, float) and float(v).is_integer() else str(v) for v in values]


def _check_scores(table: Table, name: str) -> np.ndarray:
    values = table.column(name, "--score-col")
    scores = np.empty(len(values), dtype=np.float32)
    bad = []
    for i, value in enumerate(values):
        try:
            scores[i] = float(value)
        except (TypeError, ValueError):
            bad.append(i)
            continue
        if not math.isfinite(scores[i]):
            bad.append(i)
    if bad:
        raise TaskError(
            f"{table.where}: column {name!r} has {len(bad)} missing or non-numeric score(s) at "
            f"row(s) {table.rows(bad)}."
        )
    return scores


@dataclass
class _Columns:
    kind: str
    text_col: str = "text"
    label_col: str = "label"
    text_cols: tuple[str, str] = ("sentence1", "sentence2")
    score_col: str = "score"
    tokens_col: str = "tokens"
    tags_col: str = "tags"


def _sorted_label_names(names: Sequence[str]) -> list[str]:
    unique = set(names)
    if all(re.fullmatch(r"-?\d+", name) for name in unique):
        return sorted(unique, key=int)
    return sorted(unique)


def _build_task(
    spec: TaskSpec, tables: dict[str, Table], cols: _Columns, source: str, val_fraction: float, seed: int
) -> TaskData:
    """Validate every split's columns, map labels to ids, carve validation if needed."""
    if cols.kind == "tagging":
        task = _tagging_task(spec, tables, cols, source)
    elif cols.kind == "similarity":
        splits = {}
        for name, table in tables.items():
            a = _check_texts(table, cols.text_cols[0], "--text-cols")
            b = _check_texts(table, cols.text_cols[1], "--text-cols")
            splits[name] = TaskSplit(
                name, labels=_check_scores(table, cols.score_col), pairs=list(zip(a, b, strict=True))
            )
        task = TaskData(spec=spec, splits=splits, label_names=[], source=source)
    else:
        texts = {name: _check_texts(table, cols.text_col, "--text-col") for name, table in tables.items()}
        names = {name: _check_labels(table, cols.label_col) for name, table in tables.items()}
        reference = "train" if "train" in names else next(iter(names))
        label_names = _sorted_label_names(names[reference])
        if len(label_names) < 2:
            raise TaskError(
                f"{tables[reference].where}: every row has the label {label_names[0]!r}; a "
                f"classifier needs at least two labels. Check --label-col or add rows of other labels."
            )
        ids = {label: i for i, label in enumerate(label_names)}
        for name, split_names in names.items():
            unseen = sorted(set(split_names) - ids.keys())
            if unseen:
                count = sum(1 for label in split_names if label not in ids)
                raise TaskError(
                    f"{tables[name].where}: {count} row(s) of split {name!r} have label(s) that the {reference} "
                    f"split does not have: {', '.join(map(repr, unseen[:MAX_ROWS_LISTED]))}"
                    f"{' ...' if len(unseen) > MAX_ROWS_LISTED else ''}. A classifier cannot predict labels "
                    f"it never saw; fix the files or drop those rows."
                )
        splits = {
            name: TaskSplit(
                name, labels=np.array([ids[label] for label in names[name]], dtype=np.int64), texts=texts[name]
            )
            for name in tables
        }
        task = TaskData(spec=spec, splits=splits, label_names=label_names, source=source)
    if "validation" not in task.splits and "train" in task.splits:
        task = _carve_validation(task, val_fraction, seed)
    order = [s for s in SPLITS if s in task.splits] + [s for s in task.splits if s not in SPLITS]
    task.splits = {name: task.splits[name] for name in order}
    _warn_test_in_train(task)
    return task


def _tagging_task(spec: TaskSpec, tables: dict[str, Table], cols: _Columns, source: str) -> TaskData:
    """Sentences of words with one tag id per word; tag names sorted as label names are."""
    rows: dict[str, TaggedRows] = {
        name: check_tagged_rows(table, cols.tokens_col, cols.tags_col) for name, table in tables.items()
    }
    reference = "train" if "train" in rows else next(iter(rows))
    tag_names = _sorted_label_names([tag for tags in rows[reference].tags for tag in tags])
    if len(tag_names) < 2:
        raise TaskError(
            f"{rows[reference].where}: every word has the tag {tag_names[0]!r}; a tagger needs at least two "
            f"tags. Check --tags-col or add sentences with other tags."
        )
    check_tags_seen_in_train({name: part for name, part in rows.items() if name != reference}, tag_names)
    ids = {tag: i for i, tag in enumerate(tag_names)}
    splits = {
        name: TaskSplit(
            name,
            labels=np.array([ids[tag] for tags in part.tags for tag in tags], dtype=np.int64),
            sentences=part.sentences,
        )
        for name, part in rows.items()
    }
    return TaskData(spec=spec, splits=splits, label_names=tag_names, source=source)


_WARNED: set = set()  # (source, warning) pairs already shown by this process
_QUIET = {"data warnings": False}


def quiet_data_warnings() -> None:
    """Show no warning about task data from now on in this process. A study's worker process calls it: the
    process that started it loaded the same data first and showed them, so a run says each once."""
    _QUIET["data warnings"] = True


def _warn_once(task: TaskData, message: str) -> None:
    if _QUIET["data warnings"]:
        return
    if (task.source, message) not in _WARNED:
        _WARNED.add((task.source, message))
        log.warning(message)


def _warn_test_in_train(task: TaskData) -> None:
    """Test rows whose text (or sentence pair) is also in train: counted, and warned about."""
    if "train" not in task.splits or "test" not in task.splits:
        return
    train, test = (
        [tuple(words) for words in part.sentences]
        if part.sentences is not None
        else list(part.pairs if part.pairs is not None else part.texts or [])
        for part in (task.splits["train"], task.splits["test"])
    )
    seen: set = set(train)
    duplicated = sum(1 for row in test if row in seen)
    if duplicated:
        _warn_once(
            task,
            f"warning: task {task.name!r}: {duplicated} of {len(test)} test rows also appear in train "
            f"(same text); their score measures memory, not generalisation. Remove them from one "
            f"of the two splits for a clean test score.",
        )


def _stratified_pick(labels: np.ndarray, count_for: Any, rng: np.random.Generator) -> np.ndarray:
    """For each label value (sorted), ``count_for(n_label)`` random positions; sorted result."""
    picked = []
    for value in np.unique(labels):
        positions = np.flatnonzero(labels == value)
        k = int(count_for(len(positions)))
        if k > 0:
            picked.append(rng.permutation(positions)[:k])
    return np.sort(np.concatenate(picked)) if picked else np.empty(0, dtype=np.int64)


def _carve_validation(task: TaskData, fraction: float, seed: int) -> TaskData:
    """Move a seeded ``fraction`` of train (stratified by label for classification) to validation."""
    if not 0.0 < fraction < 1.0:
        raise TaskError(f"val_fraction must be between 0 and 1, got {fraction!r}")
    train = task.splits["train"]
    rng = np.random.default_rng(seed)
    if task.kind == "classification":
        # Every label keeps at least one training example.
        val_idx = _stratified_pick(train.labels, lambda n: min(round(fraction * n), n - 1), rng)
    else:
        val_idx = np.sort(rng.permutation(len(train))[: round(fraction * len(train))])
    if len(val_idx) == 0:
        raise TaskError(
            f"task {task.name!r}: train has only {len(train)} rows, too few to carve a "
            f"{fraction:.0%} validation split; add a validation file."
        )
    keep = np.setdiff1d(np.arange(len(train)), val_idx)
    splits = dict(task.splits)
    splits["train"] = train.subset(keep)
    splits["validation"] = replace(train.subset(val_idx), name="validation")
    return replace(task, splits=splits)


# ----------------------------------------------------------------------------- sources


def _load_local_registered(spec: TaskSpec, data_dir: Path, cols: _Columns, val_fraction: float, seed: int) -> TaskData:
    folder = data_dir / spec.local_name if spec.local_name else None
    if folder is None or not folder.is_dir():
        present = sorted(p.name for p in data_dir.iterdir() if p.is_dir()) if data_dir.is_dir() else []
        where = (
            f"{data_dir} (it has: {', '.join(present) or 'nothing'})"
            if data_dir.is_dir()
            else f"{data_dir}, which does not exist"
        )
        download = (
            f", or unset --data-dir/${DATA_ENV} to download {spec.hf_dataset!r} with the `datasets` library"
            if spec.hf_dataset
            else " (this task has no download source)"
        )
        hint = f"Put {spec.local_name or spec.name}/train.jsonl and test.jsonl there{download}."
        raise TaskError(f"task {spec.name!r} is not in the data dir {where}. {hint}")
    files = find_split_files(folder)
    wanted = ("test",) if spec.zero_shot_of else ("train", "test")
    missing = [s for s in wanted if s not in files]
    if missing:
        raise TaskError(
            f"task {spec.name!r}: {folder} lacks the split file(s) "
            f"{', '.join(f'{s}.jsonl' for s in missing)} (found: "
            f"{', '.join(p.name for p in files.values()) or 'none'})."
        )
    if spec.zero_shot_of:  # evaluated on test only
        files = {"test": files["test"]}
    tables = {split: read_table(path) for split, path in files.items()}
    return _build_task(spec, tables, cols, str(folder), val_fraction, seed)


def _load_online(spec: TaskSpec, cols: _Columns, val_fraction: float, seed: int) -> TaskData:
    offline_hint = (
        f"Pass --data-dir (or set ${DATA_ENV}) to a folder with {spec.local_name or spec.name}/"
        f"train.jsonl and test.jsonl in the shared layout."
    )
    if spec.hf_dataset is None:
        raise TaskError(f"task {spec.name!r} has no download source and no data dir. {offline_hint}")
    try:
        import datasets
    except ImportError as exc:
        raise TaskError(
            f"task {spec.name!r} has no data dir, and downloading {spec.hf_dataset!r} needs the "
            f"`datasets` library (pip install datasets). {offline_hint}"
        ) from exc
    unreachable = hub_unreachable()
    if unreachable is not None:
        raise TaskError(
            f"task {spec.name!r} loads {spec.hf_dataset!r} from the Hugging Face hub, which cannot be reached "
            f"({unreachable}). {offline_hint}"
        )
    try:
        loaded = datasets.load_dataset(spec.hf_dataset, spec.hf_config)
    except Exception as exc:  # offline, missing dataset, ...
        raise TaskError(
            f"could not load {spec.hf_dataset!r} from the Hugging Face hub "
            f"({type(exc).__name__}: {exc}). {offline_hint}"
        ) from exc
    tables = {}
    for split in SPLITS:
        if split not in loaded:
            continue
        part = loaded[split]
        columns = {name: part[name] for name in part.column_names}
        feature = part.features.get(cols.label_col)
        if cols.kind == "classification" and hasattr(feature, "int2str") and cols.label_col in columns:
            columns[cols.label_col] = [feature.int2str(int(v)) for v in columns[cols.label_col]]
        tables[split] = Table(columns, f"{spec.hf_dataset} [{split}]", first_row=1)
    if "test" not in tables:
        raise TaskError(f"{spec.hf_dataset!r} has no test split (it has {list(loaded)}).")
    if spec.zero_shot_of:
        tables = {"test": tables["test"]}
    return _build_task(spec, tables, cols, f"hf:{spec.hf_dataset}", val_fraction, seed)


def _custom_columns(sample: Table, given: _ColumnOptions) -> _Columns:
    text_col, label_col, text_cols, score_col = given.text_col, given.label_col, given.text_cols, given.score_col
    tokens_col, tags_col = given.tokens_col, given.tags_col
    sequence = dict(text_col=text_col, label_col=label_col, text_cols=text_cols, score_col=score_col)
    present = sample.columns.keys()
    if tokens_col is not None or tags_col is not None:
        if any(option is not None for option in sequence.values()):
            raise TaskError(
                f"{sample.where}: --tokens-col/--tags-col are for a token task (a list of words and a list of tags "
                "per row), --text-col/--label-col/--text-cols/--score-col for a text task; drop one kind"
            )
        cols = _Columns("tagging", tokens_col=tokens_col or "tokens", tags_col=tags_col or "tags")
        text_layout = "text" in present or {"sentence1", "sentence2"} <= present
        if text_layout and not {cols.tokens_col, cols.tags_col} <= present:  # a text file given token options
            kind = "classification" if "text" in present else "similarity"
            refuse_other_kind_columns(sample.where, kind, dict(tokens_col=tokens_col, tags_col=tags_col))
        return cols
    if all(option is None for option in sequence.values()):
        if {"tokens", "tags"} <= present:
            return _Columns("tagging")
        lists = [name for name, values in sample.columns.items() if isinstance(values[0], (list, tuple))]
        if lists and "text" not in present and not {"sentence1", "sentence2"} <= present:
            raise TaskError(
                f"{sample.where} has neither the columns tokens/tags nor text (columns present: "
                f"{', '.join(map(str, present))}); its columns {', '.join(lists)} hold lists: for a token task "
                "pass --tokens-col and --tags-col, for a text task --text-col and --label-col"
            )
    # a token file given a text task's options: the tokens/tags columns beside no such text column, or the
    # text column and the label column (absent: no text task either) holding lists
    named = list(text_cols) if text_cols is not None else [text_col or "text"]
    target = (label_col or "label") if text_cols is None else (score_col or "score")
    listed = {name for name in present if isinstance(sample.columns[name][0], (list, tuple))}
    words_as_text = bool(listed & set(named)) and (target in listed or target not in present)
    if words_as_text or ({"tokens", "tags"} <= present and not set(named) <= present):
        refuse_other_kind_columns(sample.where, "tagging", sequence)
    if text_cols is not None:
        if len(text_cols) != 2:
            raise TaskError(f"text_cols needs exactly two column names, got {list(text_cols)}")
        return _Columns("similarity", text_cols=(text_cols[0], text_cols[1]), score_col=score_col or "score")
    if text_col is None and label_col is None and {"sentence1", "sentence2"} <= sample.columns.keys():
        return _Columns("similarity", score_col=score_col or "score")
    if score_col is not None:
        raise TaskError(
            "score_col is for sentence pairs; also pass text_cols (two columns), e.g. --text-cols sentence1,sentence2"
        )
    return _Columns("classification", text_col=text_col or "text", label_col=label_col or "label")


def _load_custom(path: Path, given: _ColumnOptions, val_fraction: float, seed: int) -> TaskData:
    if path.is_dir():
        files = find_split_files(path)
        if "train" not in files:
            present = sorted(p.name for p in path.iterdir())
            raise TaskError(
                f"{path} has no train file (train.jsonl/.csv/.tsv/.parquet); it has: "
                f"{', '.join(present[:20]) or 'nothing'}."
            )
        tables = {split: read_table(file) for split, file in files.items()}
    else:
        tables = {"train": read_table(path)}
    cols = _custom_columns(tables["train"], given)
    spec = TaskSpec(
        name=path.stem if path.is_file() else path.name,
        kind=cols.kind,
        metric="spearman" if cols.kind == "similarity" else "accuracy",
        text_col=cols.text_col,
        label_col=cols.label_col,
        text_cols=cols.text_cols,
        score_col=cols.score_col,
        tokens_col=cols.tokens_col,
        tags_col=cols.tags_col,
        splits=tuple(tables),
        description=f"custom task from {path}",
    )
    return _build_task(spec, tables, cols, str(path), val_fraction, seed)


def load_task(
    name_or_path: str | os.PathLike | TaskData,
    data_dir: PathLike | None = None,
    *,
    text_col: str | None = None,
    label_col: str | None = None,
    text_cols: Sequence[str] | None = None,
    score_col: str | None = None,
    tokens_col: str | None = None,
    tags_col: str | None = None,
    val_fraction: float = 0.15,
    seed: int = 42,
) -> TaskData:
    """Load a registered task or a custom file/folder into a validated :class:`TaskData`.

    Args:
        name_or_path: a registered name (see :func:`list_tasks`), a folder of split files
            (``train``/``validation``/``test`` with suffix .jsonl/.csv/.tsv/.parquet), or one
            such file (it becomes ``train``; validation is carved from it).
        data_dir: local data in the shared layout; default ``$ILGE_SEARCH_DATA``; without one,
            registered tasks are downloaded with Hugging Face ``datasets``.
        text_col, label_col: classification columns (override the registered ones).
        text_cols, score_col: two text columns and a score column for sentence-pair tasks.
        tokens_col, tags_col: a tagging task's columns, one list of words and one list of tags per row
            (default ``tokens``/``tags``; a custom file with both columns is a tagging task).
        val_fraction, seed: where there is no validation split, a stratified, seeded
            ``val_fraction`` of train becomes one (whole sentences for tagging).

    Raises:
        TaskError: (a ValueError) unknown task, missing files or columns, empty texts,
            labels in validation/test that train lacks; for tagging also an empty sentence, a word that is
            not a non-empty string, or a row whose numbers of words and tags differ; column options of the
            other kind of task (``tokens_col``/``tags_col`` for a text task, the text options for a token
            task), naming the options to pass instead.
    """
    if isinstance(name_or_path, TaskData):
        return name_or_path
    options = _ColumnOptions(text_col, label_col, text_cols, score_col, tokens_col, tags_col)
    raw = os.fspath(name_or_path)
    path = Path(raw).expanduser()
    key = raw.strip().lower().replace("-", "_")
    if key in TASKS and not (path.exists() and os.sep in raw):
        return _load_registered(get_task_spec(key), data_dir, options, val_fraction, seed)
    if path.exists():
        return _load_custom(path, options, val_fraction, seed)
    get_task_spec(raw)  # raises the unknown-task error
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class _ColumnOptions:
    """The column names the caller of :func:`load_task` passed (``None``: not given)."""

    text_col: str | None = None
    label_col: str | None = None
    text_cols: Sequence[str] | None = None
    score_col: str | None = None
    tokens_col: str | None = None
    tags_col: str | None = None


def _load_registered(
    spec: TaskSpec, data_dir: PathLike | None, given: _ColumnOptions, val_fraction: float, seed: int
) -> TaskData:
    """A registered task from its local copy (the given, the environment's or the shipped data folder) or online."""
    refuse_other_kind_columns(spec.name, spec.kind, vars(given))  # the option names are load_task's
    local = registered_task_dir(spec.local_name, data_dir)
    # The shared local layout always uses text/label and sentence1/sentence2/score.
    registered = (spec.text_col, spec.label_col, spec.text_cols, spec.score_col)
    defaults = _Columns(spec.kind) if local is not None else _Columns(spec.kind, *registered)
    if given.text_cols is not None and len(given.text_cols) != 2:
        raise TaskError(f"text_cols needs exactly two column names, got {list(given.text_cols)}")
    cols = _Columns(
        spec.kind,
        given.text_col or defaults.text_col,
        given.label_col or defaults.label_col,
        (given.text_cols[0], given.text_cols[1]) if given.text_cols else defaults.text_cols,
        given.score_col or defaults.score_col,
        given.tokens_col or spec.tokens_col,
        given.tags_col or spec.tags_col,
    )
    if local is None:
        return _load_online(spec, cols, val_fraction, seed)
    task = _load_local_registered(spec, local, cols, val_fraction, seed)
    if resolve_data_dir(data_dir) is None:  # the shipped subset, not the full task: say so
        where = f"no --data-dir or ${DATA_ENV}, reading the shipped subset in {SHIPPED_DATA_DIR}"
        _warn_once(task, f"note: task {spec.name!r}: {where}; pass --data-dir for another copy")
    return task


# ----------------------------------------------------------------------------- subsets


def _pick(part: TaskSplit, kind: str, n: int, rng: np.random.Generator, stratified: bool) -> np.ndarray:
    if n >= len(part):
        return np.arange(len(part))
    if kind != "classification" or not stratified:
        return np.sort(rng.permutation(len(part))[:n])
    values, counts = np.unique(part.labels, return_counts=True)
    exact = counts * n / len(part)
    quota = np.floor(exact).astype(int)
    # Hand out the remainder by largest fractional part (ties broken at random, seeded).
    order = np.lexsort((rng.random(len(values)), -(exact - quota)))
    quota[order[: n - quota.sum()]] += 1
    return np.sort(
        np.concatenate(
            [rng.permutation(np.flatnonzero(part.labels == value))[:k] for value, k in zip(values, quota, strict=True)]
        )
    )


def subsample(
    task: TaskData,
    n: int | None = None,
    *,
    fraction: float | None = None,
    seed: int = 0,
    stratified: bool = True,
    splits: Sequence[str] | None = None,
) -> TaskData:
    """At most ``n`` examples (or a ``fraction``) of each split, stratified by label for
    classification; label ids and names are kept. ``splits`` limits which splits shrink.

    A classification train split left without some of its labels (``n`` below the number
    of labels) is logged as a one-line warning: those labels can never be predicted."""
    if (n is None) == (fraction is None):
        raise ValueError("pass exactly one of n (examples per split) or fraction")
    check_int("n", n, allow_none=True)
    if fraction is not None and not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    rng = np.random.default_rng(seed)
    new_splits = {}
    for name, part in task.splits.items():
        if splits is not None and name not in splits:
            new_splits[name] = part
            continue
        count = n if n is not None else max(1, round((fraction or 1.0) * len(part)))
        new_splits[name] = part.subset(_pick(part, task.kind, count, rng, stratified))
        labels = len(np.unique(part.labels))
        lost = labels - len(np.unique(new_splits[name].labels))
        if name == "train" and task.kind == "classification" and lost:
            _warn_once(
                task,
                f"warning: task {task.name!r}: {lost} of {labels} labels have no example among the "
                f"{len(new_splits[name])} training rows kept (--max-train {count}), so they can never "
                f"be predicted; use --max-train {labels} or more, or --shots.",
            )
    return replace(task, splits=new_splits)


def few_shot(task: TaskData, shots_per_label: int, *, seed: int = 0) -> TaskData:
    """Keep ``shots_per_label`` random training examples per label (all of a label that has
    fewer); validation and test are unchanged. Classification tasks only.

    ``shots_per_label`` above every label's count raises :class:`TaskError`: it would keep
    the whole train split under a few-shot name."""
    if task.kind == "tagging":
        raise TaskError(
            f"few-shot draws texts per label, but {task.name!r} tags words (a tagging task); drop --shots "
            f"and cap the training sentences with --max-train instead"
        )
    if task.kind != "classification":
        raise ValueError(f"few_shot needs a classification task; {task.name!r} is {task.kind}")
    check_int("shots_per_label", shots_per_label)
    rng = np.random.default_rng(seed)
    train = task.split("train")
    largest = int(np.bincount(train.labels).max()) if len(train) else 0
    if shots_per_label > largest:
        raise TaskError(
            f"shots_per_label={shots_per_label} (--shots) is more than any label of {task.name!r} has in "
            f"train (the largest has {largest}), so every training example would be kept and the "
            f"study would not be few-shot. Use --shots {largest} or fewer, or drop --shots."
        )
    keep = _stratified_pick(train.labels, lambda count: min(shots_per_label, count), rng)
    return replace(task, splits={**task.splits, "train": train.subset(keep)})
