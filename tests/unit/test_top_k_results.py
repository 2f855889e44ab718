"""`top_k` counts results for every search type: a search of several rounds reads more for its
context, and gives its `top_k` best."""

from __future__ import annotations

from kenning.retrieval.contract import SearchRequest, SearchType
from kenning.retrieval.registry import search
from tests.twins import TwinServices
from tests.unit.test_graph_search_types import SCOPE, ScriptedCompleter, memory, with_completer

__all__ = ["memory"]  # the module's twin memory, as a fixture here too


def test_a_search_of_several_rounds_gives_its_top_k_best_and_reads_the_rest_for_its_context(
    memory: TwinServices,
) -> None:
    # Given a chain of thought that searches again for what is missing, then decomposes
    def answer(system: str, prompt: str) -> str:
        if "sub-questions" in system:
            return "What did Grace Hopper build?\nWhere did Alan Turing work?\nWhom did Ada Lovelace know?"
        return "Where did Alan Turing work?" if "missing" in system else "Grace Hopper built it."

    completer = ScriptedCompleter(answer)
    for kind in (SearchType.GRAPH_COMPLETION_COT, SearchType.GRAPH_COMPLETION_DECOMPOSITION):
        every = search(
            with_completer(memory, completer),
            SearchRequest(query="Who built the first compiler?", type=kind, scopes=[SCOPE], top_k=1000),
        )
        # When it is asked for two results
        two = search(
            with_completer(memory, completer),
            SearchRequest(query="Who built the first compiler?", type=kind, scopes=[SCOPE], top_k=2),
        )
        # Then it gives two, and its context still reads what all its rounds found
        assert len(every.results) > 2, (kind, every.results)
        assert len(two.results) == 2, (kind, two.results)
        assert "Grace Hopper" in two.context and "Alan Turing" in two.context, kind
