"""SUMMARIES: vector search over chunk summaries; each hit refers to the chunk it summarises."""

from __future__ import annotations

from retrieval.contract import Hit, SearchPorts, SearchRequest, answer_from_context
from retrieval.reference import best_first, chunk_nodes, point_hit

SUMMARY_COLLECTION = "TextSummary_text"


class SummariesRetriever:
    def __init__(self, ports: SearchPorts) -> None:
        self._ports = ports

    def get_retrieved_objects(self, request: SearchRequest) -> list[Hit]:
        vector = self._ports.embedder.embed([request.query])[0]
        hits: list[Hit] = []
        for scope in request.scopes:
            points = self._ports.vectors.search(scope, SUMMARY_COLLECTION, vector, request.top_k)
            chunks = chunk_nodes(self._ports.graph, scope, (p.payload.get("chunk_id") for p in points))
            hits += [point_hit(scope, point, "summary", chunks) for point in points]
        return best_first(hits, request.top_k)

    def get_context_from_objects(self, request: SearchRequest, objects: list[Hit]) -> str:
        return "\n\n".join(hit.text for hit in objects)

    def get_completion_from_context(self, request: SearchRequest, context: str) -> str:
        return answer_from_context(self._ports.completer, request.query, context)
