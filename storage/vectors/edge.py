"""Qdrant Edge adapter for the `VectorStore` port: the Qdrant engine in process, on disk.

Each collection is a folder under the store's path:

    <path>/<collection>/collection.json   dimension and distance, written once at creation
    <path>/<collection>/shard/            the engine's shard (segments, WAL, HNSW and payload indexes)
    <path>/<collection>/.lock             held (flock) by the one process that has the shard open
    <path>/<collection>/.want             held shared by processes waiting for that lock
    <path>/<collection>/.sock             where the holder answers other processes' searches

Processes share a collection by taking turns on its shard (`holder`); a search goes first to
the process holding it (`shard_server`), and only a process that finds no holder answering
opens the shard itself.
"""

from __future__ import annotations

import os
import re
import threading
import uuid
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import qdrant_edge as qe

from kenning.pipeline.errors import StoreError
from kenning.pipeline.models import Scope, ScoredPoint, VectorPoint
from kenning.storage.vectors.holder import (
    META_FILE,
    Releaser,
    Shard,
    recorded_dimension,
    scope_conditions,
    scope_filter_of,
    search_shard,
    translated,
)
from kenning.storage.vectors.rules import mismatch, require_dimension, scoped_payload
from kenning.storage.vectors.shard_server import search_remotely

DEFAULT_BATCH_SIZE = 256
DEFAULT_INDEX_THRESHOLD = 20_000
DEFAULT_LOCK_TIMEOUT_S = 300.0
DEFAULT_LINGER_S = 300.0
SCROLL_PAGE = 1_000
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")


class EdgeVectorStore:
    """A `VectorStore` on Qdrant Edge under `path`: one shard per collection, shared by processes.

    Writes go in batches of `batch_size` points. Once a collection holds `index_threshold`
    points outside its HNSW index, the write that crossed it builds the index (searches of
    other processes wait meanwhile), unless `auto_index` is off and `optimize` is left to
    the caller; below it, searches scan the scope's points exactly.
    Tenant and dataset are payload-indexed, so a search reads only its scope's points; where
    those indexes estimate that the collection holds the scope's points alone, a search skips
    the filter and checks its hits instead (`search_shard`).
    A process waits at most `lock_timeout_s` for a collection another process holds, then
    raises `TransientStoreError`. Nothing is opened until first use; `close` lets go of
    everything, and a later call opens again.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        index_threshold: int = DEFAULT_INDEX_THRESHOLD,
        lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
        linger_s: float = DEFAULT_LINGER_S,
        auto_index: bool = True,
    ) -> None:
        if batch_size < 1 or index_threshold < 1:
            raise StoreError("the vector store's batch_size and index_threshold must be positive")
        self._path = Path(path)
        self._batch_size = batch_size
        self._index_threshold = index_threshold
        self._lock_timeout_s = lock_timeout_s
        self._linger_s = linger_s
        self._auto_index = auto_index
        self._dimensions: dict[str, int] = {}
        self._shards: dict[str, Shard] = {}
        self._lock = threading.Lock()
        self._releaser: Releaser | None = None
        _track(self)

    def ensure_collection(self, name: str, dimension: int) -> None:
        """Create the collection, or raise `DimensionMismatch` if it exists with another size."""
        existing = self._dimension_of(name)
        if existing is None:
            with self._using(name, f"create collection {name!r}", create=dimension):
                pass
            existing = self._dimension_of(name)
        if existing != dimension:
            raise mismatch(name, existing or 0, dimension)

    def upsert(self, scope: Scope, collection: str, points: Sequence[VectorPoint]) -> None:
        """Insert or replace points by id, `batch_size` at a time, stamped with the scope."""
        dimension = self._dimension_of(collection)
        if dimension is None:
            raise StoreError(f"collection {collection!r} does not exist; ensure_collection creates it")
        for point in points:
            require_dimension(collection, dimension, point.vector)
        with translated(f"stage points for {collection!r}"):
            staged = [
                qe.Point(_point_id(p.id), list(p.vector), scoped_payload(scope, p.payload)) for p in points
            ]
        if not staged:
            return
        with self._using(collection, f"upsert into {collection!r}", writes=True) as shard:
            for start in range(0, len(staged), self._batch_size):
                batch = staged[start : start + self._batch_size]
                shard.update(qe.UpdateOperation.upsert_points(batch))
            if self._auto_index:
                info = shard.info()
                if info.points_count - info.indexed_vectors_count >= self._index_threshold:
                    shard.optimize()

    def search(
        self,
        scope: Scope,
        collection: str,
        vector: Sequence[float],
        limit: int,
        fields: Sequence[str] | None = None,
    ) -> list[ScoredPoint]:
        """Closest points of the scope first; `score` is the cosine distance, 1 - similarity."""
        dimension = self._dimension_of(collection)
        if dimension is None or limit <= 0:
            return []
        require_dimension(collection, dimension, vector)
        shard = self._shard(collection)
        if not shard.is_open:
            hits = search_remotely(shard.folder, scope, vector, limit, fields)
            if hits is not None:
                return hits
        with self._using(collection, f"search {collection!r}") as engine:
            return search_shard(engine, shard.estimates, scope, vector, limit, fields)

    def retrieve(
        self, scope: Scope, collection: str, ids: Sequence[str], fields: Sequence[str] | None = None
    ) -> list[VectorPoint]:
        """The scope's points with these ids, `batch_size` ids at a time, vectors included."""
        wanted = list(dict.fromkeys(_point_id(raw) for raw in ids))
        if self._dimension_of(collection) is None or not wanted:
            return []
        selector: bool | list[str] = [*fields, "tenant", "dataset"] if fields is not None else True
        records: list[qe.Record] = []
        with self._using(collection, f"read points of {collection!r}") as shard:
            for start in range(0, len(wanted), self._batch_size):
                batch = wanted[start : start + self._batch_size]
                where = qe.Filter(must=[*scope_conditions(scope), qe.HasIdCondition(set(batch))])
                request = qe.ScrollRequest(
                    limit=len(batch), filter=where, with_payload=selector, with_vector=True
                )
                records += shard.scroll(request)[0]
        return [_vector_point(record) for record in records]

    def delete(self, scope: Scope, collection: str, ids: Sequence[str]) -> None:
        """Remove the scope's points with these ids, `batch_size` ids at a time."""
        wanted = [_point_id(raw) for raw in ids]
        if self._dimension_of(collection) is None or not wanted:
            return
        with self._using(collection, f"delete from {collection!r}", writes=True) as shard:
            for start in range(0, len(wanted), self._batch_size):
                only = qe.HasIdCondition(set(wanted[start : start + self._batch_size]))
                where = qe.Filter(must=[*scope_conditions(scope), only])
                shard.update(qe.UpdateOperation.delete_points_by_filter(where))

    def set_payload(self, scope: Scope, collection: str, values: dict[str, dict[str, Any]]) -> None:
        """Merge each patch into its point's payload: one operation per point (patches differ)."""
        patches = [(_point_id(raw), scoped_payload(scope, patch)) for raw, patch in values.items()]
        if self._dimension_of(collection) is None or not patches:
            return
        with self._using(collection, f"set payload in {collection!r}", writes=True) as shard:
            for point_id, patch in patches:
                where = qe.Filter(must=[*scope_conditions(scope), qe.HasIdCondition({point_id})])
                shard.update(qe.UpdateOperation.set_payload_by_filter(where, patch))

    def list_collections(self) -> list[str]:
        if not self._path.is_dir():
            return []
        return sorted(entry.name for entry in self._path.iterdir() if (entry / META_FILE).is_file())

    def count(self, scope: Scope, collection: str) -> int:
        if self._dimension_of(collection) is None:
            return 0
        with self._using(collection, f"count {collection!r}") as shard:
            return shard.count(qe.CountRequest(exact=True, filter=scope_filter_of(scope)))

    def close(self) -> None:
        """Close every open shard and release its lock; a later call opens it again."""
        with self._lock:
            shards, self._shards = list(self._shards.values()), {}
            releaser, self._releaser = self._releaser, None
        if releaser is not None:
            releaser.stop()
        for shard in shards:
            shard.release_now()

    def optimize(self, collection: str) -> bool:
        """Index the collection's points now (HNSW, vacuum); whether anything changed."""
        if self._dimension_of(collection) is None:
            return False
        with self._using(collection, f"optimize {collection!r}") as shard:
            return shard.optimize()

    def erase_deleted(self, scope: Scope) -> int:
        """Rebuild every collection from its live points (`Shard.rebuild`), so that deleted
        points leave no payload in segment files or WAL; how many collections were rebuilt.
        Every collection, whatever `scope`: a scope's points share them with other scopes."""
        names = self.list_collections()
        for name in names:
            with translated(f"rebuild {name!r}"):
                self._shard(name).rebuild()
        return len(names)

    def point_ids(self, collection: str) -> set[str]:
        """Every point id of the collection, in all scopes: for checks and tools, not for queries."""
        found: set[str] = set()
        if self._dimension_of(collection) is None:
            return found
        offset: qe.PointId | None = None
        with self._using(collection, f"list points of {collection!r}") as shard:
            while True:
                request = qe.ScrollRequest(offset=offset, limit=SCROLL_PAGE, with_payload=False)
                records, offset = shard.scroll(request)
                found.update(str(record.id) for record in records)
                if offset is None:
                    return found

    @contextmanager
    def _using(
        self, name: str, action: str, create: int | None = None, writes: bool = False
    ) -> Iterator[qe.EdgeShard]:
        shard = self._shard(name)
        with translated(action):
            engine = shard.enter(create)
            try:
                yield engine
            finally:
                if writes:
                    shard.estimates.clear()
                shard.leave()

    def _shard(self, name: str) -> Shard:
        folder = self._folder(name)
        with self._lock:
            shard = self._shards.get(name)
            if shard is None:
                shard = Shard(folder, self._lock_timeout_s, self._index_threshold, self._shard_opened)
                self._shards[name] = shard
            if self._releaser is None:
                self._releaser = Releaser(self, self._linger_s)
            return shard

    def _shard_opened(self) -> None:
        with self._lock:
            releaser = self._releaser
        if releaser is not None:
            releaser.wake()

    def _open_shards(self) -> list[Shard]:
        with self._lock:
            return list(self._shards.values())

    def _folder(self, name: str) -> Path:
        if NAME.fullmatch(name) is None:
            raise StoreError(f"collection name {name!r} is not a plain file name")
        return self._path / name

    def _dimension_of(self, name: str) -> int | None:
        """The collection's vector size, or None when it does not exist; sizes never change."""
        if name not in self._dimensions:
            dimension = recorded_dimension(self._folder(name))
            if dimension is None:
                return None
            self._dimensions[name] = dimension
        return self._dimensions[name]

    def _forget_after_fork(self) -> None:
        # A child of fork() shares the parent's open file descriptions, hence its locks: it must
        # neither use nor close the parent's shards. It keeps them unreachable and opens its own.
        for shard in self._shards.values():
            shard.server.forget()
        _ORPHANS.extend(self._shards.values())
        self._shards = {}
        self._lock = threading.Lock()
        self._releaser = None


def _point_id(raw: str) -> str:
    try:
        return str(uuid.UUID(raw))
    except ValueError as exc:
        raise StoreError(f"point id {raw!r} is not a UUID") from exc


def _vector_point(record: qe.Record) -> VectorPoint:
    vector = record.vector
    if not isinstance(vector, list):
        raise StoreError(f"point {record.id} has no single unnamed vector; it was not stored here")
    return VectorPoint(id=str(record.id), vector=_numbers(vector), payload=dict(record.payload or {}))


def _numbers(values: list[Any]) -> list[float]:
    """The vector as floats, read at once (a walk reads hundreds); anything but numbers refused."""
    array = np.asarray(values)
    if array.ndim != 1 or array.dtype.kind not in "fiu":
        raise StoreError(f"a stored vector holds {values[:3]!r}..., not numbers")
    return array.astype(np.float64).tolist()  # type: ignore[no-any-return]


_STORES: weakref.WeakSet[EdgeVectorStore] = weakref.WeakSet()
_ORPHANS: list[Shard] = []
_FORK_HOOK = threading.Lock()
_fork_hook_set = False


def _track(store: EdgeVectorStore) -> None:
    global _fork_hook_set
    with _FORK_HOOK:
        _STORES.add(store)
        if not _fork_hook_set:
            os.register_at_fork(after_in_child=_forget_in_child)
            _fork_hook_set = True


def _forget_in_child() -> None:
    for store in list(_STORES):
        store._forget_after_fork()
