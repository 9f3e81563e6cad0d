"""Helpers shared by the fault tests (imported as ``faultkit``; fixtures live in conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List


def remount(target: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(target)], check=True, capture_output=True)


def write_task(folder: Path, splits: Dict[str, List[dict]]) -> Path:
    """A custom task folder: one JSONL file per split."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def sentences(count: int, start: int = 0) -> List[str]:
    words = "river stone cloud lamp garden violin harbour pencil meadow copper lantern orchard".split()
    return [
        f"the {words[i % 12]} near the {words[(i * 5 + 3) % 12]} is number {i}" for i in range(start, start + count)
    ]


def labelled(count: int, labels: List[str], start: int = 0) -> List[dict]:
    return [{"text": text, "label": labels[i % len(labels)]} for i, text in enumerate(sentences(count, start))]


def cli_command(*args: str) -> List[str]:
    """The `ilge-search` entry point, run by this interpreter in a subprocess."""
    return [sys.executable, "-c", "from ilge_search.cli import cli; cli()", *args]


def subprocess_env() -> Dict[str, str]:
    return dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")


def temp_files(folder: Path) -> List[Path]:
    return sorted(folder.rglob(".*.tmp-*")) if folder.is_dir() else []
