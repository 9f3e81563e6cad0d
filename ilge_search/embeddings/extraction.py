"""The one extraction path: every hidden state of a frozen model, pooled over tokens or over words.

Texts are sorted by length so that each batch needs little padding, run under ``torch.inference_mode``
with ``output_hidden_states=True``, and each batch is pooled at once to ``(batch, num_layers, hidden)``
((N, L, T, D) is never held); :meth:`LayerEmbedder.iter_pooled_batches` streams them in the original
order. Sentences of words take the same path (:meth:`LayerEmbedder.iter_word_batches`, windows and
word pooling of :mod:`ilge_search.embeddings.words`).
"""

from __future__ import annotations

import gc
import inspect
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..progress import BarSpec, new_bar
from ..tasks.tagging import sentence_offsets
from ..validation import check_int
from .entry_file import STORAGE_DTYPES
from .models import (
    ModelSource,
    load_config,
    load_model_and_tokenizer,
    resolve_device,
    resolve_dtype,
    resolve_model,
    text_config,
)
from .words import WORD_POOLINGS, WordTokenizer, WordWindow, check_sentences, pool_window_words

__all__ = [
    "POOLINGS",
    "ExtractionSettings",
    "WORD_POOLINGS",
    "LayerEmbedder",
    "check_texts",
    "extract_layer_embeddings",
    "pool_hidden_states",
]

POOLINGS = ("mean", "last", "first", "mean_including_padding")
PathLike = str | os.PathLike
_LENGTH_CHUNK = 2048  # texts tokenised at a time when measuring lengths


def _check_pooling(pooling: str) -> None:
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {list(POOLINGS)}, got {pooling!r}")


def pool_hidden_states(
    hidden_states: Sequence[torch.Tensor], attention_mask: torch.Tensor, pooling: str = "mean"
) -> torch.Tensor:
    """Pool each layer's tokens into one vector, in float32.

    ``mean`` averages the real tokens; ``last``/``first`` take the last/first real token
    (found from the mask, so left and right padding give the same result);
    ``mean_including_padding`` averages every position.

    Shapes:
        hidden_states: L tensors of (B, T, D); attention_mask: (B, T) -> (B, L, D).
    """
    _check_pooling(pooling)
    mask = attention_mask.to(torch.bool)  # (B, T)
    batch, length = mask.shape
    first = hidden_states[0]
    out = torch.empty(batch, len(hidden_states), first.shape[-1], dtype=torch.float32, device=first.device)
    if pooling in ("last", "first"):
        as_int = mask.to(torch.int32)
        if pooling == "last":
            position = length - 1 - as_int.flip(1).argmax(1)  # (B,) last 1 in each row
        else:
            position = as_int.argmax(1)  # (B,) first 1 in each row
        rows = torch.arange(batch, device=mask.device)
        for layer, h in enumerate(hidden_states):
            out[:, layer] = h[rows, position].float()
        return out
    if pooling == "mean_including_padding":
        for layer, h in enumerate(hidden_states):
            out[:, layer] = h.float().mean(1)
        return out
    keep = mask.unsqueeze(-1)  # (B, T, 1)
    counts = mask.sum(1, keepdim=True).clamp(min=1).to(torch.float32)  # (B, 1)
    for layer, h in enumerate(hidden_states):
        # masked_fill, not a multiply: padded positions may hold NaN in some attention kernels.
        out[:, layer] = h.float().masked_fill(~keep, 0.0).sum(1) / counts
    return out


class LayerEmbedder:
    """Pooled embeddings of every layer of a frozen model; the model loads on first use.

    Args:
        model: an alias (``minilm-l6``, ``smollm2-135m``), local folder, hub id or :class:`ModelSource`.
        pooling: ``mean`` (real tokens), ``last``, ``first`` or ``mean_including_padding``.
        max_length: longer texts are truncated to this many tokens (and to the model's limit).
        batch_size: texts per forward pass.
        device: ``auto`` (cuda, then mps, then cpu) or a torch device string.
        dtype: ``auto`` (bfloat16 on CUDA, float32 elsewhere) or a dtype name.
        cache_dir: where GGUF aliases are converted and weight hashes memoised.
        padding_side: override the tokenizer's (``left``/``right``); None keeps its default.

    Shapes:
        embed: N texts -> (N, L, D) float32 with L = ``num_layers`` = num_hidden_layers + 1.
    """

    def __init__(
        self,
        model: str | PathLike | ModelSource,
        pooling: str = "mean",
        max_length: int = 512,
        batch_size: int = 32,
        device: str = "auto",
        dtype: str | torch.dtype = "auto",
        cache_dir: PathLike | None = None,
        padding_side: str | None = None,
    ) -> None:
        _check_pooling(pooling)
        for name, value in (("max_length", max_length), ("batch_size", batch_size)):
            check_int(name, value)
        if padding_side not in (None, "left", "right"):
            raise ValueError(f"padding_side must be 'left', 'right' or None, got {padding_side!r}")
        resolve_device(device)  # a device this machine lacks fails here, not after loading the model
        self.model = model
        self.pooling = pooling
        self.max_length = max_length
        self.batch_size = batch_size
        self.device = device
        self.dtype = dtype
        self.cache_dir = cache_dir
        self.padding_side = padding_side
        self._source: ModelSource | None = None
        self._model: Any = None
        self._tokenizer: Any = None
        self._config: Any = None
        self._forward_kwargs: dict = {}
        self._accepts_position_ids = False

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(model={str(self.model)!r}, pooling={self.pooling!r}, "
            f"max_length={self.max_length}, batch_size={self.batch_size}, device={self.device!r})"
        )

    # -- model -------------------------------------------------------------------------

    @property
    def source(self) -> ModelSource:
        """The resolved model (no weights loaded)."""
        if self._source is None:
            self._source = resolve_model(self.model, self.cache_dir, materialize=False)
        return self._source

    @property
    def is_loaded(self) -> bool:
        return self._model is not None

    def _load_config(self) -> Any:
        if self._config is None:
            if self._model is not None:
                self._config = self._model.config
            else:
                self._config = load_config(self.source, self.cache_dir)
        return text_config(self._config)

    @property
    def num_layers(self) -> int:
        """``num_hidden_layers + 1`` (the embedding output plus every block)."""
        return int(self._load_config().num_hidden_layers) + 1

    @property
    def hidden_size(self) -> int:
        return int(self._load_config().hidden_size)

    @property
    def effective_max_length(self) -> int:
        """``max_length`` capped at the model's position embeddings and the tokenizer's limit."""
        limits = [self.max_length]
        positions = getattr(self._load_config(), "max_position_embeddings", None)
        if positions:
            limits.append(int(positions))
        tokenizer_limit = getattr(self._tokenizer, "model_max_length", None)
        if tokenizer_limit and tokenizer_limit < 1_000_000:  # "no limit" is stored as a huge number
            limits.append(int(tokenizer_limit))
        return min(limits)

    def load(self) -> LayerEmbedder:
        """Load the model and tokenizer now (``embed`` does this on first use)."""
        if self._model is None:
            device = resolve_device(self.device)
            model, tokenizer = load_model_and_tokenizer(
                self.source, device, resolve_dtype(self.dtype, device), self.cache_dir
            )
            if self.padding_side is not None:
                tokenizer.padding_side = self.padding_side
            parameters = inspect.signature(model.forward).parameters
            self._forward_kwargs = {"use_cache": False} if "use_cache" in parameters else {}
            self._accepts_position_ids = "position_ids" in parameters
            self._model, self._tokenizer, self._config = model, tokenizer, model.config
        return self

    def unload(self) -> None:
        """Drop the model and tokenizer to free memory; the next ``embed`` reloads them."""
        was_cuda = self._model is not None and next(self._model.parameters()).is_cuda
        self._model = self._tokenizer = None
        gc.collect()
        if was_cuda:
            torch.cuda.empty_cache()

    # -- extraction --------------------------------------------------------------------

    def _token_lengths(self, texts: Sequence[str]) -> np.ndarray:
        lengths = np.empty(len(texts), dtype=np.int64)
        for start in range(0, len(texts), _LENGTH_CHUNK):
            chunk = list(texts[start : start + _LENGTH_CHUNK])
            ids = self._tokenizer(chunk, truncation=True, max_length=self.effective_max_length)["input_ids"]
            lengths[start : start + len(chunk)] = [len(row) for row in ids]
        return lengths

    def iter_pooled_batches(
        self, texts: Sequence[str], progress: bool = True
    ) -> Iterator[tuple[np.ndarray, torch.Tensor]]:
        """Yield ``(indices, pooled)``: positions in ``texts`` and their (b, L, D) float32 CPU tensor.

        Batches come longest first (padding is minimal and any out-of-memory shows at once).
        """
        texts = check_texts(texts)
        self.load()
        lengths = self._token_lengths(texts)
        if (lengths == 0).any():
            bad = np.flatnonzero(lengths == 0)[:10].tolist()
            raise ValueError(f"texts at positions {bad} produce no tokens with this tokenizer; remove them")
        order = np.argsort(-lengths, kind="stable")
        bar = new_bar(BarSpec(f"embed {self.source.name}", len(texts), "text", enabled=progress))
        try:
            for start in range(0, len(order), self.batch_size):
                indices = order[start : start + self.batch_size]
                encoded = self._tokenizer(
                    [texts[i] for i in indices],
                    padding=True,
                    truncation=True,
                    max_length=self.effective_max_length,
                    return_tensors="pt",
                )
                with torch.inference_mode():
                    hidden_states, mask = self._hidden_states(encoded)
                    pooled = pool_hidden_states(hidden_states, mask, self.pooling)
                del hidden_states
                bar.update(len(indices))
                yield indices, pooled.cpu()
        finally:
            bar.close()

    def _hidden_states(self, encoded: Any) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """Every hidden state of a padded batch (call under ``torch.inference_mode``), and its attention mask."""
        device = next(self._model.parameters()).device
        encoded = {name: tensor.to(device) for name, tensor in encoded.items()}
        mask = encoded["attention_mask"]
        extra = dict(self._forward_kwargs)
        if self._accepts_position_ids and bool((mask[:, 0] == 0).any()):
            # Left padding: count positions from each row's first real token, as with no padding.
            extra["position_ids"] = (mask.long().cumsum(-1) - 1).clamp(min=0)
        outputs = self._model(**encoded, **extra, output_hidden_states=True, return_dict=True)
        return outputs.hidden_states, mask

    def word_windows(self, sentences: Sequence[Sequence[str]], window_overlap: int = 0) -> list[WordWindow]:
        """Every sentence's model inputs: one window each, or several for one longer than
        :attr:`effective_max_length` pieces (``window_overlap`` pieces shared between neighbours).
        Loads the tokenizer (and the model) if needed; raises ``ValueError`` for a word the
        tokenizer drops or one too long for a window."""
        check_int("window_overlap", window_overlap, minimum=0)
        self.load()
        tokenizer = WordTokenizer(self._tokenizer)
        max_length = self.effective_max_length
        return [
            window
            for index, words in enumerate(sentences)
            for window in tokenizer.windows(index, words, max_length, window_overlap)
        ]

    def iter_word_batches(
        self,
        sentences: Sequence[Sequence[str]],
        word_pooling: str = "first",
        window_overlap: int = 0,
        progress: bool = True,
    ) -> Iterator[tuple[np.ndarray, torch.Tensor]]:
        """Yield ``(rows, pooled)``: positions of words in the sentences' words laid end to end, and their
        (n, L, D) float32 CPU tensor. Every word of every sentence comes exactly once.

        ``word_pooling``: ``first`` (the word's first piece) or ``mean`` (all its pieces).
        Windows come longest first, as texts do in :meth:`iter_pooled_batches`.
        """
        if word_pooling not in WORD_POOLINGS:
            raise ValueError(f"word_pooling must be one of {list(WORD_POOLINGS)}, got {word_pooling!r}")
        sentences = check_sentences(sentences)
        windows = self.word_windows(sentences, window_overlap)
        offsets = sentence_offsets([len(words) for words in sentences])
        order = sorted(range(len(windows)), key=lambda i: -len(windows[i].input_ids))
        bar = new_bar(BarSpec(f"embed {self.source.name}", int(offsets[-1]), "word", enabled=progress))
        try:
            for start in range(0, len(order), self.batch_size):
                batch = [windows[i] for i in order[start : start + self.batch_size]]
                encoded = self._tokenizer.pad({"input_ids": [w.input_ids for w in batch]}, return_tensors="pt")
                length = encoded["input_ids"].shape[1]
                left = self._tokenizer.padding_side == "left"
                pad_left = [length - len(w.input_ids) if left else 0 for w in batch]
                with torch.inference_mode():
                    hidden_states, _ = self._hidden_states(encoded)
                    pooled = pool_window_words(hidden_states, batch, pad_left, word_pooling)
                del hidden_states
                rows = np.concatenate(
                    [offsets[w.sentence] + w.first_word + np.arange(w.keep[0], w.keep[1]) for w in batch]
                )
                bar.update(len(rows))
                yield rows, pooled.cpu()
        finally:
            bar.close()

    def embed(self, texts: Sequence[str], progress: bool = True) -> torch.Tensor:
        """(N, L, D) float32 embeddings, in the order of ``texts``."""
        texts = check_texts(texts)
        self.load()
        out = torch.empty(len(texts), self.num_layers, self.hidden_size, dtype=torch.float32)
        for indices, pooled in self.iter_pooled_batches(texts, progress=progress):
            out[torch.from_numpy(indices)] = pooled
        return out


@dataclass(frozen=True)
class ExtractionSettings:
    """How texts become layer embeddings. ``pooling``, ``max_length`` and ``storage_dtype`` (the cache's; uncached
    embeddings are float32) are part of a cache entry's key; ``batch_size`` and ``device`` say how it is extracted."""

    pooling: str = "mean"
    max_length: int = 512
    batch_size: int = 32
    device: str = "auto"
    storage_dtype: str = "float16"

    def check(self) -> None:
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {list(POOLINGS)}, got {self.pooling!r}")
        if self.storage_dtype not in STORAGE_DTYPES:
            raise ValueError(f"storage_dtype must be one of {list(STORAGE_DTYPES)}, got {self.storage_dtype!r}")
        for name, value in (("max_length", self.max_length), ("batch_size", self.batch_size)):
            check_int(name, value)
        resolve_device(self.device)  # a device this machine lacks: refused before any task, model or cache work


def check_texts(texts: Sequence[str]) -> list[str]:
    """``texts`` as a list; one string, no texts, or texts empty or not strings are refused."""
    if isinstance(texts, str):
        raise TypeError("texts must be a list of strings, not one string")
    texts = list(texts)
    if not texts:
        raise ValueError("texts is empty; pass at least one text")
    bad = [i for i, text in enumerate(texts) if not isinstance(text, str) or not text.strip()]
    if bad:
        raise ValueError(
            f"{len(bad)} text(s) are empty or not strings, at positions {bad[:10]}"
            f"{' ...' if len(bad) > 10 else ''}; remove or fill them"
        )
    return texts


def extract_layer_embeddings(
    model: str | PathLike | ModelSource,
    texts: Sequence[str],
    *,
    settings: ExtractionSettings = ExtractionSettings(),
    dtype: str | torch.dtype = "auto",
    cache_dir: PathLike | None = None,
    progress: bool = True,
) -> torch.Tensor:
    """(N, L, D) float32 pooled embeddings of every layer, uncached (see :class:`EmbeddingCache`
    for the cached path). ``dtype``: the model's weights; ``cache_dir``: where its files are downloaded."""
    s = settings
    embedder = LayerEmbedder(model, s.pooling, s.max_length, s.batch_size, s.device, dtype, cache_dir)
    try:
        return embedder.embed(texts, progress=progress)
    finally:
        embedder.unload()
