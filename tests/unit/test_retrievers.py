"""The search types on in-memory twins: what each retrieves, the context it builds, its references."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from kenning.pipeline import collection
from kenning.pipeline.assembly import STRUCTURAL_RELATIONSHIPS
from kenning.pipeline.ingest import Source, add
from kenning.pipeline.models import DocumentRecord, GraphEdge, GraphNode, Scope
from kenning.retrieval.contract import Hit, SearchRequest, SearchResult, SearchType
from kenning.retrieval.fusion import LANES, FusionConfig, reciprocal_rank_fusion
from kenning.retrieval.registry import REGISTRY, search
from kenning.storage.graph.sql import SqlGraphStore
from kenning.storage.sql.engine import open_engine
from kenning.workers.runtime.local_runner import LocalRunner
from tests.twins import TwinServices

LIBRARY = Scope(tenant="t1", dataset="library")
SECRET = Scope(tenant="t1", dataset="secret")
CORPUS = [
    (
        "ada.txt",
        "Ada Lovelace worked with Charles Babbage on the Analytical Engine in London. "
        "Ada Lovelace wrote the first published algorithm in 1843.",
    ),
    ("turing.txt", "Alan Turing worked at Bletchley Park. Alan Turing proposed the Turing Test in 1950."),
    ("hopper.md", "# Grace Hopper\n\nGrace Hopper built the first compiler at Remington Rand in 1952."),
    ("remington.txt", "Remington Rand was an American business machines manufacturer based in New York."),
]
SECRET_CORPUS = [("zephyr.txt", "Grace Hopper secretly designed the Zephyr Engine in Oslo.")]
NEW_TYPES = [
    SearchType.CHUNKS_LEXICAL,
    SearchType.SUMMARIES,
    SearchType.RAG_COMPLETION,
    SearchType.TRIPLET_COMPLETION,
    SearchType.HYBRID_COMPLETION,
]
COMPLETING = [SearchType.RAG_COMPLETION, SearchType.TRIPLET_COMPLETION, SearchType.HYBRID_COMPLETION]


class RecordingCompleter:
    def __init__(self) -> None:
        self.prompts: list[str] = []

    def complete(self, system: str, prompt: str) -> str:
        self.prompts.append(prompt)
        return "Grace Hopper."


def sources(corpus: list[tuple[str, str]]) -> list[Source]:
    return [Source(name=name, uri=f"test:{name}", data=text.encode()) for name, text in corpus]


@pytest.fixture(scope="module")
def services() -> TwinServices:
    """Two datasets of one tenant, cognified: the library and a secret one."""
    made = TwinServices()
    for scope, corpus in ((LIBRARY, CORPUS), (SECRET, SECRET_CORPUS)):
        add(made.metadata, made.blobs, scope, sources(corpus))
        run = LocalRunner(made, made.lock, concurrency=2).run(scope)
        assert run.status.value == "completed", run.error
    return made


def documents(services: TwinServices, scope: Scope) -> dict[str, DocumentRecord]:
    dataset = services.metadata.get_dataset(scope)
    assert dataset is not None
    return {document.name: document for document in services.chunks.list_documents(dataset.id)}


def run(services: TwinServices, kind: SearchType, query: str, **fields: object) -> SearchResult:
    request = SearchRequest.model_validate({"query": query, "type": kind, "scopes": [LIBRARY], **fields})
    return search(services, request)


def test_every_search_type_is_registered() -> None:
    assert set(REGISTRY) == set(SearchType)
    assert SearchRequest(query="q").type == SearchType.AUTO


def test_load_indexes_chunk_text_lexically_with_the_vector_payload(services: TwinServices) -> None:
    [hit] = services.lexical.search(LIBRARY, "compiler", 5)
    [point] = [
        p for p in services.vectors.search(LIBRARY, "DocumentChunk_text", [1.0] * 384, 100) if p.id == hit.id
    ]
    assert "Grace Hopper built the first compiler" in hit.payload["text"]
    for key in ("text", "chunk_id", "document_id", "data_ids", "index"):
        assert hit.payload[key] == point.payload[key], key


def test_load_embeds_facts_between_entities_as_triplets(services: TwinServices) -> None:
    # Given the loaded library, its triplet points and its graph edges
    points = services.vectors.search(LIBRARY, "Triplet_text", [1.0] * 384, 1000)
    _, edges = services.graph.export(LIBRARY)
    by_id = {edge.id: edge for edge in edges}
    # Then every triplet is a fact edge of the graph, never a structural one, rendered with names
    assert points
    for point in points:
        edge = by_id[point.id]
        assert edge.relationship not in STRUCTURAL_RELATIONSHIPS
        assert point.payload["chunk_id"] == edge.properties["chunk_id"] and point.payload["data_ids"]
    texts = {point.payload["text"] for point in points}
    assert (
        "Grace Hopper -> built compiler at -> Remington Rand: "
        "Grace Hopper built the first compiler at Remington Rand in 1952." in texts
    )
    facts = {edge.id for edge in edges if edge.relationship not in STRUCTURAL_RELATIONSHIPS}
    assert {point.id for point in points} == facts


@pytest.mark.parametrize(
    ("kind", "query"),
    [
        (SearchType.CHUNKS_LEXICAL, "Who built the first compiler?"),
        (SearchType.SUMMARIES, "Grace Hopper built the first compiler"),
        (SearchType.RAG_COMPLETION, "Grace Hopper built the first compiler"),
        (SearchType.TRIPLET_COMPLETION, "Grace Hopper built compiler at Remington Rand"),
        (SearchType.HYBRID_COMPLETION, "Who built the first compiler?"),
        (SearchType.GRAPH_PPR, "Who built the first compiler?"),
        (SearchType.GRAPH_COMPLETION, "Who built the first compiler?"),
    ],
)
def test_each_type_finds_the_source_and_cites_it(
    services: TwinServices, kind: SearchType, query: str
) -> None:
    # When asking about the compiler
    result = run(services, kind, query, only_context=True)
    # Then the best hit comes from hopper.md, with references to its item, document and chunk
    hopper = documents(services, LIBRARY)["hopper.md"]
    top = result.results[0]
    assert "compiler" in top.text and top.dataset == "library"
    assert (top.document_id, top.data_id) == (hopper.id, hopper.data_id)
    [chunk] = services.graph.get_nodes(LIBRARY, [top.chunk_id or ""])
    assert chunk.type == "DocumentChunk" and chunk.properties["document_id"] == hopper.id
    # And every hit carries its references, best first, and appears in the context
    assert all(hit.chunk_id and hit.document_id and hit.data_id for hit in result.results)
    assert [hit.score for hit in result.results] == sorted((h.score for h in result.results), reverse=True)
    assert all(hit.text in result.context for hit in result.results)
    assert result.answer is None and result.notice is None


class Reads:
    """A graph store that notes every node and whole edge it gives out; `hidden` edges it keeps back."""

    def __init__(self, graph: object, hidden: str = "") -> None:
        self._graph = graph
        self._hidden = hidden
        self.nodes: set[str] = set()
        self.edges: list[GraphEdge] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self._graph, name)

    def get_nodes(self, scope: Scope, node_ids: list[str], **options: object) -> list[GraphNode]:
        found: list[GraphNode] = self._graph.get_nodes(scope, node_ids, **options)  # type: ignore[attr-defined]
        self.nodes.update(node.id for node in found)
        return found

    def get_edges(self, scope: Scope, node_ids: list[str], **options: object) -> list[GraphEdge]:
        found: list[GraphEdge] = self._graph.get_edges(scope, node_ids, **options)  # type: ignore[attr-defined]
        kept = [edge for edge in found if edge.relationship != self._hidden]
        self.edges += kept
        return kept


def graph_completion(services: TwinServices, graph: Reads, query: str, top_edges: int) -> list[Hit]:
    reading = TwinServices(**{**services.__dict__, "graph": graph})
    request = SearchRequest.model_validate(
        {
            "query": query,
            "type": SearchType.GRAPH_COMPLETION,
            "scopes": [LIBRARY],
            "only_context": True,
            "options": {"top_edges": top_edges, "passages": 0},
        }
    )
    return search(reading, request).results


def test_graph_completion_reads_only_the_entities_its_triplets_name(services: TwinServices) -> None:
    # Given a store that notes the nodes it gives out
    graph = Reads(services.graph)
    # When GRAPH_COMPLETION keeps one triplet of a question that names no entity
    [hit] = graph_completion(services, graph, "who built the first compiler?", top_edges=1)
    # Then the only entities it read are the ends of that triplet
    entities = {n.id for n in services.graph.get_nodes(LIBRARY, sorted(graph.nodes)) if n.type == "Entity"}
    assert entities and entities <= {hit.extra["source_id"], hit.extra["target_id"]}


def test_graph_completion_gives_facts_only_and_reads_no_contains_edge_whole(services: TwinServices) -> None:
    # Given a store that notes the edges it gives out whole
    graph = Reads(services.graph)
    # When GRAPH_COMPLETION may keep more triplets than its chunks have facts
    hits = graph_completion(services, graph, "who built the first compiler?", top_edges=10)
    # Then it gives their facts alone: a chunk's `contains` edges are structure, not knowledge
    assert hits and all(hit.extra["relationship"] not in STRUCTURAL_RELATIONSHIPS for hit in hits)
    assert "--[contains]-->" not in "".join(hit.text for hit in hits)
    # And it read no `contains` edge whole: their shapes say which entities its chunks hold
    assert not [edge for edge in graph.edges if edge.relationship == "contains"]


def test_graph_completion_leaves_out_a_contains_edge_deleted_while_it_ranked(services: TwinServices) -> None:
    # Given a store whose `contains` edges are gone by the time they are read whole
    graph = Reads(services.graph, hidden="contains")
    # When GRAPH_COMPLETION keeps enough triplets to reach them
    hits = graph_completion(services, graph, "who built the first compiler?", top_edges=40)
    # Then it gives the facts alone, without failing
    assert hits and all(hit.extra["relationship"] != "contains" for hit in hits)


def test_one_graph_completion_search_starts_no_read_of_the_graph_shape(tmp_path: Path) -> None:
    """The shape is read in the background from a scope's second search on: a one-shot command
    never pays for it. GRAPH_COMPLETION's own read of its chunks' edges does not count as one."""
    # Given the library cognified into a SQL graph that reads shapes in the background
    graph = SqlGraphStore(open_engine(f"sqlite:///{tmp_path / 'graph.db'}"), snapshots="background")
    served = TwinServices(graph=graph)  # type: ignore[arg-type]
    add(served.metadata, served.blobs, LIBRARY, sources(CORPUS))
    LocalRunner(served, served.lock, concurrency=1).run(LIBRARY)
    # When one GRAPH_COMPLETION search runs
    assert run(
        served, SearchType.GRAPH_COMPLETION, "Who built the first compiler?", only_context=True
    ).results
    # Then no shape was read, nor is being read
    for thread in threading.enumerate():
        if thread.name == "snapshot":
            thread.join(10)
    assert graph.shape_held(LIBRARY) is None


def test_lexical_hits_carry_their_bm25_score(services: TwinServices) -> None:
    result = run(services, SearchType.CHUNKS_LEXICAL, "Alan Turing Bletchley", only_context=True)
    assert [hit.kind for hit in result.results] == ["chunk"]
    top = result.results[0]
    assert top.extra["bm25"] > 0 and top.score == pytest.approx(1 - 1 / (1 + top.extra["bm25"]))
    assert run(services, SearchType.CHUNKS_LEXICAL, "the of and", only_context=True).results == []


def test_hybrid_context_is_the_chunks_then_their_facts(services: TwinServices) -> None:
    result = run(services, SearchType.HYBRID_COMPLETION, "Grace Hopper compiler", only_context=True, top_k=3)
    assert len(result.results) == 3 and {hit.kind for hit in result.results} == {"chunk"}
    top = result.results[0]
    assert "Grace Hopper" in top.text and 0 < top.score <= 1
    assert set(top.extra["lanes"]) <= set(LANES)
    assert len(top.extra["lanes"]) >= 3 and top.extra["rrf"] > 0
    chunks, facts = result.context.split("\n\nFacts:\n")
    assert chunks.startswith(top.text)
    # A fact says when it held where its sentence gives a time
    assert "- Grace Hopper -> built compiler at -> Remington Rand (since 1952): Grace Hopper built" in facts


def test_hybrid_by_default_searches_no_summaries_and_only_the_facts_of_its_context(
    services: TwinServices, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the vector searches recorded
    searched: list[tuple[str, int]] = []
    original = services.vectors.search

    def recording(scope: Scope, name: str, vector: list[float], limit: int, fields: object = None) -> object:
        searched.append((name, limit))
        return original(scope, name, vector, limit, fields)  # type: ignore[arg-type]

    monkeypatch.setattr(services.vectors, "search", recording)
    # When HYBRID_COMPLETION runs with its default lanes
    result = run(services, SearchType.HYBRID_COMPLETION, "Grace Hopper compiler", only_context=True, top_k=3)
    # Then the summaries lane is not searched, the edge facts only as deep as the context takes
    assert collection.SUMMARIES not in {name for name, _ in searched}
    assert [limit for name, limit in searched if name == collection.EDGES] == [FusionConfig().facts]
    # and the context still ends with the facts
    assert "- Grace Hopper -> built compiler at -> Remington Rand" in result.context.split("\n\nFacts:\n")[1]


def test_hybrid_entity_lane_reaches_chunks_through_graph_neighbours(services: TwinServices) -> None:
    # Given only the entity lane, started from the single best entity: Grace Hopper
    lane = {"weights": {"entities": 1.0}, "entity_seeds": 1, "facts": 0}
    # When searching with and without the seed's neighbours
    near = run(services, SearchType.HYBRID_COMPLETION, "Grace Hopper", only_context=True, options=lane)
    alone = run(
        services,
        SearchType.HYBRID_COMPLETION,
        "Grace Hopper",
        only_context=True,
        options={**lane, "neighbours": 0},
    )
    # Then the neighbour Remington Rand brings in the chunk about it, which never names Grace Hopper
    assert any(hit.text.startswith("Remington Rand was") for hit in near.results)
    assert [hit.text for hit in alone.results] == [near.results[0].text]
    assert "Grace Hopper" in near.results[0].text and "Facts:" not in near.context


def test_hybrid_gives_a_chunk_missing_from_the_graph_its_indexed_text() -> None:
    # Given a library whose graph lost the chunk about Remington Rand, still indexed as a vector
    served = TwinServices()
    add(served.metadata, served.blobs, LIBRARY, sources(CORPUS))
    LocalRunner(served, served.lock, concurrency=1).run(LIBRARY)
    [lost] = [
        point.id
        for point in served.vectors.search(LIBRARY, collection.CHUNKS, served.embedder.embed(["x"])[0], 10)
        if str(point.payload.get("text", "")).startswith("Remington Rand was")
    ]
    served.graph.delete_elements(LIBRARY, [lost], [])
    # When only the vector lane of chunks ranks
    lane = {"weights": {"chunks": 1.0}, "facts": 0}
    result = run(served, SearchType.HYBRID_COMPLETION, "Remington Rand", only_context=True, options=lane)
    # Then the chunk still comes back with its text, read from the vector index
    [hit] = [hit for hit in result.results if hit.chunk_id == lost]
    assert hit.text.startswith("Remington Rand was an American") and hit.kind == "chunk"
    # And so it does when only the lexical lane ranks
    lane = {"weights": {"lexical": 1.0}, "facts": 0}
    result = run(served, SearchType.HYBRID_COMPLETION, "Remington Rand", only_context=True, options=lane)
    [hit] = [hit for hit in result.results if hit.chunk_id == lost]
    assert hit.text.startswith("Remington Rand was an American") and hit.kind == "chunk"
    # Read from the vector index, not from the lexical index's payload: gone from both graph and
    # vectors, the lexical lane's hit of it is dropped
    served.vectors.delete(LIBRARY, collection.CHUNKS, [lost])
    result = run(served, SearchType.HYBRID_COMPLETION, "Remington Rand", only_context=True, options=lane)
    assert result.results and lost not in {hit.chunk_id for hit in result.results}
    # But a lane that ranks chunks without searching their index (summaries) brings no such hit
    lane = {"weights": {"summaries": 1.0}, "facts": 0}
    result = run(served, SearchType.HYBRID_COMPLETION, "Remington Rand", only_context=True, options=lane)
    assert result.results and lost not in {hit.chunk_id for hit in result.results}


@pytest.mark.parametrize("kind", [*NEW_TYPES, SearchType.CHUNKS, SearchType.GRAPH_PPR])
def test_without_an_llm_the_answer_is_none_with_a_notice(services: TwinServices, kind: SearchType) -> None:
    result = run(services, kind, "Who built the first compiler?")
    assert result.results and result.context
    assert result.answer is None and result.notice and "LLM" in result.notice


@pytest.mark.parametrize("kind", COMPLETING)
def test_completion_types_ask_once_with_the_context(kind: SearchType) -> None:
    # Given a library served with an LLM that records its prompts
    completer = RecordingCompleter()
    served = TwinServices(completer=completer)  # type: ignore[arg-type]
    add(served.metadata, served.blobs, LIBRARY, sources(CORPUS))
    LocalRunner(served, served.lock, concurrency=1).run(LIBRARY)
    # When a completion type answers
    result = run(served, kind, "Who built the first compiler at Remington Rand?")
    # Then one call was made, with the context in its prompt, and its answer is returned
    assert result.answer == "Grace Hopper." and result.notice is None
    assert len(completer.prompts) == 1 and result.context in completer.prompts[0]


def test_rag_context_numbers_the_chunks(services: TwinServices) -> None:
    result = run(services, SearchType.RAG_COMPLETION, "Grace Hopper compiler", only_context=True, top_k=2)
    assert result.context.startswith(f"[1] {result.results[0].text}\n\n[2] {result.results[1].text}")


@pytest.mark.parametrize("kind", [*NEW_TYPES, SearchType.CHUNKS, SearchType.GRAPH_COMPLETION])
def test_another_datasets_data_never_appears(services: TwinServices, kind: SearchType) -> None:
    # Given a secret dataset that shares the entity Grace Hopper with the library
    query = "Grace Hopper secretly designed the Zephyr Engine in Oslo"
    # When the library is searched for the secret's very text
    mine = run(services, kind, query, only_context=True)
    # Then nothing of the secret dataset comes back
    secret = documents(services, SECRET)["zephyr.txt"]
    assert all(hit.dataset == "library" for hit in mine.results)
    assert all(hit.data_id != secret.data_id and hit.document_id != secret.id for hit in mine.results)
    assert "Zephyr" not in mine.context and "Oslo" not in mine.context
    # And an empty dataset gives nothing at all
    empty = run(services, kind, query, only_context=True, scopes=[Scope(tenant="t1", dataset="empty")])
    assert empty.results == [] and empty.context == ""
    # And another tenant's dataset of the same name neither
    other = run(services, kind, query, only_context=True, scopes=[Scope(tenant="t2", dataset="secret")])
    assert other.results == []


def test_hybrid_searches_each_requested_scope(services: TwinServices) -> None:
    result = run(
        services,
        SearchType.HYBRID_COMPLETION,
        "Zephyr Engine compiler",
        only_context=True,
        scopes=[LIBRARY, SECRET],
    )
    assert {hit.dataset for hit in result.results} == {"library", "secret"}
    secret = documents(services, SECRET)["zephyr.txt"]
    assert [hit.document_id for hit in result.results if hit.dataset == "secret"] == [secret.id]


@pytest.mark.parametrize(("chunks_depth", "chunk_searches"), [(40, 1), (5, 2)])
def test_hybrid_walk_starts_from_the_chunks_lane_when_it_went_deep_enough(
    services: TwinServices, monkeypatch: pytest.MonkeyPatch, chunks_depth: int, chunk_searches: int
) -> None:
    """The graph lane's walk needs the 10 closest chunks: the chunks lane's 40 hold them, its 5 do not."""
    searched: list[str] = []
    inner = services.vectors.search

    def search(scope: Scope, name: str, *args: object, **kwargs: object) -> object:
        searched.append(name)
        return inner(scope, name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(services.vectors, "search", search)
    options = {"depths": {"chunks": chunks_depth}}
    result = run(
        services, SearchType.HYBRID_COMPLETION, "Grace Hopper compiler", only_context=True, options=options
    )
    assert result.results
    assert searched.count(collection.CHUNKS) == chunk_searches


def test_hybrid_reads_no_chunk_payload_from_the_vector_index_when_the_graph_has_the_chunks(
    services: TwinServices, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hits' text comes from the graph's chunk nodes: copying the chunks' payloads out of the
    index (their text, a kilobyte each) was wasted. Only their feedback weight is read."""
    fields: list[object] = []
    inner = services.vectors.search

    def search(scope: Scope, name: str, vector: list[float], limit: int, asked: object = None) -> object:
        if name == collection.CHUNKS:
            fields.append(asked)
        return inner(scope, name, vector, limit, asked)  # type: ignore[arg-type]

    monkeypatch.setattr(services.vectors, "search", search)
    result = run(services, SearchType.HYBRID_COMPLETION, "Grace Hopper compiler", only_context=True)
    assert result.results and all(hit.text for hit in result.results)
    assert fields == [("weight",)]


def test_hybrid_reads_no_payload_from_the_lexical_index(
    services: TwinServices, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lexical lane ranks ids; the hits' text comes from the graph (a chunk it lacks: from the
    vector index). Reading and decoding the texts' payloads cost a query half a millisecond."""
    asked: list[object] = []
    inner = services.lexical.search

    def search(scope: Scope, query: str, limit: int, **options: object) -> object:
        asked.append(options.get("payloads", True))
        return inner(scope, query, limit, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(services.lexical, "search", search)
    result = run(services, SearchType.HYBRID_COMPLETION, "Grace Hopper compiler", only_context=True)
    assert result.results and all(hit.text for hit in result.results)
    assert asked == [False]


def test_hybrid_reads_the_provenance_of_its_chunks_alone(
    services: TwinServices, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hit's data item is its chunk's; the facts' ends are named, never cited. An entity is
    supported by every item that mentions it: on the full 2Wiki store, their provenance was 500
    rows a question."""
    asked: list[tuple[list[str], bool]] = []
    inner = services.graph.get_nodes

    def get_nodes(scope: Scope, node_ids: list[str], *, provenance: bool = True) -> list[GraphNode]:
        asked.append((list(node_ids), provenance))
        return inner(scope, node_ids, provenance=provenance)

    monkeypatch.setattr(services.graph, "get_nodes", get_nodes)
    result = run(services, SearchType.HYBRID_COMPLETION, "Grace Hopper compiler", only_context=True, top_k=3)
    chunks = {hit.chunk_id for hit in result.results}
    assert result.results and all(hit.data_id for hit in result.results)
    assert "Grace Hopper -> built compiler at -> Remington Rand" in result.context
    with_provenance = {node for ids, provenance in asked if provenance for node in ids}
    assert with_provenance == chunks


def test_rank_fusion_sums_weighted_reciprocal_ranks() -> None:
    # Given two lanes that disagree, and a lane switched off
    lanes = {"a": ["x", "y", "x"], "b": ["y", "z"], "off": ["w"]}
    # When fused with k = 60
    fused = reciprocal_rank_fusion(lanes, {"a": 1.0, "b": 2.0, "off": 0.0}, k=60)
    # Then y leads (in both lanes), an item repeated in a lane counts once, the switched-off lane adds nothing
    assert [entry.id for entry in fused] == ["y", "z", "x"]
    by_id = {entry.id: entry for entry in fused}
    assert by_id["y"].score == pytest.approx(1 / 62 + 2 / 61)
    assert by_id["x"].score == pytest.approx(1 / 61) and by_id["x"].ranks == {"a": 1}
    assert FusionConfig(weights={"chunks": 1.0, "facts": 0.5}).best_score() == pytest.approx(1.5 / 61)


def test_fusion_options_are_validated() -> None:
    config = FusionConfig.model_validate({"depths": {"chunks": 5}, "unrelated": True})
    assert (config.depth("chunks"), config.depth("lexical")) == (5, 20)
    with pytest.raises(ValueError, match="depths"):
        FusionConfig.model_validate({"depths": {"chunks": 0}})
    # A lane misspelt or weighed below zero is an error, not a lane silently off
    with pytest.raises(ValueError, match="'fact'.*lanes are chunks, lexical"):
        FusionConfig.model_validate({"weights": {"chunks": 1.0, "fact": 0.5}})
    with pytest.raises(ValueError, match="'chunk'"):
        FusionConfig.model_validate({"depths": {"chunk": 5}})
    with pytest.raises(ValueError, match="weights"):
        FusionConfig.model_validate({"weights": {"chunks": -1.0}})
