"""Progress of a step in its own units (documents, chunks), reported from inside the step.

The runner that executes a step says where reports go (`reporting`); a step calls `report`
as its work advances. With no runner listening, a report goes nowhere. Reports follow the
thread (and context) the step runs in: work a step hands to other threads reports through it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

# (step name, done, total)
ProgressCallback = Callable[[str, int, int], None]

_listener: ContextVar[ProgressCallback | None] = ContextVar("kenning_progress", default=None)


@dataclass
class Reported:
    """How many reports reached the callback while `reporting` was open."""

    count: int = 0


@contextmanager
def reporting(callback: ProgressCallback) -> Iterator[Reported]:
    """Send the reports of the steps run in this block (and this context) to `callback`."""
    reported = Reported()

    def listen(step: str, done: int, total: int) -> None:
        reported.count += 1
        callback(step, done, total)

    token = _listener.set(listen)
    try:
        yield reported
    finally:
        _listener.reset(token)


def report(step: str, done: int, total: int) -> None:
    """`done` of the step's `total` units are done."""
    listener = _listener.get()
    if listener is not None:
        listener(step, done, total)
