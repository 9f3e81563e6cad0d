"""What ``ILGEClassifier`` and ``ILGETagger`` share: one base estimator for the config, the checks every
fit makes, the embedding cache, the fitted state, the saved folder (``save``/``load``) and ``from_study``.

A subclass states only what differs: its folder's names (``FORMAT``, ``META_FILE``), how it reads its
inputs and trains, the model its saved config builds, and the fields besides the shared ones it saves
(its pooling; a classifier's task kind). The on-disk format stays each class's own: the same file
names, keys and checks as before the two shared this base.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from sklearn.base import BaseEstimator
from sklearn.exceptions import NotFittedError

from .. import engine  # its training functions looked up per call: tests count them
from .._version import __version__
from ..embeddings.cache import EmbeddingCache
from ..embeddings.models import model_reference_to_load, model_reference_to_save, resolve_device
from ..encoders import config_class_for, config_from_dict
from ..encoders.configs import BestLayerConfig, CayleyConfig, EncoderConfig
from ..engine import TAGGING, TrainingRecipe
from ..record.fields import Attrs
from ..study.export import StudyExport, StudyModel, load_for_estimator
from ..validation import ArgumentTypeError
from .saved import FolderMismatch, check_digest, check_mix, folder_digest

if TYPE_CHECKING:
    from ..embeddings.cache import EmbeddingCache
    from ..engine.core import Dataset
    from ..storage import Storage

__all__ = ["FORMAT_VERSION", "WEIGHTS_FILE", "Fitted", "LoadOptions", "SavedEstimator", "load_state", "read_weights"]

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"

PathLike = str | os.PathLike
EstimatorT = TypeVar("EstimatorT", bound="SavedEstimator")


@dataclass(frozen=True)
class Fitted:
    """An estimator's fitted state, whether trained here, read from a saved folder or exported from a study."""

    model: torch.nn.Module  # an ILGEModel, an ensemble of them or a TaggerModel
    config: EncoderConfig
    classes: np.ndarray
    num_layers: int
    hidden_size: int
    task_kind: str = "classification"
    score_range: tuple[float, float] | None = None
    history: list[dict[str, float]] = field(default_factory=list)
    best_epoch: int | None = None
    best_val_score: float | None = None
    best_layer: int | None = None  # a best-layer config's layer (its fitted attribute exists only when known)
    provenance: Attrs | None = None  # from_study's record of where the model came from


@dataclass(frozen=True)
class LoadOptions:
    """How ``load`` rebuilds an estimator: the runtime settings a saved folder does not fix."""

    device: str = "auto"
    cache_dir: PathLike | None = None
    batch_size: int = 32
    progress: bool = False
    base_model: PathLike | None = None  # replaces the recorded base model (one elsewhere on disk must be given)
    force: bool = False  # use a folder whose files disagree with its digest or counts (predict --force)


def read_weights(weights_path: Path) -> dict[str, torch.Tensor]:
    """The saved tensors, refused when unreadable or not finite (such weights predict nothing)."""

    try:
        state = load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ValueError(f"{weights_path} cannot be read ({exc}); the saved weights are corrupt") from None
    bad = sorted(k for k, t in state.items() if t.is_floating_point() and not bool(torch.isfinite(t).all()))
    if bad:
        raise ValueError(
            f"{weights_path} holds NaN or infinite values in {bad[:5]}; these weights cannot "
            f"predict anything, retrain and save again"
        )
    return state


def _check_agreement(
    meta: Attrs, state: Mapping[str, torch.Tensor], meta_path: Path, weights_path: Path, *, force: bool
) -> None:
    """Refuse a folder whose files disagree with the digest or counts its JSON records, unless ``force``
    (which logs what it overrides); mix weights that are no mixture are refused whatever ``force``."""
    checks = (
        partial(check_mix, state, meta, meta_path, weights_path),  # first: no mixture is refused whatever force
        partial(check_digest, meta, meta_path, weights_path),
    )
    for check in checks:
        try:
            check()
        except FolderMismatch as exc:
            if not force:
                raise
            logger.warning("using %s although %s", weights_path.parent, str(exc).split("; ")[0])


def load_state(model: torch.nn.Module, state: dict[str, torch.Tensor], weights_path: Path) -> None:
    """Put ``state`` into ``model`` after checking it has exactly the model's tensors, in their shapes."""
    expected = model.state_dict()
    missing, unexpected = set(expected) - set(state), set(state) - set(expected)
    wrong_shape = [k for k in set(expected) & set(state) if expected[k].shape != state[k].shape]
    if missing or unexpected or wrong_shape:
        raise ValueError(
            f"{weights_path} does not match its config: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}, wrong shape {sorted(wrong_shape)[:5]}"
        )
    model.load_state_dict(state)


class SavedEstimator(BaseEstimator):
    """The shared half of ``ILGEClassifier`` and ``ILGETagger``; ``__init__`` (and so ``get_params``) is
    each subclass's own, as scikit-learn reads the parameters from its signature."""

    FORMAT: ClassVar[str]  # the "format" value of the saved JSON
    META_FILE: ClassVar[str]  # the saved JSON's file name
    NOUN: ClassVar[str]  # "classifier" or "tagger", in messages
    FIT_METHODS: ClassVar[str] = "fit()"  # what the not-fitted message tells to call
    TAGGING: ClassVar[bool] = False  # which kind of study from_study exports
    POOLING: ClassVar[str]  # the constructor argument (and saved field) of the subclass's pooling

    # parameters every subclass's __init__ stores
    base_model: PathLike | None
    config: EncoderConfig | str | None
    max_length: int
    batch_size: int
    device: str
    random_state: int
    cache_dir: PathLike | None
    progress: bool
    val_fraction: float
    patience: int

    # fitted attributes (absent until fit, load or from_study sets them, as scikit-learn expects)
    classes_: np.ndarray
    config_: EncoderConfig
    model_: torch.nn.Module  # narrowed by each subclass
    num_layers_: int
    hidden_size_: int
    history_: list[dict[str, float]]
    best_epoch_: int | None
    best_val_score_: float | None
    num_trainable_params_: int
    best_layer_: int | None
    layer_scores_: list[float]
    provenance_: Attrs

    # ------------------------------------------------------------------ checks

    def _resolved_config(self) -> EncoderConfig:
        config = self.config
        if config is None:
            return CayleyConfig()
        if isinstance(config, str):
            return config_class_for(config)()
        if isinstance(config, dict):
            return config_from_dict(config)
        if not isinstance(config, EncoderConfig):
            raise ArgumentTypeError(
                f"config must be an EncoderConfig, a family name or None, got {type(config).__name__}"
            )
        return config

    def _check_run_params(self) -> None:
        """The checks of the settings every fit uses: device, seed and validation share."""
        resolve_device(self.device)  # a device this machine lacks fails before any embedding or training
        if isinstance(self.random_state, bool) or not isinstance(self.random_state, (int, np.integer)):
            raise ValueError(f"random_state must be an integer, got {self.random_state!r}")
        if not 0.0 < float(self.val_fraction) < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {self.val_fraction!r}")

    def _check_fitted(self) -> None:
        if not hasattr(self, "model_"):
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet; call {self.FIT_METHODS} first")

    # ------------------------------------------------------------------ embeddings

    def _embedding_cache(self) -> EmbeddingCache:

        cache: EmbeddingCache | None = getattr(self, "_cache", None)
        if cache is None:
            cache = EmbeddingCache(self.cache_dir)
            self._cache: EmbeddingCache | None = cache
        return cache

    def __getstate__(self) -> Attrs:
        state = self.__dict__.copy()
        state.pop("_cache", None)  # never pickle a loaded LLM
        return state

    def unload_llm(self: EstimatorT) -> EstimatorT:
        """Free the LLM (the trained encoder stays); the next text method reloads it."""
        cache = getattr(self, "_cache", None)
        if cache is not None:
            cache.unload()
        self._cache = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return self

    # ------------------------------------------------------------------ fitting

    def _trained(self, config: EncoderConfig, classes: np.ndarray, train: Dataset, val: Dataset) -> Fitted:
        """``config`` trained by the one engine on ``train``, early-stopped on ``val`` (a best-layer config
        without a layer tries each one and keeps the best, its scores in ``layer_scores_``)."""

        options: Attrs = dict(
            task_kind=TAGGING if self.TAGGING else "classification",
            num_classes=len(classes),
            seed=int(self.random_state),
            device=self.device,
            recipe=TrainingRecipe(patience=self.patience),
            progress=bool(self.progress),
        )
        layer = None
        if isinstance(config, BestLayerConfig) and config.layer is None:
            layer, result, scores = engine.select_best_layer(config, train, val, **options)
            config = config.replace(layer=layer)
            self.layer_scores_ = scores
        else:
            result = engine.train_encoder(config, train, val, **options)
        features = train[0]
        shape = (features.num_layers, features.hidden_size) if self.TAGGING else tuple(features.shape[1:3])
        return Fitted(
            model=result.model,
            config=config,
            classes=classes,
            num_layers=int(shape[0]),
            hidden_size=int(shape[1]),
            history=result.history,
            best_epoch=result.best_epoch,
            best_val_score=result.best_val_metric,
            best_layer=layer,
        )

    # ------------------------------------------------------------------ fitted state

    def _adopt(self: EstimatorT, fitted: Fitted) -> EstimatorT:
        """Set the fitted attributes from ``fitted``; returns ``self``."""
        self.classes_, self.config_, self.model_ = fitted.classes, fitted.config, fitted.model
        self.num_layers_, self.hidden_size_ = fitted.num_layers, fitted.hidden_size
        self.history_ = fitted.history
        self.best_epoch_, self.best_val_score_ = fitted.best_epoch, fitted.best_val_score
        self.num_trainable_params_ = sum(p.numel() for p in fitted.model.parameters() if p.requires_grad)
        if fitted.best_layer is not None:
            self.best_layer_ = fitted.best_layer
        if fitted.provenance is not None:
            self.provenance_ = fitted.provenance
        return self

    # ------------------------------------------------------------------ the saved folder

    def _kind_fields(self) -> Attrs:
        """Saved fields only the subclass has (none by default)."""
        return {}

    def _saved_meta(self, path: Path) -> Attrs:
        """The JSON ``save`` writes beside the weights (keys in their historical order)."""
        return {
            "format": self.FORMAT,
            "format_version": FORMAT_VERSION,
            "library_version": __version__,
            "config": self.config_.to_dict(),
            "classes": self.classes_.tolist(),  # numpy scalars become plain JSON values
            "classes_kind": self.classes_.dtype.kind,
            "base_model": model_reference_to_save(self.base_model, path),  # a local folder inside path: ./relative
            self.POOLING: getattr(self, self.POOLING),
            "max_length": self.max_length,
            "num_layers": self.num_layers_,
            "hidden_size": self.hidden_size_,
            "random_state": int(self.random_state),
            "best_epoch": self.best_epoch_,
            "best_val_score": self.best_val_score_,
            **self._kind_fields(),
            "provenance": getattr(self, "provenance_", None),  # set by from_study: study, trial, seed ...
        }

    def _write_folder(self, path: Path, meta: Attrs) -> Path:
        """Write the weights and ``meta`` into ``path`` (already checked by the subclass's ``save``)."""

        path.mkdir(parents=True, exist_ok=True)
        state = {name: tensor.detach().cpu().contiguous() for name, tensor in self.model_.state_dict().items()}
        # write to temporary names, then rename: an interrupted save never leaves a half-written pair
        tmp_weights, tmp_meta = path / (WEIGHTS_FILE + ".tmp"), path / (self.META_FILE + ".tmp")
        save_file(state, str(tmp_weights), metadata={"format_version": str(FORMAT_VERSION)})
        meta = {**meta, "digest": folder_digest(tmp_weights, meta)}  # what a load checks the folder against
        tmp_meta.write_text(json.dumps(meta, indent=2), encoding="utf-8")
        os.chmod(tmp_weights, tmp_meta.stat().st_mode & 0o7777)  # safetensors writes 0600; follow the umask
        os.replace(tmp_weights, path / WEIGHTS_FILE)
        os.replace(tmp_meta, path / self.META_FILE)
        return path

    @classmethod
    def _check_meta(cls, meta: Attrs, meta_path: Path) -> None:
        """The subclass's checks of its saved JSON as a whole."""
        raise NotImplementedError

    @classmethod
    def _read_meta(cls, path: Path) -> Attrs:
        """The checked JSON of a folder ``save`` wrote."""
        meta_path, weights_path = path / cls.META_FILE, path / WEIGHTS_FILE
        name = cls.__name__
        if not meta_path.is_file() or not weights_path.is_file():
            raise ValueError(f"{path} is not a saved {name}: expected {cls.META_FILE} and {WEIGHTS_FILE} in it")
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{meta_path} is not valid JSON ({exc}); the saved {cls.NOUN} is corrupt") from None
        if not isinstance(meta, dict) or meta.get("format") != cls.FORMAT:
            raise ValueError(f"{meta_path} was not written by {name}.save()")
        if meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"{path} has format_version {meta.get('format_version')!r}; this ilge-search "
                f"({__version__}) reads version {FORMAT_VERSION}. Save it again with a matching version."
            )
        cls._check_meta(meta, meta_path)
        return meta

    @classmethod
    def _saved_arguments(cls, meta: Attrs, classes: np.ndarray) -> Attrs:
        """The subclass's own constructor arguments read from its saved JSON (its pooling ...)."""
        return {cls.POOLING: meta[cls.POOLING]}

    @classmethod
    def _saved_model(cls, meta: Attrs, fitted: Fitted) -> torch.nn.Module:
        """The untrained model the saved JSON describes (``fitted.model`` is not set yet)."""
        raise NotImplementedError

    @classmethod
    def _saved_fitted(cls, meta: Attrs, meta_path: Path) -> Fitted:
        """The fitted state a saved JSON records, the model left to ``_saved_model`` (a placeholder here)."""
        config = config_from_dict(meta["config"])  # every field read here passed the subclass's _check_meta
        classes = np.asarray(meta["classes"])
        num_layers, hidden_size = int(meta["num_layers"]), int(meta["hidden_size"])
        recorded_kind = str(meta.get("classes_kind", classes.dtype.kind)).replace("u", "i")
        if classes.ndim != 1 or classes.dtype.kind.replace("u", "i") != recorded_kind:
            raise ValueError(f"{meta_path}: 'classes' do not match their recorded type; the file is corrupt")
        task_kind = meta.get("task_kind", "classification")
        score_range = meta.get("score_range")
        return Fitted(
            model=None,  # type: ignore[arg-type]  # built from this state by _saved_model
            config=config,
            classes=classes,
            num_layers=num_layers,
            hidden_size=hidden_size,
            task_kind=task_kind,
            score_range=None if score_range is None else (float(score_range[0]), float(score_range[1])),
            best_epoch=meta.get("best_epoch"),
            best_val_score=meta.get("best_val_score"),
            best_layer=config.layer if isinstance(config, BestLayerConfig) else None,
            provenance=meta.get("provenance") or None,
        )

    @classmethod
    def _load_folder(cls: type[EstimatorT], path: PathLike, options: LoadOptions) -> EstimatorT:
        """What ``load`` does: the checked JSON, the estimator it describes, then the checked weights."""
        path = Path(path)
        meta_path = path / cls.META_FILE
        meta = cls._read_meta(path)
        fitted = cls._saved_fitted(meta, meta_path)
        make: Callable[..., EstimatorT] = cls  # each subclass's own __init__ takes these arguments
        try:
            estimator = make(
                base_model=meta["base_model"],
                config=fitted.config,
                max_length=int(meta["max_length"]),
                batch_size=options.batch_size,
                device=options.device,
                random_state=int(meta["random_state"]),
                cache_dir=options.cache_dir,
                progress=options.progress,
                **cls._saved_arguments(meta, fitted.classes),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{meta_path} is missing or has invalid fields ({exc!r}); the file is corrupt") from None
        estimator.base_model = model_reference_to_load(meta["base_model"], path, options.base_model)
        model = cls._saved_model(meta, fitted)
        state = read_weights(path / WEIGHTS_FILE)
        _check_agreement(meta, state, path / cls.META_FILE, path / WEIGHTS_FILE, force=options.force)
        load_state(model, state, path / WEIGHTS_FILE)
        model.to(resolve_device(options.device)).eval()
        score_range = getattr(model, "score_range", fitted.score_range)  # as the built model reads it
        adopted: EstimatorT = estimator._adopt(replace(fitted, model=model, score_range=score_range))
        return adopted

    # ------------------------------------------------------------------ from a study

    @classmethod
    def _found_classes(cls, found: StudyModel, study_name: str) -> np.ndarray:
        """The classes of a study's label names (in the order the task sorted them)."""
        return np.asarray(found.label_names)

    @classmethod
    def _found_arguments(cls, found: StudyModel, classes: np.ndarray) -> Attrs:
        """The subclass's own constructor arguments for a study's model (its pooling ...)."""
        raise NotImplementedError

    @classmethod
    def from_study(
        cls: type[EstimatorT],
        storage: str | Storage | None,
        study_name: str,
        *,
        export: StudyExport | None = None,
        **settings: Any,
    ) -> EstimatorT:
        """The model a finished study found, as a fitted estimator (``save`` writes the usual folder).

        The final evaluation's weights (its best seed by validation), or for a study without one (or ``retrain=True``)
        the best trial retrained once with ``seed``; ``provenance_`` says which (study, trial, seed, storage without
        password, scores, versions). On the study's test split it scores the stored final test score of that seed. A
        similarity study gives a similarity model; a tagging study is exported by ``ILGETagger`` (its words made as the
        study made them). How the study is read is a :class:`~ilge_search.study.export.StudyExport` (its fields say
        what each setting does), given as ``export`` or as its fields by keyword (``device="cpu"``); keywords replace
        the fields of ``export``, and a keyword that is not a field is refused.
        """
        how = StudyExport.with_settings(export, settings)
        found = load_for_estimator(storage, study_name, how, tagging=cls.TAGGING)
        return cls._from_found(found, study_name, how)

    @classmethod
    def _from_found(cls: type[EstimatorT], found: StudyModel, study_name: str, export: StudyExport) -> EstimatorT:
        classes = cls._found_classes(found, study_name)
        make: Callable[..., EstimatorT] = cls  # each subclass's own __init__ takes these arguments
        estimator = make(**cls._found_arguments(found, classes), **found.estimator_arguments(export))
        fitted = Fitted(
            model=found.model_on(export.device),
            config=found.config,
            classes=classes,
            num_layers=found.num_layers,
            hidden_size=found.hidden_size,
            task_kind=found.task_kind,
            score_range=found.score_range,
            best_val_score=found.provenance.get("val_score"),
            best_layer=found.best_layer,
            provenance=dict(found.provenance),
        )
        adopted: EstimatorT = estimator._adopt(fitted)
        return adopted
