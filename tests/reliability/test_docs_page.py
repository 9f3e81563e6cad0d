"""Every test docs/reliability.md names exists, and every guarantee on it names one."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_test_the_reliability_page_names_exists():
    text = (ROOT / "docs" / "reliability.md").read_text(encoding="utf-8")
    references, current = [], None
    for match in re.finditer(r"(tests/[\w/]+\.py)(?:::(\w+))?|(?<![\w/.])::(\w+)", text):
        if match.group(1):
            current = match.group(1)
            references.append((current, match.group(2)))
        else:
            assert current is not None, f"::{match.group(3)} names no file before it"
            references.append((current, match.group(3)))
    missing = []
    for file, name in references:
        path = ROOT / file
        if not path.is_file():
            missing.append(file)
            continue
        names = {
            n.name for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(n, ast.FunctionDef)
        }
        if name is not None and name not in names:
            missing.append(f"{file}::{name}")
    assert not missing, missing
    bullets = re.split(r"\n- ", text)[1:]
    assert bullets and all("::" in bullet for bullet in bullets), "a guarantee names no test"
    assert len(references) >= 25
