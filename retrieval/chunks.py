"""CHUNKS: vector search over chunk text."""

from __future__ import annotations

from kenning.pipeline.collection import CHUNKS
from kenning.retrieval.contract import Hit, SearchPorts, SearchRequest, answer_from_context
from kenning.retrieval.reference import best_first, weighted_score


class ChunksRetriever:
    def __init__(self, ports: SearchPorts) -> None:
        self._ports = ports

    def get_retrieved_objects(self, request: SearchRequest) -> list[Hit]:
        vector = self._ports.embedder.embed([request.query])[0]
        hits: list[Hit] = []
        for scope in request.scopes:
            for point in self._ports.vectors.search(scope, CHUNKS, vector, request.top_k):
                data_ids = point.payload.get("data_ids") or [None]
                hits.append(
                    Hit(
                        text=str(point.payload.get("text", "")),
                        score=weighted_score(point),
                        kind="chunk",
                        dataset=scope.dataset,
                        data_id=data_ids[0],
                        document_id=point.payload.get("document_id"),
                        chunk_id=point.id,
                    )
                )
        return best_first(hits, request.top_k)

    def get_context_from_objects(self, request: SearchRequest, objects: list[Hit]) -> str:
        return "\n\n".join(hit.text for hit in objects)

    def get_completion_from_context(self, request: SearchRequest, context: str) -> str:
        return answer_from_context(self._ports.completer, request.query, context)
