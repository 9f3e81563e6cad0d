"""Every skip in the suite goes through ``tests/announced_skips.py`` (or the outside-need probes of
``tests/conftest.py``), whose reasons say what is missing and how to get it, and the run's summary prints one
line per reason: a skip written any other way is refused here, read from the source with ``ast``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ALLOWED = {TESTS / "announced_skips.py", TESTS / "conftest.py"}  # the helpers and the outside-need probes
BARE = {"skip", "skipif", "importorskip"}  # pytest.skip(...), pytest.mark.skipif(...), pytest.importorskip(...)


def bare_skips(source: str) -> list[int]:
    """The lines of ``source`` that skip with pytest directly: ``pytest.skip``, ``pytest.importorskip``,
    ``pytest.mark.skip`` / ``skipif``, also as ``from pytest import skip``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in BARE:
            base = node.value
            if (isinstance(base, ast.Name) and base.id == "pytest") or (
                isinstance(base, ast.Attribute) and base.attr == "mark"
            ):
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module in ("pytest", "_pytest.outcomes"):
            lines += [node.lineno for alias in node.names if alias.name in BARE]
    return lines


def test_no_test_file_skips_without_announcing_why():
    offenders = [
        f"{path.relative_to(TESTS)}:{line}"
        for path in sorted(TESTS.rglob("*.py"))
        if path not in ALLOWED
        for line in bare_skips(path.read_text(encoding="utf-8"))
    ]
    assert not offenders, (
        f"skip through tests/announced_skips.py (skip_because, module_or_skip, skipped_where): {offenders}"
    )


@pytest.mark.parametrize(
    "source",
    [
        "import pytest\npytest.skip('x')",
        "import pytest\nmod = pytest.importorskip('mteb')",
        "import pytest\nmark = pytest.mark.skipif(True, reason='x')",
        "import pytest\n@pytest.mark.skip\ndef test(): pass",
        "from pytest import importorskip",
    ],
)
def test_the_check_sees_each_bare_form(source):
    assert bare_skips(source)


def test_the_helpers_are_allowed_and_seen_as_such():
    assert not bare_skips("from announced_skips import skip_because\nskip_because('needs root')")


def test_the_summary_names_the_reason_of_a_runtime_skip(pytester):
    pytester.makeconftest((TESTS / "conftest.py").read_text(encoding="utf-8"))
    (pytester.path / "announced_skips.py").write_text((TESTS / "announced_skips.py").read_text(encoding="utf-8"))
    pytester.makepyfile(
        test_one="""
from announced_skips import module_or_skip, skip_because, skipped_where

def test_root():
    skip_because("needs root here")

def test_module():
    module_or_skip("no_such_module_anywhere", "pip install it")

@skipped_where(True, "never on this machine")
def test_marked():
    pass
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(skipped=3)
    result.stdout.fnmatch_lines(
        [
            "skipped 1 test(s): needs root here",
            "skipped 1 test(s): needs the no_such_module_anywhere package, not installed here: pip install it",
            "skipped 1 test(s): never on this machine",
        ]
    )
