"""RAG_COMPLETION: the chunks closest to the query, then one answer from them."""

from __future__ import annotations

from kenning.retrieval.chunks import ChunksRetriever
from kenning.retrieval.contract import Hit, SearchRequest


class RagCompletionRetriever(ChunksRetriever):
    """CHUNKS retrieval; the context numbers the chunks so an answer can point at them."""

    def get_context_from_objects(self, request: SearchRequest, objects: list[Hit]) -> str:
        return "\n\n".join(f"[{number}] {hit.text}" for number, hit in enumerate(objects, 1))
