"""`ilge-search embed` and `ilge-search cache ls/rm` through click's CliRunner."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from ilge_search.cli import cli
from ilge_search.tasks.core import load_task, subsample


@pytest.fixture(scope="module")
def custom_file(data_dir, tmp_path_factory):
    """60 real banking77 texts in a CSV with custom column names."""
    import pandas as pd

    task = subsample(load_task("banking77", data_dir), 60, seed=3, splits=["test"])
    names = ["card", "other"]
    frame = pd.DataFrame(
        {
            "utterance": task["test"].texts,
            "intent": [names[int("card" not in task.label_names[i])] for i in task["test"].labels],
        }
    )
    path = tmp_path_factory.mktemp("custom") / "intents.csv"
    frame.to_csv(path, index=False)
    return path


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.mark.realmodel
def test_embed_then_cache_hit_then_ls_and_rm(custom_file, tmp_path, request):
    cache = str(tmp_path / "cache")
    args = [
        "embed",
        "--model",
        "minilm-l6",
        "--task",
        str(custom_file),
        "--text-col",
        "utterance",
        "--label-col",
        "intent",
        "--quiet",
        "--cache-dir",
        cache,
    ]
    first = run(*args)
    assert first.exit_code == 0, first.output
    assert "minilm-l6 / intents: 7 layers x 384" in first.output
    assert re.search(r"train\s+extracted key [0-9a-f]{24}  features 51x7x384 float16  labels \(51,\)", first.output)
    assert re.search(r"validation\s+extracted key [0-9a-f]{24}  features 9x7x384", first.output)

    request.getfixturevalue("no_model_loads")  # from here on, loading a model fails the test
    second = run(*args)
    assert second.exit_code == 0, second.output
    assert second.output.count("cache hit") == 2
    keys = re.findall(r"key ([0-9a-f]{24})", second.output)
    assert keys == re.findall(r"key ([0-9a-f]{24})", first.output)

    listing = run("cache", "ls", "--cache-dir", cache)
    assert listing.exit_code == 0
    assert listing.output.splitlines()[0].split() == ["key", "model", "task", "split", "shape", "MB", "created"]
    assert all(key in listing.output for key in keys) and "51x7x384" in listing.output
    assert "2 entries" in listing.output

    removed = run("cache", "rm", keys[0][:10], "--cache-dir", cache)
    assert removed.exit_code == 0 and f"removed 1 entry: {keys[0]}" in removed.output
    assert keys[0] not in run("cache", "ls", "--cache-dir", cache).output
    assert "removed 1 entry" in run("cache", "rm", "--all", "--cache-dir", cache).output
    assert "no embedding cache entries" in run("cache", "ls", "--cache-dir", cache).output


@pytest.mark.realmodel
def test_embed_one_split_of_a_registered_task(data_dir, cache_dir, tmp_path):
    folder = tmp_path / "data" / "sst2"
    folder.mkdir(parents=True)
    sst2 = subsample(load_task("sst2", data_dir), 30, seed=0)
    for split in ("train", "test"):
        part = sst2[split]
        (folder / f"{split}.jsonl").write_text(
            "".join(
                json.dumps({"text": t, "label": sst2.label_names[label]}) + "\n"
                for t, label in zip(part.texts, part.labels, strict=True)
            )
        )
    result = run(
        "embed",
        "--model",
        "minilm-l6",
        "--task",
        "sst2",
        "--split",
        "test",
        "--pooling",
        "first",
        "--max-length",
        "64",
        "--quiet",
        "--data-dir",
        str(tmp_path / "data"),
        "--cache-dir",
        str(cache_dir),
    )
    assert result.exit_code == 0, result.output
    assert re.search(r"test\s+extracted .* features 30x7x384", result.output)
    assert "train" not in result.output.split("\n", 1)[1]


def test_bad_input_is_a_clear_error_without_loading_a_model(custom_file, data_dir, tmp_path, no_model_loads):
    cache = str(tmp_path / "cache")
    unknown = run("embed", "--model", "minilm-l6", "--task", "bankng77", "--cache-dir", cache)
    assert unknown.exit_code == 1 and "unknown task 'bankng77'. Known tasks: banking77" in unknown.output
    columns = run("embed", "--model", "minilm-l6", "--task", str(custom_file), "--cache-dir", cache)
    assert columns.exit_code == 1
    assert "no column 'text' (columns present: utterance, intent). Pass --text-col" in columns.output
    model = run(
        "embed", "--model", "./nowhere", "--task", "banking77", "--data-dir", str(data_dir), "--cache-dir", cache
    )
    assert model.exit_code == 1 and "not a model folder" in model.output
    split = run(
        "embed",
        "--model",
        "minilm-l6",
        "--task",
        "banking77",
        "--split",
        "dev",
        "--data-dir",
        str(data_dir),
        "--cache-dir",
        cache,
    )
    assert split.exit_code == 1 and "no split(s) ['dev']" in split.output
    pooling = run("embed", "--model", "minilm-l6", "--task", "banking77", "--pooling", "max")
    assert pooling.exit_code == 2 and "Invalid value for '--pooling'" in pooling.output


def test_cache_rm_needs_a_key_or_all(tmp_path):
    neither = run("cache", "rm", "--cache-dir", str(tmp_path))
    assert neither.exit_code == 2 and "give a KEY or --all" in neither.output
    missing = run("cache", "rm", "abc", "--cache-dir", str(tmp_path))
    assert missing.exit_code == 1 and "no cache entry matches 'abc'" in missing.output
