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

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..settings import DATA_ENV, SHIPPED_DATA_DIR, registered_task_dir, resolve_data_dir
from ..validation import check_int
from .columns import Columns, TaskColumns, build_task, custom_columns
from .data import TaskData, TaskSplit
from .files import Table, TaskError, find_split_files, hub_unreachable, read_table
from .registry import SPLITS, TASKS, TaskSpec, get_task_spec, list_tasks
from .tagging import refuse_other_kind_columns

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
log = logging.getLogger(__name__)  # data warnings: one line each (the CLI shows them as they are)


def _build_task(
    spec: TaskSpec, tables: dict[str, Table], cols: Columns, source: str, val_fraction: float, seed: int
) -> TaskData:
    """Validate every split's columns, map labels to ids, carve validation if needed."""
    task = build_task(spec, tables, cols, source)
    if "validation" not in task.splits and "train" in task.splits:
        task = _carve_validation(task, val_fraction, seed)
    order = [s for s in SPLITS if s in task.splits] + [s for s in task.splits if s not in SPLITS]
    task.splits = {name: task.splits[name] for name in order}
    _warn_test_in_train(task)
    return task


_WARNED: set = set()  # (source, warning) pairs already shown by this process
_QUIET = {"data warnings": False}
_USUAL_COLUMNS = TaskColumns()  # every column as the task registers it or as usually named


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


def _stratified_pick(labels: np.ndarray, count_for: Callable[[int], int], rng: np.random.Generator) -> np.ndarray:
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


def _load_local_registered(spec: TaskSpec, data_dir: Path, cols: Columns, val_fraction: float, seed: int) -> TaskData:
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


def _load_online(spec: TaskSpec, cols: Columns, val_fraction: float, seed: int) -> TaskData:
    offline_hint = (
        f"Pass --data-dir (or set ${DATA_ENV}) to a folder with {spec.local_name or spec.name}/"
        f"train.jsonl and test.jsonl in the shared layout."
    )
    if spec.hf_dataset is None:
        raise TaskError(f"task {spec.name!r} has no download source and no data dir. {offline_hint}")
    try:
        import datasets  # heavy: an optional dependency
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


def _load_custom(path: Path, given: TaskColumns, val_fraction: float, seed: int) -> TaskData:
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
    cols = custom_columns(tables["train"], given)
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
    columns: TaskColumns = _USUAL_COLUMNS,
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
        columns: a :class:`~ilge_search.tasks.columns.TaskColumns`: ``text_col``, ``label_col`` (overriding the
            registered ones); ``text_cols``, ``score_col`` for sentence pairs; ``tokens_col``, ``tags_col``, one list
            of words and one of tags per row (default ``tokens``/``tags``; a file with both is a tagging task).
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
    raw = os.fspath(name_or_path)
    path = Path(raw).expanduser()
    key = raw.strip().lower().replace("-", "_")
    if key in TASKS and not (path.exists() and os.sep in raw):
        return _load_registered(get_task_spec(key), data_dir, columns, val_fraction, seed)
    if path.exists():
        return _load_custom(path, columns, val_fraction, seed)
    get_task_spec(raw)  # raises the unknown-task error
    raise AssertionError("unreachable")


def _load_registered(
    spec: TaskSpec, data_dir: PathLike | None, given: TaskColumns, val_fraction: float, seed: int
) -> TaskData:
    """A registered task from its local copy (the given, the environment's or the shipped data folder) or online."""
    refuse_other_kind_columns(spec.name, spec.kind, vars(given))  # the option names are load_task's
    local = registered_task_dir(spec.local_name, data_dir)
    # The shared local layout always uses text/label and sentence1/sentence2/score.
    registered = (spec.text_col, spec.label_col, spec.text_cols, spec.score_col)
    defaults = Columns(spec.kind) if local is not None else Columns(spec.kind, *registered)
    if given.text_cols is not None and len(given.text_cols) != 2:
        raise TaskError(f"text_cols needs exactly two column names, got {list(given.text_cols)}")
    cols = Columns(
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
