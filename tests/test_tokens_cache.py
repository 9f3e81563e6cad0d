"""Word-level layer states and their ragged cache entries (issue 30, phase A).

Most tests use tiny random models built in a temporary folder (``ilge_search.testing.tiny_models``:
a BERT with a WordPiece tokenizer and a Llama with a byte-level BPE tokenizer), so the words'
alignment, the windows, the keys and the file layout are checked without loading a real LLM;
the memory test writes a large entry through a fake embedder.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from ilge_search.cli import cli
from ilge_search.embeddings.cache import EmbeddingCache, ExtractionSettings
from ilge_search.embeddings.extraction import LayerEmbedder
from ilge_search.embeddings.models import ModelSource
from ilge_search.embeddings.word_cache import (
    WordOptions,
    get_or_extract_sentences,
    get_or_extract_words,
    load_word_embeddings,
    sentences_fingerprint,
)
from ilge_search.embeddings.words import WordTokenizer
from ilge_search.tasks.core import TaskError, load_task
from ilge_search.testing.tiny_models import tiny_decoder, tiny_encoder

SENTENCES = [
    ["Unbelievably", ",", "graphs", "pass", "messages", "between", "layers", "."],
    ["Who", "wrote", "this", "?"],
    ["The", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "."],
    ["Prices", "rose", "3.5", "%", "."],
    ["zebra"],
]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tiny-models")
    return {"encoder": str(tiny_encoder(root / "encoder")), "decoder": str(tiny_decoder(root / "decoder"))}


def _tagging_file(folder: Path, sentences=SENTENCES) -> Path:
    """A custom tagging task: the sentences, each word tagged by its length class."""
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "validation", "test"):
        rows = [{"tokens": words, "tags": ["S" if len(w) < 4 else "L" for w in words]} for words in sentences]
        (folder / f"{split}.jsonl").write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    return folder


def _word_vectors(embedder: LayerEmbedder, sentences, **options) -> dict[int, torch.Tensor]:
    vectors: dict[int, torch.Tensor] = {}
    for rows, pooled in embedder.iter_word_batches(sentences, progress=False, **options):
        for row, vector in zip(rows.tolist(), pooled, strict=True):
            assert row not in vectors, f"word {row} came twice"
            vectors[row] = vector
    return vectors


# ----------------------------------------------------------------------------- alignment of pieces to words


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
@pytest.mark.parametrize("word_pooling", ["first", "mean"])
def test_word_vectors_are_the_models_states_of_the_words_pieces(models, kind, word_pooling):
    """Each word's vector, in every layer, is its first piece's (or its pieces' mean) hidden state from one
    run of the model over the sentence's words joined by spaces, batched or not."""
    embedder = LayerEmbedder(models[kind], batch_size=2, device="cpu")
    vectors = _word_vectors(embedder, SENTENCES, word_pooling=word_pooling)
    assert sorted(vectors) == list(range(sum(map(len, SENTENCES))))
    tokenizer = WordTokenizer(embedder._tokenizer)
    row = 0
    for words in SENTENCES:
        ids, owners = tokenizer.pieces(words)
        with torch.no_grad():
            states = embedder._model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        for word in range(len(words)):
            pieces = np.flatnonzero(owners == word)
            assert len(pieces) >= 1
            chosen = pieces[:1] if word_pooling == "first" else pieces
            expected = torch.stack([layer[0, chosen].mean(0) for layer in states])  # (L, D)
            torch.testing.assert_close(vectors[row + word], expected, atol=1e-4, rtol=1e-4)
        row += len(words)


def test_decoder_words_keep_the_space_before_them(models):
    """Byte-level BPE: the model reads the sentence's text, a space before every word but the first, not the
    words glued together as ``is_split_into_words`` gives them; a piece that is only a space is no word's."""
    embedder = LayerEmbedder(models["decoder"], device="cpu").load()
    tokenizer = embedder._tokenizer
    words = ["Layers", "of", "a", "frozen", "model"]
    ids, owners = WordTokenizer(tokenizer).pieces(words)
    assert tokenizer.decode(ids) == "Layers of a frozen model"
    assert tokenizer.decode(tokenizer(words, is_split_into_words=True)["input_ids"]) == "Layersofafrozenmodel"
    pieces = tokenizer.convert_ids_to_tokens(ids)
    assert [piece for piece, owner in zip(pieces, owners, strict=True) if owner < 0] == ["Ġ"] * (pieces.count("Ġ"))
    assert pieces.count("Ġ") >= 1  # this small vocabulary has words whose space is a piece of its own
    assert sorted(set(owners[owners >= 0].tolist())) == list(range(len(words)))


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_word_by_word_path_gives_the_same_pieces_as_offsets(models, kind):
    """The path for tokenizers without character offsets gives the same ids and the same word of every piece."""
    tokenizer = LayerEmbedder(models[kind], device="cpu").load()._tokenizer
    by_offsets, word_by_word = WordTokenizer(tokenizer), WordTokenizer(tokenizer, use_offsets=False)
    assert (by_offsets.num_special, word_by_word.num_special) == ((2, 2) if kind == "encoder" else (0, 0))
    for words in SENTENCES:
        ids, owners = by_offsets.pieces(words)
        ids_slow, owners_slow = word_by_word.pieces(words)
        assert ids == ids_slow
        np.testing.assert_array_equal(owners, owners_slow)


def test_a_word_the_tokenizer_drops_is_refused_with_its_place(models):
    embedder = LayerEmbedder(models["encoder"], device="cpu")
    with pytest.raises(ValueError, match=r"sentence 2, word 3 \('\\u200b'\) gives no token"):
        embedder.word_windows([["fine"], ["a", "b", "\u200b", "c"]])


# ----------------------------------------------------------------------------- windows


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
@pytest.mark.parametrize("overlap", [0, 4])
def test_long_sentences_are_cut_into_windows_and_every_word_gets_one_vector(models, kind, overlap):
    """With max_length 16 the longer sentences need several windows: none exceeds 16 pieces, their kept
    words tile the sentence, and a word's vector is its state in the window that kept it."""
    embedder = LayerEmbedder(models[kind], max_length=16, batch_size=3, device="cpu")
    windows = embedder.word_windows(SENTENCES, window_overlap=overlap)
    assert all(len(window.input_ids) <= 16 for window in windows)
    for index, words in enumerate(SENTENCES):
        mine = [w for w in windows if w.sentence == index]
        kept = [w.first_word + k for w in mine for k in range(*w.keep)]
        assert kept == list(range(len(words)))
    assert len(windows) > len(SENTENCES)  # the check above ran over real cuts
    pairs = [(a, b) for a, b in itertools.pairwise(windows) if a.sentence == b.sentence]
    shared = [a.first_word + int(a.piece_words.max()) + 1 - b.first_word for a, b in pairs]  # words in both
    assert (max(shared) > 0) == (overlap > 0)

    vectors = _word_vectors(embedder, SENTENCES, window_overlap=overlap)
    assert sorted(vectors) == list(range(sum(map(len, SENTENCES))))
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in SENTENCES])])
    for window in windows[:4]:
        with torch.no_grad():
            states = embedder._model(torch.tensor([window.input_ids]), output_hidden_states=True).hidden_states
        for k in range(*window.keep):
            first = int(np.flatnonzero(window.piece_words == k)[0])
            expected = torch.stack([layer[0, first] for layer in states])
            row = offsets[window.sentence] + window.first_word + k
            torch.testing.assert_close(vectors[row], expected, atol=1e-4, rtol=1e-4)


def test_a_word_longer_than_a_window_is_refused(models):
    embedder = LayerEmbedder(models["encoder"], max_length=6, device="cpu")
    with pytest.raises(
        ValueError, match=r"sentence 1, word 1 \('Unbelievably'\) alone needs 11 pieces.*raise max_length"
    ):
        embedder.word_windows(SENTENCES[:1])
    with pytest.raises(ValueError, match=r"window overlap must be in \[0, 10\)"):
        LayerEmbedder(models["encoder"], max_length=12, device="cpu").word_windows(SENTENCES[:1], window_overlap=10)


# ----------------------------------------------------------------------------- cache entries


def test_entry_layout_offsets_labels_and_hits(models, tmp_path):
    task = load_task(_tagging_file(tmp_path / "task"))
    cache = EmbeddingCache(tmp_path / "cache")
    entry = get_or_extract_words(cache, models["encoder"], task, "train", WordOptions(device="cpu"), progress=False)
    assert (entry.hit, entry.features.dtype, tuple(entry.features.shape)) == (False, torch.float16, (28, 3, 32))
    np.testing.assert_array_equal(entry.offsets, task["train"].word_offsets)
    np.testing.assert_array_equal(entry.labels.numpy(), task["train"].labels)
    assert entry.label_names == task.label_names == ["L", "S"]
    assert (entry.num_sentences, entry.num_words, entry.num_layers, entry.hidden_size) == (5, 28, 3, 32)
    assert entry.sentence(1).shape == (4, 3, 32)
    meta = entry.meta
    assert (meta["entry"], meta["word_pooling"], meta["window_overlap"], meta["num_words"]) == ("words", "first", 0, 28)
    assert meta["bytes_per_word"] == pytest.approx(meta["file_size"] / 28)
    assert meta["words_per_second"] > 0 and "pooling" not in meta

    again = get_or_extract_words(cache, models["encoder"], task, "train", WordOptions(device="cpu"), progress=False)
    assert again.hit and again.key == entry.key
    torch.testing.assert_close(again.features, entry.features)

    from safetensors import safe_open  # the file is plain safetensors

    with safe_open(str(entry.path), framework="pt") as handle:
        assert set(handle.keys()) == {"features", "offsets", "labels"}
        torch.testing.assert_close(handle.get_tensor("features"), entry.features)

    direct = _word_vectors(LayerEmbedder(models["encoder"], device="cpu"), task["train"].sentences)
    torch.testing.assert_close(entry.features.float(), torch.stack([direct[i] for i in range(28)]).half().float())


def test_keys_follow_word_pooling_max_length_overlap_dtype_and_content(models, tmp_path):
    task = load_task(_tagging_file(tmp_path / "task"))
    cache = EmbeddingCache(tmp_path / "cache")
    options = [
        WordOptions(device="cpu"),
        WordOptions(word_pooling="mean", device="cpu"),
        WordOptions(max_length=16, device="cpu"),
        WordOptions(max_length=16, window_overlap=4, device="cpu"),
        WordOptions(storage_dtype="float32", device="cpu"),
    ]
    keys = [get_or_extract_words(cache, models["encoder"], task, "train", o, progress=False).key for o in options]
    assert len(set(keys)) == len(keys)
    assert get_or_extract_words(cache, models["decoder"], task, "train", options[0], progress=False).key not in keys
    # batch size and device are not part of the key
    same = WordOptions(batch_size=1, device="cpu")
    assert get_or_extract_words(cache, models["encoder"], task, "train", same, progress=False).hit

    changed_word = load_task(_tagging_file(tmp_path / "other", [["New", "York"], *SENTENCES[1:]]))
    joined_words = load_task(_tagging_file(tmp_path / "joined", [["New York"], *SENTENCES[1:]]))
    fingerprints = {t.fingerprint("train") for t in (task, changed_word, joined_words)}
    assert len(fingerprints) == 3  # ["New", "York"] and ["New York"] read the same text but are other words
    assert sentences_fingerprint([["New", "York"]]) != sentences_fingerprint([["New York"]])


def test_a_tagging_task_has_no_sequence_entries_and_a_sequence_task_no_word_entries(models, tmp_path):
    task = load_task(_tagging_file(tmp_path / "task"))
    cache = EmbeddingCache(tmp_path / "cache")
    with pytest.raises(TaskError, match="tagging task: its words are cached one vector per word"):
        cache.get_or_extract(models["encoder"], task, "train", settings=ExtractionSettings(device="cpu"))
    texts = tmp_path / "texts.jsonl"
    texts.write_text("\n".join(json.dumps({"text": f"text {i}", "label": i % 2}) for i in range(20)))
    with pytest.raises(TaskError, match="classification task: word vectors are for tagging tasks"):
        get_or_extract_words(cache, models["encoder"], texts, "train")


def test_sentences_without_tags_and_the_task_loader(models, tmp_path):
    cache = EmbeddingCache(tmp_path / "cache")
    entry = get_or_extract_sentences(cache, models["decoder"], SENTENCES, WordOptions(device="cpu"), progress=False)
    assert entry.labels.numel() == 0 and entry.label_names == [] and entry.num_words == 28
    assert get_or_extract_sentences(cache, models["decoder"], SENTENCES, WordOptions(device="cpu")).hit
    with pytest.raises(ValueError, match=r"sentences\[1\] is str, not a list of words"):
        get_or_extract_sentences(cache, models["decoder"], [["ok"], "not split"])

    loaded = load_word_embeddings(
        models["encoder"],
        _tagging_file(tmp_path / "task"),
        cache_dir=tmp_path / "cache",
        options=WordOptions(device="cpu"),
        progress=False,
    )
    assert list(loaded.splits) == ["train", "validation", "test"]
    assert (loaded.num_layers, loaded.hidden_size, loaded.label_names) == (3, 32, ["L", "S"])
    assert loaded.cache_keys["train"] == loaded["train"].key


def test_cache_ls_lists_word_entries_and_rm_removes_them(models, tmp_path):
    task = load_task(_tagging_file(tmp_path / "task"))
    cache = EmbeddingCache(tmp_path / "cache")
    entry = get_or_extract_words(cache, models["encoder"], task, "test", WordOptions(device="cpu"), progress=False)
    runner = CliRunner()
    listed = runner.invoke(cli, ["cache", "ls", "--cache-dir", str(tmp_path / "cache")])
    assert listed.exit_code == 0, listed.output
    assert entry.key in listed.output and "28x3x32" in listed.output and "test" in listed.output
    removed = runner.invoke(cli, ["cache", "rm", entry.key[:10], "--cache-dir", str(tmp_path / "cache")])
    assert removed.exit_code == 0 and entry.key in removed.output
    assert not entry.path.exists() and cache.ls() == []


def test_a_damaged_entry_is_rebuilt_and_a_failed_extraction_leaves_nothing(models, tmp_path, monkeypatch):
    task = load_task(_tagging_file(tmp_path / "task"))
    cache = EmbeddingCache(tmp_path / "cache")
    options = WordOptions(device="cpu")
    entry = get_or_extract_words(cache, models["encoder"], task, "train", options, progress=False)
    expected = entry.features.clone()
    data = bytearray(entry.path.read_bytes())
    data[-300] ^= 0xFF  # inside the features
    entry.path.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="corrupt.*checksum.*rebuilding it"):
        rebuilt = get_or_extract_words(EmbeddingCache(tmp_path / "cache"), models["encoder"], task, "train", options)
    assert not rebuilt.hit
    torch.testing.assert_close(rebuilt.features, expected)

    def broken(self, *args, **kwargs):
        yield np.arange(3), torch.zeros(3, 3, 32)
        raise RuntimeError("the model failed mid-way")

    monkeypatch.setattr(LayerEmbedder, "iter_word_batches", broken)
    with pytest.raises(RuntimeError, match="mid-way"):
        get_or_extract_words(cache, models["encoder"], task, "validation", options, progress=False)
    leftovers = sorted(p.name for p in (tmp_path / "cache" / "embeddings").iterdir())
    assert leftovers == sorted([rebuilt.path.name, rebuilt.path.with_suffix(".json").name])


# ----------------------------------------------------------------------------- memory


class _FakeEmbedder:
    """Stands in for a model: word ``r`` gets the vector ``r % 251`` in every layer and dimension."""

    num_layers, hidden_size, effective_max_length = 4, 256, 512

    def load(self):
        return self

    def iter_word_batches(self, sentences, word_pooling, window_overlap, progress):
        total = sum(len(words) for words in sentences)
        for start in range(0, total, 4096):
            rows = np.arange(start, min(start + 4096, total))
            yield rows, torch.from_numpy((rows % 251).astype(np.float32))[:, None, None].expand(-1, 4, 256)


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_reading_an_entry_maps_it_instead_of_loading_it(tmp_path, monkeypatch):
    """A 200 MB entry (100,000 words x 4 layers x 256) is read back, checksum included, with memory growing
    by a small fraction of its size; one sentence's rows hold what was written."""
    monkeypatch.setattr(EmbeddingCache, "embedder", lambda self, *args, **kwargs: _FakeEmbedder())
    source = ModelSource(name="fake", path="/nonexistent", revision="sha256:" + "0" * 64)
    sentences = [[f"w{i}"] * 20 for i in range(5000)]
    written = get_or_extract_sentences(EmbeddingCache(tmp_path), source, sentences, progress=False)
    size, key = written.path.stat().st_size, written.key
    assert size > 200e6
    del written
    os.utime(tmp_path / "embeddings" / f"{key}.safetensors")  # a changed file is checksummed again when read

    before = _rss_bytes()
    entry = get_or_extract_sentences(EmbeddingCache(tmp_path), source, sentences, progress=False)
    grown = _rss_bytes() - before
    assert entry.hit and grown < size / 10, f"reading grew memory by {grown / 1e6:.0f} MB of a {size / 1e6:.0f} MB file"
    sentence = entry.sentence(4321).float()
    assert torch.equal(sentence[:, 0, 0], torch.arange(4321 * 20, 4322 * 20).remainder(251).float())
    assert _rss_bytes() - before < size / 10


@pytest.mark.realmodel
@pytest.mark.slow  # the first smollm2-135m load of a session dequantises its GGUF weights
def test_smollm2_words_through_the_cache(cache_dir):
    """The GGUF decoder: its fast tokenizer maps pieces to words by offsets, and each word's cached vector
    (float16) is its first piece's state in a direct run of the model over the sentence."""
    cache = EmbeddingCache(cache_dir)
    entry = get_or_extract_sentences(cache, "smollm2-135m", SENTENCES[:3], WordOptions(device="cpu"), progress=False)
    assert (entry.num_layers, entry.hidden_size, entry.num_words) == (31, 576, 22)
    embedder = cache.embedder(cache.resolve("smollm2-135m"), ExtractionSettings(device="cpu")).load()
    ids, owners = WordTokenizer(embedder._tokenizer).pieces(SENTENCES[2])
    with torch.no_grad():
        states = embedder._model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    for word in (0, 4, 9):
        first = int(np.flatnonzero(owners == word)[0])
        expected = torch.stack([layer[0, first] for layer in states])
        got = entry.features[12 + word].float()
        assert ((got - expected).norm(dim=-1) / expected.norm(dim=-1)).max() < 1e-2  # float16 storage
    cache.unload()
