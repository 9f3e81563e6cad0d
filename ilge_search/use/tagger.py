"""``ILGETagger``: one tag per word, from an encoder over every layer of a frozen LLM, scikit-learn style.

The frozen LLM turns each word into its per-layer states ``(L, D)`` (its first piece, or the mean of its pieces, through
the one embedding cache's word entries), and the one training engine trains a per-token encoder and a linear head on
them. A graph family (``cayley``, ``fc``) passes messages over one graph per sentence, whose nodes are the sentence's
(word, layer) pairs; any other family reads each word's layers alone.

The estimator follows scikit-learn's rules: ``__init__`` only stores its arguments, ``fit`` returns ``self``, fitted
state ends in ``_``, the seed comes in as ``random_state``, and ``sklearn.base.clone`` works. Inputs are sentences
already split into words (``"The cat sat".split()``); ``predict`` returns one list of tags per sentence.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..embeddings.word_cache import WordOptions, get_or_extract_sentences
from ..embeddings.words import WORD_POOLINGS, check_sentences
from ..encoders.configs import EncoderConfig
from ..engine import build_tagger, predict_logits
from ..record.fields import Attrs
from ..validation import check_choice, check_int
from .estimator import FORMAT_VERSION, WEIGHTS_FILE, Fitted, LoadOptions, SavedEstimator
from .saved import check_saved_fields

if TYPE_CHECKING:
    from ..engine import TaggerModel
    from ..study.export import StudyModel

__all__ = ["ILGETagger", "FORMAT_VERSION", "META_FILE", "check_tagger_folder"]

FORMAT = "ilge-search-tagger"
META_FILE = "ilge_tagger.json"

PathLike = str | os.PathLike


def _check_tags(tags: Any, sentences: list[list[str]], name: str) -> list[list[Any]]:
    """One list of tags per sentence, each as long as its sentence; tags all strings or all integers."""
    if isinstance(tags, (str, bytes)):
        raise ValueError(f"{name} must be a list of tag lists, one per sentence, not one string")
    tags = [list(row) if not isinstance(row, (str, bytes)) else row for row in tags]
    if len(tags) != len(sentences):
        raise ValueError(f"got {len(sentences)} sentences but {len(tags)} {name}; give one list of tags per sentence")
    for i, (row, words) in enumerate(zip(tags, sentences, strict=True)):
        if isinstance(row, (str, bytes)) or len(row) != len(words):
            count = "a string" if isinstance(row, (str, bytes)) else f"{len(row)} tags"
            raise ValueError(f"{name}[{i}] has {count} for {len(words)} words; give exactly one tag per word")
    kinds = {type(tag) for row in tags for tag in row}
    if not kinds <= {str} and not all(issubclass(kind, (int, np.integer)) and kind is not bool for kind in kinds):
        raise ValueError(f"{name} must be all strings or all integers, got {sorted(k.__name__ for k in kinds)}")
    return tags


def _flat(tags: list[list[object]]) -> np.ndarray:
    return np.asarray([tag for row in tags for tag in row])


class ILGETagger(SavedEstimator):
    """Word tagger: an encoder over every layer of a frozen LLM's word states, plus a linear head.

    Args:
        base_model: model alias (``"minilm-l6"``, ``"smollm2-135m"``), local folder or Hugging Face id.
        config: an encoder config (default ``CayleyConfig()``: one graph per sentence), or a family name such as
            ``"last-layer"`` for its defaults; ``BestLayerConfig(layer=None)`` picks the layer on validation data.
        word_pooling: ``"first"`` (a word is its first piece) or ``"mean"`` (the mean of its pieces).
        max_length: pieces per model input; longer sentences are cut into windows, never truncated.
        batch_size: model inputs per LLM forward pass (the encoder's batch is ``config.batch_size`` sentences).
        device: ``"auto"``, ``"cpu"``, ``"cuda"`` ...
        random_state: seeds the validation split, initialisation and batch order.
        cache_dir: embedding cache (default: ``$ILGE_SEARCH_CACHE`` or ``~/.cache/ilge-search``).
        progress: show progress bars.
        val_fraction: share of the training sentences held out for early stopping when no validation sentences are
            given.
        patience: early-stopping patience in epochs.

    Fitted attributes:
        classes_ (the tags, sorted), model_, config_ (resolved), num_layers_, hidden_size_, history_,
        best_epoch_, best_val_score_ (validation token accuracy), num_trainable_params_, and for
        best-layer ``best_layer_`` and ``layer_scores_``.
    """

    FORMAT = FORMAT
    META_FILE = META_FILE
    NOUN = "tagger"
    POOLING = "word_pooling"
    TAGGING = True

    word_pooling: str

    model_: TaggerModel

    def __init__(
        self,
        base_model: PathLike | None = None,
        config: EncoderConfig | str | None = None,
        word_pooling: str = "first",
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
        self.word_pooling = word_pooling
        self.max_length = max_length
        self.batch_size = batch_size
        self.device = device
        self.random_state = random_state
        self.cache_dir = cache_dir
        self.progress = progress
        self.val_fraction = val_fraction
        self.patience = patience

    # ------------------------------------------------------------------ checks

    def _check_params(self) -> EncoderConfig:
        if self.base_model is None or not isinstance(self.base_model, (str, os.PathLike)):
            raise ValueError(f"base_model must be a model name or folder, got {self.base_model!r}")
        check_choice("word_pooling", self.word_pooling, WORD_POOLINGS)
        check_int("max_length", self.max_length)
        check_int("batch_size", self.batch_size)
        check_int("patience", self.patience)
        self._check_run_params()
        return self._resolved_config()

    def _encode(self, tags: list[list[object]], name: str) -> np.ndarray:
        flat = _flat(tags)
        if flat.dtype.kind != self.classes_.dtype.kind and not (
            flat.dtype.kind in "iu" and self.classes_.dtype.kind in "iu"
        ):
            raise ValueError(f"{name} are {flat.dtype} but the tags seen in fit are {self.classes_.dtype}")
        unseen = np.setdiff1d(np.unique(flat), self.classes_)
        if unseen.size:
            raise ValueError(
                f"{name} contain {unseen.size} tag(s) not seen in training: {unseen[:10].tolist()}; "
                f"known tags: {self.classes_[:20].tolist()}"
            )
        return np.searchsorted(self.classes_, flat).astype(np.int64)

    # ------------------------------------------------------------------ embeddings

    def _embed(self, sentences: list[list[str]]) -> Any:
        """The sentences' word entry (memory-mapped); only sentences never extracted reach the LLM."""

        options = WordOptions(
            word_pooling=self.word_pooling, max_length=self.max_length, batch_size=self.batch_size, device=self.device
        )
        model = cast(PathLike, self.base_model)  # checked by _check_params
        return get_or_extract_sentences(
            self._embedding_cache(), model, sentences, options, progress=bool(self.progress)
        )

    # ------------------------------------------------------------------ fitting

    def _validation_split(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Seeded split of the training sentences into (train, validation) positions."""
        held_out = round(count * float(self.val_fraction))
        if count < 2 or held_out == 0 or held_out == count:
            raise ValueError(
                f"{count} training sentence(s) are too few to hold out {self.val_fraction:.0%} for validation; "
                f"pass val_sentences/val_tags, or more sentences"
            )
        order = np.random.default_rng(int(self.random_state)).permutation(count)
        return np.sort(order[held_out:]), np.sort(order[:held_out])

    def fit(
        self,
        sentences: Sequence[Sequence[str]],
        tags: Sequence[Sequence[object]],
        val_sentences: Sequence[Sequence[str]] | None = None,
        val_tags: Sequence[Sequence[object]] | None = None,
    ) -> ILGETagger:
        """Embed the words with the frozen LLM and train the encoder and head.

        Tags may be strings or integers. Without validation sentences, a seeded ``val_fraction``
        of the training sentences is held out for early stopping.
        """
        config = self._check_params()
        words = check_sentences(sentences)
        gold = _check_tags(tags, words, "tags")
        if (val_sentences is None) != (val_tags is None):
            raise ValueError("pass both val_sentences and val_tags, or neither")
        if val_sentences is None:
            train_rows, val_rows = self._validation_split(len(words))
            val_words, val_gold = [words[i] for i in val_rows], [gold[i] for i in val_rows]
            words, gold = [words[i] for i in train_rows], [gold[i] for i in train_rows]
        else:
            val_words = check_sentences(val_sentences, "val_sentences")
            val_gold = _check_tags(val_tags, val_words, "val_tags")
        self.classes_ = np.unique(_flat(gold))
        if len(self.classes_) < 2:
            raise ValueError(f"need at least 2 distinct tags to train a tagger, got {self.classes_.tolist()}")
        y, y_val = self._encode(gold, "tags"), self._encode(val_gold, "val_tags")
        trained = self._trained(config, self.classes_, (self._embed(words), y), (self._embed(val_words), y_val))
        return self._adopt(trained)

    # ------------------------------------------------------------------ prediction

    def predict(self, sentences: Sequence[Sequence[str]]) -> list[list[object]]:
        """One list of tags per sentence, one tag per word, in the type given to ``fit``."""

        self._check_fitted()
        self._check_params()
        sentences = check_sentences(sentences)
        entry = self._embed(sentences)
        if (entry.num_layers, entry.hidden_size) != (self.num_layers_, self.hidden_size_):
            raise ValueError(
                f"{self.base_model!r} gives ({entry.num_layers}, {entry.hidden_size}) word states but the tagger "
                f"was fitted on ({self.num_layers_}, {self.hidden_size_})"
            )
        predicted = self.classes_[predict_logits(self.model_, entry, device=self.device).argmax(dim=1).numpy()]
        return [predicted[entry.offsets[i] : entry.offsets[i + 1]].tolist() for i in range(entry.num_sentences)]

    def score(self, sentences: Sequence[Sequence[str]], tags: Sequence[Sequence[object]]) -> float:
        """Token accuracy: the share of words whose predicted tag is the given one."""
        self._check_fitted()
        checked = check_sentences(sentences)
        gold = _flat(_check_tags(tags, checked, "tags"))
        predicted = _flat(self.predict(checked))
        return float((predicted == gold).mean())

    # ------------------------------------------------------------------ persistence

    def save(self, path: PathLike) -> Path:
        """Write ``model.safetensors`` and ``ilge_tagger.json`` into the folder ``path``.

        The LLM is not saved, only its name; no pickle is used. Files of those names that an
        earlier ``ILGETagger.save`` did not write are never replaced: the save is refused.
        """
        self._check_fitted()
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise ValueError(f"{path} exists and is not a folder; save() writes a folder")
        _refuse_foreign_files(path)
        return self._write_folder(path, self._saved_meta(path))

    @classmethod
    def _check_meta(cls, meta: Attrs, meta_path: Path) -> None:
        check_saved_fields(meta, meta_path, classes_needed=1)

    @classmethod
    def _saved_model(cls, meta: Attrs, fitted: Fitted) -> TaggerModel:

        return build_tagger(fitted.config, fitted.num_layers, fitted.hidden_size, len(fitted.classes))

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
    ) -> ILGETagger:
        """Rebuild a tagger written by :meth:`save` (the LLM loads on the first ``predict``).

        The recorded base model is used if it is an alias, a hub id or a folder inside ``path``;
        one elsewhere on disk is refused unless given as ``base_model`` (which replaces it). A folder whose
        weights or tags differ from the digest its save recorded is refused unless ``force``.
        """
        return cls._load_folder(path, LoadOptions(device, cache_dir, batch_size, progress, base_model, force))

    @classmethod
    def _found_arguments(cls, found: StudyModel, classes: np.ndarray) -> Attrs:
        return {"word_pooling": found.word_pooling or "first"}


def check_tagger_folder(path: PathLike) -> Path:
    """``path`` if :meth:`ILGETagger.save` may write there (a new or empty folder, or an earlier save);
    else a one-line ``ValueError``, before any work."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{path} exists and is not a folder; the tagger is saved as a folder")
    _refuse_foreign_files(path)
    return path


def _refuse_foreign_files(path: Path) -> None:
    """Refuse to replace a weights or record file that an ``ILGETagger.save`` did not write."""
    weights, meta = path / WEIGHTS_FILE, path / META_FILE
    ours = False
    if meta.exists():
        try:
            ours = json.loads(meta.read_text(encoding="utf-8")).get("format") == FORMAT
        except (OSError, ValueError, AttributeError):
            ours = False
    if (meta.exists() or weights.exists()) and not ours:
        found = ", ".join(p.name for p in (weights, meta) if p.exists())
        raise ValueError(
            f"{path} already holds {found}, not written by ILGETagger.save(); save into a new or empty folder"
        )
