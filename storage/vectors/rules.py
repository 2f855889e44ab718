"""The rules every vector store follows: the scope stamped on each payload, the dimension checked,
distance from similarity, and whether a stored payload is a scope's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kenning.pipeline.errors import DimensionMismatch
from kenning.pipeline.models import Scope


def scoped_payload(scope: Scope, payload: dict[str, Any]) -> dict[str, Any]:
    """The payload as stored: the caller's fields plus the scope, which always wins."""
    return {**payload, "tenant": scope.tenant, "dataset": scope.dataset}


def require_dimension(collection: str, expected: int, vector: Sequence[float]) -> None:
    if len(vector) != expected:
        raise DimensionMismatch(
            f"collection {collection!r} holds vectors of dimension {expected}, got one of {len(vector)}"
        )


def mismatch(collection: str, existing: int, requested: int) -> DimensionMismatch:
    return DimensionMismatch(
        f"collection {collection!r} exists with dimension {existing}, but dimension {requested} was "
        "requested; the embedding model changed: re-index into a fresh store or configure the old model"
    )


def distance_of(similarity: float) -> float:
    """Cosine distance from cosine similarity, clamped to [0, 2] against rounding."""
    return min(2.0, max(0.0, 1.0 - similarity))


def in_scope(payload: Mapping[str, Any] | None, scope: Scope) -> bool:
    """Whether a stored payload is the scope's (its `tenant` and `dataset` fields say so)."""
    return (
        payload is not None
        and payload.get("tenant") == scope.tenant
        and payload.get("dataset") == scope.dataset
    )
