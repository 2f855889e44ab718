"""CODING_RULES: the chunks of one node set, closest to the query first, as a list of rules."""

from __future__ import annotations

from kenning.pipeline.collection import CHUNKS
from kenning.retrieval.contract import Hit, SearchPorts, SearchRequest, answer_from_context
from kenning.retrieval.reference import best_first, point_hit

DEFAULT_NODE_SET = "coding_agent_rules"
# Membership is filtered after the search, so look far past top_k to find the set's chunks.
CANDIDATES = 1000


class CodingRulesRetriever:
    """Chunks whose data was added with the node set (`options["node_set"]`), ranked by similarity."""

    def __init__(self, ports: SearchPorts) -> None:
        self._ports = ports

    def get_retrieved_objects(self, request: SearchRequest) -> list[Hit]:
        node_set = str(request.options.get("node_set") or DEFAULT_NODE_SET)
        vector = self._ports.embedder.embed([request.query])[0]
        limit = max(CANDIDATES, request.top_k)
        hits: list[Hit] = []
        for scope in request.scopes:
            for point in self._ports.vectors.search(scope, CHUNKS, vector, limit):
                if node_set in (point.payload.get("node_sets") or []):
                    hits.append(point_hit(scope, point, "rule", {}))
        return best_first(hits, request.top_k)

    def get_context_from_objects(self, request: SearchRequest, objects: list[Hit]) -> str:
        return "\n".join(f"- {hit.text}" for hit in objects)

    def get_completion_from_context(self, request: SearchRequest, context: str) -> str:
        return answer_from_context(self._ports.completer, request.query, context)
