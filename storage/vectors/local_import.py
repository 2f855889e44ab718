"""Moving an embedded home's vectors from qdrant-client local mode into Qdrant Edge, once."""

from __future__ import annotations

import fcntl
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

from kenning.pipeline.errors import StoreError
from kenning.pipeline.models import Scope, VectorPoint
from kenning.storage.vectors.edge import EdgeVectorStore

if TYPE_CHECKING:
    from qdrant_client.models import Record

IMPORTED_MARK = ".imported-from-qdrant-local"
PAGE = 256


def import_local_qdrant(source: Path, target: EdgeVectorStore, marks: Path) -> int:
    """Copy every point of the local-mode folder `source` into `target`, unless `marks` says it
    was done; the number of points copied.

    Ids, vectors and payloads are kept, each point in its own (tenant, dataset), so a second
    copy after an interrupted one changes nothing. The local-mode folder is left as it was.
    Raises `StoreError` if another process holds it.
    """
    mark = marks / IMPORTED_MARK
    if mark.exists() or not (source / "collection").is_dir():
        return 0
    marks.mkdir(parents=True, exist_ok=True)
    with (marks / ".import.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # processes starting together: one copies, the others wait
        if mark.exists():
            return 0
        copied = _copy_all(source, target)
        mark.write_text(f"{copied} points from {source}\n")
    return copied


def _copy_all(source: Path, target: EdgeVectorStore) -> int:
    from qdrant_client import QdrantClient
    from qdrant_client import models as qm

    from kenning.storage.vectors.qdrant import QdrantVectorStore

    # The adapter opens the folder only when it is free, with a clear error when it is not.
    check = QdrantVectorStore(path=source)
    check.list_collections()
    check.close()
    copied = 0
    try:
        client = QdrantClient(path=str(source))
    except RuntimeError as exc:
        raise StoreError(f"could not open the Qdrant local path {source}: {exc}") from exc
    try:
        for collection in client.get_collections().collections:
            vectors = client.get_collection(collection.name).config.params.vectors
            if not isinstance(vectors, qm.VectorParams):
                raise StoreError(f"collection {collection.name!r} in {source} was not made by kenning")
            target.ensure_collection(collection.name, vectors.size)
            offset: qm.ExtendedPointId | None = None
            while True:
                records, offset = client.scroll(
                    collection.name, limit=PAGE, offset=offset, with_payload=True, with_vectors=True
                )
                copied += _copy(target, collection.name, records)
                if offset is None:
                    break
    except (RuntimeError, ValueError, KeyError, OSError) as exc:
        # Local mode reports a broken storage with these built-in types.
        raise StoreError(f"could not read the Qdrant local path {source}: {exc}") from exc
    finally:
        client.close()
    return copied


def _copy(target: EdgeVectorStore, collection: str, records: list[Record]) -> int:
    by_scope: dict[Scope, list[VectorPoint]] = defaultdict(list)
    for record in records:
        payload = dict(record.payload or {})
        vector = record.vector if isinstance(record.vector, list) else []
        numbers = [float(x) for x in vector if isinstance(x, int | float)]
        tenant, dataset = payload.get("tenant"), payload.get("dataset")
        if not isinstance(tenant, str) or not isinstance(dataset, str) or not numbers:
            continue  # not a point kenning wrote: each of those has one vector and its scope
        point = VectorPoint(id=str(record.id), vector=numbers, payload=payload)
        by_scope[Scope(tenant=tenant, dataset=dataset)].append(point)
    for scope, points in by_scope.items():
        target.upsert(scope, collection, points)
    return sum(len(points) for points in by_scope.values())
