"""What a SQL store holds in memory to answer a scope's reads fast, and how it knows it is current.

A store bumps the scope's revision (one row of its own `<store>_revisions` table) in the same
transaction as every write that changes what it holds in memory. A read compares the
revision with the one its snapshot was read at: equal, it answers from memory; else from SQL,
while a new snapshot is read (`background`: in a thread, from the scope's second read in the
process on, so that a one-shot command never pays for it; `inline`: first; `off`: never).
In the background, a scope's next read waits as long as its last one took, so that a scope
written without pause (a cognify running) costs a reader at most half its time. Snapshots
are kept most recently used first, within a bound on their total size; a scope larger than
the bound is never held.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from kenning.pipeline.models import Scope

log = logging.getLogger(__name__)

Key = tuple[str, str]
MODES = ("background", "inline", "off")


class Snapshot(Protocol):
    @property
    def revision(self) -> int: ...

    @property
    def size(self) -> int: ...


T = TypeVar("T", bound=Snapshot)
R = TypeVar("R")


class Snapshots(Generic[T]):
    """The snapshots of one store's scopes. Thread-safe; one thread reads a scope at a time."""

    def __init__(
        self, max_size: int, mode: str = "background", clock: Callable[[], float] = time.monotonic
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"snapshots must be one of {MODES}, not {mode!r}")
        self.mode = mode
        self._max_size = max_size
        self._held: OrderedDict[Key, T] = OrderedDict()
        self._reading: set[Key] = set()
        self._oversized: set[Key] = set()
        self._searched: set[Key] = set()
        self._next_read: dict[Key, float] = {}
        self._clock = clock
        self._lock = threading.Lock()

    def usable(self, scope: Scope, revision: int, read: Callable[[], T | None]) -> T | None:
        """The scope's snapshot at `revision`, or None (answer from SQL). `read()` reads one on
        a connection of its own; None when a write came in meanwhile."""
        key: Key = (scope.tenant, scope.dataset)
        if self.mode == "off":
            return None
        held = self._get(key, revision)
        if held is not None:
            return held
        if self.mode == "background":
            if self._searched_before(key) and self._due(key) and self._begin_read(key):
                threading.Thread(target=self._read, args=(key, read), name="snapshot", daemon=True).start()
            return None
        if not self._begin_read(key):
            return None
        snapshot = self._read(key, read)
        return snapshot if snapshot is not None and snapshot.revision == revision else None

    def held(self, scope: Scope, revision: int) -> T | None:
        """The scope's snapshot if it is held at `revision`; unlike `usable`, never starts a read."""
        return self._get((scope.tenant, scope.dataset), revision)

    def revision(self, scope: Scope) -> int | None:
        """The revision of the scope's snapshot held, None when none is."""
        with self._lock:
            snapshot = self._held.get((scope.tenant, scope.dataset))
            return None if snapshot is None else snapshot.revision

    def reading(self, scope: Scope) -> bool:
        """Whether a read of the scope's snapshot is under way (begun by `usable` before it returns)."""
        with self._lock:
            return (scope.tenant, scope.dataset) in self._reading

    def _read(self, key: Key, read: Callable[[], T | None]) -> T | None:
        snapshot = None
        started = self._clock()
        try:
            snapshot = read()
        except Exception:
            log.exception("%s/%s not read into memory: answered from SQL", *key)
        finally:
            ended = self._clock()
            with self._lock:
                self._next_read[key] = ended + (ended - started)
            self._end_read(key, snapshot)
        return snapshot

    def _due(self, key: Key) -> bool:
        with self._lock:
            return self._clock() >= self._next_read.get(key, 0.0)

    def _get(self, key: Key, revision: int) -> T | None:
        with self._lock:
            snapshot = self._held.get(key)
            if snapshot is None or snapshot.revision != revision:
                return None
            self._held.move_to_end(key)
            return snapshot

    def _searched_before(self, key: Key) -> bool:
        with self._lock:
            if key in self._searched:
                return True
            self._searched.add(key)
            return False

    def _begin_read(self, key: Key) -> bool:
        with self._lock:
            if key in self._reading or key in self._oversized:
                return False
            self._reading.add(key)
            return True

    def _end_read(self, key: Key, snapshot: T | None) -> None:
        with self._lock:
            self._reading.discard(key)
            self._held.pop(key, None)
            if snapshot is None:
                return
            if snapshot.size > self._max_size:
                self._oversized.add(key)
                return
            self._held[key] = snapshot
            while sum(held.size for held in self._held.values()) > self._max_size:
                self._held.popitem(last=False)


def revisions_table(name: str, metadata: sa.MetaData) -> sa.Table:
    """A store's table of scope revisions."""
    return sa.Table(
        name,
        metadata,
        sa.Column("tenant", sa.String, primary_key=True),
        sa.Column("dataset", sa.String, primary_key=True),
        sa.Column("revision", sa.BigInteger, nullable=False),
    )


def bump(conn: sa.Connection, table: sa.Table, scope: Scope) -> None:
    """One more revision of the scope, in the caller's transaction."""
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    insert = dialect.insert(table).values(tenant=scope.tenant, dataset=scope.dataset, revision=1)
    conn.execute(
        insert.on_conflict_do_update(
            index_elements=["tenant", "dataset"], set_={"revision": table.c.revision + 1}
        )
    )


def revision_of(conn: sa.Connection, table: sa.Table, scope: Scope) -> int:
    """The scope's revision (0 before its first write)."""
    query = sa.select(table.c.revision).where(
        table.c.tenant == scope.tenant, table.c.dataset == scope.dataset
    )
    return int(conn.execute(query).scalar() or 0)


def read_at_revision(
    conn: sa.Connection, table: sa.Table, scope: Scope, read: Callable[[], R]
) -> tuple[int, R] | None:
    """`read()` and the scope's revision it read at; None if a write came in while it ran."""
    before = revision_of(conn, table, scope)
    found = read()
    return None if revision_of(conn, table, scope) != before else (before, found)
