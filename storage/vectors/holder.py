"""Holding a Qdrant Edge collection across processes: its shard, open in one process at a time.

The engine allows one open shard per folder, so processes share a collection by taking
turns: a process opens the shard under the exclusive lock and keeps it open while it works,
and closes it (which flushes) as soon as another process registers as waiting, or after it
has been idle for `linger_s`. The next holder loads the shard from disk and so sees every
write made before. Threads of one process share one open shard.

Opening a shard takes 15-35 ms, so searches do not take turns: the holder answers other
processes' searches over `.sock` (see `shard_server`), and only a process that finds no
holder answering opens the shard itself.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import logging
import os
import shutil
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import qdrant_edge as qe

from kenning.pipeline.errors import StoreError, TransientStoreError
from kenning.pipeline.models import Scope, ScoredPoint
from kenning.storage.vectors.rules import distance_of, in_scope
from kenning.storage.vectors.shard_server import SearchServer

POLL_S = 0.02
# How long the releaser of a process that holds no shard sleeps, unless one is opened meanwhile
# (then it wakes at once): it only checks then whether its store is still there.
IDLE_WAIT_S = 5.0
# How long a shard's estimate that a scope fills it is kept (`Estimates`), and for how many scopes.
ESTIMATE_S = 1.0
MAX_ESTIMATES = 64
# A search reads the shard's segments one after another on one engine thread. With the pool the
# engine sizes by the CPUs, a search took 1.3-2 times the CPU (threads handing work over) on the
# full 2Wiki store (0.35 against 0.61 ms for 20 chunks, 0.70 against 1.07 for 10 entity names),
# and query processes share the CPUs. The cost: alone on an idle machine, a search of a shard of
# two indexed segments waits for both in turn (bench.vectors' indexed p50: 2.1 against 1.7 ms).
SEARCH_THREADS = 1
META_FILE = "collection.json"
SHARD_DIR = "shard"
# A rebuild writes the live points into FRESH_DIR, then swaps it for SHARD_DIR by way of OLD_DIR.
FRESH_DIR = "shard.fresh"
OLD_DIR = "shard.old"
REBUILD_PAGE = 1_000
LOCK_FILE = ".lock"
WANT_FILE = ".want"
log = logging.getLogger(__name__)


class Shard:
    """One collection in this process: its engine shard, open only while this holds `.lock`."""

    def __init__(
        self, folder: Path, lock_timeout_s: float, index_threshold: int, opened: Callable[[], None]
    ) -> None:
        self.folder = folder
        self._opened = opened
        self.server = SearchServer(folder, functools.partial(_answer, self))
        self._lock_timeout_s = lock_timeout_s
        self._index_threshold = index_threshold
        self._state = threading.Condition()
        self._engine: qe.EdgeShard | None = None
        self._lock_fd: int | None = None
        self._users = 0
        self._last_used = 0.0
        self.estimates = Estimates()

    def enter(self, create: int | None) -> qe.EdgeShard:
        with self._state:
            if self._engine is not None and _others_waiting(self.folder):
                # Hand over before starting more work here, or a busy process would keep it forever.
                self._state.wait_for(lambda: self._users == 0)
                if self._engine is not None:
                    self._release()
            if self._engine is None:
                self._acquire()
                try:
                    self._engine = self._load(create)
                except BaseException:
                    self._unlock()
                    raise
                self.estimates.clear()
                self._opened()
                self._serve()
            self._users += 1
            return self._engine

    def _serve(self) -> None:
        try:
            self.server.start()
        except OSError as exc:  # a socket path too long, a file system without sockets
            log.warning("collection %r: not answering other processes' searches: %s", self.folder.name, exc)

    @property
    def is_open(self) -> bool:
        return self._engine is not None

    def enter_if_open(self) -> qe.EdgeShard | None:
        """Like `enter`, but only while the shard is open here and no other process waits for it."""
        with self._state:
            if self._engine is None or _others_waiting(self.folder):
                return None
            self._users += 1
            return self._engine

    def leave(self) -> None:
        with self._state:
            self._users -= 1
            self._last_used = time.monotonic()
            if self._users == 0:
                self._state.notify_all()
                if _others_waiting(self.folder):
                    self._release()

    def release_if_due(self, linger_s: float) -> None:
        """Let go when idle and another process waits, or when idle for `linger_s`."""
        if not self._state.acquire(blocking=False):
            return
        try:
            if self._engine is None or self._users:
                return
            idle = time.monotonic() - self._last_used
            if idle >= linger_s or _others_waiting(self.folder):
                self._release()
        finally:
            self._state.release()

    def release_now(self) -> None:
        """Close the shard once the operations in flight are done."""
        with self._state:
            self._state.wait_for(lambda: self._users == 0)
            self._release()

    def rebuild(self) -> int:
        """Write the collection's live points into a fresh shard and swap it in, so that no page
        or log entry of a deleted point stays on disk (the engine keeps them in its segments and
        WAL, and has no vacuum that drops them); how many points it holds. Holds `.lock` and waits
        for this process's other operations on the shard to end."""
        engine = self.enter(None)
        try:
            with self._state:
                self._state.wait_for(lambda: self._users == 1)
                dimension = recorded_dimension(self.folder) or 0
                fresh = self.folder / FRESH_DIR
                shutil.rmtree(fresh, ignore_errors=True)
                copied = self._copy_live(engine, fresh, dimension)
                self._engine = None
                try:
                    engine.close()
                    _swap(self.folder)
                    self._engine = qe.EdgeShard.load(str(self.folder / SHARD_DIR), self._config(dimension))
                finally:
                    if self._engine is None:
                        self._unlock()  # the next use opens it again, finishing the swap
                self.estimates.clear()
                return copied
        finally:
            self.leave()

    def _copy_live(self, engine: qe.EdgeShard, fresh: Path, dimension: int) -> int:
        target = self._created(fresh, dimension)
        copied, offset = 0, None
        try:
            while True:
                request = qe.ScrollRequest(
                    offset=offset, limit=REBUILD_PAGE, with_payload=True, with_vector=True
                )
                records, offset = engine.scroll(request)
                points = [
                    qe.Point(record.id, record.vector or [], record.payload or {}) for record in records
                ]
                if points:
                    target.update(qe.UpdateOperation.upsert_points(points))
                copied += len(points)
                if offset is None:
                    break
            if copied >= self._index_threshold:
                target.optimize()
            target.flush()
        finally:
            target.close()
        return copied

    def _created(self, engine_dir: Path, dimension: int) -> qe.EdgeShard:
        engine = qe.EdgeShard.create(str(engine_dir), self._config(dimension))
        tenant = qe.KeywordIndexParams(is_tenant=True)
        engine.update(qe.UpdateOperation.create_field_index("tenant", tenant))
        engine.update(qe.UpdateOperation.create_field_index("dataset", qe.PayloadSchemaType.Keyword))
        return engine

    def _load(self, create: int | None) -> qe.EdgeShard:
        engine_dir = self.folder / SHARD_DIR
        recorded = recorded_dimension(self.folder)
        _finish_swap(self.folder)
        if recorded is not None:
            # With this process's config, which the engine records: a shard made by an earlier
            # kenning searches on SEARCH_THREADS too.
            return qe.EdgeShard.load(str(engine_dir), self._config(recorded))
        if create is None:
            raise StoreError(f"collection {self.folder.name!r} does not exist; ensure_collection creates it")
        # A folder without its meta file is a creation that died half way: start it again.
        shutil.rmtree(engine_dir, ignore_errors=True)
        engine = self._created(engine_dir, create)
        engine.flush()
        _write_atomically(self.folder / META_FILE, {"dimension": create, "distance": "cosine"})
        return engine

    def _config(self, dimension: int) -> qe.EdgeConfig:
        # The optimizer indexes a segment once it outgrows the threshold, counted in KB of float32.
        threshold_kb = max(1, self._index_threshold * dimension * 4 // 1024)
        return qe.EdgeConfig(
            vectors=qe.EdgeVectorParams(size=dimension, distance=qe.Distance.Cosine),
            optimizers=qe.EdgeOptimizersConfig(indexing_threshold=threshold_kb),
            max_search_threads=SEARCH_THREADS,
        )

    def _acquire(self) -> None:
        """Take the collection's file lock, queueing behind processes that already wait."""
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if _others_waiting(self.folder) or not _try_lock(fd):
                self._wait_for(fd)
        except BaseException:
            os.close(fd)
            raise
        self._lock_fd = fd

    def _wait_for(self, fd: int) -> None:
        want = os.open(self.folder / WANT_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            # Holding `.want` shared tells the holder to let go after its current operation.
            fcntl.flock(want, fcntl.LOCK_SH)
            deadline = time.monotonic() + self._lock_timeout_s
            pause = 0.001
            while not _try_lock(fd):
                if time.monotonic() >= deadline:
                    raise TransientStoreError(
                        f"vector collection {self.folder.name!r} stayed busy in another process for "
                        f"{self._lock_timeout_s:g} s"
                    )
                time.sleep(pause)
                pause = min(pause * 2, POLL_S)
        finally:
            os.close(want)

    def _release(self) -> None:
        engine, self._engine = self._engine, None
        try:
            self.server.stop()
            if engine is not None:
                with translated(f"close collection {self.folder.name!r}"):
                    engine.close()
        finally:
            self._unlock()

    def _unlock(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor releases the flock


class ShardKeeper(Protocol):
    """What the releaser watches: the shards a store has open (the Qdrant Edge store)."""

    def _open_shards(self) -> list[Shard]: ...


class Releaser:
    """A daemon thread that closes this process's idle shards when others wait or time passes.
    It looks every POLL_S while this process holds a shard, and sleeps while it holds none (until
    one is opened): every wake-up costs CPU, 16 ms a second at 50 a second, and of 8 query
    processes sharing a home only one holds each collection."""

    def __init__(self, store: ShardKeeper, linger_s: float) -> None:
        self._store = weakref.ref(store)
        self._linger_s = linger_s
        self._stopped = threading.Event()
        self._opened = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kenning-vector-releaser", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._opened.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def wake(self) -> None:
        """A shard was opened here: watch it from now on."""
        self._opened.set()

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._opened.clear()
            store = self._store()
            if store is None:
                return
            held = [shard for shard in store._open_shards() if shard.is_open]
            for shard in held:
                try:
                    shard.release_if_due(self._linger_s)
                except (StoreError, OSError) as exc:  # looked at again at the next round
                    log.warning("collection %r: could not let go of it: %s", shard.folder.name, exc)
            del store
            if held:
                self._stopped.wait(POLL_S)
            else:
                self._opened.wait(IDLE_WAIT_S)


def _swap(folder: Path) -> None:
    os.replace(folder / SHARD_DIR, folder / OLD_DIR)
    os.replace(folder / FRESH_DIR, folder / SHARD_DIR)
    shutil.rmtree(folder / OLD_DIR)


def _finish_swap(folder: Path) -> None:
    """Complete a rebuild that stopped half way: a fresh shard is whole once it is renamed."""
    if not (folder / SHARD_DIR).exists():
        for done in (FRESH_DIR, OLD_DIR):
            if (folder / done).exists():
                os.replace(folder / done, folder / SHARD_DIR)
                break
    shutil.rmtree(folder / OLD_DIR, ignore_errors=True)
    shutil.rmtree(folder / FRESH_DIR, ignore_errors=True)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _others_waiting(folder: Path) -> bool:
    """Whether some process holds `.want`: it waits for this collection's lock. Call it holding
    the shard's `_state`: it probes with a lock of its own, which a second probe from this process
    at the same moment takes for a waiting process (then the shard is handed over for nothing,
    and with 8 query processes every search took its turn on the shard, 20 times slower)."""
    try:
        fd = os.open(folder / WANT_FILE, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        if not _try_lock(fd):
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def recorded_dimension(folder: Path) -> int | None:
    """The vector size in a collection folder's meta file; None when there is none."""
    try:
        recorded = json.loads((folder / META_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StoreError(f"collection {folder.name!r} has an unreadable {META_FILE}: {exc}") from exc
    if not isinstance(recorded, dict):
        raise StoreError(f"collection {folder.name!r} has a {META_FILE} that is not an object")
    if recorded.get("distance") != "cosine" or not isinstance(recorded.get("dimension"), int):
        raise StoreError(f"collection {folder.name!r} is not a single cosine vector; it was not made here")
    dimension: int = recorded["dimension"]
    return dimension


def _write_atomically(path: Path, content: dict[str, Any]) -> None:
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    staging.write_text(json.dumps(content))
    os.replace(staging, path)


@contextmanager
def translated(action: str) -> Iterator[None]:
    """Turn the engine's errors (plain `Exception`s and `ValueError`s) into store errors."""
    try:
        yield
    except StoreError:
        raise
    except Exception as exc:  # the engine raises bare Exception for every failure
        raise StoreError(f"the vector engine could not {action}: {exc}") from exc


def _answer(
    shard: Shard, scope: Scope, vector: Sequence[float], limit: int, fields: Sequence[str] | None
) -> list[ScoredPoint]:
    """Another process's search, answered only while the shard is open here and no process
    waits for it: else that process searches on its own."""
    engine = shard.enter_if_open()
    if engine is None:
        raise StoreError(f"collection {shard.folder.name!r} is not open in this process")
    try:
        with translated(f"search {shard.folder.name!r}"):
            return search_shard(engine, shard.estimates, scope, vector, limit, fields)
    finally:
        shard.leave()


def search_shard(
    engine: qe.EdgeShard,
    estimates: Estimates,
    scope: Scope,
    vector: Sequence[float],
    limit: int,
    fields: Sequence[str] | None,
) -> list[ScoredPoint]:
    """The scope's closest points. When the payload index estimates that every point of the shard
    is the scope's (one dataset in the collection, the common case embedded), the engine searches
    without the scope filter, which on a segment without an HNSW index doubles a search's time;
    its hits are then checked, and any not of the scope (a write between the estimate and the
    search, or an estimate too high) sends the search again with the filter."""
    selector: bool | list[str] = [*fields, "tenant", "dataset"] if fields is not None else True
    query = qe.Query.Nearest(list(vector))
    scope_filter = scope_filter_of(scope)

    def ask(only: qe.Filter | None) -> list[qe.ScoredPoint]:
        request = qe.QueryRequest(
            limit=limit, query=query, filter=only, with_payload=selector, with_vector=False
        )
        return engine.query(request)

    if estimates.all_of_scope(engine, scope, scope_filter):
        hits = ask(None)
        if all(in_scope(hit.payload, scope) for hit in hits):
            return _scored(hits)
    return _scored(ask(scope_filter))


class Estimates:
    """`_all_of_scope` of one shard's engine, kept ESTIMATE_S per scope (two engine calls a search
    saved), forgotten when the engine is opened again and after each write through it. While this
    process holds the shard, no other process writes there. A stale estimate would cost time,
    never a wrong answer: `search_shard` checks every hit of an unfiltered search, and searches again
    with the filter when one is another scope's."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, str], tuple[float, bool]] = {}
        self._lock = threading.Lock()

    def all_of_scope(self, engine: qe.EdgeShard, scope: Scope, scope_filter: qe.Filter) -> bool:
        key, now = (scope.tenant, scope.dataset), time.monotonic()
        with self._lock:
            known = self._known.get(key)
        if known is not None and now - known[0] < ESTIMATE_S:
            return known[1]
        found = _all_of_scope(engine, scope_filter)
        with self._lock:
            if len(self._known) >= MAX_ESTIMATES:
                self._known.clear()
            self._known[key] = (now, found)
        return found

    def clear(self) -> None:
        with self._lock:
            self._known.clear()


def _all_of_scope(engine: qe.EdgeShard, scope_filter: qe.Filter) -> bool:
    """Whether the payload index estimates that the shard holds the scope's points alone."""
    total = engine.info().points_count
    return total > 0 and engine.count(qe.CountRequest(filter=scope_filter, exact=False)) >= total


def _scored(hits: Sequence[qe.ScoredPoint]) -> list[ScoredPoint]:
    return [
        ScoredPoint(id=str(hit.id), score=distance_of(hit.score), payload=dict(hit.payload or {}))
        for hit in hits
    ]


def scope_filter_of(scope: Scope) -> qe.Filter:
    return qe.Filter(must=scope_conditions(scope))


def scope_conditions(scope: Scope) -> list[qe.ConditionType]:
    return [
        qe.FieldCondition("tenant", match=qe.MatchValue(scope.tenant)),
        qe.FieldCondition("dataset", match=qe.MatchValue(scope.dataset)),
    ]
