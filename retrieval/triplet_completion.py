"""TRIPLET_COMPLETION: vector search over facts embedded as `source -> relationship -> target: text`."""

from __future__ import annotations

from retrieval.contract import Hit, SearchPorts, SearchRequest, answer_from_context
from retrieval.reference import best_first, chunk_nodes, point_hit

TRIPLET_COLLECTION = "Triplet_text"


class TripletCompletionRetriever:
    def __init__(self, ports: SearchPorts) -> None:
        self._ports = ports

    def get_retrieved_objects(self, request: SearchRequest) -> list[Hit]:
        vector = self._ports.embedder.embed([request.query])[0]
        hits: list[Hit] = []
        for scope in request.scopes:
            points = self._ports.vectors.search(scope, TRIPLET_COLLECTION, vector, request.top_k)
            chunks = chunk_nodes(self._ports.graph, scope, (p.payload.get("chunk_id") for p in points))
            for point in points:
                hit = point_hit(scope, point, "triplet", chunks)
                hit.extra.update(
                    {key: point.payload.get(key) for key in ("source_id", "target_id", "relationship")}
                )
                hits.append(hit)
        return best_first(hits, request.top_k)

    def get_context_from_objects(self, request: SearchRequest, objects: list[Hit]) -> str:
        return "\n".join(hit.text for hit in objects)

    def get_completion_from_context(self, request: SearchRequest, context: str) -> str:
        return answer_from_context(self._ports.completer, request.query, context)
