"""GRAPH_PPR: personalized PageRank on hand-made graphs, and the retriever on in-memory twins."""

from __future__ import annotations

from typing import Any

import pytest

from kenning.pipeline import collection
from kenning.pipeline.ingest import Source, add
from kenning.pipeline.models import (
    DocumentRecord,
    EdgeShape,
    Entity,
    GraphEdge,
    GraphNode,
    Scope,
    VectorPoint,
)
from kenning.pipeline.ports import Neighbourhood
from kenning.retrieval.contract import SearchRequest, SearchResult, SearchType
from kenning.retrieval.graph_ppr import (
    WalkConfig,
    alike_edges,
    exact_entities,
    personalized_pagerank,
    question_names,
    question_spans,
    restart_weights,
    walk,
)
from kenning.retrieval.registry import search
from kenning.storage.graph.memory import MemoryGraphStore
from kenning.workers.runtime.local_runner import LocalRunner
from tests.twins import TwinServices

CONFIG = WalkConfig()
LIBRARY = Scope(tenant="t1", dataset="ppr-library")
OTHER = Scope(tenant="t1", dataset="ppr-other")
CORPUS = [
    ("hopper.txt", "Grace Hopper built the first compiler at Remington Rand in 1952."),
    ("remington.txt", "Remington Rand was a business machines maker based in Norwalk Connecticut."),
    ("norwalk.txt", "Norwalk Connecticut lies on the coast of Long Island Sound."),
    ("turing.txt", "Alan Turing worked at Bletchley Park during the war."),
    ("lovelace.txt", "Ada Lovelace wrote notes on the Analytical Engine of Charles Babbage."),
]


def contains(chunk: str, *entities: str) -> list[tuple[str, str, float]]:
    return [(chunk, entity, 1.0) for entity in entities]


def test_a_walk_with_no_edges_stays_at_its_restart_nodes() -> None:
    scores = personalized_pagerank([], {}, {"a": 0.75, "b": 0.25}, CONFIG)
    assert scores == pytest.approx({"a": 0.75 * (1 - CONFIG.damping), "b": 0.25 * (1 - CONFIG.damping)})


def test_the_walk_reaches_a_chunk_two_hops_from_the_seed_and_not_an_unlinked_one() -> None:
    # Given film -> c1 (which names the director) -> director -> c2, and c3 about something else
    edges = contains("c1", "film", "director") + contains("c2", "director") + contains("c3", "other")
    degrees = {"c1": 2, "c2": 1, "c3": 1, "film": 1, "director": 2, "other": 1}
    # When the walk restarts at the film
    scores = personalized_pagerank(edges, degrees, {"film": 1.0}, CONFIG)
    # Then the director's own chunk is reached, the unrelated one is not
    assert scores["c1"] > scores["c2"] > 0
    assert scores["c3"] == 0


def test_a_hub_entity_passes_little_to_each_chunk_it_is_in() -> None:
    # Given a seed chunk naming a rare entity (in one other chunk) and a hub (in 500 chunks, 2 here)
    edges = contains("seed", "rare", "hub") + contains("rare-chunk", "rare") + contains("hub-chunk", "hub")
    degrees = {"seed": 2, "rare": 2, "hub": 500, "rare-chunk": 1, "hub-chunk": 1}
    scores = personalized_pagerank(edges, degrees, {"seed": 1.0}, CONFIG)
    # Then the rare entity's chunk outranks the hub's by far: the hub divides by its whole degree
    assert scores["rare-chunk"] > 50 * scores["hub-chunk"] > 0
    # And without whole-graph degrees the two would tie: the projection alone hides the hub
    local = {node: 0 for node in degrees}
    flat = personalized_pagerank(edges, local, {"seed": 1.0}, CONFIG)
    assert flat["rare-chunk"] == pytest.approx(flat["hub-chunk"])


def test_an_entity_seed_weighs_its_link_over_its_degree_and_chunks_take_their_share() -> None:
    projected = Neighbourhood(edges=[], degrees={"rare": 1, "hub": 9})
    weights = restart_weights({"rare": 1.0, "hub": 1.0}, {"c1": 0.6, "c2": 0.2}, projected, 0.5)
    assert weights == pytest.approx({"rare": 0.6, "hub": 0.6 / 9, "c1": 0.25, "c2": 0.25 / 3})
    assert sum(weights.values()) == pytest.approx(1.0)
    only_chunks = restart_weights({}, {"c1": 0.6, "c2": 0.2}, projected, 0.5)
    assert only_chunks == pytest.approx({"c1": 0.75, "c2": 0.25})


def test_with_no_chunk_weight_the_chunks_seed_the_walk_only_when_no_entity_does() -> None:
    projected = Neighbourhood(edges=[], degrees={"rare": 1})
    assert restart_weights({"rare": 1.0}, {"c1": 0.6}, projected, 0.0) == pytest.approx({"rare": 1.0})
    assert restart_weights({}, {"c1": 0.6, "c2": 0.2}, projected, 0.0) == pytest.approx(
        {"c1": 0.75, "c2": 0.25}
    )


def test_the_walk_reads_a_bounded_neighbourhood_from_the_store() -> None:
    # Given a graph store holding a chain of chunks and entities
    store = MemoryGraphStore()
    nodes = [GraphNode(id=i, type="Entity", properties={}) for i in ("e1", "e2", "e3")]
    nodes += [GraphNode(id=i, type="DocumentChunk", properties={}) for i in ("c1", "c2", "c3")]
    store.upsert_nodes(LIBRARY, nodes)
    links = [("c1", "e1"), ("c1", "e2"), ("c2", "e2"), ("c2", "e3"), ("c3", "e3")]
    edges = [GraphEdge(id=f"{c}-{e}", source_id=c, target_id=e, relationship="contains") for c, e in links]
    store.upsert_edges(LIBRARY, edges)
    # When the walk starts at e1 with three hops projected
    projected = store.neighbourhood(LIBRARY, ["e1"], hops=3)
    scores = personalized_pagerank(
        [(e.source_id, e.target_id, 1.0) for e in projected.edges], projected.degrees, {"e1": 1.0}, CONFIG
    )
    # Then it sees c1, e2 and c2 (e1 -> c1 -> e2 -> c2), nothing beyond, and degrees of the whole graph
    assert {e.id for e in projected.edges} == {"c1-e1", "c1-e2", "c2-e2"}
    assert projected.degrees["c2"] == 2
    assert "c3" not in scores and "e3" not in scores and scores["c2"] > 0


@pytest.fixture(scope="module")
def services() -> TwinServices:
    made = TwinServices()
    for scope, corpus in (
        (LIBRARY, CORPUS),
        (OTHER, [("x.txt", "Grace Hopper met Remington Rand in Oslo.")]),
    ):
        add(
            made.metadata,
            made.blobs,
            scope,
            [Source(name=n, uri=f"t:{n}", data=t.encode()) for n, t in corpus],
        )
        run = LocalRunner(made, made.lock, concurrency=2).run(scope)
        assert run.status.value == "completed", run.error
    return made


def documents(services: TwinServices) -> dict[str, DocumentRecord]:
    dataset = services.metadata.get_dataset(LIBRARY)
    assert dataset is not None
    return {document.id: document for document in services.chunks.list_documents(dataset.id)}


def ask(services: TwinServices, query: str, **options: object) -> SearchResult:
    request = SearchRequest(
        query=query, type=SearchType.GRAPH_PPR, scopes=[LIBRARY], only_context=True, options=options
    )
    return search(services, request)


def test_graph_ppr_follows_entities_from_the_question_to_the_chunks_beyond(services: TwinServices) -> None:
    # When asking a two-hop question with no dense seeds: only the graph can reach the answer
    result = ask(services, "Where was the maker based where Grace Hopper built a compiler?", chunk_seeds=0)
    names = [documents(services)[hit.document_id or ""].name for hit in result.results]
    # Then the chunk naming Grace Hopper comes first, the maker's own chunk next, via Remington Rand
    assert names[:2] == ["hopper.txt", "remington.txt"]
    assert "turing.txt" not in names and "lovelace.txt" not in names
    # And every hit is a chunk with its references, best first, in the context
    assert all(hit.kind == "chunk" and hit.chunk_id and hit.data_id for hit in result.results)
    assert [hit.score for hit in result.results] == sorted((h.score for h in result.results), reverse=True)
    assert all(hit.text in result.context and hit.extra["ppr"] > 0 for hit in result.results)
    assert result.results[0].score == 1.0


def test_graph_ppr_links_question_names_to_entities_by_normalised_name(services: TwinServices) -> None:
    # Given a question naming an entity in other case and spacing
    [node] = services.graph.get_nodes(
        LIBRARY, [Entity(name="alan  TURING", tenant="t1", dataset="ppr-library").id]
    )
    assert node.properties["name"] == "Alan Turing"
    # Then the walk starts there, with no help from dense chunk hits
    result = ask(services, "Which park did Alan Turing work at?", chunk_seeds=0, entity_links=0)
    assert "Bletchley Park" in result.results[0].text


def test_graph_ppr_with_no_seeds_finds_nothing(services: TwinServices) -> None:
    # A question naming nothing, with neither its closest chunks nor its closest facts as seeds
    result = ask(services, "what is this about?", chunk_seeds=0, fact_seeds=0)
    assert result.results == [] and result.context == ""


def test_graph_ppr_reads_only_its_scopes(services: TwinServices) -> None:
    result = ask(services, "Grace Hopper Remington Rand Oslo")
    assert result.results and all("Oslo" not in hit.text for hit in result.results)
    assert {hit.dataset for hit in result.results} == {"ppr-library"}


def test_hybrid_graph_lane_is_the_walk(services: TwinServices) -> None:
    # Given only the graph lane of the hybrid retriever, and the walk with the same settings
    options = {"weights": {"graph": 1.0}, "facts": 0, "chunk_seeds": 0}
    query = "Where was the maker based where Grace Hopper built a compiler?"
    request = SearchRequest(
        query=query, type=SearchType.HYBRID_COMPLETION, scopes=[LIBRARY], only_context=True, options=options
    )
    hybrid = search(services, request)
    # Then it ranks the chunks as GRAPH_PPR does, each from the graph lane
    assert [hit.chunk_id for hit in hybrid.results] == [
        hit.chunk_id for hit in ask(services, query, **options).results
    ]
    assert all(set(hit.extra["lanes"]) == {"graph"} for hit in hybrid.results)


def test_the_walk_from_a_deeper_search_of_the_closest_chunks_ranks_as_from_its_own(
    services: TwinServices,
) -> None:
    # Given the chunks closest to the question, searched deeper than the walk's chunk seeds
    query = "Where was the maker based where Grace Hopper built a compiler?"
    config = WalkConfig(chunk_seeds=3, chunk_weight=1.0)
    vector = services.embedder.embed([query])[0]
    closest = services.vectors.search(LIBRARY, collection.CHUNKS, vector, 40, ())
    # When the walk starts from them, and from its own search
    given = walk(services, LIBRARY, query, config, vector, closest)
    own = walk(services, LIBRARY, query, config, vector)
    # Then both rank alike
    assert len(closest) > config.chunk_seeds
    assert given.ranked and given == own


def test_a_walk_that_reaches_one_chunk_goes_on_with_the_closest_chunks(services: TwinServices) -> None:
    # When the question's only name is in one chunk, and what it asks is worded in another
    query = "What did Alan Turing write notes on?"
    result = ask(services, query)
    # Then the named chunk comes first, then the closest chunks the walk did not reach
    names = [documents(services)[hit.document_id or ""].name for hit in result.results]
    assert names[:2] == ["turing.txt", "lovelace.txt"] and len(names) == len(CORPUS)
    assert result.results[0].score > result.results[1].score > 0
    # And the graph completion's context holds what that chunk says
    completion = SearchRequest(
        query=query, type=SearchType.GRAPH_COMPLETION, scopes=[LIBRARY], only_context=True
    )
    assert "Analytical Engine" in search(services, completion).context


def test_graph_completion_gives_the_facts_of_the_walks_best_chunks_one_chunk_at_a_time(
    services: TwinServices,
) -> None:
    # When GRAPH_COMPLETION answers the two-hop question
    query = "Where was the maker based where Grace Hopper built a compiler?"
    walked = ask(services, query)
    request = SearchRequest(
        query=query,
        type=SearchType.GRAPH_COMPLETION,
        scopes=[LIBRARY],
        only_context=True,
        options={"passages": 0},
    )
    result = search(services, request)
    # Then (asked for facts alone) its first triplets come one from each of the walk's best
    # chunks, in the walk's order
    chunks = [hit.chunk_id for hit in walked.results]
    firsts = list(dict.fromkeys(hit.chunk_id for hit in result.results))
    assert firsts == chunks[: len(firsts)] and len(firsts) >= 2
    assert [hit.chunk_id for hit in result.results[: len(firsts)]] == firsts
    # And each is an edge of the graph drawn from its chunk, facts first
    assert result.results[0].kind == "edge" and "Grace Hopper" in result.results[0].text
    assert "Remington Rand" in result.context


def test_the_walk_reads_only_the_graphs_shape_and_ranks_as_with_whole_edges(
    services: TwinServices, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a store that records how the walk reads the neighbourhood, and can be made to read edges whole
    graph = services.graph
    read = graph.neighbourhood
    asked: list[bool] = []
    whole = False

    def recording(*args: Any, shape_only: bool = False, **kwargs: Any) -> Neighbourhood:
        asked.append(shape_only)
        return read(*args, shape_only=shape_only and not whole, **kwargs)

    monkeypatch.setattr(graph, "neighbourhood", recording)
    query = "Where was the maker based where Grace Hopper built a compiler?"
    # When the walk runs on the shape alone, then on whole edges
    lean = ask(services, query)
    whole = True
    full = ask(services, query)
    # Then it asked for the shape only, and ranks the same chunks with the same scores either way
    assert asked == [True, True]
    assert lean.results and [(h.chunk_id, h.extra["ppr"]) for h in lean.results] == [
        (h.chunk_id, h.extra["ppr"]) for h in full.results
    ]


TITLED = Scope(tenant="t1", dataset="ppr-titled")
FILMS = [
    ("blood.txt", "Blood Street\n\nBlood Street is a 1988 film directed by Leo Fong."),
    (
        "fong.txt",
        "Leo Fong\n\nLeo Fong is a Chinese-American martial artist and director born in Canton. "
        "He trained with Bruce Lee in Oakland and with Ed Parker in Pasadena, and taught in Sacramento.",
    ),
    ("killpoint.txt", "Killpoint\n\nKillpoint is a 1984 action film starring Leo Fong."),
    ("lowblow.txt", "Low Blow\n\nLow Blow is a 1986 film starring Leo Fong."),
    ("showdown.txt", "Showdown\n\nShowdown is a 1993 film starring Leo Fong."),
    ("rules.txt", "Rules for Stage Combat\n\nRules for Stage Combat is a 1970 manual on fights in plays."),
]


@pytest.fixture(scope="module")
def titled() -> TwinServices:
    made = TwinServices()
    add(made.metadata, made.blobs, TITLED, [Source(name=n, uri=f"t:{n}", data=t.encode()) for n, t in FILMS])
    run = LocalRunner(made, made.lock, concurrency=2).run(TITLED)
    assert run.status.value == "completed", run.error
    return made


def test_graph_ppr_goes_from_a_mention_to_the_document_about_it(titled: TwinServices) -> None:
    # When asking about the director of a film, with no dense seeds: three documents name him,
    # one is about him
    def ranked(**options: object) -> list[str]:
        request = SearchRequest(
            query="What nationality is the director of film Blood Street?",
            type=SearchType.GRAPH_PPR,
            scopes=[TITLED],
            only_context=True,
            options={"chunk_seeds": 0, "fact_seeds": 0, **options},
        )
        dataset = titled.metadata.get_dataset(TITLED)
        assert dataset is not None
        names = {d.id: d.name for d in titled.chunks.list_documents(dataset.id)}
        return [names[hit.document_id or ""] for hit in search(titled, request).results]

    # Then the film's document comes first, and the director's own document next, before the
    # films that also name him
    assert ranked()[:2] == ["blood.txt", "fong.txt"]
    # And without the edge from a document to its title's entity, it would not
    assert ranked(about_weight=0)[:2] != ["blood.txt", "fong.txt"]


def test_question_spans_keep_titles_whole_within_a_clause() -> None:
    spans = question_spans(
        "What does PEP 5 (Guidelines for Language Evolution) specify, and Gaby: A True Story?"
    )
    assert "Guidelines for Language Evolution" in spans and "Gaby: A True Story" in spans
    assert "PEP 5" in spans and not [span for span in spans if "(" in span or "," in span]
    assert all(span.split()[-1][0].isupper() or span.split()[-1][0].isdigit() for span in spans)


def test_a_title_with_small_words_is_linked_whole_and_its_parts_are_not_embedded(
    titled: TwinServices,
) -> None:
    # Given an embedder that records what it is asked to embed
    asked: list[list[str]] = []
    embed = titled.embedder.embed

    def recording(texts: list[str]) -> list[list[float]]:
        asked.append(list(texts))
        return embed(texts)

    titled.embedder.embed = recording  # type: ignore[method-assign,assignment]
    try:
        # When a question names a title the extractor cuts at "for", with no dense seeds
        request = SearchRequest(
            query="What does Rules for Stage Combat teach?",
            type=SearchType.GRAPH_PPR,
            scopes=[TITLED],
            only_context=True,
            options={"chunk_seeds": 0},
        )
        result = search(titled, request)
    finally:
        titled.embedder.embed = embed  # type: ignore[method-assign]
    # Then the walk starts at the title's entity, not at the entities its words also name, and
    # finds its document first
    names = [*question_names(request.query), *question_spans(request.query)]
    assert set(exact_entities(titled, TITLED, names)) == {"Rules for Stage Combat"}
    assert result.results and "Rules for Stage Combat is a 1970 manual" in result.results[0].text
    # And the parts of the title are not looked up by embedding: the whole title is an entity
    assert asked == [["What does Rules for Stage Combat teach?"]]


def test_the_walk_crosses_between_two_names_of_one_thing() -> None:
    # Given one paragraph naming "Moscow State University" and another about "Lomonosov Moscow
    # State University": two entities, no edge between them
    services = TwinServices()
    corpus = {
        "tokarev.txt": "Sergei Tokarev was a professor at Moscow State University.",
        "msu.txt": "Lomonosov Moscow State University was founded by Mikhail Lomonosov.",
        "kazan.txt": "Ivan Petrov taught at Kazan University for forty years.",
    }
    add(
        services.metadata,
        services.blobs,
        LIBRARY,
        [Source(name=n, uri=f"t:{n}", data=t.encode()) for n, t in corpus.items()],
    )
    assert LocalRunner(services, services.lock, concurrency=1).run(LIBRARY).status.value == "completed"
    query = "Who founded the university where Sergei Tokarev was a professor?"

    def reached(alike_names: float) -> list[str]:
        config = WalkConfig(alike_names=alike_names)  # every chunk projected, none restarting the walk
        found = walk(services, LIBRARY, query, config).ranked
        nodes = {node.id: node for node in services.graph.get_nodes(LIBRARY, [e.chunk_id for e in found])}
        return [str(nodes[entry.chunk_id].properties["text"]).split()[0] for entry in found]

    # Then, names that embed alike joined, the walk goes on from Tokarev's paragraph to the university's
    assert reached(0.8) == ["Sergei", "Lomonosov"]
    # And with no names joined it stops at Tokarev's
    assert reached(1.01) == ["Sergei"]


@pytest.mark.parametrize(
    ("one", "other", "joined"),
    [
        ("Moscow State University", "Lomonosov Moscow State University", True),
        ("Tom Clancy", "Thomas Leo Tom Clancy Jr", True),
        ("Sergei Aleksandrovich Kosarev", "Sergei Aleksandrovich Kudryavtsev", False),  # two people
        ("Beatrice", "Beatrice I", False),  # a one-word name is within too many
        ("October 2013", "October 1, 2013", False),  # two dates
        ("Clancy Tom", "Tom Clancy Jr", False),  # not word for word
    ],
)
def test_two_names_are_joined_only_when_one_runs_within_the_other(one: str, other: str, joined: bool) -> None:
    # Given two entities of a walk whose names embed alike
    services = TwinServices()
    names = {"a": one, "b": other}
    services.vectors.ensure_collection(collection.ENTITIES, services.embedder.dimension)
    vectors = services.embedder.embed([one, one])  # the same vector: only the names tell them apart
    points = [
        VectorPoint(
            id=Entity(name=name, tenant="t1", dataset=LIBRARY.dataset).id, vector=v, payload={"text": name}
        )
        for name, v in zip(names.values(), vectors, strict=True)
    ]
    services.vectors.upsert(LIBRARY, collection.ENTITIES, points)
    edges = [EdgeShape(f"c-{p.id}", "chunk", p.id, "contains") for p in points]
    # Then they are joined for the walk only when the shorter name runs word for word in the other
    found = alike_edges(services, LIBRARY, edges, CONFIG)
    assert bool(found) is joined
    assert not alike_edges(services, LIBRARY, edges, WalkConfig(alike_names=1.01))
