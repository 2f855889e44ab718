"""One registry from search type to retriever, and the dispatcher that runs them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kenning.pipeline.errors import NoLLMConfigured
from kenning.pipeline.lexical import LexicalIndex
from kenning.pipeline.ports import Completer, Embedder, GraphStore, VectorStore
from kenning.retrieval.choice import AutoRetriever
from kenning.retrieval.chunks import ChunksRetriever
from kenning.retrieval.chunks_lexical import ChunksLexicalRetriever
from kenning.retrieval.coding_rules import CodingRulesRetriever
from kenning.retrieval.contract import Hit, Retriever, SearchPorts, SearchRequest, SearchResult, SearchType
from kenning.retrieval.conversation import ConversationRetriever
from kenning.retrieval.cypher import CypherRetriever, NaturalLanguageRetriever
from kenning.retrieval.graph_completion import GraphCompletionRetriever
from kenning.retrieval.graph_ppr import GraphPprRetriever
from kenning.retrieval.graph_variants import (
    ChainOfThoughtRetriever,
    ContextExtensionRetriever,
    DecompositionRetriever,
    GraphSummaryRetriever,
)
from kenning.retrieval.hybrid_completion import HybridCompletionRetriever
from kenning.retrieval.rag_completion import RagCompletionRetriever
from kenning.retrieval.reference import best_first
from kenning.retrieval.router import AgenticRetriever, FeelingLuckyRetriever
from kenning.retrieval.summaries import SummariesRetriever
from kenning.retrieval.temporal import TemporalRetriever
from kenning.retrieval.timeline import TimeView
from kenning.retrieval.triplet_completion import TripletCompletionRetriever

RetrieverFactory = Callable[[SearchPorts], Retriever]

REGISTRY: dict[SearchType, RetrieverFactory] = {
    SearchType.AUTO: lambda ports: AutoRetriever(ports, search),
    SearchType.CHUNKS: ChunksRetriever,
    SearchType.CHUNKS_LEXICAL: ChunksLexicalRetriever,
    SearchType.SUMMARIES: SummariesRetriever,
    SearchType.RAG_COMPLETION: RagCompletionRetriever,
    SearchType.TRIPLET_COMPLETION: TripletCompletionRetriever,
    SearchType.GRAPH_COMPLETION: GraphCompletionRetriever,
    SearchType.GRAPH_PPR: GraphPprRetriever,
    SearchType.HYBRID_COMPLETION: HybridCompletionRetriever,
    SearchType.GRAPH_SUMMARY_COMPLETION: GraphSummaryRetriever,
    SearchType.GRAPH_COMPLETION_COT: ChainOfThoughtRetriever,
    SearchType.GRAPH_COMPLETION_CONTEXT_EXTENSION: ContextExtensionRetriever,
    SearchType.GRAPH_COMPLETION_DECOMPOSITION: DecompositionRetriever,
    SearchType.TEMPORAL: TemporalRetriever,
    SearchType.CYPHER: CypherRetriever,
    SearchType.NATURAL_LANGUAGE: NaturalLanguageRetriever,
    # The router's retrievers search through this module's dispatcher, passed in (no import cycle).
    SearchType.FEELING_LUCKY: lambda ports: FeelingLuckyRetriever(ports, search),
    SearchType.AGENTIC_COMPLETION: lambda ports: AgenticRetriever(ports, search),
    SearchType.CODING_RULES: CodingRulesRetriever,
    SearchType.CONVERSATION: ConversationRetriever,
}


class HistoryCompleter:
    """A completer that puts the session's last exchanges before every prompt."""

    def __init__(self, inner: Completer, history: list[str]) -> None:
        self._inner = inner
        self._history = "\n".join(history)

    def complete(self, system: str, prompt: str) -> str:
        return self._inner.complete(system, f"Conversation so far:\n<<<\n{self._history}\n>>>\n\n{prompt}")


@dataclass(frozen=True)
class WithHistory:
    """The ports, with completions that see the session's history."""

    ports: SearchPorts
    history: list[str]

    @property
    def vectors(self) -> VectorStore:
        return self.ports.vectors

    @property
    def lexical(self) -> LexicalIndex:
        return self.ports.lexical

    @property
    def graph(self) -> GraphStore:
        return self.ports.graph

    @property
    def embedder(self) -> Embedder:
        return self.ports.embedder

    @property
    def completer(self) -> Completer:
        return HistoryCompleter(self.ports.completer, self.history)


# Rows of a query, in the query's own order and number (KENNING_CYPHER_MAX_ROWS bounds them).
ROWS = frozenset({SearchType.CYPHER, SearchType.NATURAL_LANGUAGE})


def shown(request: SearchRequest, objects: list[Hit]) -> list[Hit]:
    """The results a search gives: its `top_k` best, whatever the type (a search of several rounds
    reads more for its context, and gives the best of them); a query's rows as they are."""
    return objects if request.type in ROWS else best_first(objects, request.top_k)


def search(ports: SearchPorts, request: SearchRequest) -> SearchResult:
    """Run the request's retriever: objects, then context, then (unless only_context) an answer.

    With no LLM configured the answer is None and `notice` says why; context still comes back.
    """
    ports = TimeView(ports, request.as_of)
    retriever = REGISTRY[request.type](WithHistory(ports, request.history) if request.history else ports)
    objects = retriever.get_retrieved_objects(request)
    context = retriever.get_context_from_objects(request, objects)
    searched = retriever.searched if isinstance(retriever, AutoRetriever) else [request.type]
    result = SearchResult(
        query=request.query,
        type=request.type,
        searched=searched,
        results=shown(request, objects),
        context=context,
    )
    if request.only_context:
        return result
    try:
        result.answer = retriever.get_completion_from_context(request, context)
    except NoLLMConfigured as error:
        result.notice = str(error)
    return result
