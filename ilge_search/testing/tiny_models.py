"""Tiny random language models in local folders, for tests that need a model but not a trained one.

:func:`tiny_encoder` writes a 2-layer BERT with a WordPiece tokenizer ([CLS] ... [SEP],
lower-cased); :func:`tiny_decoder` a 2-layer Llama with a byte-level BPE tokenizer (no special
tokens around a text, a word after a space is one ``Ġ`` piece or more), the two tokenizer
families of the offline models (MiniLM-L6 and SmolLM2). Both tokenizers are trained here on
:data:`CORPUS` with a small vocabulary, so most words split into several pieces; nothing is
downloaded. Each takes well under a second and loads through ``resolve_model(folder)`` like
any local model.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

__all__ = ["CORPUS", "tiny_encoder", "tiny_decoder"]

CORPUS = [
    "The quick brown fox jumps over the lazy dog .",
    "A tagger gives every word of a sentence one tag .",
    "Layers of a frozen language model hold different information about each word .",
    "She did n't say where the meeting would be held tomorrow morning .",
    "Graphs over words and layers pass messages between neighbouring nodes .",
    "Unbelievably , the results came out of the laboratory before noon !",
    "Prices rose 3.5 % in October , the statistics office said on Tuesday .",
    "Who wrote this , and why was it sent to me ?",
]


def _train_tokenizer(kind: str) -> object:

    if kind == "wordpiece":
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece()
        tokenizer.train_from_iterator(CORPUS, trainers.WordPieceTrainer(vocab_size=120, special_tokens=specials))
        cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
        tokenizer.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)]
        )
        return tokenizer
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return tokenizer


def _save_random(model_class: type, config: PretrainedConfig, tokenizer: PreTrainedTokenizerBase, folder: Path) -> Path:
    """A seeded random ``model_class(config)`` and ``tokenizer`` saved into ``folder``."""

    torch.manual_seed(0)
    model_class(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def tiny_encoder(folder: str | os.PathLike, hidden_size: int = 32, num_layers: int = 2) -> Path:
    """A random BERT (``num_layers + 1`` hidden states of ``hidden_size``) and its WordPiece tokenizer."""
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast  # heavy: transformers loads in seconds

    folder = Path(folder)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_train_tokenizer("wordpiece"),
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=128,
    )
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden_size,
        max_position_embeddings=128,
    )
    return _save_random(BertModel, config, tokenizer, folder)


def tiny_decoder(folder: str | os.PathLike, hidden_size: int = 32, num_layers: int = 2) -> Path:
    """A random Llama (``num_layers + 1`` hidden states of ``hidden_size``) and its byte-level BPE tokenizer."""
    from transformers import LlamaConfig, LlamaModel, PreTrainedTokenizerFast  # heavy: transformers loads in seconds

    folder = Path(folder)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_train_tokenizer("bpe"), eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=2 * hidden_size,
        max_position_embeddings=256,
    )
    return _save_random(LlamaModel, config, tokenizer, folder)
