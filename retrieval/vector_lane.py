"""Retrievers that are one vector search over one collection: SUMMARIES and TRIPLET_COMPLETION."""

from __future__ import annotations

from typing import ClassVar

from kenning.pipeline.models import Scope, ScoredPoint
from kenning.retrieval.contract import Hit, SearchPorts, SearchRequest, answer_from_context
from kenning.retrieval.reference import best_first, chunk_nodes, point_hit

# Points searched beyond top_k where some relationships are left out, to fill their places.
SPARE = 10


class VectorLaneRetriever:
    """The collection's closest points, each referring to the chunk it came from."""

    collection: ClassVar[str]
    kind: ClassVar[str]
    extra_fields: ClassVar[tuple[str, ...]] = ()
    separator: ClassVar[str] = "\n\n"
    skipped_relationships: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, ports: SearchPorts) -> None:
        self._ports = ports

    def get_retrieved_objects(self, request: SearchRequest) -> list[Hit]:
        vector = self._ports.embedder.embed([request.query])[0]
        hits: list[Hit] = []
        for scope in request.scopes:
            points = self._points(scope, vector, request.top_k)
            chunks = chunk_nodes(self._ports.graph, scope, (p.payload.get("chunk_id") for p in points))
            texts = self._texts(scope, points, request.as_of)
            for point in points:
                hit = point_hit(scope, point, self.kind, chunks)
                hit.text = texts.get(point.id, hit.text)
                hit.extra.update({key: point.payload.get(key) for key in self.extra_fields})
                hits.append(hit)
        return best_first(hits, request.top_k)

    def _texts(self, scope: Scope, points: list[ScoredPoint], as_of: str | None) -> dict[str, str]:
        """The text each point's hit gives, where it is not the point's own (`text`): none here."""
        return {}

    def _points(self, scope: Scope, vector: list[float], top_k: int) -> list[ScoredPoint]:
        """The closest points but those of a skipped relationship."""
        if not self.skipped_relationships:
            return self._ports.vectors.search(scope, self.collection, vector, top_k)
        found = self._ports.vectors.search(scope, self.collection, vector, top_k + SPARE)
        kept = [p for p in found if p.payload.get("relationship") not in self.skipped_relationships]
        return kept[:top_k]

    def get_context_from_objects(self, request: SearchRequest, objects: list[Hit]) -> str:
        return self.separator.join(hit.text for hit in objects)

    def get_completion_from_context(self, request: SearchRequest, context: str) -> str:
        return answer_from_context(self._ports.completer, request.query, context)
