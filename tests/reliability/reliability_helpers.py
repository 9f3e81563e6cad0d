"""Helpers shared by the reliability tests: the CLI in a subprocess, plain-SQLite reads, tmpfs mounts, tiny
task folders (fixtures live in conftest.py; the real trec subset is ``trec_cached`` of tests/conftest.py)."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from announced_skips import skip_because

MODEL = "minilm-l6"
SMALL = ["--max-train", "240", "--max-eval", "160", "--max-epochs", "6"]
SMALL_NAME = "train240:eval160:ep6"


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def cli_command(*args: str) -> list[str]:
    """The `ilge-search` entry point, run by this interpreter."""
    return [sys.executable, "-c", "from ilge_search.cli import cli; cli()", *args]


def subprocess_env(**extra: str) -> dict[str, str]:
    return dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **extra)


def one_line_error(result) -> str:
    """What a refused ``CliRunner`` command printed: it exited 1 through ``SystemExit`` with no traceback, and
    its output is one line, ``Error: ...`` (returned with runs of whitespace collapsed)."""
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return " ".join(lines[0].split())


def refused_run(tmp_path: Path, task: Path, *more: str):
    """``ilge-search run`` of ``minilm-l6`` on the task folder ``task`` with ``more`` options, through
    ``CliRunner``, for a run that must be refused: its storage file must not exist afterwards."""
    from click.testing import CliRunner

    from ilge_search.cli import cli

    db = tmp_path / "s.db"
    args = ["run", "--model", MODEL, "--task", str(task), "--storage", sqlite_url(db)]
    args += ["--cache-dir", str(tmp_path / "cache"), "--device", "cpu", "--quiet", "--n-trials", "1"]
    result = CliRunner().invoke(cli, [*args, "--final-seeds", "0", *more])
    assert not db.exists(), "a refused run created its storage"
    return result


def run_args(db: Path, data_dir: Path, cache_dir: Path, *more: str) -> list[str]:
    """``ilge-search run`` on the cached trec subset, no final evaluation, no pruning."""
    return [
        "run",
        "--model",
        MODEL,
        "--task",
        "trec",
        "--storage",
        sqlite_url(db),
        "--final-seeds",
        "0",
        "--pruner",
        "none",
        "--data-dir",
        str(data_dir),
        "--cache-dir",
        str(cache_dir),
        "--device",
        "cpu",
        "--quiet",
        *SMALL,
        *more,
    ]


def trials(db: Path) -> dict[int, tuple[str, int]]:
    """``{number: (state, epochs reported)}`` read with plain sqlite3, as another process sees it mid-run."""
    if not db.exists():
        return {}
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as conn:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'trial_intermediate_values'").fetchone() is None:
            return {}
        rows = conn.execute(
            "SELECT t.number, t.state, COUNT(v.trial_intermediate_value_id) FROM trials t "
            "LEFT JOIN trial_intermediate_values v ON v.trial_id = t.trial_id GROUP BY t.trial_id"
        ).fetchall()
    return {number: (state, epochs) for number, state, epochs in rows}


def integrity(db: Path) -> str:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as conn:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]


def trial_states(db: Path) -> dict[int, str]:
    """``{trial number: state}`` read with plain sqlite3 (what a second process sees mid-run)."""
    return {number: state for number, (state, _) in trials(db).items()}


def wait_for(condition, timeout: float, proc: subprocess.Popen | None = None, step: float = 0.05):
    """Poll ``condition()`` until it is truthy (its value is returned) or ``timeout`` passes (``None``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            return condition() or None
        time.sleep(step)
    return None


@contextlib.contextmanager
def tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """A tiny tmpfs mounted at ``folder`` (skips the test where mounting is not allowed)."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        skip_because(f"cannot mount a tmpfs here ({mounted.stderr.strip() or 'mount failed'}); run the suite as root")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def remount_read_only(folder: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True, capture_output=True)


def fill(folder: Path) -> Path:
    """Write a file into ``folder`` until its filesystem is full."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as handle, contextlib.suppress(OSError):
        while True:
            handle.write(b"\0" * 4096)
    return filler


def remount(target: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(target)], check=True, capture_output=True)


def write_task(folder: Path, splits: dict[str, list[dict]]) -> Path:
    """A custom task folder: one JSONL file per split."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def sentences(count: int, start: int = 0) -> list[str]:
    words = [
        "river",
        "stone",
        "cloud",
        "lamp",
        "garden",
        "violin",
        "harbour",
        "pencil",
        "meadow",
        "copper",
        "lantern",
        "orchard",
    ]
    return [
        f"the {words[i % 12]} near the {words[(i * 5 + 3) % 12]} is number {i}" for i in range(start, start + count)
    ]


def labelled(count: int, labels: list[str], start: int = 0) -> list[dict]:
    return [{"text": text, "label": labels[i % len(labels)]} for i, text in enumerate(sentences(count, start))]


def temp_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob(".*.tmp-*")) if folder.is_dir() else []
