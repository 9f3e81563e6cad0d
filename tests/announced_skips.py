"""The one way a test skips (``tests/test_skips_announced.py`` refuses any other): each helper names what is
missing and how to get it, and ``tests/conftest.py`` prints one ``skipped N test(s): why`` line per reason at the
end of the run, so no skipped test goes unexplained."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import NoReturn

import pytest


def skip_because(why: str) -> NoReturn:
    """Skip the running test (or fixture) because ``why``: what is missing here, and how to get it."""
    pytest.skip(why)


def module_or_skip(name: str, install: str) -> ModuleType:
    """The module ``name``, or a skip saying it is not installed and ``install`` (how to install it)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        skip_because(f"needs the {name} package, not installed here: {install}")


def skipped_where(condition: bool, why: str) -> pytest.MarkDecorator:
    """A mark that skips the test when ``condition`` holds, because ``why``."""
    return pytest.mark.skipif(condition, reason=why)
