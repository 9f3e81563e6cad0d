"""Parameter checks declared once and shared by every module (as scikit-learn's ``_param_validation``).

Each raises ``ValueError`` with one line that names the parameter, what it
must be and what it got; the CLI turns that line into its error message.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable
from typing import Literal, TypeVar, cast, overload

__all__ = [
    "check_int",
    "check_choice",
    "check_positive_number",
    "check_items",
    "usable_cpus",
    "ArgumentTypeError",
]

T = TypeVar("T")


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the system has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type (an ``int`` where a model or a config belongs).

    A ``TypeError``, as the published ``ilge`` package raises for these, and a
    ``ValueError``, so the CLI reports it as one line like every other bad argument.
    """


@overload
def check_int(name: str, value: object, *, minimum: int = 1, allow_none: Literal[False] = False) -> int: ...
@overload
def check_int(name: str, value: object, *, minimum: int = 1, allow_none: bool) -> int | None: ...
def check_int(name: str, value: object, *, minimum: int = 1, allow_none: bool = False) -> int | None:
    """``value`` if it is an integer >= ``minimum`` (or ``None`` when allowed); bools are refused."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        allowed = " or None" if allow_none else ""
        raise ValueError(f"{name} must be an integer >= {minimum}{allowed}, got {value!r}")
    return value


def check_positive_number(name: str, value: object, *, allow_none: bool = False, unit: str = "") -> float | None:
    """``value`` if it is a real number > 0 (or ``None`` when allowed)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number{' of ' + unit if unit else ''}, got {value!r}")
    return value


def check_choice(name: str, value: T, choices: Collection[object]) -> T:
    """``value`` if it is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}: unknown {name} {value!r}")
    return value


def check_items(name: str, value: object, what: str, item: str) -> list:
    r"""``value`` as a non-empty list; one string, something that is not iterable or nothing at all is
    refused, saying that ``name`` must be ``what`` (a list of ``item``\ s)."""
    if isinstance(value, (str, bytes)):
        raise ValueError(f"{name} must be {what}, not a single string")
    try:
        items = list(cast(Iterable[object], value))
    except TypeError:
        raise ValueError(f"{name} must be {what}, got {type(value).__name__}") from None
    if not items:
        raise ValueError(f"{name} is empty; pass at least one {item}")
    return items
