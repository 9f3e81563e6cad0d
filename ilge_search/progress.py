"""The one way ilge-search shows progress: every bar and note goes through :func:`new_bar`, :func:`steps`, :func:`note`.

On a terminal (stderr is a TTY) or in a notebook a bar is a tqdm bar. In a file or pipe (a log, a CI job,
``2> run.log``) a bar redrawn with carriage returns would leave thousands of updates in one line, so there
each bar writes whole lines instead: one per finished tenth of its total (one per step when it has ten steps or
fewer) and one when it closes, so a bar costs at most a dozen lines whatever it counts; a bar without a total
(a search bounded by time) writes at most one line per :data:`UNKNOWN_TOTAL_EVERY` seconds. A ``transient``
bar (one nested inside another, such as a trial's epochs) writes nothing off a terminal: its parent's lines
already say how far the run is.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

from tqdm.auto import tqdm

__all__ = ["Bar", "BarSpec", "LineBar", "new_bar", "on_terminal", "note", "steps"]

T = TypeVar("T")

MILESTONES = 10  # lines per bar off a terminal (besides the closing one): one per finished tenth
UNKNOWN_TOTAL_EVERY = 30.0  # seconds between the lines of a bar that has no total


class Bar(Protocol):
    """What callers use of a bar: tqdm's ``n``, ``update``, ``set_postfix_str`` and ``close``."""

    n: float

    def update(self, n: float = 1) -> object: ...

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> object: ...

    def close(self) -> object: ...

    def __enter__(self) -> Bar: ...

    def __exit__(self, *exc: object) -> object: ...


@dataclass(frozen=True)
class BarSpec:
    """What a bar counts: its label (``desc``), its total (None: unknown), the ``unit`` of one step, whether it
    is shown at all (``enabled``, False for ``--quiet``) and whether it disappears when done (``transient``)."""

    desc: str
    total: float | None = None
    unit: str = "it"
    enabled: bool = True
    transient: bool = False


def on_terminal() -> bool:
    """Whether stderr, where bars go, is a terminal that redraws a line in place, or a notebook (whose
    kernel's stderr is no terminal, but tqdm draws its bars there as widgets)."""
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty()) or "ipykernel" in sys.modules


class LineBar:
    """A bar for a file: a line at each finished tenth of ``total`` and a closing line, never a ``'\\r'``."""

    def __init__(self, spec: BarSpec) -> None:
        self.spec, self.n = spec, 0.0
        self._postfix, self._written, self._closed = "", 0.0, False
        self._started = self._last_line = time.monotonic()
        self._silent = not spec.enabled or spec.transient

    def update(self, n: float = 1) -> None:
        self.n += n
        total = self.spec.total
        if (total and self._milestone(self.n, total) > self._milestone(self._written, total)) or (
            not total and n and time.monotonic() - self._last_line >= UNKNOWN_TOTAL_EVERY
        ):
            self._line()

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self._postfix = s

    def close(self) -> None:
        if not self._closed and self.n != self._written:
            self._line()
        self._closed = True

    def __enter__(self) -> LineBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _milestone(done: float, total: float) -> int:
        return int(MILESTONES * max(done, 0) / total) if total > 0 else 0

    def _line(self) -> None:
        self._written, self._last_line = self.n, time.monotonic()
        if self._silent:
            return
        count = f"{self.n:g}/{self.spec.total:g}" if self.spec.total else f"{self.n:g}"
        postfix = f", {self._postfix}" if self._postfix else ""
        seconds = time.monotonic() - self._started
        print(f"{self.spec.desc}: {count} {self.spec.unit}{postfix} ({seconds:.1f}s)", file=sys.stderr, flush=True)


def new_bar(spec: BarSpec) -> Bar:
    """A bar for ``spec``: tqdm on a terminal, a :class:`LineBar` otherwise (see the module's note)."""
    if not on_terminal():
        return LineBar(spec)

    return tqdm(
        total=spec.total,
        desc=spec.desc,
        unit=spec.unit,
        disable=not spec.enabled,
        leave=not spec.transient,
        dynamic_ncols=True,
        file=sys.stderr,
    )


def steps(items: Iterable[T], spec: BarSpec) -> Iterator[T]:
    """``items`` one by one, counted by a bar for ``spec`` (its total: ``len(items)`` when not given)."""
    if spec.total is None and hasattr(items, "__len__"):
        spec = BarSpec(spec.desc, len(items), spec.unit, spec.enabled, spec.transient)  # type: ignore[arg-type]
    progress = new_bar(spec)
    try:
        for item in items:
            yield item
            progress.update(1)
    finally:
        progress.close()


def note(line: str) -> None:
    """One progress note on stderr, above a running bar on a terminal (so the bar is not torn)."""
    if on_terminal():
        tqdm.write(line, file=sys.stderr)
    else:
        print(line, file=sys.stderr, flush=True)
