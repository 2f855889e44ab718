"""CHUNKS_LEXICAL: BM25 over chunk text, through the lexical index."""

from __future__ import annotations

from kenning.retrieval.contract import Hit, SearchPorts, SearchRequest, answer_from_context
from kenning.retrieval.reference import best_first, lexical_score, point_hit


class ChunksLexicalRetriever:
    """Chunks ranked by BM25; `score` is bm25 / (1 + bm25), `extra["bm25"]` the BM25 score."""

    def __init__(self, ports: SearchPorts) -> None:
        self._ports = ports

    def get_retrieved_objects(self, request: SearchRequest) -> list[Hit]:
        hits: list[Hit] = []
        for scope in request.scopes:
            for point in self._ports.lexical.search(scope, request.query, request.top_k):
                hit = point_hit(scope, point, "chunk", {})
                hit.chunk_id = point.id
                hit.extra["bm25"] = point.payload.get("bm25")
                hit.score = lexical_score(float(point.payload.get("bm25") or 0.0))
                hits.append(hit)
        return best_first(hits, request.top_k)

    def get_context_from_objects(self, request: SearchRequest, objects: list[Hit]) -> str:
        return "\n\n".join(hit.text for hit in objects)

    def get_completion_from_context(self, request: SearchRequest, context: str) -> str:
        return answer_from_context(self._ports.completer, request.query, context)
