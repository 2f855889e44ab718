"""In-memory vector store: the twin of the Qdrant adapters, brute force over numpy arrays, under the
same rules (`kenning.storage.vectors.rules`)."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from kenning.pipeline.errors import StoreError
from kenning.pipeline.models import Scope, ScoredPoint, VectorPoint
from kenning.storage.vectors.rules import distance_of, in_scope, mismatch, require_dimension, scoped_payload

Vector = npt.NDArray[np.float64]


@dataclass
class _Point:
    vector: Vector
    payload: dict[str, Any]


@dataclass
class _Collection:
    dimension: int
    points: dict[str, _Point] = field(default_factory=dict)


class MemoryVectorStore:
    """A `VectorStore` held in memory, with the same semantics as `QdrantVectorStore`."""

    def __init__(self) -> None:
        self._collections: dict[str, _Collection] = {}
        self._lock = threading.Lock()

    def ensure_collection(self, name: str, dimension: int) -> None:
        with self._lock:
            existing = self._collections.get(name)
            if existing is None:
                self._collections[name] = _Collection(dimension)
            elif existing.dimension != dimension:
                raise mismatch(name, existing.dimension, dimension)

    def upsert(self, scope: Scope, collection: str, points: Sequence[VectorPoint]) -> None:
        with self._lock:
            target = self._collections.get(collection)
            if target is None:
                raise StoreError(f"collection {collection!r} does not exist; ensure_collection creates it")
            staged = {_point_id(p.id): self._stage(scope, collection, target.dimension, p) for p in points}
            target.points.update(staged)

    def search(
        self,
        scope: Scope,
        collection: str,
        vector: Sequence[float],
        limit: int,
        fields: Sequence[str] | None = None,
    ) -> list[ScoredPoint]:
        """Closest points of the scope first; `score` is the cosine distance."""
        with self._lock:
            target = self._collections.get(collection)
            if target is None or limit <= 0:
                return []
            require_dimension(collection, target.dimension, vector)
            rows = [(pid, p) for pid, p in target.points.items() if in_scope(p.payload, scope)]
        if not rows:
            return []
        similarities = np.stack([p.vector for _, p in rows]) @ _normalized(vector)
        order = np.argsort(-similarities, kind="stable")[:limit]
        return [
            ScoredPoint(
                id=rows[i][0],
                score=distance_of(float(similarities[i])),
                payload=_selected(_json_copy(rows[i][1].payload), fields),
            )
            for i in order
        ]

    def retrieve(
        self, scope: Scope, collection: str, ids: Sequence[str], fields: Sequence[str] | None = None
    ) -> list[VectorPoint]:
        wanted = list(dict.fromkeys(map(_point_id, ids)))
        with self._lock:
            target = self._collections.get(collection)
            if target is None:
                return []
            found = [(pid, target.points.get(pid)) for pid in wanted]
            return [
                VectorPoint(
                    id=pid,
                    vector=[float(x) for x in p.vector],
                    payload=_selected(_json_copy(p.payload), fields),
                )
                for pid, p in found
                if p is not None and in_scope(p.payload, scope)
            ]

    def delete(self, scope: Scope, collection: str, ids: Sequence[str]) -> None:
        with self._lock:
            target = self._collections.get(collection)
            if target is None:
                return
            for point_id in map(_point_id, ids):
                point = target.points.get(point_id)
                if point is not None and in_scope(point.payload, scope):
                    del target.points[point_id]

    def set_payload(self, scope: Scope, collection: str, values: dict[str, dict[str, Any]]) -> None:
        with self._lock:
            target = self._collections.get(collection)
            if target is None:
                return
            for raw_id, patch in values.items():
                point = target.points.get(_point_id(raw_id))
                if point is not None and in_scope(point.payload, scope):
                    point.payload.update(_json_copy(scoped_payload(scope, patch)))

    def list_collections(self) -> list[str]:
        with self._lock:
            return sorted(self._collections)

    def count(self, scope: Scope, collection: str) -> int:
        with self._lock:
            target = self._collections.get(collection)
            if target is None:
                return 0
            return sum(1 for p in target.points.values() if in_scope(p.payload, scope))

    def close(self) -> None:
        """Nothing to release; the data stays for the life of the object."""

    def _stage(self, scope: Scope, collection: str, dimension: int, point: VectorPoint) -> _Point:
        require_dimension(collection, dimension, point.vector)
        return _Point(_normalized(point.vector), _json_copy(scoped_payload(scope, point.payload)))


def _point_id(raw: str) -> str:
    # Qdrant accepts UUIDs only and answers them in canonical form; the twin does the same.
    try:
        return str(uuid.UUID(raw))
    except ValueError as exc:
        raise StoreError(f"point id {raw!r} is not a UUID") from exc


def _json_copy(payload: dict[str, Any]) -> dict[str, Any]:
    # A JSON round trip stores what Qdrant would store and detaches it from the caller's objects.
    try:
        copied: dict[str, Any] = json.loads(json.dumps(payload))
    except (TypeError, ValueError) as exc:
        raise StoreError(f"payload is not JSON: {exc}") from exc
    return copied


def _normalized(vector: Sequence[float]) -> Vector:
    array = np.asarray(vector, dtype=np.float64)
    norm = float(np.linalg.norm(array))
    return array / norm if norm > 0.0 else array


def _selected(payload: dict[str, Any], fields: Sequence[str] | None) -> dict[str, Any]:
    if fields is None:
        return payload
    keep = {*fields, "tenant", "dataset"}
    return {key: value for key, value in payload.items() if key in keep}
