"""From sentences of words to model inputs and back: which token pieces belong to which word.

A sentence's words are joined by single spaces, tokenised as one text, and each piece is mapped to the
word whose characters it covers through the fast tokenizer's character offsets (``is_split_into_words``
drops the space before every word for byte-level BPE tokenizers, so their pieces would differ from the
texts the model was trained on; docs/tokens.md says by how much). A piece covering no word's characters
belongs to no word; a tokenizer without offsets is handled word by word.

A sentence longer than ``max_length`` pieces is cut into windows at word boundaries that share about
``overlap`` pieces; a shared word takes its vector from the window where it is further from the edge, so
every word gets exactly one vector.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..record.core import WORD_POOLINGS
from ..validation import check_items

__all__ = ["WORD_POOLINGS", "WordWindow", "WordTokenizer", "check_sentences", "pool_window_words"]

_NO_WORD = -1


def check_sentences(sentences: object, name: str = "sentences") -> list[list[str]]:
    """``sentences`` as a list of lists of words; anything else is a one-line ``ValueError``."""
    if isinstance(sentences, (str, bytes)):
        raise ValueError(f"{name} must be a list of sentences, each a list of words, not one string")
    checked = []
    for i, words in enumerate(check_items(name, sentences, "a list of sentences, each a list of words", "sentence")):
        if isinstance(words, (str, bytes)) or not isinstance(words, Sequence):
            raise ValueError(
                f"{name}[{i}] is {type(words).__name__}, not a list of words; split each sentence into words "
                f'(e.g. "The cat sat".split())'
            )
        if not words:
            raise ValueError(f"{name}[{i}] is an empty sentence; remove it")
        for j, word in enumerate(words):
            if not isinstance(word, str) or not word.strip():
                raise ValueError(f"{name}[{i}][{j}] is {word!r}; every word must be a non-empty string")
        checked.append(list(words))
    return checked


@dataclass(frozen=True)
class WordWindow:
    """One model input: a run of one sentence's words with the model's special tokens around them.

    Attributes:
        sentence: index of the sentence.
        first_word: index, in the sentence, of the window's first word.
        input_ids: the pieces, special tokens included.
        piece_words: ``(len(input_ids),)`` int64, the window-relative word of each piece; -1 for
            special tokens and pieces that cover no word's characters.
        keep: ``(start, stop)``, window-relative: the words this window gives vectors for (with
            overlapping windows the others come from a neighbour).
    """

    sentence: int
    first_word: int
    input_ids: list[int]
    piece_words: np.ndarray
    keep: tuple[int, int]

    @property
    def num_kept(self) -> int:
        return self.keep[1] - self.keep[0]


class WordTokenizer:
    """A Hugging Face tokenizer, used to tokenise sentences of words and to cut long ones into windows.

    Args:
        tokenizer: the model's tokenizer.
        use_offsets: map pieces to words by character offsets (default: when the tokenizer is fast);
            ``False`` tokenises word by word.
    """

    def __init__(self, tokenizer: Any, use_offsets: bool | None = None) -> None:
        self.tokenizer = tokenizer
        self.use_offsets = bool(getattr(tokenizer, "is_fast", False)) if use_offsets is None else use_offsets
        # where a text goes between the special tokens: find a one-word text's own pieces among them
        with_special = list(tokenizer("a")["input_ids"])
        bare = list(tokenizer("a", add_special_tokens=False)["input_ids"])
        starts = [i for i in range(len(with_special) - len(bare) + 1) if with_special[i : i + len(bare)] == bare]
        if not bare or not starts:
            raise ValueError(f"{type(tokenizer).__name__} does not keep a text's pieces between its special tokens")
        self.prefix, self.suffix = with_special[: starts[0]], with_special[starts[0] + len(bare) :]

    @property
    def num_special(self) -> int:
        """Special tokens around every text (2 for BERT's [CLS] and [SEP], 0 for SmolLM2)."""
        return len(self.prefix) + len(self.suffix)

    def pieces(self, words: Sequence[str]) -> tuple[list[int], np.ndarray]:
        """Input ids of the words joined by single spaces, and each piece's word (-1: none)."""
        if self.use_offsets:
            return self._pieces_by_offsets(words)
        return self._pieces_word_by_word(words)

    def _pieces_by_offsets(self, words: Sequence[str]) -> tuple[list[int], np.ndarray]:
        text = " ".join(words)
        char_word = np.full(len(text), _NO_WORD, dtype=np.int64)
        position = 0
        for index, word in enumerate(words):
            char_word[position : position + len(word)] = index
            position += len(word) + 1
        # verbose=False: a sentence longer than the model takes is cut into windows below, so transformers'
        # "sequence length is longer than the specified maximum" warning would be wrong (and -q cannot hide it)
        encoded = self.tokenizer(text, return_offsets_mapping=True, return_special_tokens_mask=True, verbose=False)
        piece_words = np.full(len(encoded["input_ids"]), _NO_WORD, dtype=np.int64)
        for piece, ((start, stop), special) in enumerate(
            zip(encoded["offset_mapping"], encoded["special_tokens_mask"], strict=True)
        ):
            covered = char_word[start:stop] if not special else char_word[:0]
            covered = covered[covered != _NO_WORD]
            if covered.size:
                piece_words[piece] = covered[0]
        return list(encoded["input_ids"]), piece_words

    def _pieces_word_by_word(self, words: Sequence[str]) -> tuple[list[int], np.ndarray]:
        ids, owners = list(self.prefix), [_NO_WORD] * len(self.prefix)
        for index, word in enumerate(words):
            # the leading space is what a BPE tokenizer sees before every word but the first of a text
            word_ids = self.tokenizer(word if index == 0 else f" {word}", add_special_tokens=False, verbose=False)[
                "input_ids"
            ]
            ids += word_ids
            # a piece that is only that space covers none of the word's characters, as with offsets
            owners += [index if self.tokenizer.decode([piece]).strip() else _NO_WORD for piece in word_ids]
        ids += self.suffix
        owners += [_NO_WORD] * len(self.suffix)
        return ids, np.asarray(owners, dtype=np.int64)

    def windows(self, sentence: int, words: Sequence[str], max_length: int, overlap: int = 0) -> list[WordWindow]:
        """The sentence as one window, or as several of at most ``max_length`` pieces each.

        Raises ``ValueError`` for a word that gives no piece, or one that alone needs more
        pieces than ``max_length`` leaves after the special tokens.
        """
        ids, piece_words = self.pieces(words)
        counts = np.bincount(piece_words[piece_words != _NO_WORD], minlength=len(words))
        if (counts == 0).any():
            word = int(np.flatnonzero(counts == 0)[0])
            raise ValueError(
                f"sentence {sentence + 1}, word {word + 1} ({words[word]!r}) gives no token with this tokenizer "
                f"(characters it drops); replace or remove that word"
            )
        if len(ids) <= max_length:
            return [WordWindow(sentence, 0, ids, piece_words, (0, len(words)))]
        budget = max_length - self.num_special
        if not 0 <= overlap < budget:
            raise ValueError(
                f"window overlap must be in [0, {budget}) pieces for max_length {max_length}, got {overlap}"
            )
        spans = self._spans(sentence, words, counts, max_length, overlap)
        return self._kept_windows(sentence, words, spans)

    def _spans(
        self, sentence: int, words: Sequence[str], counts: np.ndarray, max_length: int, overlap: int
    ) -> list[tuple[int, int, list[int], np.ndarray]]:
        """``(start, stop, ids, piece_words)`` of each window: as many whole words as fit, then back off by
        ``overlap`` pieces of words for the next start (always at least one word further on)."""
        spans: list[tuple[int, int, list[int], np.ndarray]] = []
        budget, start = max_length - self.num_special, 0
        while True:
            stop = start
            while stop < len(words) and counts[start : stop + 1].sum() <= budget:
                stop += 1
            while stop > start:  # a window starting mid-sentence may tokenise into more pieces: shrink it
                ids, piece_words = self.pieces(words[start:stop])
                if len(ids) <= max_length:
                    break
                stop -= 1
            if stop == start:
                raise ValueError(
                    f"sentence {sentence + 1}, word {start + 1} ({words[start]!r}) alone needs "
                    f"{int(counts[start])} pieces, more than the {budget} that max_length {max_length} leaves; "
                    "raise max_length"
                )
            spans.append((start, stop, ids, piece_words))
            if stop == len(words):
                return spans
            next_start = stop
            while next_start - 1 > start and counts[next_start - 1 : stop].sum() <= overlap:
                next_start -= 1
            start = next_start

    @staticmethod
    def _kept_windows(
        sentence: int, words: Sequence[str], spans: list[tuple[int, int, list[int], np.ndarray]]
    ) -> list[WordWindow]:
        windows, keep_from = [], 0
        for index, (start, stop, ids, piece_words) in enumerate(spans):
            keep_to = stop if index == len(spans) - 1 else (spans[index + 1][0] + stop) // 2
            if not start <= keep_from <= keep_to <= stop:
                raise RuntimeError(f"sentence {sentence + 1}: its windows do not cover every word once; report this")
            windows.append(WordWindow(sentence, start, ids, piece_words, (keep_from - start, keep_to - start)))
            keep_from = keep_to
        return windows


def pool_window_words(
    hidden_states: Sequence[torch.Tensor],
    windows: Sequence[WordWindow],
    pad_left: Sequence[int],
    word_pooling: str = "first",
) -> torch.Tensor:
    """Each kept word's vector in every layer, float32, windows in order and words in order within each.

    ``first`` takes the word's first piece, ``mean`` averages its pieces.

    Shapes:
        hidden_states: L tensors of (B, T, D), window ``b`` starting at position ``pad_left[b]``
        -> (sum of the windows' kept words, L, D).
    """
    if word_pooling not in WORD_POOLINGS:
        raise ValueError(f"word_pooling must be one of {list(WORD_POOLINGS)}, got {word_pooling!r}")
    batch, length, hidden = hidden_states[0].shape
    positions, rows, row = [], [], 0
    for b, window in enumerate(windows):
        start, stop = window.keep
        owners = window.piece_words
        kept = np.flatnonzero((owners >= start) & (owners < stop))
        positions.append(b * length + pad_left[b] + kept)
        rows.append(row + owners[kept] - start)
        row += window.num_kept
    device = hidden_states[0].device
    flat_positions = torch.from_numpy(np.concatenate(positions)).to(device)
    flat_rows = torch.from_numpy(np.concatenate(rows)).to(device)
    out = torch.empty(row, len(hidden_states), hidden, dtype=torch.float32, device=device)
    if word_pooling == "first":
        # pieces come in order, so a word's first piece is the smallest position among its pieces
        first = torch.full((row,), batch * length, dtype=torch.long, device=device)
        first = first.scatter_reduce(0, flat_rows, flat_positions, reduce="amin")
        for layer, h in enumerate(hidden_states):
            out[:, layer] = h.reshape(batch * length, hidden)[first].float()
        return out
    counts = torch.bincount(flat_rows, minlength=row).clamp(min=1).to(torch.float32).unsqueeze(1)
    for layer, h in enumerate(hidden_states):
        pieces = h.reshape(batch * length, hidden)[flat_positions].float()
        out[:, layer] = torch.zeros(row, hidden, device=device).index_add_(0, flat_rows, pieces) / counts
    return out
