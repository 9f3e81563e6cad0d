"""``ILGEClassifier``: text classification with an ILGE encoder, scikit-learn style.

The frozen LLM turns each text into per-layer embeddings ``(L, D)`` (through the one embedding cache), and the one
training engine trains the encoder plus a linear head on them. The estimator follows scikit-learn's rules: ``__init__``
only stores its arguments, ``fit`` returns ``self``, fitted state ends in ``_``, the seed comes in as ``random_state``,
and ``sklearn.base.clone`` works.

Texts already embedded in this process are never sent through the LLM again:
embeddings are memoised per (model, token pooling, max_length) and text, and
texts not in the memo go through :class:`~ilge_search.embeddings.cache.EmbeddingCache`.

:meth:`ILGEClassifier.from_study` turns a finished study into a fitted estimator (the same folder format as
:meth:`~ILGEClassifier.save`). A similarity (sentence-pair) study gives a *similarity model*: ``predict`` takes
``(sentence_a, sentence_b)`` pairs and returns scores on the task's scale, and ``score`` is the Spearman correlation.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from sklearn.base import ClassifierMixin

from ..embeddings.extraction import POOLINGS, ExtractionSettings
from ..encoders.configs import EncoderConfig
from ..engine import build_model, predict_logits, spearman
from ..engine.ensemble import EnsembleModel, build_ensemble
from ..record.fields import Attrs
from ..study.export import StudyExport, load_study_ensemble
from ..validation import check_int
from .estimator import FORMAT_VERSION, WEIGHTS_FILE, Fitted, LoadOptions, SavedEstimator
from .inputs import check_features, check_labels, check_pairs, check_texts
from .saved import check_saved_fields

if TYPE_CHECKING:
    from ..engine import ILGEModel
    from ..storage import Storage
    from ..study.export import StudyModel

__all__ = ["ILGEClassifier", "check_save_folder", "clear_embedding_memo", "FORMAT_VERSION", "WEIGHTS_FILE"]

META_FILE = "ilge_classifier.json"

PathLike = str | os.PathLike

# (base_model, token_pooling, max_length) -> {text: (L, D) tensor}; see clear_embedding_memo()
_EMBEDDING_MEMO: dict[tuple[str, str, int], dict[str, torch.Tensor]] = {}


def check_save_folder(path: PathLike, *, overwrite: bool = False, keep: PathLike | None = None) -> None:
    """Refuse a folder :meth:`ILGEClassifier.save` must not write into: anything but a new or empty folder,
    or, with ``overwrite``, one holding an earlier save. ``keep`` (the base model, when it is a local folder
    inside ``path``) does not count: saving writes beside it and never into it.

    Raises:
        ValueError: ``path`` is a file, holds other files without ``overwrite``, or holds files that are
            not a saved classifier.
    """
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"{path} exists and is not a folder; pass another --out")
    if not path.is_dir():
        return
    kept = Path(keep).expanduser() if keep is not None else None
    kept = kept.resolve() if kept is not None and kept.is_dir() else None
    entries = [entry for entry in path.iterdir() if kept is None or not kept.is_relative_to(entry.resolve())]
    if not entries:
        return
    if not overwrite:
        raise ValueError(
            f"{path} exists and is not empty; pass another --out, or --overwrite to replace the model files in it"
        )
    if not (path / META_FILE).is_file():
        raise ValueError(f"{path} holds files that are not an exported model; pass an empty or new --out")


def clear_embedding_memo() -> None:
    """Forget the in-process embeddings of every text (the disk cache is kept)."""
    _EMBEDDING_MEMO.clear()


class ILGEClassifier(ClassifierMixin, SavedEstimator):
    """Text classifier: an ILGE encoder over every layer of a frozen LLM, plus a linear head.

    Args:
        base_model: model alias (``"minilm-l6"``, ``"smollm2-135m"``), local folder or Hugging Face id. Only needed for
            the text methods.
        config: an encoder family or baseline config (default ``CayleyConfig()``), or a family name such as
            ``"deepset"`` for its defaults. ``BestLayerConfig(layer=None)`` picks the layer on validation data.
        num_classes: expected number of classes; checked against the labels. With integer labels in ``[0, num_classes)``
            classes missing from the training data still get a logit.
        token_pooling: ``"mean"``, ``"last"``, ``"first"`` or ``"mean_including_padding"``.
        max_length: tokens per text passed to the LLM.
        batch_size: texts per LLM forward pass (the encoder's training batch size is ``config.batch_size``).
        device: ``"auto"``, ``"cpu"``, ``"cuda"`` ...
        random_state: seeds the validation split, initialisation and batch order.
        cache_dir: embedding cache (default: ``$ILGE_SEARCH_CACHE`` or ``~/.cache/ilge-search``).
        progress: show progress bars.
        val_fraction: share of the training data held out (stratified) for early stopping when no validation data are
            given.
        patience: early-stopping patience in epochs.

    Fitted attributes:
        classes_, model_, config_ (resolved config), num_layers_, hidden_size_,
        history_, best_epoch_, best_val_score_, and for best-layer ``best_layer_``
        and ``layer_scores_`` (validation accuracy per layer).
    """

    FORMAT = "ilge-search-classifier"
    META_FILE = META_FILE
    NOUN = "classifier"
    POOLING = "token_pooling"
    FIT_METHODS = "fit() or fit_embeddings()"

    num_classes: int | None
    token_pooling: str

    # fitted attributes besides the shared ones (absent until fit, load or from_study sets them)
    model_: ILGEModel
    task_kind_: str
    score_range_: tuple[float, float] | None
    n_members_: int

    def __init__(
        self,
        base_model: PathLike | None = None,
        config: EncoderConfig | str | None = None,
        num_classes: int | None = None,
        token_pooling: str = "mean",
        max_length: int = 512,
        batch_size: int = 32,
        device: str = "auto",
        random_state: int = 0,
        cache_dir: PathLike | None = None,
        progress: bool = False,
        val_fraction: float = 0.15,
        patience: int = 10,
    ) -> None:
        # kept as given, as scikit-learn's get_params and clone read them
        self.base_model = base_model
        self.config = config
        self.num_classes = num_classes
        self.token_pooling = token_pooling
        self.max_length = max_length
        self.batch_size = batch_size
        self.device = device
        self.random_state = random_state
        self.cache_dir = cache_dir
        self.progress = progress
        self.val_fraction = val_fraction
        self.patience = patience

    # ------------------------------------------------------------------ validation

    def _check_params(self, needs_model: bool) -> EncoderConfig:
        config = self._resolved_config()
        if needs_model:
            if self.base_model is None:
                raise ValueError("base_model is None; pass a model name or folder, or use fit_embeddings()")
            if not isinstance(self.base_model, (str, os.PathLike)):
                raise ValueError(f"base_model must be a model name or folder, got {type(self.base_model).__name__}")
            if self.token_pooling not in POOLINGS:
                raise ValueError(f"token_pooling must be one of {list(POOLINGS)}, got {self.token_pooling!r}")
            for name in ("max_length", "batch_size"):
                check_int(name, getattr(self, name))
        check_int("num_classes", self.num_classes, minimum=2, allow_none=True)
        self._check_run_params()
        return config

    def _fit_classes(self, labels: np.ndarray) -> np.ndarray:
        distinct = np.unique(labels)
        if self.num_classes is None:
            classes = distinct
        elif labels.dtype.kind in "iu" and distinct.min() >= 0 and distinct.max() < self.num_classes:
            classes = np.arange(self.num_classes, dtype=labels.dtype)
        elif len(distinct) == self.num_classes:
            classes = distinct
        else:
            raise ValueError(
                f"num_classes={self.num_classes} but the labels have {len(distinct)} distinct values "
                f"{distinct[:10].tolist()}{'...' if len(distinct) > 10 else ''}; fix num_classes or the labels"
            )
        if len(classes) < 2:
            raise ValueError(f"need at least 2 classes to train a classifier, got {classes.tolist()}")
        return classes

    def _encode(self, labels: np.ndarray, classes: np.ndarray, name: str) -> np.ndarray:
        if labels.dtype.kind != classes.dtype.kind and not (labels.dtype.kind in "iu" and classes.dtype.kind in "iu"):
            raise ValueError(f"{name} are {labels.dtype} but the classes are {classes.dtype}; use one label type")
        unseen = np.setdiff1d(np.unique(labels), classes)
        if unseen.size:
            raise ValueError(
                f"{name} contain {unseen.size} label(s) not seen in training: {unseen[:10].tolist()}; "
                f"known classes: {classes[:20].tolist()}{'...' if len(classes) > 20 else ''}"
            )
        return np.searchsorted(classes, labels).astype(np.int64)

    def _validation_split(self, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Stratified, seeded split of train into (train rows, validation rows).

        About ``val_fraction`` of the rows are held out, each class in proportion (largest remainders get the rounding),
        and every class keeps at least one training row.
        """
        rng = np.random.default_rng(int(self.random_state))
        classes, counts = np.unique(labels, return_counts=True)
        quota = counts * float(self.val_fraction)
        n_val = np.floor(quota).astype(np.int64)
        remaining = round(len(labels) * float(self.val_fraction)) - int(n_val.sum())
        # hand the rounding to the classes with the largest remainders (random tie-break)
        order = np.lexsort((rng.random(len(classes)), -(quota - n_val)))
        for i in order[: max(remaining, 0)]:
            n_val[i] += 1
        n_val = np.minimum(n_val, counts - 1)
        train_parts, val_parts = [], []
        for label, k in zip(classes, n_val, strict=True):
            rows = rng.permutation(np.flatnonzero(labels == label))
            val_parts.append(rows[:k])
            train_parts.append(rows[k:])
        val_rows = np.sort(np.concatenate(val_parts))
        if val_rows.size == 0:
            raise ValueError(
                f"too few examples to hold out {self.val_fraction:.0%} for validation; "
                "pass val_texts/val_labels (or X_val/y_val) or more data"
            )
        return np.sort(np.concatenate(train_parts)), val_rows

    # ------------------------------------------------------------------ embeddings

    def _embed(self, texts: list[str]) -> torch.Tensor:
        """(N, L, D) embeddings; only texts never seen in this process reach the LLM."""
        key = (str(self.base_model), self.token_pooling, int(self.max_length))
        memo = _EMBEDDING_MEMO.setdefault(key, {})
        missing = list(dict.fromkeys(text for text in texts if text not in memo))
        if missing:
            if self.base_model is None:
                raise ValueError("base_model is None; pass a model name or folder, or use the *_embeddings methods")
            cache = self._embedding_cache()
            settings = ExtractionSettings(self.token_pooling, self.max_length, self.batch_size, self.device)
            features = cache.get_or_extract_texts(
                self.base_model, missing, settings=settings, progress=bool(self.progress)
            )
            for text, row in zip(missing, features, strict=True):
                memo[text] = row
        return torch.stack([memo[text] for text in texts])  # (N, L, D)

    # ------------------------------------------------------------------ fitting

    def fit(
        self,
        texts: Sequence[str],
        labels: Sequence[object],
        val_texts: Sequence[str] | None = None,
        val_labels: Sequence[object] | None = None,
    ) -> ILGEClassifier:
        """Embed the texts with the frozen LLM and train the encoder and head.

        Labels may be ints or strings. Without validation data, a stratified
        ``val_fraction`` of the training data is held out for early stopping.
        """
        config = self._check_params(needs_model=True)
        train_texts = check_texts(texts)
        label_array = check_labels(labels, len(train_texts))
        if (val_texts is None) != (val_labels is None):
            raise ValueError("pass both val_texts and val_labels, or neither")
        if val_texts is None or val_labels is None:
            return self._train_held_out(config, label_array, "labels", lambda: self._embed(train_texts))
        held_out_texts = check_texts(val_texts, "val_texts")
        held_out_labels = check_labels(val_labels, len(held_out_texts), "val_labels")
        classes = self._fit_classes(label_array)
        y = self._encode(label_array, classes, "labels")
        y_val = self._encode(held_out_labels, classes, "val_labels")
        features = self._embed(train_texts + held_out_texts)  # one pass for all texts not yet embedded
        return self._train(config, classes, features[: len(train_texts)], y, features[len(train_texts) :], y_val)

    def fit_embeddings(
        self, X: Any, y: Sequence[object], X_val: Any = None, y_val: Sequence[object] | None = None
    ) -> ILGEClassifier:
        """Train on precomputed per-layer embeddings ``X`` of shape ``(N, L, D)``."""
        config = self._check_params(needs_model=False)
        X = check_features(X)
        labels = check_labels(y, X.shape[0], "y")
        if (X_val is None) != (y_val is None):
            raise ValueError("pass both X_val and y_val, or neither")
        if X_val is None or y_val is None:
            return self._train_held_out(config, labels, "y", lambda: X)
        X_val = check_features(X_val, "X_val")
        if X_val.shape[1:] != X.shape[1:]:
            raise ValueError(f"X_val rows are {tuple(X_val.shape[1:])} but X rows are {tuple(X.shape[1:])}")
        val_labels = check_labels(y_val, X_val.shape[0], "y_val")
        classes = self._fit_classes(labels)
        y_ids = self._encode(labels, classes, "y")
        return self._train(config, classes, X, y_ids, X_val, self._encode(val_labels, classes, "y_val"))

    def _train_held_out(
        self, config: EncoderConfig, labels: np.ndarray, name: str, features: Callable[[], torch.Tensor]
    ) -> ILGEClassifier:
        """Train on all but a stratified ``val_fraction`` of the rows, held out for early stopping; ``features``
        gives the rows' embeddings once the labels are checked."""
        classes = self._fit_classes(labels)
        y = self._encode(labels, classes, name)
        train_rows, val_rows = self._validation_split(y)
        X = features()
        return self._train(config, classes, X[train_rows], y[train_rows], X[val_rows], y[val_rows])

    def _train(
        self,
        config: EncoderConfig,
        classes: np.ndarray,
        X: torch.Tensor,
        y: np.ndarray,
        X_val: torch.Tensor,
        y_val: np.ndarray,
    ) -> ILGEClassifier:
        train, val = (X, torch.from_numpy(y)), (X_val, torch.from_numpy(y_val))
        return self._adopt(self._trained(config, classes, train, val))

    def _adopt(self, fitted: Fitted) -> ILGEClassifier:
        """Set the fitted attributes from ``fitted``, a classifier's task kind among them; returns ``self``."""
        super()._adopt(fitted)
        self.task_kind_, self.score_range_ = fitted.task_kind, fitted.score_range
        self.n_members_ = int(getattr(fitted.model, "n_members", 1))  # an ensemble exported from a study: its members
        return self

    # ------------------------------------------------------------------ prediction

    def _similarity(self) -> bool:
        """True for a similarity model (from a sentence-pair study): inputs are pairs, outputs scores."""
        self._check_fitted()
        return getattr(self, "task_kind_", "classification") == "similarity"

    def _checked_embeddings(self, X: Any) -> torch.Tensor:
        pairs = self._similarity()
        X = check_features(X, pairs=pairs)
        if tuple(X.shape[-2:]) != (self.num_layers_, self.hidden_size_):
            raise ValueError(
                f"X rows are {tuple(X.shape[1:])} but the classifier was fitted on "
                f"({self.num_layers_}, {self.hidden_size_}) layer embeddings{' per sentence' if pairs else ''}"
            )
        return X

    def _inputs(self, X: Sequence[object]) -> torch.Tensor:
        """Texts (or, for a similarity model, sentence pairs) -> their per-layer embeddings."""
        self._check_params(needs_model=True)
        if self._similarity():
            flat = check_pairs(X)
            features = self._embed(flat)  # (2N, L, D), pairs interleaved
            return features.view(len(flat) // 2, 2, *features.shape[1:])
        return self._embed(check_texts(X))

    def _only_classification(self, method: str) -> None:
        if self._similarity():
            raise ValueError(f"{method} is for classifiers; this similarity model gives scores: use predict()")

    def predict_proba_embeddings(self, X: Any) -> np.ndarray:
        """Class probabilities ``(N, n_classes)`` for precomputed ``(N, L, D)`` embeddings."""

        self._only_classification("predict_proba")
        logits = predict_logits(self.model_, self._checked_embeddings(X))
        return torch.softmax(logits.double(), dim=1).numpy()

    def predict_embeddings(self, X: Any) -> np.ndarray:
        """Labels (in the type given to ``fit``) for precomputed embeddings; a similarity
        model takes ``(N, 2, L, D)`` and gives scores on the task's scale."""

        if self._similarity():
            cosine = predict_logits(self.model_, self._checked_embeddings(X)).double().numpy()
            if self.score_range_ is None:
                return cosine
            low, high = self.score_range_  # the model regresses the cosine on scores scaled to [0, 1]
            return low + cosine * (high - low)
        return self.classes_[self.predict_proba_embeddings(X).argmax(axis=1)]

    def predict_proba(self, texts: Sequence[str]) -> np.ndarray:
        """Class probabilities ``(N, n_classes)``, columns in ``classes_`` order."""
        self._check_fitted()
        self._only_classification("predict_proba")
        return self.predict_proba_embeddings(self._inputs(texts))

    def predict(self, texts: Sequence[object]) -> np.ndarray:
        """Predicted labels, in the type given to ``fit`` (ints or strings).

        A similarity model takes ``(sentence_a, sentence_b)`` pairs and returns
        their similarity scores on the task's scale (e.g. 0-5 for STS-B).
        """
        self._check_fitted()
        return self.predict_embeddings(self._inputs(texts))

    def _score_predictions(self, predicted: np.ndarray, labels: Any, sample_weight: Any) -> float:
        if self._similarity():
            if sample_weight is not None:
                raise ValueError("sample_weight is not supported for similarity scores (Spearman)")
            return spearman(predicted, labels)
        correct = (predicted == labels).astype(np.float64)
        if sample_weight is None:
            return float(correct.mean())
        return float(np.average(correct, weights=np.asarray(sample_weight, dtype=np.float64)))

    def _checked_targets(self, labels: Any, num_rows: int, name: str) -> np.ndarray:
        if not self._similarity():
            labels = check_labels(labels, num_rows, name)
            self._encode(labels, self.classes_, name)
            return labels
        scores = np.asarray(labels, dtype=np.float64)
        if scores.ndim != 1 or scores.shape[0] != num_rows or not np.all(np.isfinite(scores)):
            raise ValueError(f"{name} must be {num_rows} finite gold scores, got shape {scores.shape}")
        return scores

    def score(self, texts: Sequence[object], labels: Sequence[object], sample_weight: Any = None) -> float:
        """Accuracy on ``texts`` (Spearman correlation for a similarity model's pairs);
        labels unseen in training raise before any embedding."""
        self._check_fitted()
        count = len(check_pairs(texts)) // 2 if self._similarity() else len(check_texts(texts))
        targets = self._checked_targets(labels, count, "labels")
        return self._score_predictions(self.predict(texts), targets, sample_weight)

    def score_embeddings(self, X: Any, y: Sequence[object]) -> float:
        """Accuracy (Spearman for a similarity model) on precomputed embeddings."""
        self._check_fitted()
        X = self._checked_embeddings(X)
        return self._score_predictions(self.predict_embeddings(X), self._checked_targets(y, X.shape[0], "y"), None)

    # ------------------------------------------------------------------ persistence

    def save(self, path: PathLike, *, overwrite: bool = False) -> Path:
        """Write ``model.safetensors`` and ``ilge_classifier.json`` into directory ``path``.

        The LLM is not saved, only its name; no pickle is used. ``path`` must be new or empty, or, with
        ``overwrite``, an earlier save (:func:`check_save_folder`), so saving never replaces files it
        did not write; a base model folder kept inside ``path`` stays, recorded as ``./relative``.
        """

        self._check_fitted()
        path = Path(path).expanduser()
        check_save_folder(path, overwrite=overwrite, keep=self.base_model)
        meta = self._saved_meta(path)
        if isinstance(self.model_, EnsembleModel):  # an ensemble: every member's config and count
            meta["ensemble"] = self.model_.description
        return self._write_folder(path, meta)

    def _kind_fields(self) -> Attrs:
        return {
            "task_kind": getattr(self, "task_kind_", "classification"),
            "score_range": getattr(self, "score_range_", None),
        }

    @classmethod
    def _check_meta(cls, meta: Attrs, meta_path: Path) -> None:
        task_kind, score_range = meta.get("task_kind", "classification"), meta.get("score_range")
        if task_kind not in ("classification", "similarity") or (
            score_range is not None and (not isinstance(score_range, list) or len(score_range) != 2)
        ):
            raise ValueError(
                f"{meta_path}: invalid task_kind {task_kind!r} or score_range {score_range!r}; the file is corrupt"
            )
        check_saved_fields(meta, meta_path, classes_needed=2 if task_kind == "classification" else 0)

    @classmethod
    def _saved_arguments(cls, meta: Attrs, classes: np.ndarray) -> Attrs:
        classification = meta.get("task_kind", "classification") == "classification"
        return {"num_classes": len(classes) if classification else None, **super()._saved_arguments(meta, classes)}

    @classmethod
    def _saved_model(cls, meta: Attrs, fitted: Fitted) -> torch.nn.Module:

        num_classes = len(fitted.classes) or None
        if meta.get("ensemble"):  # an ensemble's folder: its members' configs and counts
            sizes = {"num_layers": fitted.num_layers, "hidden_size": fitted.hidden_size}
            kind = {"task_kind": fitted.task_kind, "num_classes": num_classes, "score_range": meta.get("score_range")}
            return build_ensemble({**sizes, **kind, "ensemble": meta["ensemble"]})
        return build_model(
            fitted.config,
            fitted.num_layers,
            fitted.hidden_size,
            fitted.task_kind,
            num_classes=num_classes,
            score_range=fitted.score_range,
        )

    @classmethod
    def load(
        cls,
        path: PathLike,
        *,
        device: str = "auto",
        cache_dir: PathLike | None = None,
        batch_size: int = 32,
        progress: bool = False,
        base_model: PathLike | None = None,
        force: bool = False,
    ) -> ILGEClassifier:
        """Rebuild a classifier written by :meth:`save` (the LLM loads on the first text method).

        The recorded base model is used if it is an alias, a hub id or a folder inside ``path``; one elsewhere on disk
        is refused unless given as ``base_model`` (which replaces it). Weights holding NaN or infinity are refused,
        and so is a folder whose weights, classes or ensemble counts differ from the digest its save recorded
        (:class:`~ilge_search.use.saved.FolderMismatch`, a ``ValueError``) unless ``force``.
        """
        return cls._load_folder(path, LoadOptions(device, cache_dir, batch_size, progress, base_model, force))

    @classmethod
    def from_study_ensemble(
        cls,
        storage: str | Storage | None,
        study_name: str,
        *,
        artifact_dir: PathLike | None = None,
        device: str = "auto",
        cache_dir: PathLike | None = None,
        batch_size: int = 32,
    ) -> ILGEClassifier:
        """The ensemble a study stored (``ilge-search ensemble`` or ``run --ensemble K``) as one fitted
        estimator: ``n_members_`` members predicting their mixed probabilities or scores (see
        :mod:`ilge_search.study.stages.ensemble_work`); ``save`` writes an ensemble folder that ``load`` reads back."""
        found = load_study_ensemble(storage, study_name, artifact_dir=artifact_dir)
        return cls._from_found(
            found, study_name, StudyExport(device=device, cache_dir=cache_dir, batch_size=batch_size)
        )

    @classmethod
    def _found_classes(cls, found: StudyModel, study_name: str) -> np.ndarray:
        names = found.label_names
        if names and all(name.lstrip("-").isdigit() for name in names):
            classes = np.asarray([int(name) for name in names])  # "2" < "10" as numbers, as the task sorted them
        else:
            classes = np.asarray(names)
        if classes.size and not np.all(classes[:-1] < classes[1:]):
            raise ValueError(f"study {study_name!r} has label names out of order ({names[:5]}...); cannot export it")
        return classes

    @classmethod
    def _found_arguments(cls, found: StudyModel, classes: np.ndarray) -> Attrs:
        return {"num_classes": len(classes) or None, "token_pooling": found.token_pooling}
