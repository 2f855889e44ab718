"""AUTO: each dataset searched the way that serves what it holds, the default of `search` and `recall`.

What a dataset holds is read from what was stored, never guessed from the question: every
remembered message is one point of the conversation turns collection (TURNS), every chunk one
point of the chunks collection. A dataset with turns and no other chunks holds a conversation
and is searched with CONVERSATION; one without turns holds documents and is searched with
HYBRID_COMPLETION (the graph and the chunks fused); one with both (documents added beside
remembered messages, or a message long enough to make several chunks) is searched with both,
fused by reciprocal rank. Each hit says in `extra["search"]` the search that found it, and
`SearchResult.searched` lists every search run. An explicit type always wins over AUTO.
"""

from __future__ import annotations

import enum

from kenning.pipeline.collection import CHUNKS
from kenning.pipeline.models import Scope
from kenning.retrieval.contract import Hit, SearchPorts, SearchRequest, SearchType, answer_from_context
from kenning.retrieval.conversation import TURNS
from kenning.retrieval.fusion import reciprocal_rank_fusion
from kenning.retrieval.reference import best_first, relevance
from kenning.retrieval.router import Dispatch

# The k of 1 / (k + rank) when a dataset's two searches are fused: small, as CONVERSATION's own.
FUSION_K = 10


class Holding(enum.StrEnum):
    NOTHING = "nothing"
    MESSAGES = "messages"
    DOCUMENTS = "documents"
    BOTH = "both"


SEARCHES: dict[Holding, tuple[SearchType, ...]] = {
    Holding.NOTHING: (SearchType.HYBRID_COMPLETION,),
    Holding.MESSAGES: (SearchType.CONVERSATION,),
    Holding.DOCUMENTS: (SearchType.HYBRID_COMPLETION,),
    Holding.BOTH: (SearchType.CONVERSATION, SearchType.HYBRID_COMPLETION),
}


def holding(ports: SearchPorts, scope: Scope) -> Holding:
    """What the dataset holds, from the points stored: turns (messages), and chunks beyond them."""
    turns, chunks = ports.vectors.count(scope, TURNS), ports.vectors.count(scope, CHUNKS)
    if turns and chunks > turns:
        return Holding.BOTH
    if turns:
        return Holding.MESSAGES
    return Holding.DOCUMENTS if chunks else Holding.NOTHING


def chosen(ports: SearchPorts, scopes: list[Scope]) -> dict[str, tuple[SearchType, ...]]:
    """The searches AUTO runs, by dataset."""
    return {scope.key: SEARCHES[holding(ports, scope)] for scope in scopes}


class AutoRetriever:
    """Runs, through `dispatch`, the search each dataset's holding calls for; `searched` lists them."""

    def __init__(self, ports: SearchPorts, dispatch: Dispatch) -> None:
        self._ports = ports
        self._dispatch = dispatch
        self.searched: list[SearchType] = []

    def get_retrieved_objects(self, request: SearchRequest) -> list[Hit]:
        hits: list[Hit] = []
        for scope, kinds in zip(request.scopes, chosen(self._ports, request.scopes).values(), strict=True):
            self.searched += [kind for kind in kinds if kind not in self.searched]
            found = [self._search(request, scope, kind) for kind in kinds]
            hits += found[0] if len(found) == 1 else fused(found, request.top_k)
        return best_first(hits, request.top_k)

    def _search(self, request: SearchRequest, scope: Scope, kind: SearchType) -> list[Hit]:
        # Within this search, on ports that already give a completion the history: none of its own.
        within = {"type": kind, "scopes": [scope], "only_context": True, "history": []}
        inner = request.model_copy(update=within)
        hits = self._dispatch(self._ports, inner).results
        for hit in hits:
            hit.extra["search"] = kind.value
        return hits

    def get_context_from_objects(self, request: SearchRequest, objects: list[Hit]) -> str:
        return "\n\n".join(hit.text for hit in objects)

    def get_completion_from_context(self, request: SearchRequest, context: str) -> str:
        return answer_from_context(self._ports.completer, request.query, context)


def fused(rankings: list[list[Hit]], top_k: int) -> list[Hit]:
    """The hits of several searches of one dataset, one per chunk, by reciprocal rank; each hit's
    score is its fused score over the best possible (first in every search)."""
    by_key: dict[str, Hit] = {}
    lanes: dict[str, list[str]] = {}
    for hits in rankings:
        keys = [hit.chunk_id or hit.text for hit in hits]
        lanes[str(hits[0].extra["search"]) if hits else str(len(lanes))] = keys
        for key, hit in zip(keys, hits, strict=True):
            by_key.setdefault(key, hit)
    best = len(rankings) / (FUSION_K + 1)
    found = []
    for entry in reciprocal_rank_fusion(lanes, dict.fromkeys(lanes, 1.0), FUSION_K)[:top_k]:
        hit = by_key[entry.id].model_copy(deep=True)
        hit.score = relevance(entry.score / best)
        hit.extra["search"] = "+".join(entry.ranks)
        found.append(hit)
    return found
