"""Write the demo's banking77 subset (``examples/data/banking77``) from the full banking77 files.

The full set is PolyAI's banking77 (CC BY 4.0); this draws a seeded, stratified subset of it, the same number
of rows per label from each split, and keeps the rows as they are. Run from the repository root:

    python examples/data/make_demo_data.py /path/to/datasets/banking77
"""

from __future__ import annotations

import json
import random
import sys
from collections import defaultdict
from pathlib import Path

PER_LABEL = {"train": 24, "test": 10}  # rows per label and split: 1,848 train and 770 test rows in all
SEED = 0
OUT = Path(__file__).resolve().parent / "banking77"


def draw(source: Path, split: str, per_label: int, seed: int) -> list[str]:
    """``per_label`` lines per label of ``source/<split>.jsonl``, in their original order."""
    lines = source.joinpath(f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
    by_label: dict[str, list[int]] = defaultdict(list)
    for number, line in enumerate(lines):
        by_label[json.loads(line)["label"]].append(number)
    rng = random.Random(seed)
    kept = sorted(n for label in sorted(by_label) for n in rng.sample(by_label[label], per_label))
    return [lines[n] for n in kept]


def main(source: Path) -> None:
    OUT.mkdir(exist_ok=True)
    for split, per_label in PER_LABEL.items():
        rows = draw(source, split, per_label, SEED)
        OUT.joinpath(f"{split}.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
        print(f"{split}: {len(rows)} rows")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
