"""The arrays a study trains on: the task with its data options, and its cached layer embeddings.

The runner resolves the model once (no weights loaded) and puts the
:class:`~ilge_search.embeddings.models.ModelSource` in the :class:`DataSpec`; workers and
zero-shot tasks reuse it instead of resolving (and hashing) the model again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..embeddings.cache import EmbeddingCache, ExtractionSettings, load_task_embeddings
from ..embeddings.models import ModelSource
from ..embeddings.word_cache import WordEmbeddings, WordOptions, load_word_embeddings, word_entry_key
from ..engine import evaluate
from ..tasks.columns import TaskColumns
from ..tasks.core import few_shot, load_task, subsample
from .options import StudyOptions

if TYPE_CHECKING:
    from ..embeddings.cache import CachedEmbeddings, TaskEmbeddings
    from ..embeddings.word_cache import TaskWordEmbeddings, WordEmbeddings
    from ..engine.core import Dataset, TrainOptions
    from ..tasks.core import TaskData
    from .shapes import TrainedModel

__all__ = [
    "DataSpec",
    "StudyData",
    "load_task_data",
    "load_study_data",
    "load_zero_shot_data",
    "expected_cache_keys",
]


@dataclass(frozen=True)
class DataSpec:
    """Everything that decides the arrays a study trains on (picklable, for workers).

    ``source`` is the resolved model; without it the model is resolved when
    the embeddings are loaded.
    """

    model: str
    task: str
    shots: int | None = None
    max_train: int | None = None
    max_eval: int | None = None
    data_seed: int = 0
    data_dir: str | None = None
    cache_dir: str | None = None
    device: str = "auto"
    source: ModelSource | None = None
    word_pooling: str = "first"
    columns: tuple[tuple[str, Any], ...] = ()  # a custom file's column options (text_col ...), sorted pairs

    def column_options(self) -> dict[str, Any]:
        """The column options of a custom task file, by name (as its record keeps them)."""
        return dict(self.columns)

    def task_columns(self) -> TaskColumns:
        return TaskColumns(**self.column_options())  # as load_task takes them

    @classmethod
    def from_options(cls, model: str, task: str, options: StudyOptions, source: ModelSource | None = None) -> DataSpec:
        """The data part of ``options`` for ``model`` and ``task``."""
        return cls(
            model=str(model),
            task=str(task),
            shots=options.data.shots,
            max_train=options.data.max_train,
            max_eval=options.data.max_eval,
            data_seed=options.data.data_seed,
            data_dir=None if options.data.data_dir is None else str(options.data.data_dir),
            cache_dir=None if options.data.cache_dir is None else str(options.data.cache_dir),
            device=options.runtime.device,
            source=source,
            word_pooling=options.data.word_pooling,
            columns=tuple(sorted(options.data.column_options().items())),
        )

    @property
    def model_or_source(self) -> str | ModelSource:
        """What :func:`~ilge_search.embeddings.cache.load_task_embeddings` gets: the resolved source if there is one."""
        return self.source if self.source is not None else self.model


@dataclass
class StudyData:
    """The cached arrays of one (model, task) and what studies record about them."""

    task_kind: str
    metric: str
    train: Dataset
    validation: Dataset
    test: Dataset | None
    num_layers: int
    hidden_size: int
    num_classes: int | None
    label_names: list[str]
    split_sizes: dict[str, int]
    cache_keys: dict[str, str]
    model_revision: str = ""

    def test_split(self) -> Dataset:
        """The test features and labels (loaded only by ``load_study_data(..., with_test=True)``)."""
        if self.test is None:
            raise ValueError("the test split was not loaded; load the study data with with_test=True")
        return self.test

    def train_options(self, seed: int, device: str) -> TrainOptions:
        """The keywords of a training on this data (``train_encoder``, ``select_best_layer``) with ``seed``."""
        return {"task_kind": self.task_kind, "num_classes": self.num_classes, "seed": seed, "device": device}

    def test_metrics(self, model: TrainedModel) -> dict[str, float]:
        """Every metric of the task for ``model`` (trained on this data) on the test split, by its own head."""

        features, labels = self.test_split()
        return evaluate(model, features, labels, task_kind=self.task_kind)


def load_task_data(spec: DataSpec, loaded: TaskData | None = None) -> TaskData:
    """Load the task (or take ``loaded``, the task as read) and apply the data options (few-shot, caps);
    no model loads."""

    task_data = loaded if loaded is not None else load_task(spec.task, spec.data_dir, columns=spec.task_columns())
    if spec.shots is not None:
        if task_data.kind != "classification":
            raise ValueError(f"--shots needs a classification task; {spec.task!r} is {task_data.kind}")
        task_data = few_shot(task_data, spec.shots, seed=spec.data_seed)
    if spec.max_train is not None:
        task_data = subsample(task_data, spec.max_train, seed=spec.data_seed, splits=["train"])
    if spec.max_eval is not None:
        eval_splits = [name for name in ("validation", "test") if name in task_data.splits]
        task_data = subsample(task_data, spec.max_eval, seed=spec.data_seed, splits=eval_splits)
    return task_data


def expected_cache_keys(spec: DataSpec, task_data: TaskData, fingerprints: dict[str, str]) -> dict[str, str]:
    """The embedding-cache keys the study's splits will have (``fingerprints``: split -> content sha256),
    computed without reading or writing the cache; empty when the model is not resolved in ``spec``."""

    if spec.source is None:
        return {}
    cache = EmbeddingCache(spec.cache_dir)
    if task_data.kind == "tagging":
        options = WordOptions(word_pooling=spec.word_pooling, device="cpu")
        return {
            split: word_entry_key(cache, spec.source, (task_data.name, split, fingerprint), options)
            for split, fingerprint in fingerprints.items()
        }
    return {
        split: cache.key(model_identity=spec.source.identity, task=task_data.name, split=split, fingerprint=fingerprint)
        for split, fingerprint in fingerprints.items()
    }


def load_study_data(
    spec: DataSpec, *, with_test: bool, progress: bool = True, task_data: TaskData | None = None
) -> StudyData:
    """Embeddings of every needed split, from the cache (extracting on a miss). A tagging task's splits are
    word entries (memory-mapped), its labels one tag id per word and its ``split_sizes`` count sentences."""
    if task_data is None:
        task_data = load_task_data(spec)
    splits = ["train", "validation"] + (["test"] if with_test else [])
    tagging = task_data.kind == "tagging"
    loaded: dict[str, Any] = {
        "data_dir": spec.data_dir,
        "cache_dir": spec.cache_dir,
        "splits": splits,
        "progress": progress,
    }
    embeddings: TaskEmbeddings | TaskWordEmbeddings
    if tagging:
        options = WordOptions(word_pooling=spec.word_pooling, device=spec.device)
        embeddings = load_word_embeddings(spec.model_or_source, task_data, options=options, **loaded)
    else:
        settings = ExtractionSettings(device=spec.device)
        embeddings = load_task_embeddings(spec.model_or_source, task_data, settings=settings, **loaded)
    by_split = embeddings.splits

    def pair(name: str) -> Dataset:
        split = by_split[name]
        return (split if tagging else split.features), split.labels

    kind = task_data.spec.kind
    return StudyData(
        task_kind=kind,
        metric=task_data.spec.metric,
        train=pair("train"),
        validation=pair("validation"),
        test=pair("test") if "test" in by_split else None,
        num_layers=int(embeddings.num_layers),
        hidden_size=int(embeddings.hidden_size),
        num_classes=None if kind == "similarity" else len(embeddings.label_names),
        label_names=list(embeddings.label_names),
        split_sizes={name: _rows(split) for name, split in by_split.items()},
        cache_keys=dict(embeddings.cache_keys),
        model_revision=spec.source.revision if spec.source is not None else "",
    )


def _rows(split: CachedEmbeddings | WordEmbeddings) -> int:
    """Texts of a split, or sentences of a word split (a word entry is a cached entry with offsets)."""

    return int(split.num_sentences if isinstance(split, WordEmbeddings) else split.labels.shape[0])


def load_zero_shot_data(spec: DataSpec, task_names: list[str], *, progress: bool = True) -> dict[str, Dataset]:
    """``{task: (test features, test scores)}`` of similarity tasks scored zero-shot.

    Each task is loaded without the study's training options (``shots``,
    ``max_train``); ``max_eval`` still applies.
    """

    out: dict[str, Dataset] = {}
    for name in task_names:
        zero_spec = dataclasses.replace(spec, task=name, shots=None, max_train=None)
        zero_task = load_task_data(zero_spec)
        if zero_task.kind != "similarity":
            raise ValueError(f"zero-shot task {name!r} is {zero_task.kind}, not a similarity task")
        emb = load_task_embeddings(
            spec.model_or_source,
            zero_task,
            data_dir=spec.data_dir,
            cache_dir=spec.cache_dir,
            splits=["test"],
            settings=ExtractionSettings(device=spec.device),
            progress=progress,
        )
        out[name] = (emb.splits["test"].features, emb.splits["test"].labels)
    return out
