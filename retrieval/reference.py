"""References from retrieved points to their sources: the data item, the document and the chunk."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kenning.pipeline.models import NEUTRAL_WEIGHT, GraphNode, Scope, ScoredPoint
from kenning.pipeline.ports import GraphStore
from kenning.retrieval.contract import Hit

CHUNK_TYPE = "DocumentChunk"
# How far a feedback weight moves a hit: at weight 1 (always rated best) a hit counts as
# 0.1 closer in cosine distance, at 0 as 0.1 farther; unrated points stay where they are.
WEIGHT_EFFECT = 0.2


def relevance(value: float) -> float:
    """A score within [0, 1], the range of every hit's score (higher is better)."""
    return min(1.0, max(0.0, value))


def similarity(distance: float) -> float:
    """A vector hit's score: its cosine similarity 1 - distance, within [0, 1]."""
    return relevance(1.0 - distance)


def lexical_score(bm25: float) -> float:
    """A BM25 score as a hit's: bm25 / (1 + bm25), in [0, 1); the index's distance is 1 minus it."""
    return relevance(bm25 / (1.0 + bm25)) if bm25 > 0 else 0.0


def weighted_score(point: ScoredPoint) -> float:
    """The point's similarity, moved by the feedback weight that `improve` wrote into its payload."""
    weight = point.payload.get("weight")
    if not isinstance(weight, int | float):
        return similarity(point.score)
    return similarity(point.score - WEIGHT_EFFECT * (float(weight) - NEUTRAL_WEIGHT))


def by_feedback(points: list[ScoredPoint]) -> list[ScoredPoint]:
    """Vector hits ordered by their similarity moved by feedback (`weighted_score`), best first."""
    return sorted(points, key=lambda point: -weighted_score(point))


def feedback(points: Iterable[ScoredPoint]) -> dict[str, float]:
    """How far feedback moves each rated point's score (up to WEIGHT_EFFECT / 2 either way), by id:
    a fused search adds it to its own score, so a rating counts whichever search ranks the chunk."""
    found = {}
    for point in points:
        weight = point.payload.get("weight")
        if isinstance(weight, int | float):
            found[point.id] = WEIGHT_EFFECT * (float(weight) - NEUTRAL_WEIGHT)
    return found


def chunk_nodes(
    graph: GraphStore, scope: Scope, chunk_ids: Iterable[str | None], *, provenance: bool = True
) -> dict[str, GraphNode]:
    """The chunk nodes of the scope among these ids, by id; one graph read (two with
    `provenance`, their data ids)."""
    wanted = sorted({chunk_id for chunk_id in chunk_ids if chunk_id})
    if not wanted:
        return {}
    found = graph.get_nodes(scope, wanted, provenance=provenance)
    return {node.id: node for node in found if node.type == CHUNK_TYPE}


def point_hit(scope: Scope, point: ScoredPoint, kind: str, chunks: dict[str, GraphNode]) -> Hit:
    """A hit for a vector or lexical point whose payload names its chunk (`chunk_id`) and sources."""
    chunk_id = str(point.payload.get("chunk_id") or "") or None
    node = chunks.get(chunk_id or "")
    document_id = point.payload.get("document_id") or (node.properties.get("document_id") if node else None)
    return Hit(
        text=str(point.payload.get("text", "")),
        score=weighted_score(point),
        kind=kind,
        dataset=scope.dataset,
        data_id=first(point.payload.get("data_ids")) or first(node.data_ids if node else None),
        document_id=str(document_id) if document_id else None,
        chunk_id=chunk_id,
    )


def chunk_hit(scope: Scope, node: GraphNode, score: float) -> Hit:
    """A hit for a chunk node of the graph."""
    document_id = node.properties.get("document_id")
    return Hit(
        text=str(node.properties.get("text", "")),
        score=score,
        kind="chunk",
        dataset=scope.dataset,
        data_id=first(node.data_ids),
        document_id=str(document_id) if document_id else None,
        chunk_id=node.id,
    )


def first(values: Sequence[str] | None) -> str | None:
    return str(values[0]) if values else None


def best_first(hits: list[Hit], limit: int) -> list[Hit]:
    """The `limit` best hits over every scope searched, highest score first; ties keep their order."""
    return sorted(hits, key=lambda hit: -hit.score)[:limit]
