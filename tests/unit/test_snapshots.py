"""What a SQL store holds in memory: used only at its revision, read in the background from a
scope's second read on, never past its bound, and not read again back to back."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from kenning.pipeline.models import Scope
from kenning.storage.sql.snapshots import Snapshots

SCOPE = Scope(tenant="t", dataset="d")


@dataclass(frozen=True)
class Held:
    revision: int
    size: int = 1


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Reads:
    """A read that returns the scope at `revision`, taking `takes` seconds of the clock."""

    def __init__(self, clock: Clock, revision: int, takes: float = 0.0) -> None:
        self.clock, self.revision, self.takes, self.count = clock, revision, takes, 0
        self.done = threading.Event()

    def __call__(self) -> Held:
        self.count += 1
        self.clock.now += self.takes
        self.done.set()
        return Held(self.revision)


def wait_for_read(snapshots: Snapshots[Held], reads: Reads, revision: int) -> Held | None:
    assert reads.done.wait(10)
    for _ in range(200):  # the thread keeps what it read right after the read returns
        if snapshots.revision(SCOPE) is not None:
            break
        threading.Event().wait(0.01)
    return snapshots.usable(SCOPE, revision, reads)


def test_inline_reads_first_and_uses_only_the_current_revision() -> None:
    clock = Clock()
    snapshots: Snapshots[Held] = Snapshots(10, "inline", clock)
    assert snapshots.usable(SCOPE, 1, Reads(clock, 1)) == Held(1)
    assert snapshots.usable(SCOPE, 1, Reads(clock, 1)) == Held(1)
    # A write moved the scope on: what was read at revision 1 is not used
    assert snapshots.usable(SCOPE, 2, Reads(clock, 1)) is None
    assert snapshots.usable(SCOPE, 2, Reads(clock, 2)) == Held(2)


def test_background_reads_from_the_second_search_on() -> None:
    clock = Clock()
    snapshots: Snapshots[Held] = Snapshots(10, "background", clock)
    reads = Reads(clock, 1)
    assert snapshots.usable(SCOPE, 1, reads) is None
    # A process that searches once never reads (a read in a thread would be begun by now)
    assert not snapshots.reading(SCOPE) and reads.count == 0
    assert snapshots.usable(SCOPE, 1, reads) is None  # answered from SQL, read in a thread
    assert wait_for_read(snapshots, reads, 1) == Held(1)
    assert reads.count == 1


def test_a_scope_is_not_read_again_sooner_than_its_last_read_took() -> None:
    clock = Clock()
    snapshots: Snapshots[Held] = Snapshots(10, "background", clock)
    first = Reads(clock, 1, takes=5.0)
    snapshots.usable(SCOPE, 1, first)
    snapshots.usable(SCOPE, 1, first)
    assert wait_for_read(snapshots, first, 1) == Held(1)
    # When writes keep coming, the next read waits as long as the last one took
    second = Reads(clock, 2)
    assert snapshots.usable(SCOPE, 2, second) is None
    assert second.count == 0
    clock.now += 5.0
    assert snapshots.usable(SCOPE, 2, second) is None
    assert wait_for_read(snapshots, second, 2) == Held(2)


def test_a_scope_past_the_bound_is_never_held_nor_read_again() -> None:
    clock = Clock()
    snapshots: Snapshots[Held] = Snapshots(10, "inline", clock)
    big = Reads(clock, 1)
    big_read = lambda: Held(1, size=11)  # noqa: E731
    assert snapshots.usable(SCOPE, 1, big_read) == Held(1, size=11)  # current: used once, not kept
    assert snapshots.usable(SCOPE, 1, big) is None
    assert big.count == 0 and snapshots.revision(SCOPE) is None


def test_the_least_recently_used_goes_first_past_the_bound() -> None:
    clock = Clock()
    snapshots: Snapshots[Held] = Snapshots(2, "inline", clock)
    scopes = [Scope(tenant="t", dataset=name) for name in "abc"]
    for scope in scopes:
        assert snapshots.usable(scope, 1, lambda: Held(1)) == Held(1)
    assert [snapshots.revision(scope) for scope in scopes] == [None, 1, 1]
