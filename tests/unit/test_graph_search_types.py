"""The LLM-driven graph variants, TEMPORAL, FEELING_LUCKY, AGENTIC and the CYPHER gate, on twins."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kenning.pipeline.ingest import Source, add
from kenning.pipeline.lexical import LexicalIndex
from kenning.pipeline.models import Scope
from kenning.pipeline.ports import Completer, Embedder, GraphStore, VectorStore
from kenning.retrieval.contract import Principal, SearchRequest, SearchResult, SearchType
from kenning.retrieval.cypher import QueryRejected
from kenning.retrieval.registry import REGISTRY, search
from kenning.workers.runtime.local_runner import LocalRunner
from kenning.workers.runtime.settings import load_settings
from kenning.workers.runtime.wiring import open_completer
from tests.twins import TwinServices

SCOPE = Scope(tenant="t1", dataset="history")
CORPUS = {
    "ada.txt": "Ada Lovelace published the first algorithm in 1843. Ada Lovelace knew Charles Babbage.",
    "turing.txt": "Alan Turing proposed the Turing Test in 1950. Alan Turing worked at Bletchley Park.",
    "hopper.txt": "Grace Hopper built the first compiler in 1952. Grace Hopper worked at Remington Rand.",
}
GRAPH_VARIANTS = (
    SearchType.GRAPH_SUMMARY_COMPLETION,
    SearchType.GRAPH_COMPLETION_COT,
    SearchType.GRAPH_COMPLETION_CONTEXT_EXTENSION,
    SearchType.GRAPH_COMPLETION_DECOMPOSITION,
)


class ScriptedCompleter:
    """Answers from a function of (system, prompt), recording every call."""

    def __init__(self, answer: Callable[[str, str], str]) -> None:
        self.answer = answer
        self.calls: list[tuple[str, str]] = []

    def complete(self, system: str, prompt: str) -> str:
        self.calls.append((system, prompt))
        return self.answer(system, prompt)


@pytest.fixture(scope="module")
def memory() -> TwinServices:
    services = TwinServices()
    services.config.temporal = True
    sources = [Source(name=name, uri=f"test:{name}", data=text.encode()) for name, text in CORPUS.items()]
    add(services.metadata, services.blobs, SCOPE, sources)
    assert LocalRunner(services, services.lock).run(SCOPE).status.value == "completed"
    return services


def run(services: TwinServices, kind: SearchType, query: str, **options: object) -> SearchResult:
    only_context = bool(options.pop("only_context", False))
    request = SearchRequest(
        query=query, type=kind, scopes=[SCOPE], only_context=only_context, options=options
    )
    return search(services, request)


def with_completer(services: TwinServices, completer: ScriptedCompleter) -> TwinServices:
    copy = TwinServices(**{**services.__dict__, "completer": completer})  # type: ignore[arg-type]
    return copy


def test_every_search_type_is_registered() -> None:
    assert set(REGISTRY) == set(SearchType)


@pytest.mark.parametrize("kind", GRAPH_VARIANTS)
def test_graph_variants_give_the_graph_context_offline(memory: TwinServices, kind: SearchType) -> None:
    plain = run(memory, SearchType.GRAPH_COMPLETION, "Who built the first compiler?", only_context=True)
    result = run(memory, kind, "Who built the first compiler?")
    assert result.context == plain.context and result.results
    assert result.answer is None and result.notice and "LLM" in result.notice


def test_decomposition_retrieves_for_each_sub_question(memory: TwinServices) -> None:
    completer = ScriptedCompleter(
        lambda system, prompt: (
            "What did Grace Hopper build?\nWhere did Alan Turing work?"
            if "sub-questions" in system
            else "Grace Hopper and Alan Turing."
        )
    )
    result = run(
        with_completer(memory, completer), SearchType.GRAPH_COMPLETION_DECOMPOSITION, "Two pioneers?"
    )
    assert "Grace Hopper" in result.context and "Alan Turing" in result.context
    assert result.answer == "Grace Hopper and Alan Turing."


def test_chain_of_thought_searches_again_for_what_is_missing(memory: TwinServices) -> None:
    def answer(system: str, prompt: str) -> str:
        return "Where did Alan Turing work?" if "missing" in system else "Grace Hopper built it."

    completer = ScriptedCompleter(answer)
    # Two facts a search: the first search finds the compiler's, not where Turing worked
    first = run(
        memory, SearchType.GRAPH_COMPLETION, "Who built the first compiler?", only_context=True, top_edges=2
    )
    result = run(
        with_completer(memory, completer),
        SearchType.GRAPH_COMPLETION_COT,
        "Who built the first compiler?",
        only_context=True,
        rounds=2,
        top_edges=2,
    )
    assert "Bletchley" not in first.context
    assert len(result.results) > len(first.results) and "Bletchley" in result.context


def test_chain_of_thought_goes_on_only_with_a_follow_up_question(memory: TwinServices) -> None:
    # Given a model that answers the follow-up step with a name, not a question
    def answer(system: str, prompt: str) -> str:
        return "Bletchley Park Alan Turing" if "missing" in system else "Grace Hopper built it."

    completer = ScriptedCompleter(answer)
    first = run(memory, SearchType.GRAPH_COMPLETION, "Who built the first compiler?", only_context=True)
    # When chain of thought runs
    result = run(
        with_completer(memory, completer),
        SearchType.GRAPH_COMPLETION_COT,
        "Who built the first compiler?",
        only_context=True,
        rounds=3,
    )
    # Then the name is not searched as a question: the context is the first search's
    assert result.context == first.context
    assert sum("missing" in system for system, _ in completer.calls) == 1


def test_decomposition_leaves_out_lines_that_are_not_questions(memory: TwinServices) -> None:
    def decomposed(plan: str) -> SearchResult:
        completer = ScriptedCompleter(lambda system, prompt: plan if "sub-questions" in system else "x")
        services = with_completer(memory, completer)
        return run(services, SearchType.GRAPH_COMPLETION_DECOMPOSITION, "Two pioneers?", only_context=True)

    with_a_name = decomposed("Remington Rand\nWhat did Ada Lovelace publish?")
    questions_only = decomposed("What did Ada Lovelace publish?")
    assert with_a_name.context == questions_only.context
    assert (
        with_a_name.context != decomposed("What is Remington Rand?\nWhat did Ada Lovelace publish?").context
    )


def test_feeling_lucky_routes_by_rules_when_the_reply_names_no_one_type(memory: TwinServices) -> None:
    for reply in ("CHUNKS or GRAPH_COMPLETION", "Henry-Lepaute", "I would search the passages."):
        completer = ScriptedCompleter(lambda system, prompt, reply=reply: reply)
        picked = run(
            with_completer(memory, completer),
            SearchType.FEELING_LUCKY,
            "What happened in 1950?",
            only_context=True,
        )
        assert picked.results[0].extra["routed_to"] == "TEMPORAL", reply


def test_graph_summary_uses_the_llm_summary_as_context(memory: TwinServices) -> None:
    completer = ScriptedCompleter(lambda system, prompt: "SUMMARY: Hopper built a compiler.")
    result = run(
        with_completer(memory, completer), SearchType.GRAPH_SUMMARY_COMPLETION, "compiler", only_context=True
    )
    assert result.context == "SUMMARY: Hopper built a compiler."


def test_graph_summary_gives_the_graph_context_under_one_heading(memory: TwinServices) -> None:
    # Given the graph's context for a question: passages, then facts under their own heading
    graph = run(memory, SearchType.GRAPH_COMPLETION, "compiler", only_context=True).context
    assert graph.count("Facts:") == 1
    # When GRAPH_SUMMARY_COMPLETION asks for its summary
    completer = ScriptedCompleter(lambda system, prompt: "SUMMARY")
    run(with_completer(memory, completer), SearchType.GRAPH_SUMMARY_COMPLETION, "compiler", only_context=True)
    # Then its request holds that context whole, with no second heading around it
    [(_, prompt)] = completer.calls
    assert graph in prompt and prompt.count("Facts:") == 1


def test_temporal_keeps_events_in_the_asked_range(memory: TwinServices) -> None:
    in_1952 = run(memory, SearchType.TEMPORAL, "What happened in 1952?", only_context=True)
    assert in_1952.results and all("1952" in hit.text for hit in in_1952.results)
    assert in_1952.results[0].chunk_id and in_1952.results[0].data_id
    forties = run(memory, SearchType.TEMPORAL, "What was published between 1840 and 1849?", only_context=True)
    assert [hit.text for hit in forties.results] == [
        "[1843] Ada Lovelace published the first algorithm in 1843."
    ]
    undated = run(memory, SearchType.TEMPORAL, "the Turing Test", only_context=True)
    assert "1950" in undated.results[0].text


def test_feeling_lucky_routes_by_rules_offline_and_by_the_llm_when_there_is_one(memory: TwinServices) -> None:
    dated = run(memory, SearchType.FEELING_LUCKY, "What happened in 1950?", only_context=True)
    assert dated.results and dated.results[0].extra["routed_to"] == "TEMPORAL"
    short = run(memory, SearchType.FEELING_LUCKY, "Remington Rand", only_context=True)
    assert short.results[0].extra["routed_to"] == "CHUNKS_LEXICAL"
    completer = ScriptedCompleter(lambda system, prompt: "CHUNKS")
    picked = run(
        with_completer(memory, completer),
        SearchType.FEELING_LUCKY,
        "What happened in 1950?",
        only_context=True,
    )
    assert picked.results[0].extra["routed_to"] == "CHUNKS"


def test_agentic_completion_follows_the_llm_tools_until_it_answers(memory: TwinServices) -> None:
    replies = iter(["SEARCH_CHUNKS: first compiler", "ANSWER: Grace Hopper"])
    completer = ScriptedCompleter(lambda system, prompt: next(replies))
    result = run(
        with_completer(memory, completer), SearchType.AGENTIC_COMPLETION, "Who built the first compiler?"
    )
    assert result.answer == "Grace Hopper"
    assert any("Grace Hopper built the first compiler" in hit.text for hit in result.results)
    assert "Observation" in completer.calls[1][1]


def test_a_routed_search_puts_the_session_history_before_its_prompts_once(memory: TwinServices) -> None:
    """FEELING_LUCKY routed to DECOMPOSITION, which asks the LLM for sub-questions, then answers."""

    def answer(system: str, prompt: str) -> str:
        return "GRAPH_COMPLETION_DECOMPOSITION" if "Types:" in prompt else "Who built the first compiler?"

    completer = ScriptedCompleter(answer)
    request = SearchRequest(
        query="Who built the first compiler?",
        type=SearchType.FEELING_LUCKY,
        scopes=[SCOPE],
        history=["Q: Who was Grace Hopper? A: A computer scientist."],
    )
    search(with_completer(memory, completer), request)
    assert len(completer.calls) >= 3  # the route, the sub-questions, the answer
    assert {prompt.count("Conversation so far") for _, prompt in completer.calls} == {1}


def test_agentic_completion_offline_gives_context_and_a_notice(memory: TwinServices) -> None:
    result = run(memory, SearchType.AGENTIC_COMPLETION, "Who built the first compiler?")
    assert result.results and result.answer is None and result.notice


def test_cypher_is_refused_unless_allowed_and_needs_a_cypher_store(memory: TwinServices) -> None:
    with pytest.raises(QueryRejected, match="disabled"):
        run(memory, SearchType.CYPHER, "MATCH (n) RETURN n")
    allowed = Principal(tenant=SCOPE.tenant, may_run_cypher=True)
    request = SearchRequest(
        query="MATCH (n) RETURN n", type=SearchType.CYPHER, scopes=[SCOPE], principal=allowed
    )
    with pytest.raises(QueryRejected, match="KENNING_GRAPH_BACKEND=falkordb"):
        search(memory, request)


class WithoutLLM:
    """The memory's stores, and the completer the wiring builds when no LLM endpoint is configured."""

    def __init__(self, services: TwinServices) -> None:
        self._services = services

    @property
    def vectors(self) -> VectorStore:
        return self._services.vectors

    @property
    def lexical(self) -> LexicalIndex:
        return self._services.lexical

    @property
    def graph(self) -> GraphStore:
        return self._services.graph

    @property
    def embedder(self) -> Embedder:
        return self._services.embedder

    @property
    def completer(self) -> Completer:
        return open_completer(load_settings(llm_url=""))


@pytest.mark.parametrize(
    "kind", [SearchType.GRAPH_COMPLETION, *GRAPH_VARIANTS, SearchType.TRIPLET_COMPLETION]
)
def test_without_an_llm_completion_types_give_context_and_name_the_setting(
    memory: TwinServices, kind: SearchType
) -> None:
    # Given the memory with no LLM endpoint configured
    request = SearchRequest(query="Who built the first compiler?", type=kind, scopes=[SCOPE])
    # When a completion type is asked
    result = search(WithoutLLM(memory), request)
    # Then it answers nothing, gives the context, and says which setting would give an answer
    assert result.answer is None and result.results and result.context
    assert result.notice and "KENNING_LLM_URL" in result.notice
