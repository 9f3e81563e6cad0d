"""Every test the Guarantees page (docs/guarantees.md) names exists, so no guarantee points at nothing."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _guarantees() -> str:
    return (ROOT / "docs" / "guarantees.md").read_text(encoding="utf-8")


def _test_names(path: Path) -> set:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_named_test_exists_and_every_guarantee_names_one():
    section = _guarantees()
    references = []  # (file, test or None), a bare ::name belongs to the file named last before it
    current = None
    for match in re.finditer(r"(tests/[\w/]+\.py)(?:::(\w+))?|(?<![\w/.])::(\w+)", section):
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
        elif name is not None and name not in _test_names(path):
            missing.append(f"{file}::{name}")
    assert not missing, f"the Guarantees page names tests that do not exist: {missing}"
    bullets = [b for b in re.split(r"\n- ", section)[1:]]
    assert bullets and all("tests/" in b or "::" in b for b in bullets), "a guarantee names no test"
    assert len(references) >= 40
