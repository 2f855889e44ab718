"""Entity linking in the offline graph: one node per name, aliases, title entities, fewer, better edges."""

from __future__ import annotations

from collections import defaultdict

import pytest

from kenning.pipeline.chunking import ChunkingConfig
from kenning.pipeline.context import PipelineConfig
from kenning.pipeline.ingest import Source, add
from kenning.pipeline.linking import (
    canonical_name,
    document_title,
    first_sentence,
    name_key,
    title_entity_name,
)
from kenning.pipeline.models import GraphEdge, GraphNode, KnowledgeGraph, Scope
from kenning.pipeline.offline import OfflineExtractor
from kenning.workers.runtime.local_runner import LocalRunner
from tests.twins import TwinServices

SCOPE = Scope(tenant="t1", dataset="wiki")
FILM = "Film X\n\nFilm X is a 1990 film directed by John Smith. It was released in France."
DIRECTOR = (
    "John Smith (director)\n\nJohn Smith (1920-1990) was an American director. His father was Paul Smith."
)


def edges_of(graph: KnowledgeGraph) -> set[tuple[str, str, str]]:
    return {(edge.source, edge.relationship, edge.target) for edge in graph.edges}


def extract(text: str) -> KnowledgeGraph:
    return OfflineExtractor().extract(text).graph


def cognify(
    corpus: dict[str, str], config: PipelineConfig | None = None
) -> tuple[list[GraphNode], list[GraphEdge]]:
    services = TwinServices(config=config or PipelineConfig())
    add(
        services.metadata,
        services.blobs,
        SCOPE,
        [Source(name=n, uri=f"test:{n}", data=t.encode()) for n, t in corpus.items()],
    )
    run = LocalRunner(services, services.lock, concurrency=2).run(SCOPE)
    assert run.status.value == "completed", run.error
    return services.graph.export(SCOPE)


@pytest.mark.parametrize(
    ("variants", "expected"),
    [
        (["John Smith", "john  smith", "John Smith's", "JOHN SMITH."], "John Smith"),
        (["The Beatles", "the Beatles", "Beatles’"], "Beatles"),
        (["Americans", "American"], "American"),
        (["films", "film"], "film"),
        (["Hassan Al- Qeed", "Hassan Al-Qeed"], "Hassan Al-Qeed"),
        (["Lothair II.", "Lothair II"], "Lothair II"),
    ],
)
def test_variants_of_a_name_share_one_key_and_read_well(variants: list[str], expected: str) -> None:
    # Given mentions that differ in case, spacing, punctuation, possessive, article or plural
    # When they are made canonical
    names = {canonical_name(variant) for variant in variants}
    # Then they are one readable name with one key
    assert {name_key(variant) for variant in variants} == {name_key(expected)}
    assert expected in names


def test_canonical_names_keep_what_tells_names_apart() -> None:
    assert canonical_name("Evans") == "Evans"  # a surname, not a plural
    assert canonical_name("Washington, D.C.") == "Washington, D.C."
    assert canonical_name("Inc.") != ""
    assert name_key("Paul Smith") != name_key("John Smith")


def test_a_title_is_a_short_first_line_followed_by_text() -> None:
    assert document_title(FILM) == "Film X"
    assert document_title("# Grace Hopper\n\nGrace Hopper built a compiler.") == "Grace Hopper"
    assert document_title("Title\n=====\n\nBody text.") == "Title"
    assert document_title("Film X is a 1990 film.\n\nMore text follows.") == ""
    assert document_title("Film X") == ""
    assert document_title("hello there\n\nHow are you?") == ""
    pep = "PEP: 8\nTitle: Style Guide for Python Code\nAuthor: Guido van Rossum\n\nIntroduction"
    assert document_title(pep) == "Style Guide for Python Code"
    assert document_title(" ".join(pep.split("\n", 2)[:2]) + " " + pep.split("\n", 2)[2]) == (
        "Style Guide for Python Code"
    )
    assert title_entity_name("John Smith (director)") == "John Smith"


def test_relations_join_neighbours_through_a_phrase_and_never_every_pair() -> None:
    # Given a sentence with a list of names after its subject
    text = "Pieces of Eight is an album by The Band, Bob Dylan and Joni Mitchell, recorded in London."
    # When it is extracted
    edges = edges_of(extract(text))
    # Then the subject relates to its neighbour by the phrase, the list members are not related
    # to each other, and no edge is a nameless `related_to`
    assert ("pieces of eight", "is_album_by", "band") in edges
    assert ("pieces of eight", "recorded_in", "london") in edges
    listed = {"band", "bob dylan", "joni mitchell"}
    assert not [e for e in edges if e[0] in listed and e[2] in listed]
    assert all(relationship != "related_to" for _, relationship, _ in edges)
    assert len(edges) <= 3


def test_a_date_or_a_modifier_is_not_the_subject_of_a_relation() -> None:
    graph = extract("The Tender Years is a 1948 American drama film directed by Harold D. Schuster.")
    assert edges_of(graph) >= {("tender years", "directed_by", "harold d. schuster")}
    assert not [e for e in edges_of(graph) if e[0] in {"1948", "american"}]


@pytest.mark.parametrize(
    ("text", "name", "alias"),
    [
        (
            "Forbidden Ground, also known as Battle Ground, is a 2013 film.",
            "forbidden ground",
            "battle ground",
        ),
        ("The Federal Bureau of Investigation (FBI) is an agency.", "federal bureau of investigation", "fbi"),
        (
            "Marilyn Monroe (born Norma Jeane Mortenson; 1926) was an actress.",
            "marilyn monroe",
            "norma jeane mortenson",
        ),
        (
            "Eduardo De Filippo (1900 – 1984), known simply as Eduardo, was an actor.",
            "eduardo de filippo",
            "eduardo",
        ),
    ],
)
def test_apposition_makes_an_alias(text: str, name: str, alias: str) -> None:
    graph = extract(text)
    assert (name, "also_known_as", alias) in edges_of(graph)
    assert {name, alias} <= {node.id for node in graph.nodes}


def test_a_later_mention_of_an_alias_is_the_named_entity() -> None:
    graph = extract("The Federal Bureau of Investigation (FBI) is an agency. The FBI was founded in 1908.")
    assert ("federal bureau of investigation", "founded_in", "1908") in edges_of(graph)


def test_a_pronoun_stands_for_the_title() -> None:
    edges = edges_of(extract(DIRECTOR)) | edges_of(extract(FILM))
    assert ("john smith", "father_was", "paul smith") in edges
    assert ("film x", "released_in", "france") in edges


def test_a_multi_hop_chain_runs_through_one_entity_node() -> None:
    # Given a film's paragraph naming its director, and the director's paragraph naming his father
    nodes, edges = cognify({"Film X": FILM, "John Smith (director)": DIRECTOR})
    chunks = {n.id: n.properties["text"] for n in nodes if n.type == "DocumentChunk"}
    entities = {n.id: n.properties["name"] for n in nodes if n.type == "Entity"}
    contained: dict[str, set[str]] = defaultdict(set)
    for edge in edges:
        if edge.source_id in chunks and edge.target_id in entities:
            contained[edge.target_id].add(chunks[edge.source_id])
    # Then one entity node, John Smith, is contained by both paragraphs' chunks
    shared = [entities[e] for e, texts in contained.items() if len(texts) == 2]
    assert shared == ["John Smith"]
    # and the father hangs off that node
    by_name = {name: i for i, name in entities.items()}
    relation = {(e.source_id, e.relationship, e.target_id) for e in edges}
    assert (by_name["John Smith"], "father_was", by_name["Paul Smith"]) in relation
    # and each title entity is linked to its paragraph's chunk
    assert {entities[e] for e, texts in contained.items() if any(t.startswith("Film X") for t in texts)} >= {
        "Film X",
        "John Smith",
    }


def test_every_chunk_of_a_document_contains_its_title_entity_across_load_batches() -> None:
    # Given a titled document long enough for several chunks, loaded one chunk per batch
    body = " ".join(f"Sentence {n} tells of the harbour and its keepers in detail." for n in range(40))
    config = PipelineConfig(chunking=ChunkingConfig(size=64, overlap=8), load_batch=1)
    nodes, edges = cognify({"harbour.md": f"# Harrow Point\n\n{body}"}, config)
    chunks = {n.id for n in nodes if n.type == "DocumentChunk"}
    title = next(n.id for n in nodes if n.type == "Entity" and n.properties["name"] == "Harrow Point")
    # Then every chunk contains the title's entity, and is about it
    assert len(chunks) > 2
    assert {e.source_id for e in edges if e.target_id == title and e.relationship == "contains"} == chunks
    about = [(e.source_id, e.target_id) for e in edges if e.relationship == "is_about"]
    assert sorted(about) == sorted((chunk, title) for chunk in chunks)


def test_the_title_entity_mentions_the_first_sentence_entities_no_fact_reaches() -> None:
    # Given a paragraph whose first sentence lists names that no relation phrase joins
    text = "Naked Tango\n\nNaked Tango is a 1991 film starring Vincent Rey, Mathilda May and Esai Morales."
    # When it is cognified
    nodes, edges = cognify({"Naked Tango": text})
    names = {n.id: n.properties["name"] for n in nodes if n.type == "Entity"}
    facts = {
        (names[e.source_id], e.relationship, names[e.target_id])
        for e in edges
        if {e.source_id, e.target_id} <= names.keys()
    }
    # Then the starring fact holds, and the title mentions the listed names the fact does not reach
    assert ("Naked Tango", "starring", "Vincent Rey") in facts
    assert {("Naked Tango", "mentions", "Mathilda May"), ("Naked Tango", "mentions", "Esai Morales")} <= facts
    assert ("Naked Tango", "mentions", "Vincent Rey") not in facts
    assert not [f for f in facts if f[0] in {"Mathilda May", "Esai Morales", "Vincent Rey"}]


def test_a_header_block_with_no_text_after_it_has_no_first_sentence() -> None:
    # Given a document that is only a header block naming its title (a rejected PEP's stub)
    header = "PEP: 210\nTitle: Decoupling the Interpreter Loop\nAuthor: David Ascher\nStatus: Rejected"
    # Then it has no first sentence, and the offline extractor reads it without failing
    assert first_sentence(header) == ""
    assert [node.name for node in OfflineExtractor().extract(header).graph.nodes][:1] == [
        "Decoupling the Interpreter Loop"
    ]


def test_a_name_written_with_stress_marks_is_one_name_not_its_pieces() -> None:
    # Given Russian names with combining stress marks, as Wikipedia writes them
    names = {node.name for node in extract("Серге́й Алекса́ндрович То́карев was a Russian scholar.").nodes}
    # Then the name is whole: no piece cut at a mark ("Серге") that other Sergeis would share
    assert "Серге́й Алекса́ндрович То́карев" in names
    assert not names & {"Серге", "Алекса", "То"}


@pytest.mark.parametrize("verb", ["Did", "Does", "Was", "Is", "Were", "Has", "Can"])
def test_a_question_opening_with_a_verb_names_what_follows_it(verb: str) -> None:
    names = {node.name for node in extract(f"{verb} John Updike and Tom Clancy both write novels?").nodes}
    assert {"John Updike", "Tom Clancy"} <= names
    assert not any(name.startswith(verb) for name in names)
