"""Training taggers: a feature standardiser, a per-token encoder and a linear head over sentences of words.

Data: a set of sentences is its word vectors ``features`` ``(W, L, D)`` (any float tensor,
a memory-mapped cache entry included), ``offsets`` ``(S + 1,)`` (sentence ``i`` is rows
``offsets[i]:offsets[i + 1]``) and one class id per word. Only the rows of a batch are read
and upcast, never the whole set.

Batches hold sentences of one length only, so a batch is a ``(B, T, L, D)`` block with no
padding and the per-token graph of each sentence is exactly its ``T * L`` (word, layer)
nodes. A batch has at most ``config.batch_size`` sentences and ``recipe.max_batch_nodes``
nodes; the batches, and the sentences within each length, are reshuffled every epoch from
the run's seed.

Encoders (:func:`build_tagger`): ``cayley`` and ``fc`` pass messages over one graph per
sentence (:func:`~ilge_search.encoders.aggregator.build_per_token_aggregator`, ``output_mode="per_token"``,
each word's layer nodes pooled as ``config.pooling`` says); every other family (``cayley-word``,
DeepSet and the layer baselines) reads each word's ``(L, D)`` on its own, so it cannot see the neighbouring words.
Metrics are over words: ``accuracy`` (the selection metric), ``macro_f1`` and ``loss``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from ..embeddings.models import resolve_device
from ..encoders.aggregator import build_aggregator, build_per_token_aggregator
from ..encoders.configs import BestLayerConfig, CayleyConfig, CayleyWordConfig, EncoderConfig, FCConfig
from .loop import TAGGING, RunSettings, TrainResult, run_epochs
from .metrics import check_finite, check_label_range, class_metrics
from .standardizer import FeatureStandardizer

__all__ = [
    "WordSet",
    "TaggerModel",
    "build_tagger",
    "sentence_batches",
    "as_word_set",
    "prepare_words",
    "train_prepared_words",
    "predict_word_logits",
    "evaluate_words",
]

EVAL_BATCH_NODES = 65536  # (word, layer) nodes per batch when predicting


@dataclass(frozen=True)
class WordSet:
    """Sentences of word vectors, checked: ``features`` ``(W, L, D)``, ``offsets`` ``(S + 1,)`` int64 and
    ``labels`` ``(W,)`` int64 class ids (None when there is nothing to score)."""

    features: torch.Tensor
    offsets: np.ndarray
    labels: torch.Tensor | None = None

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def num_words(self) -> int:
        return int(self.features.shape[0])

    def gather(self, sentences: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
        """Sentences of one length as ``(B, T, L, D)`` (the stored dtype), and their rows in ``features``."""
        length = int(self.offsets[sentences[0] + 1] - self.offsets[sentences[0]])
        rows = (self.offsets[sentences][:, None] + np.arange(length)).reshape(-1)
        block = self.features[torch.from_numpy(rows)]
        return block.view(len(sentences), length, *self.features.shape[1:]), rows


def _ragged_parts(features: Any, name: str) -> tuple[Any, Any]:
    """``(word features, sentence offsets)`` from a pair, or from an object that has both (a cache entry)."""
    if hasattr(features, "features") and hasattr(features, "offsets"):
        return features.features, features.offsets
    if isinstance(features, (tuple, list)) and len(features) == 2:
        return features[0], features[1]
    raise ValueError(
        f"{name} features of a tagging task must be (word features (W, L, D), sentence offsets (S + 1,)) "
        f"or a word cache entry, got {type(features).__name__}"
    )


def _check_offsets(offsets: Any, num_words: int, name: str) -> np.ndarray:
    offsets = np.asarray(offsets)
    if offsets.ndim != 1 or offsets.dtype.kind not in "iu" or len(offsets) < 2:
        raise ValueError(f"{name} sentence offsets must be a 1-D integer array of S + 1 positions")
    offsets = offsets.astype(np.int64)
    if offsets[0] != 0 or offsets[-1] != num_words or (np.diff(offsets) <= 0).any():
        raise ValueError(
            f"{name} sentence offsets must rise strictly from 0 to the number of words ({num_words}); "
            f"got {offsets[0]} .. {offsets[-1]}, every sentence needs at least one word"
        )
    return offsets


def as_word_set(features: Any, labels: Any, name: str) -> WordSet:
    """Check a tagging set: ``features`` is ``(word features, sentence offsets)`` or a word cache entry;
    ``labels`` one class id per word (or None). Problems are one-line ``ValueError``\\ s naming ``name``."""
    words, offsets = _ragged_parts(features, name)
    words = torch.as_tensor(words)
    if not words.is_floating_point() or words.dim() != 3 or words.shape[0] == 0:
        raise ValueError(
            f"{name} word features must be a non-empty float tensor (W, L, D), got {words.dtype} {tuple(words.shape)}"
        )
    offsets = _check_offsets(offsets, words.shape[0], name)
    check_finite(words, name, "word features", "word")
    if labels is None:
        return WordSet(words, offsets)
    labels = torch.as_tensor(np.asarray(labels) if not isinstance(labels, torch.Tensor) else labels)
    if labels.dim() != 1 or labels.shape[0] != words.shape[0]:
        raise ValueError(f"{name} has {words.shape[0]} words but labels of shape {tuple(labels.shape)}; one per word")
    if labels.is_floating_point() or labels.dtype == torch.bool:
        raise ValueError(f"{name} labels must be integer class ids, got {labels.dtype}")
    return WordSet(words, offsets, labels.long())


def sentence_batches(
    lengths: np.ndarray, batch_size: int, max_nodes: int, num_layers: int, generator: torch.Generator | None = None
) -> list[np.ndarray]:
    """Sentence indices grouped by length, cut into batches of at most ``batch_size`` sentences and
    ``max_nodes`` (word, layer) nodes (one sentence at least). With ``generator`` the sentences of each
    length and the batches are in a random order, else in index order, shortest first."""
    count = len(lengths)
    order = torch.randperm(count, generator=generator).numpy() if generator is not None else np.arange(count)
    order = order[np.argsort(lengths[order], kind="stable")]
    groups = np.split(order, np.flatnonzero(np.diff(lengths[order])) + 1)
    batches = []
    for group in groups:
        per_batch = max(1, min(batch_size, max_nodes // (int(lengths[group[0]]) * num_layers)))
        batches += [group[start : start + per_batch] for start in range(0, len(group), per_batch)]
    if generator is not None:
        batches = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
    return batches


# --------------------------------------------------------------------------- model


class TaggerModel(nn.Module):
    """A feature standardiser, a per-token encoder and a linear head; what tagging training returns.

    Args:
        encoder: a :class:`~ilge_search.encoders.aggregator.PerTokenAggregator` (``per_word=False``: one graph
            per sentence) or an :class:`~ilge_search.encoders.aggregator.Aggregator` applied to each word alone.
        head: ``nn.Linear(encoder.out_dim, num_classes)``.
        per_word: whether ``encoder`` reads words one at a time.

    Shapes:
        - input: ``(B, T, L, D)``, sentences of ``T`` words each
        - output: logits ``(B, T, num_classes)``
    """

    def __init__(self, encoder: Any, head: nn.Linear, per_word: bool) -> None:
        super().__init__()
        self.num_layers, self.hidden_in = int(encoder.num_layers), int(encoder.hidden_in)
        self.standardizer = FeatureStandardizer(self.num_layers, self.hidden_in)
        self.encoder = encoder
        self.head = head
        self.per_word = per_word
        self.task_kind = TAGGING

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, T, L, D)`` -> ``(B, T, out_dim)``: each word's representation before the head."""
        z = self.standardizer(x)
        if self.per_word:
            batch, length = x.shape[:2]
            return self.encoder(z.flatten(0, 1)).view(batch, length, -1)
        with warnings.catch_warnings():
            # a long sentence's graph is large by nature; the batch's node cap already bounds the cost
            warnings.filterwarnings("ignore", message="per-token graph has")
            return self.encoder(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x))

    def extra_repr(self) -> str:
        return f"task_kind={self.task_kind!r}, per_word={self.per_word}"


def build_tagger(config: EncoderConfig, num_layers: int, hidden_in: int, num_classes: int) -> TaggerModel:
    """An untrained :class:`TaggerModel` for ``config`` (initialised from the global torch RNG).

    ``cayley``/``fc`` get one graph per sentence; any other family (``cayley-word`` included: the Cayley
    graph over one word's layers) reads each word's layers alone.
    """

    if num_classes is None or num_classes < 2:
        raise ValueError(f"tagging needs num_classes >= 2, got {num_classes!r}")
    if isinstance(config, (CayleyConfig, FCConfig)) and not isinstance(config, CayleyWordConfig):
        encoder: Any = build_per_token_aggregator(
            config, num_layers, hidden_in, token_pooling=config.pooling, output_mode="per_token"
        )
        per_word = False
    else:
        encoder, per_word = build_aggregator(config, num_layers=num_layers, hidden_in=hidden_in), True
    return TaggerModel(encoder, nn.Linear(encoder.out_dim, num_classes), per_word)


# --------------------------------------------------------------------------- evaluation


@torch.no_grad()
def predict_word_logits(
    model: TaggerModel, words: Any, device: str | torch.device | None = None, max_batch_nodes: int = EVAL_BATCH_NODES
) -> torch.Tensor:
    """Logits ``(W, C)`` float32 on CPU, one row per word in the order of ``words`` (a :class:`WordSet`,
    a word cache entry, or ``(word features, sentence offsets)``). Restores the model's mode afterwards."""
    words = words if isinstance(words, WordSet) else as_word_set(words, None, "prediction")
    device = resolve_device(device if device is not None else next(model.parameters()).device)
    was_training = model.training
    model.eval()
    out = torch.empty(words.num_words, int(model.head.out_features))
    try:
        for sentences in sentence_batches(words.lengths, words.num_words, max_batch_nodes, model.num_layers):
            block, rows = words.gather(sentences)
            logits = model(block.to(device=device, dtype=torch.float32))
            out[torch.from_numpy(rows)] = logits.reshape(len(rows), -1).float().cpu()
    finally:
        model.train(was_training)
    return out


def evaluate_words(model: TaggerModel, features: Any, labels: Any, device: str | torch.device | None = None) -> dict:
    """``accuracy``, ``macro_f1`` and ``loss`` over the words of a labelled set."""
    words = as_word_set(features, labels, "evaluation")
    assert words.labels is not None
    check_label_range(words.labels, int(model.head.out_features), "evaluation")
    return class_metrics(predict_word_logits(model, words, device), words.labels)


# --------------------------------------------------------------------------- training


@dataclass(frozen=True)
class PreparedWords:
    """Checked training and validation sentences, and the number of classes."""

    train: WordSet
    val: WordSet
    num_classes: int

    @property
    def num_layers(self) -> int:
        return int(self.train.features.shape[1])

    @property
    def hidden_in(self) -> int:
        return int(self.train.features.shape[2])


def prepare_words(train: Sequence[Any], val: Sequence[Any], num_classes: int | None) -> PreparedWords:
    """Check both sets once (shapes, offsets, NaN/inf, one label per word, label range)."""
    sets = []
    for name, pair in (("train", train), ("validation", val)):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"{name} must be a (features, labels) pair; tagging features are (words, offsets)")
        sets.append(as_word_set(pair[0], pair[1], name))
    train_set, val_set = sets
    if train_set.features.shape[1:] != val_set.features.shape[1:]:
        raise ValueError(
            f"train and validation word features differ in shape: {tuple(train_set.features.shape[1:])} vs "
            f"{tuple(val_set.features.shape[1:])}"
        )
    assert train_set.labels is not None and val_set.labels is not None
    if num_classes is None:
        num_classes = int(max(train_set.labels.max(), val_set.labels.max())) + 1
    check_label_range(train_set.labels, num_classes, "train")
    check_label_range(val_set.labels, num_classes, "validation")
    return PreparedWords(train_set, val_set, num_classes)


class _TaggingTask:
    """Sentences of words for :func:`~ilge_search.engine.loop.run_epochs`."""

    def __init__(self, config: EncoderConfig, data: PreparedWords, run: RunSettings) -> None:
        self.config, self.data, self.run = config, data, run
        self.device = resolve_device(run.device)

    def build(self) -> TaggerModel:
        data, recipe, fitted = self.data, self.run.recipe, self.run.fitted_standardizer
        model = build_tagger(self.config, data.num_layers, data.hidden_in, data.num_classes)
        if recipe.standardize and fitted is not None:
            model.standardizer.load_state_dict(fitted.state_dict())
        elif recipe.standardize:
            model.standardizer.fit(data.train.features)
        return model.to(self.device)

    def train_epoch(self, model: nn.Module, optimizer: torch.optim.Optimizer, generator: torch.Generator) -> float:
        train, recipe = self.data.train, self.run.recipe
        assert train.labels is not None
        model.train()
        loss_sum = torch.zeros((), device=self.device)
        batches = sentence_batches(
            train.lengths, self.config.batch_size, recipe.max_batch_nodes, self.data.num_layers, generator
        )
        for sentences in batches:
            block, rows = train.gather(sentences)
            targets = train.labels[torch.from_numpy(rows)].to(self.device)
            logits = model(block.to(device=self.device, dtype=torch.float32))
            loss = nn.functional.cross_entropy(logits.reshape(len(rows), -1), targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach() * len(rows)
        return float(loss_sum) / train.num_words

    def validate(self, model: nn.Module) -> dict[str, float]:
        assert self.data.val.labels is not None
        logits = predict_word_logits(cast(TaggerModel, model), self.data.val, self.device)
        return class_metrics(logits, self.data.val.labels)


def train_prepared_words(config: EncoderConfig, data: PreparedWords, run: RunSettings) -> TrainResult:
    """Train a tagger on checked sentences (what ``train_encoder(task_kind="tagging")`` runs)."""
    if isinstance(config, BestLayerConfig) and config.layer is None:
        raise ValueError("BestLayerConfig.layer is None: choose it with select_best_layer(task_kind='tagging')")
    return run_epochs(config, _TaggingTask(config, data, run), run)
