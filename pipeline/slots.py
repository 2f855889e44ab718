"""Query slots: how many searches of one home run at once, the rest waiting in line.

A search on an embedded home is CPU work on this machine: the local embedder, the graph's walk, the
vector engine (or the process holding a collection, answering for it). Searches beyond the CPUs
only share them, so each takes as many times its own CPU time as there are searches, and the
slowest far longer; in line, each runs at the speed of a machine shared by the slots alone. A search
holds its slot for its retrieval, never while it waits for an LLM (`released`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol


class QuerySlots(Protocol):
    def slot(self) -> AbstractContextManager[None]:
        """Hold a slot for the block, waiting in line for one; a block within a block of the same
        thread holds the slot it has."""
        ...

    def released(self) -> AbstractContextManager[None]:
        """Within `slot`, around a wait for something off this machine (an LLM's answer): the slot
        goes to the next search meanwhile, and is taken again after. Outside `slot`: nothing."""
        ...


class NoSlots:
    """Every search at once: the slots of a deployment whose searches wait on servers."""

    @contextmanager
    def slot(self) -> Iterator[None]:
        yield

    @contextmanager
    def released(self) -> Iterator[None]:
        yield


NO_SLOTS = NoSlots()
