"""TEMPORAL: events in the time range the question asks about, ranked by similarity.

Events come from datasets cognified with `temporal=True` (collection `Event_text`, each
point carrying its day range). The question's range is read from its dates ("in 1920",
"between 1900 and 1910", "before March 1950"); with no date in it, events are ranked
by similarity alone.
"""

from __future__ import annotations

from kenning.pipeline.collection import EVENTS
from kenning.pipeline.temporal import question_range
from kenning.retrieval.contract import Hit, SearchPorts, SearchRequest, answer_from_context
from kenning.retrieval.reference import best_first, similarity

WIDE_TOP_K = 400


class TemporalRetriever:
    def __init__(self, ports: SearchPorts) -> None:
        self._ports = ports

    def get_retrieved_objects(self, request: SearchRequest) -> list[Hit]:
        vector = self._ports.embedder.embed([request.query])[0]
        wanted = question_range(request.query)
        hits: list[Hit] = []
        for scope in request.scopes:
            for point in self._ports.vectors.search(scope, EVENTS, vector, WIDE_TOP_K):
                start, end = int(point.payload.get("time_from", 0)), int(point.payload.get("time_to", 0))
                if wanted is not None and not wanted.overlaps(start, end):
                    continue
                data_ids = point.payload.get("data_ids") or [None]
                hits.append(
                    Hit(
                        text=f"[{point.payload.get('label', '')}] {point.payload.get('text', '')}",
                        score=similarity(point.score),
                        kind="event",
                        dataset=scope.dataset,
                        data_id=data_ids[0],
                        document_id=point.payload.get("document_id"),
                        chunk_id=point.payload.get("chunk_id"),
                        extra={"time_from": start, "time_to": end},
                    )
                )
        return best_first(hits, request.top_k)

    def get_context_from_objects(self, request: SearchRequest, objects: list[Hit]) -> str:
        return "\n".join(hit.text for hit in objects)

    def get_completion_from_context(self, request: SearchRequest, context: str) -> str:
        return answer_from_context(self._ports.completer, request.query, context)
