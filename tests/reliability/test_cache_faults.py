"""The embedding cache on a full disk, a read-only disk and after a killed extraction.

Full and read-only disks are real: a 1 MiB tmpfs and a read-only tmpfs mount (root only; skipped
otherwise). A process killed during extraction is a real subprocess killed with SIGKILL.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import pytest
from announced_skips import skip_because
from click.testing import CliRunner
from reliability_helpers import cli_command, labelled, one_line_error, remount, subprocess_env, temp_files, write_task

from ilge_search.cli import cli
from ilge_search.embeddings.cache import EmbeddingCache, ExtractionSettings, load_task_embeddings
from ilge_search.files import DiskError, remove_stale_temp_files

MODEL = "minilm-l6"  # 7 layers x 384: 5,376 bytes per text in float16


def _task(tmp_path: Path, train: int, test: int = 10) -> Path:
    return write_task(
        tmp_path / f"task-{train}",
        {
            "train": labelled(train, ["a", "b", "c"]),
            "validation": labelled(9, ["a", "b", "c"], 5000),
            "test": labelled(test, ["a", "b", "c"], 6000),
        },
    )


# ----------------------------------------------------------------------------- a full disk


def test_full_disk_is_refused_before_any_model_load_naming_folder_and_size(tmp_path, small_disk, no_model_loads):
    task = _task(tmp_path, 300)  # train: 300 x 7 x 384 x 2 bytes = 1.6 MB > the 1 MiB disk
    with pytest.raises(DiskError) as caught:
        load_task_embeddings(
            MODEL, task, cache_dir=small_disk, progress=False, settings=ExtractionSettings(device="cpu")
        )
    message = str(caught.value)
    assert message.startswith("not enough free space for embedding cache entry ")
    assert f"in {small_disk / 'embeddings'}: it needs 1.6 MB, " in message and "--cache-dir" in message
    assert temp_files(small_disk) == [] and list((small_disk / "embeddings").iterdir()) == []

    result = CliRunner().invoke(
        cli,
        ["embed", "--model", MODEL, "--task", str(task), "--cache-dir", str(small_disk), "--device", "cpu", "--quiet"],
    )
    assert one_line_error(result).startswith("Error: not enough free space for embedding cache entry")


def test_enospc_while_allocating_is_one_line_and_leaves_no_temp_file(tmp_path, small_disk, no_model_loads, monkeypatch):
    # a filesystem that reports more free space than it has (quotas, thin provisioning, a racing writer)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 40, 0, 1 << 40))
    with pytest.raises(DiskError) as caught:
        load_task_embeddings(
            MODEL, _task(tmp_path, 300), cache_dir=small_disk, progress=False, settings=ExtractionSettings(device="cpu")
        )
    assert f"the disk holding {small_disk / 'embeddings'} is full (No space left on device)" in str(caught.value)
    assert "nothing half-written was kept" in str(caught.value)
    assert temp_files(small_disk) == []
    assert isinstance(caught.value.__cause__, OSError) and caught.value.__cause__.errno == errno.ENOSPC


@pytest.mark.slow
@pytest.mark.realmodel
def test_disk_filled_by_another_writer_during_extraction_is_one_line_then_recovers(tmp_path, small_disk):
    """The disk fills up while the model runs: exit 1 with one line (before: a bus error, exit 135),
    no temporary file and no entry left; with space freed, the same command extracts the entry."""
    task = _task(tmp_path, 100, test=10)  # the train entry: 100 x 7 x 384 x 2 = 538 KB, fits
    embed = cli_command(
        "embed",
        "--model",
        MODEL,
        "--task",
        str(task),
        "--split",
        "train",
        "--batch-size",
        "4",
        "--cache-dir",
        str(small_disk),
        "--device",
        "cpu",
        "--quiet",
    )
    filler = small_disk / "filler.bin"
    handle = open(filler, "wb")  # noqa: SIM115 (closed in the finally below); created first: on a full tmpfs even a new empty file fails
    proc = subprocess.Popen(embed, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env())
    try:
        deadline = time.monotonic() + 120
        while not temp_files(small_disk / "embeddings") and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.poll() is None, proc.communicate()
        try:  # take every byte that is left, while the model loads and runs
            while True:
                handle.write(b"\0" * 4096)
                handle.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        _stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(OSError):  # the last buffered block has no room; the file is removed below
            handle.close()
    assert proc.returncode == 1, (proc.returncode, stderr[-2000:])
    lines = [line for line in stderr.splitlines() if line.strip() and "Loading weights" not in line]
    assert "Traceback" not in stderr and len(lines) == 1, stderr  # (transformers' loading bar aside)
    assert lines[0].startswith(f"Error: the disk holding {small_disk / 'embeddings'} is full")
    assert temp_files(small_disk) == [] and EmbeddingCache(small_disk).ls() == []
    assert sorted(p.name for p in (small_disk / "embeddings").iterdir()) == []

    filler.unlink()
    rerun = subprocess.run(embed, capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert [(e.split, e.shape) for e in EmbeddingCache(small_disk).ls()] == [("train", (100, 7, 384))]


# ----------------------------------------------------------------------------- a read-only cache


def test_read_only_cache_is_refused_in_one_line_before_any_model_load(tmp_path, read_only_dir, no_model_loads):
    task = _task(tmp_path, 30)
    with pytest.raises(
        DiskError,
        match=rf"^the embedding cache folder {read_only_dir / 'embeddings'} is not "
        rf"writable \((Read-only file system|Permission denied)\); pass --cache-dir",
    ):
        load_task_embeddings(
            MODEL, task, cache_dir=read_only_dir, progress=False, settings=ExtractionSettings(device="cpu")
        )
    result = CliRunner().invoke(
        cli,
        [
            "embed",
            "--model",
            MODEL,
            "--task",
            str(task),
            "--cache-dir",
            str(read_only_dir),
            "--device",
            "cpu",
            "--quiet",
        ],
    )
    assert "is not writable" in one_line_error(result)


@pytest.mark.slow
@pytest.mark.realmodel
def test_read_only_cache_still_serves_its_entries(tmp_path, monkeypatch):
    disk = tmp_path / "shared-cache"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True).returncode:
        skip_because("mounting a tmpfs needs root (mount -t tmpfs); run the suite as root")
    try:
        task = _task(tmp_path, 20, test=6)
        first = load_task_embeddings(
            MODEL, task, cache_dir=disk, progress=False, settings=ExtractionSettings(device="cpu")
        )
        remount(disk, "ro")
        from ilge_search.embeddings.extraction import LayerEmbedder

        monkeypatch.setattr(LayerEmbedder, "load", lambda self: pytest.fail("a model was loaded"))
        again = load_task_embeddings(
            MODEL, task, cache_dir=disk, progress=False, settings=ExtractionSettings(device="cpu")
        )
        assert all(entry.hit for entry in again.splits.values())
        assert again.cache_keys == first.cache_keys
        assert bool((again["train"].features == first["train"].features).all())
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


# ----------------------------------------------------------------------------- temporary files of dead writers


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_opening_the_cache_removes_temp_files_of_dead_writers_on_this_host_only(tmp_path):
    host = socket.gethostname()
    embeddings = tmp_path / "cache" / "embeddings"
    embeddings.mkdir(parents=True)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead, alive = _dead_pid(), sleeper.pid
        names = {
            "dead": f".abc.safetensors.tmp-{dead}-0123abcd@{host}",
            "dead-meta": f".abc.json.tmp-{dead}-89abcdef@{host}",
            "alive": f".def.safetensors.tmp-{alive}-0123abcd@{host}",
            "other-host": f".ghi.safetensors.tmp-{dead}-0123abcd@another-node",
            "no-writer": f".jkl.tmp-{dead}-0123abcd",  # written by an older version: owner unknown
        }
        for name in names.values():
            (embeddings / name).write_bytes(b"\0" * 1000)
        EmbeddingCache(tmp_path / "cache")
        left = {p.name for p in embeddings.iterdir()}
        assert left == {names["alive"], names["other-host"], names["no-writer"]}
        assert remove_stale_temp_files(embeddings) == []  # idempotent
    finally:
        sleeper.kill()
        sleeper.wait()
    remove_stale_temp_files(embeddings)
    assert names["alive"] not in {p.name for p in embeddings.iterdir()}  # its writer is gone now


def test_a_temp_file_whose_entry_lock_is_held_is_kept_even_if_its_pid_looks_dead(tmp_path):
    """A writer in another pid namespace on the same host (a container) has a pid this process cannot
    see; it holds its entry's lock while writing, so its file is left alone."""
    cache = tmp_path / "cache"
    (cache / "embeddings").mkdir(parents=True)
    (cache / "locks").mkdir()
    name = f".abc.safetensors.tmp-{_dead_pid()}-0123abcd@{socket.gethostname()}"
    (cache / "embeddings" / name).write_bytes(b"\0" * 100)
    script = (
        f"import time; from filelock import FileLock; lock = FileLock({str(cache / 'locks' / 'abc.lock')!r}); "
        "lock.acquire(); print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        EmbeddingCache(cache)
        assert (cache / "embeddings" / name).exists()
    finally:
        holder.kill()
        holder.wait()
    EmbeddingCache(cache)
    assert not (cache / "embeddings" / name).exists()


def _size(path):
    try:
        return path.stat().st_size
    except FileNotFoundError:  # renamed into place or removed between listing and stat
        return 0


def test_temp_file_of_a_sigkilled_extraction_is_removed_when_the_cache_is_next_opened(tmp_path):
    task = _task(tmp_path, 400)
    cache = tmp_path / "cache"
    embed = cli_command(
        "embed",
        "--model",
        MODEL,
        "--task",
        str(task),
        "--split",
        "train",
        "--batch-size",
        "2",
        "--cache-dir",
        str(cache),
        "--device",
        "cpu",
        "--quiet",
    )
    proc = subprocess.Popen(embed, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=subprocess_env())
    try:
        deadline = time.monotonic() + 120
        # kill it once the temp file is allocated (on a loaded machine the file can be seen before that)
        while (
            proc.poll() is None
            and time.monotonic() < deadline
            and not any(_size(path) > 400 * 7 * 384 for path in temp_files(cache))
        ):
            time.sleep(0.01)
        assert proc.poll() is None, "the extraction ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    left = temp_files(cache)
    assert len(left) == 1 and left[0].stat().st_size > 400 * 7 * 384  # the whole file was allocated
    EmbeddingCache(cache)
    assert temp_files(cache) == []


@pytest.mark.slow
@pytest.mark.realmodel
def test_sigkill_during_extraction_leaves_no_entry_that_reads_as_valid(tmp_path, data_dir):
    rows = [json.loads(line) for line in (data_dir / "trec" / "train.jsonl").read_text().splitlines()[:600]]
    task_file = tmp_path / "questions.jsonl"
    task_file.write_text("".join(json.dumps({"text": r["text"], "label": r["label"]}) + "\n" for r in rows))
    cache_dir = tmp_path / "cache"
    embed = cli_command(
        "embed",
        "--model",
        MODEL,
        "--task",
        str(task_file),
        "--split",
        "train",
        "--batch-size",
        "2",
        "--cache-dir",
        str(cache_dir),
        "--device",
        "cpu",
        "--quiet",
    )
    proc = subprocess.Popen(embed, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=subprocess_env())
    embeddings = cache_dir / "embeddings"
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if embeddings.is_dir() and list(embeddings.glob(".*.tmp-*")):
                break  # the data file is being written, batch by batch
            time.sleep(0.02)
        time.sleep(0.3)
        assert proc.poll() is None, "the extraction finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        proc.stderr.close()
    assert list(embeddings.glob(".*.tmp-*"))  # the half-written file is there, under its temporary name
    assert EmbeddingCache(cache_dir).ls() == []  # and nothing reads as an entry

    rerun = subprocess.run(embed, capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "train      extracted" in rerun.stdout and "cache hit" not in rerun.stdout
    entries = EmbeddingCache(cache_dir).ls()
    assert [(e.split, e.shape[1:]) for e in entries] == [("train", (7, 384))]
    assert f"features {'x'.join(map(str, entries[0].shape))} float16" in rerun.stdout
    assert EmbeddingCache(cache_dir)._read(entries[0].key) is not None  # size, header and checksum valid


def test_cache_ls_says_which_entries_it_cannot_read(tmp_path):
    """Before: an entry whose metadata was unreadable was left out of `cache ls` without a word."""
    from click.testing import CliRunner

    from ilge_search.cli import cli

    folder = tmp_path / "cache" / "embeddings"
    folder.mkdir(parents=True)
    (folder / "0123456789abcdef01234567.json").write_bytes(b"\xff{not json")
    result = CliRunner().invoke(cli, ["cache", "ls", "--cache-dir", str(tmp_path / "cache")])
    assert result.exit_code == 0
    assert "1 entry with unreadable metadata not listed (0123456789abcdef01234567)" in " ".join(result.output.split())
