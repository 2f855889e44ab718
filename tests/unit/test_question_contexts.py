"""Contexts that follow the question: the demo's questions on the bundled samples, offline
(the offline extractor and the local embedder, as `kenning demo` has them).

The graph walk seeds on what a question asks (the facts closest to it), not only on the names
it gives; the contexts of the completion types hold facts between entities, never the
pipeline's own structure (a chunk `contains` an entity, `is_part_of` a document...).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from kenning.pipeline.assembly import STRUCTURAL_RELATIONSHIPS
from kenning.pipeline.collection import TRIPLETS
from kenning.pipeline.ingest import Source, add
from kenning.pipeline.models import GraphEdge, Scope, ScoredPoint, VectorPoint
from kenning.pipeline.ports import Neighbourhood
from kenning.retrieval.contract import SearchRequest, SearchResult, SearchType
from kenning.retrieval.graph_completion import chunk_facts, with_closest
from kenning.retrieval.graph_ppr import Walk, WalkConfig, restart_weights, walk
from kenning.retrieval.registry import search
from kenning.storage.inference.embedder import LocalEmbedder
from kenning.workers.cli.main import DEMO_QUESTIONS, SAMPLES
from kenning.workers.runtime.local_runner import LocalRunner
from tests.twins import TwinServices

DEMO = Scope(tenant="t1", dataset="demo")
# What a context of the demo's 5 results must hold to answer each demo question. The lamp's
# changes are facts of one chunk, which gives 2 of the 5 (one fact per chunk in turn, the best
# chunk first); the offline graph has no fact for the LED lantern (its sentence joins no names).
ANSWERS = {
    DEMO_QUESTIONS[0]: ("Elinor Vance",),
    DEMO_QUESTIONS[1]: ("Osprey", "porcelain"),
    DEMO_QUESTIONS[2]: ("paraffin", "electricity"),
}
# With search's default 10 results, every change of the lamp the offline graph holds.
LAMP_CHANGES = ("whale oil", "paraffin", "electricity")
GRAPH_TYPES = (
    SearchType.GRAPH_COMPLETION,
    SearchType.GRAPH_SUMMARY_COMPLETION,
    SearchType.GRAPH_COMPLETION_COT,
    SearchType.GRAPH_COMPLETION_CONTEXT_EXTENSION,
    SearchType.GRAPH_COMPLETION_DECOMPOSITION,
)
COMPLETION_TYPES = (
    *GRAPH_TYPES,
    SearchType.HYBRID_COMPLETION,
    SearchType.TRIPLET_COMPLETION,
    SearchType.RAG_COMPLETION,
)
# A structural edge rendered as a fact: `x --[contains]--> y` (graph types) or `x -> contains -> y`.
STRUCTURE = re.compile(
    r"(--\[|-> )(" + "|".join(sorted(STRUCTURAL_RELATIONSHIPS)).replace("_", "[_ ]") + r")(\]--> | ->)"
)


@pytest.fixture(scope="module")
def samples() -> TwinServices:
    # The demo's stores: the offline extractor and the local embedder (all-MiniLM-L6-v2)
    made = TwinServices(embedder=LocalEmbedder())  # type: ignore[arg-type]
    sources = [
        Source(name=p.name, uri=f"samples:{p.name}", data=p.read_bytes())
        for p in sorted(SAMPLES.glob("*.md"))
    ]
    add(made.metadata, made.blobs, DEMO, sources)
    run = LocalRunner(made, made.lock, concurrency=2).run(DEMO)
    assert run.status.value == "completed", run.error
    return made


def ask(
    services: TwinServices,
    question: str,
    kind: SearchType,
    top_k: int = 5,
    scope: Scope = DEMO,
    **options: Any,
) -> SearchResult:
    request = SearchRequest(
        query=question, type=kind, scopes=[scope], top_k=top_k, only_context=True, options=options
    )
    return search(services, request)


pytestmark = pytest.mark.slow


@pytest.mark.parametrize("kind", GRAPH_TYPES)
def test_the_demo_questions_get_contexts_of_their_own_each_holding_its_answer(
    samples: TwinServices, kind: SearchType
) -> None:
    # When each demo question is asked as the demo asks it (5 results, no LLM)
    contexts = {question: ask(samples, question, kind).context for question in DEMO_QUESTIONS}
    # Then no two questions get the same context
    assert len(set(contexts.values())) == len(DEMO_QUESTIONS)
    # And each context holds what answers its question
    for question, context in contexts.items():
        missing = [phrase for phrase in ANSWERS[question] if phrase.casefold() not in context.casefold()]
        assert not missing, f"{question!r}: {missing} not in\n{context}"


def test_graph_completion_gives_first_the_facts_of_the_chunk_the_question_is_about(
    samples: TwinServices,
) -> None:
    # When the guild's founder is asked for, with only "Harrow Point" as a name, for facts alone
    result = ask(samples, DEMO_QUESTIONS[0], SearchType.GRAPH_COMPLETION, passages=0)
    # Then the first fact is the founding, from the guild's document
    assert "Elinor Vance founded" in result.results[0].text
    assert "keepers-guild.md" in result.context.splitlines()[0]
    # And by default the guild's chunk comes first as its text
    first = ask(samples, DEMO_QUESTIONS[0], SearchType.GRAPH_COMPLETION).results[0]
    assert first.kind == "chunk" and "Elinor Vance founded" in first.text


@pytest.mark.parametrize("kind", COMPLETION_TYPES)
def test_no_completion_context_gives_a_structural_edge_as_a_fact(
    samples: TwinServices, kind: SearchType
) -> None:
    # When every demo question is asked for many results: beyond the chunks' facts, if any
    for question in DEMO_QUESTIONS:
        result = ask(samples, question, kind, top_k=30)
        # Then the context holds facts and text, never the pipeline's own edges
        assert result.context
        assert not STRUCTURE.search(result.context), result.context
        assert all(hit.extra.get("relationship") not in STRUCTURAL_RELATIONSHIPS for hit in result.results)


def with_source_of(context: str) -> str:
    """The source label (`[document: title, chunk n]`) the context's first entry ends with."""
    return next(line for line in context.splitlines() if line.endswith("]"))


def test_with_search_default_results_the_lamp_question_gets_every_change_the_graph_holds(
    samples: TwinServices,
) -> None:
    for passages in (0, 5):
        result = ask(samples, DEMO_QUESTIONS[2], SearchType.GRAPH_COMPLETION, top_k=10, passages=passages)
        assert all(change in result.context for change in LAMP_CHANGES), result.context
        # And the lamp's chunk comes first: its document is where the walk ends up
        assert "the-lamp.md" in with_source_of(result.context)


def test_the_walk_starts_at_the_closest_facts_where_the_question_names_no_entity(
    samples: TwinServices, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a store that notes the collections searched
    searched: list[str] = []
    search_vectors = samples.vectors.search

    def noting(scope: Scope, name: str, *args: Any, **kwargs: Any) -> list[ScoredPoint]:
        searched.append(name)
        return search_vectors(scope, name, *args, **kwargs)

    monkeypatch.setattr(samples.vectors, "search", noting)
    # When the walk, seeded by facts, starts from a question whose only name is no entity's
    facts = WalkConfig(fact_seeds=3)
    walked = walk(samples, DEMO, DEMO_QUESTIONS[0], facts)
    # Then it starts from the facts closest to the question, and ends at the guild's chunk
    assert TRIPLETS in searched
    [best] = samples.graph.get_nodes(DEMO, [walked.ranked[0].chunk_id])
    assert "Elinor Vance founded" in str(best.properties["text"])
    # And a question naming an entity starts there alone: the facts are not searched
    searched.clear()
    walk(samples, DEMO, "Who was Elinor Vance?", facts)
    assert searched and TRIPLETS not in searched


def test_the_ends_of_the_closest_facts_take_their_share_of_the_restart_beside_the_names() -> None:
    projected = Neighbourhood(edges=[], degrees={"named": 1, "founder": 1, "guild": 3})
    facts = {"founder": 0.6, "guild": 0.6}
    # Beside a named entity, the facts' ends take `fact_share` of the names' 1, each by its
    # similarity over its degree
    weights = restart_weights({"named": 1.0}, {}, projected, 0.0, facts, fact_share=0.25)
    assert weights == pytest.approx({"named": 0.8, "founder": 0.15, "guild": 0.05})
    # With no name, they are where the walk starts (and the chunks still wait for no entity)
    alone = restart_weights({}, {"c1": 0.5}, projected, 0.0, facts, fact_share=0.25)
    assert alone == pytest.approx({"founder": 0.75, "guild": 0.25})


def test_a_chunks_facts_come_closest_first_and_a_fact_told_by_the_same_sentence_last() -> None:
    # Given a chunk's facts: two told by one sentence, one by another
    said = "The Osprey ran aground on the Harrow Reef in 1889."

    def fact(name: str, description: str) -> GraphEdge:
        return GraphEdge(
            id=name, source_id="a", target_id="b", relationship="r", properties={"description": description}
        )

    reef, year, cargo = fact("reef", said), fact("year", said), fact("cargo", "Divers recovered porcelain.")
    closeness = {"reef": 0.9, "year": 0.8, "cargo": 0.3}
    # When they are ordered for a question closest to the first
    ordered = chunk_facts([cargo, year, reef], Walk(ranked=[], scores={}), closeness)
    # Then the closest comes first, and the one repeating its sentence after the one with news
    assert [edge.id for edge in ordered] == ["reef", "cargo", "year"]


def cognified(dataset: str, texts: dict[str, str]) -> tuple[TwinServices, Scope]:
    """A fresh dataset of one document a text (by name), cognified offline."""
    made = TwinServices()
    scope = Scope(tenant="t1", dataset=dataset)
    sources = [Source(name=name, uri=f"t:{name}", data=text.encode()) for name, text in texts.items()]
    add(made.metadata, made.blobs, scope, sources)
    assert LocalRunner(made, made.lock).run(scope).status.value == "completed"
    return made, scope


def test_a_chunk_with_no_fact_gives_its_text_once_in_graph_completion() -> None:
    # Given a document whose sentence joins no two names: no fact is extracted from it
    texts = {
        "compiler.txt": "Grace Hopper built the first compiler at Remington Rand in 1952.",
        "sailing.txt": "Grace Hopper liked sailing on quiet mornings.",
    }
    made, scope = cognified("notes", texts)
    # When GRAPH_COMPLETION answers about it, with room for more than the facts
    request = SearchRequest(
        query="What did Grace Hopper like?",
        type=SearchType.GRAPH_COMPLETION,
        scopes=[scope],
        only_context=True,
    )
    result = search(made, request)
    # Then each chunk's text is given once (the best chunks' texts beside their facts), and no
    # structural edge is given
    passages = [hit.text for hit in result.results if hit.kind == "chunk"]
    assert sorted(passages) == sorted(texts.values())
    assert any(hit.kind == "edge" and "Remington Rand" in hit.text for hit in result.results)
    assert not STRUCTURE.search(result.context)
    # And asked for facts alone, the chunk with no fact still takes its turn with its text, once
    facts_only = search(made, request.model_copy(update={"options": {"passages": 0}}))
    passages = [hit.text for hit in facts_only.results if hit.kind == "chunk"]
    assert passages == [texts["sailing.txt"]]


def test_graph_completion_shows_the_chunk_closest_to_the_question_among_its_passages() -> None:
    # Given six paragraphs the question's one name leads to, and the paragraph the question is
    # about, which names nothing the question names (as a small model's graph may leave it)
    croydon = [
        "Croydon Airport hosted Imperial Airways from 1924.",
        "Croydon Airport was the main airport for London before the war.",
        "Amy Johnson flew from Croydon Airport to Australia in 1930.",
        "The terminal of Croydon Airport is a listed building.",
        "Croydon Airport closed in 1959 after Northolt took its flights.",
        "Charles Lindbergh landed at Croydon Airport in 1927.",
    ]
    busiest = "The eighth-busiest airport of the continent, it serves the south-east with one runway."
    texts = {**{f"croydon-{n}.txt": text for n, text in enumerate(croydon)}, "busiest.txt": busiest}
    made, scope = cognified("airports", texts)
    # When GRAPH_COMPLETION is asked with room for six results (three passages), the closest
    # chunk alone giving its text wherever the walk ranks it
    question = "Which airport that replaced Croydon Airport is the eighth-busiest of the continent?"
    result = ask(made, question, SearchType.GRAPH_COMPLETION, top_k=6, scope=scope, closest_passages=1)
    passages = [hit.text for hit in result.results if hit.kind == "chunk"]
    # Then the closest paragraph is the last of the three passages, after the walk's best two
    assert len(passages) == 3 and passages[2] == busiest
    assert all("Croydon Airport" in text for text in passages[:2])


@pytest.mark.parametrize(
    ("chunks", "passages", "expected"),
    [
        (["a", "b", "c", "d"], 2, ["a", "c", "b", "d"]),  # ranked lower: the last passage's place
        (["a", "b", "x", "d"], 2, ["a", "c", "b", "x"]),  # left out: the last chunk makes room
        (["c", "a", "b"], 2, ["c", "a", "b"]),  # a passage already
        (["a", "b"], 5, ["a", "c"]),  # fewer chunks than passages: still one of them
        (["a", "b", "c"], 0, ["a", "b", "c"]),  # facts alone: no passage to take
        ([], 3, []),
    ],
)
def test_the_closest_chunk_takes_a_passages_place_and_the_count_stays(
    chunks: list[str], passages: int, expected: list[str]
) -> None:
    assert with_closest(chunks, "c", passages) == expected


def test_triplet_completion_leaves_out_a_triplet_of_a_structural_relationship(samples: TwinServices) -> None:
    # Given a triplet point whose relationship is one of the pipeline's own (as an index rebuilt
    # from an older graph may hold), worded like the question
    text = "The Keepers' Guild -> contains -> Elinor Vance: who founded the lighthouse keepers' guild"
    vector = samples.embedder.embed([text])[0]
    payload = {"text": text, "type": "Triplet", "relationship": "contains", "source_id": "", "target_id": ""}
    point = VectorPoint(id="0b9f4c3e-5d21-4a5e-9b9a-2f1c6f0d7e11", vector=vector, payload=payload)
    samples.vectors.upsert(DEMO, TRIPLETS, [point])
    try:
        # When TRIPLET_COMPLETION answers the question
        result = ask(samples, DEMO_QUESTIONS[0], SearchType.TRIPLET_COMPLETION)
        # Then the point is not given, and the other triplets still are
        assert "-> contains ->" not in result.context
        assert len(result.results) == 5
    finally:
        samples.vectors.delete(DEMO, TRIPLETS, [point.id])


def test_graph_completion_context_gives_passages_apart_then_the_facts_under_a_heading(
    samples: TwinServices,
) -> None:
    # When the guild's founder is asked for with room for passages and facts
    result = ask(samples, DEMO_QUESTIONS[0], SearchType.GRAPH_COMPLETION, top_k=10)
    passages = [hit for hit in result.results if hit.kind == "chunk"]
    facts = [hit for hit in result.results if hit.kind == "edge"]
    assert passages and facts
    # Then the context opens with the passages, a blank line between them, each with its source
    opening, listed = result.context.split("\n\nFacts:\n")
    assert opening.startswith(passages[0].text) and opening.endswith("]")
    places = [opening.find(f"{hit.text} [") for hit in passages]
    assert places == sorted(places) and -1 not in places
    assert all(opening[place - 3 : place] == "]\n\n" for place in places[1:])
    # And the facts follow under their heading, one a line, in their order
    lines = listed.split("\n")
    assert len(lines) == len(facts)
    assert all(line.startswith(f"- {hit.text}") for line, hit in zip(lines, facts, strict=True))


def test_beside_passages_the_reader_gets_nothing_of_the_chunks_below_them(samples: TwinServices) -> None:
    # When a question is asked with room for ten results and two passages
    result = ask(samples, DEMO_QUESTIONS[1], SearchType.GRAPH_COMPLETION, top_k=10, passages=2)
    below = [hit for hit in result.results if hit.extra.get("below_passages")]
    passages = [hit for hit in result.results if hit.kind == "chunk" and hit not in below]
    assert len(passages) == 2 and below, result.results
    # Then what the chunks below the two passages give is among the results, not in the context
    assert not {hit.chunk_id for hit in below} & {hit.chunk_id for hit in passages}
    assert not any(hit.text in result.context for hit in below), result.context
    assert all(hit.text in result.context for hit in passages)
    # And `below_facts` gives it too
    both = ask(
        samples, DEMO_QUESTIONS[1], SearchType.GRAPH_COMPLETION, top_k=10, passages=2, below_facts=True
    )
    assert [hit.text for hit in both.results] == [hit.text for hit in result.results]
    assert all(hit.text in both.context for hit in below), both.context


def test_the_questions_closest_chunks_give_their_text_wherever_the_walk_ranks_them(
    samples: TwinServices,
) -> None:
    # Given the chunks closest to each demo question (the walk's chunk seeds, closest first)
    shown = 0
    for question in DEMO_QUESTIONS:
        near = walk(samples, DEMO, question, WalkConfig()).near[:2]
        # When it is asked with one passage, with and without the closest two giving their text
        alone = ask(samples, question, SearchType.GRAPH_COMPLETION, top_k=10, passages=1, closest_passages=0)
        both = ask(samples, question, SearchType.GRAPH_COMPLETION, top_k=10, passages=1)
        # Then the results come from the same chunks in the same order either way
        assert [hit.chunk_id for hit in both.results] == [hit.chunk_id for hit in alone.results]
        # And every one of the two closest among the results gives its text, passage or not
        texts = {hit.chunk_id: hit.text for hit in both.results if hit.kind == "chunk"}
        listed = {hit.chunk_id for hit in both.results}
        assert all(chunk in texts for chunk in near if chunk in listed), (near, both.results)
        assert all(texts[chunk] in both.context for chunk in near if chunk in texts)
        # Which without them only the passage and the chunks with no fact do
        alone_texts = {hit.chunk_id for hit in alone.results if hit.kind == "chunk"}
        shown += len(set(texts) - alone_texts)
    assert shown, "no demo question's second closest chunk was below its passage"
