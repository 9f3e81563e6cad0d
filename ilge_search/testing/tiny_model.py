"""A tiny local model folder: a random BERT of a few kilobytes with a word-level tokenizer.

It stands in for a language model wherever a test needs a real model reference
(resolving, weights hashing, cache keys, a classifier that embeds new texts)
but not a model that knows anything: loading it and embedding a few hundred
texts takes milliseconds. Its features carry no label; tests that train put
synthetic features under its cache keys (:mod:`ilge_search.testing.cached`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from .tasks import VOCABULARY

__all__ = ["TinyModelSpec", "write_tiny_model"]

_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


@dataclass(frozen=True)
class TinyModelSpec:
    """The tiny BERT's shape: ``num_hidden_layers + 1`` hidden states of ``hidden_size`` features each
    (what its cached features must have), and the seed of its random weights."""

    num_hidden_layers: int = 4
    hidden_size: int = 64
    max_length: int = 64
    seed: int = 0

    @property
    def num_layers(self) -> int:
        """The hidden states ILGE aggregates: the embedding output plus one per block."""
        return self.num_hidden_layers + 1


def _tokenizer(spec: TinyModelSpec):
    from transformers import PreTrainedTokenizerFast  # heavy: transformers loads in seconds

    vocab = {token: index for index, token in enumerate(_SPECIAL_TOKENS + tuple(VOCABULARY))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=spec.max_length,
    )


def write_tiny_model(folder: str | os.PathLike[str], spec: TinyModelSpec | None = None) -> Path:
    """Save a random tiny BERT and its tokenizer to ``folder`` (created; it must not hold a model yet) and
    return the folder, which ``--model`` and every model argument accept."""
    from transformers import BertConfig, BertModel  # heavy: transformers loads in seconds

    spec = spec or TinyModelSpec()
    folder = Path(folder)
    if (folder / "config.json").exists():
        raise ValueError(f"{folder} already holds a model; pass an empty or new folder")
    tokenizer = _tokenizer(spec)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=2,
        intermediate_size=spec.hidden_size,
        max_position_embeddings=spec.max_length,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = BertModel(config).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
