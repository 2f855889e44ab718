"""What the load keeps and checks of a model's extraction: each repair or drop is counted."""

from __future__ import annotations

from kenning.pipeline.assembly import Assembly, assemble
from kenning.pipeline.checks import (
    DEFAULT_ENTITY_TYPES,
    DESCRIPTIONS_DROPPED,
    ENTITIES_FROM_FACTS,
    FACTS_DROPPED,
    TYPES_MAPPED,
    entity_type,
    fact_end,
    follow_up_question,
    mentions,
    one_of,
)
from kenning.pipeline.models import (
    ChunkRecord,
    DocumentRecord,
    Edge,
    Entity,
    EntityType,
    Extraction,
    KnowledgeEdge,
    KnowledgeGraph,
    KnowledgeNode,
    Scope,
    stable_id,
)

TEXT = (
    "Elinor Vance founded the keepers' guild at Harrow Point. Her father Samuel Vance kept the light, "
    "and in 1931 the guild rescued the crew of the Marigold."
)
SCOPE = Scope(tenant="acme", dataset="lighthouse")


def assembled(
    nodes: list[KnowledgeNode], edges: list[KnowledgeEdge], types: tuple[str, ...] = DEFAULT_ENTITY_TYPES
) -> Assembly:
    record = ChunkRecord(
        id=stable_id("chunk"),
        dataset_id="ds",
        document_id=stable_id("doc"),
        data_id=stable_id("item"),
        index=1,
        text=TEXT,
        token_count=40,
        text_hash=stable_id(TEXT),
    )
    document = DocumentRecord(
        id=record.document_id, dataset_id="ds", data_id=record.data_id, name="guild", kind="text"
    )
    extraction = Extraction(graph=KnowledgeGraph(nodes=nodes, edges=edges), summary="")
    return assemble("run", SCOPE, [(record, document, extraction)], {}, entity_types=types)


def entities(assembly: Assembly) -> dict[str, Entity]:
    return {node.name: node for node in assembly.nodes.values() if isinstance(node, Entity)}


def facts(assembly: Assembly) -> list[tuple[str, str, str]]:
    names = {node.id: getattr(node, "name", "") for node in assembly.nodes.values()}
    return sorted(
        (names[edge.source_id], edge.relationship, names[edge.target_id])
        for edge in assembly.edges.values()
        if isinstance(edge, Edge) and edge.relationship not in {"contains", "is_a", "is_part_of", "made_from"}
    )


ELINOR = KnowledgeNode(
    id="e1", name="Elinor Vance", type="Person", description="Elinor Vance founded the guild."
)
GUILD = KnowledgeNode(
    id="g1", name="keepers' guild", type="Organization", description="The keepers' guild rescued a crew."
)


def test_a_fact_whose_end_the_model_did_not_list_makes_that_entity() -> None:
    # Given facts naming Samuel Vance and the Marigold, which the model did not list as nodes
    edges = [
        KnowledgeEdge(source="e1", target="Samuel Vance (Person)", relationship="daughter_of"),
        KnowledgeEdge(source="g1", target="Marigold", relationship="rescued_crew_of"),
        KnowledgeEdge(source="samuel_vance", target="g1", relationship="kept_light_for"),
    ]

    assembly = assembled([ELINOR, GUILD], edges)

    # Then every fact is kept, its missing ends made entities (typed by a hint, else generic), counted
    assert facts(assembly) == [
        ("Elinor Vance", "daughter_of", "Samuel Vance"),
        ("Samuel Vance", "kept_light_for", "keepers' guild"),
        ("keepers' guild", "rescued_crew_of", "Marigold"),
    ]
    found = entities(assembly)
    assert found["Samuel Vance"].entity_type == "Person"
    assert found["Marigold"].entity_type == ""
    assert assembly.checks[ENTITIES_FROM_FACTS] == 2
    assert assembly.checks[FACTS_DROPPED] == 0
    # And a made entity is contained by the chunk, like a listed one
    contained = {e.target_id for e in assembly.edges.values() if e.relationship == "contains"}
    assert {found["Marigold"].id, found["Samuel Vance"].id} <= contained


def test_a_fact_whose_end_is_a_key_naming_nothing_or_itself_is_dropped_and_counted() -> None:
    edges = [
        KnowledgeEdge(source="e1", target="n7", relationship="knows"),
        KnowledgeEdge(source="e1", target="Elinor Vance", relationship="is"),
    ]

    assembly = assembled([ELINOR], edges)

    assert facts(assembly) == []
    assert assembly.checks[FACTS_DROPPED] == 2
    assert "n7" not in entities(assembly)


def test_entity_types_outside_the_set_are_mapped_and_counted() -> None:
    nodes = [
        KnowledgeNode(id="a", name="Harrow Point", type="Location"),
        KnowledgeNode(id="b", name="Marigold", type="ship"),
        KnowledgeNode(id="c", name="Elinor Vance", type="person"),
        KnowledgeNode(id="d", name="whale oil", type="Fuel"),
    ]

    assembly = assembled(nodes, [])

    found = entities(assembly)
    assert {name: entity.entity_type for name, entity in found.items()} == {
        "Harrow Point": "Place",
        "Marigold": "Object",
        "Elinor Vance": "Person",
        "whale oil": "Concept",
    }
    assert assembly.checks[TYPES_MAPPED] == 3
    kinds = {node.name for node in assembly.nodes.values() if isinstance(node, EntityType)}
    assert kinds == {"Place", "Object", "Person", "Concept"}


def test_configured_types_are_kept_and_others_left_generic_without_a_generic_type() -> None:
    nodes = [
        KnowledgeNode(id="a", name="Marigold", type="Vessel"),
        KnowledgeNode(id="b", name="Elinor Vance", type="Keeper"),
    ]

    assembly = assembled(nodes, [], types=("Vessel", "Place"))

    found = entities(assembly)
    assert found["Marigold"].entity_type == "Vessel"
    assert found["Elinor Vance"].entity_type == ""
    assert assembly.checks[TYPES_MAPPED] == 1


def test_a_description_that_does_not_speak_of_its_entity_is_dropped_and_counted() -> None:
    nodes = [
        KnowledgeNode(id="p", name="Paris", type="Place", description="The first lamp burned whale oil."),
        ELINOR,
    ]

    assembly = assembled(nodes, [])

    found = entities(assembly)
    assert found["Paris"].description == ""
    assert found["Elinor Vance"].description == ELINOR.description
    assert assembly.checks[DESCRIPTIONS_DROPPED] == 1


def test_a_clean_extraction_counts_nothing() -> None:
    edges = [
        KnowledgeEdge(source="e1", target="g1", relationship="founded", description="Elinor founded it.")
    ]

    assembly = assembled([ELINOR, GUILD], edges)

    assert facts(assembly) == [("Elinor Vance", "founded", "keepers' guild")]
    assert sum(assembly.checks.values()) == 0


def test_entity_type_maps_by_the_words_of_a_type() -> None:
    assert entity_type("Sports Team", DEFAULT_ENTITY_TYPES) == ("Organization", True)
    assert entity_type("creative_work", DEFAULT_ENTITY_TYPES) == ("Work", True)
    assert entity_type("ORGANIZATION", DEFAULT_ENTITY_TYPES) == ("Organization", False)
    assert entity_type("", DEFAULT_ENTITY_TYPES) == ("", False)


def test_mentions_reads_any_word_of_the_name() -> None:
    assert mentions("Vance kept the light.", "Samuel Vance")
    assert not mentions("The first lamp burned whale oil.", "Paris")
    assert mentions("Born in 1931.", "1931")


def test_fact_end_tells_names_from_keys() -> None:
    assert fact_end("n12", ["Ada"]) is None
    assert fact_end("node_3", ["Ada"]) is None
    assert fact_end("7", ["Ada"], keys=["1", "2"]) is None
    assert fact_end("1931", ["Ada"], keys=["a", "b"]) == ("1931", "Date")
    assert fact_end("harrow_point", ["Harrow Point"]) == ("Harrow Point", "")
    assert fact_end("Samuel Vance (Person)", []) == ("Samuel Vance", "Person")


def test_a_follow_up_must_be_a_question() -> None:
    assert follow_up_question("Who founded the keepers' guild?") == "Who founded the keepers' guild?"
    assert follow_up_question('Follow-up question: "When was the light converted?"') == (
        "When was the light converted?"
    )
    assert follow_up_question("Henry-Lepaute") is None
    assert follow_up_question("Elinor Vance founded it.") is None


def test_a_router_reply_must_name_one_type() -> None:
    types = ["CHUNKS", "GRAPH_COMPLETION", "TEMPORAL"]
    assert one_of("GRAPH_COMPLETION", types) == "GRAPH_COMPLETION"
    assert one_of("`temporal`.", types) == "TEMPORAL"
    assert one_of("CHUNKS or GRAPH_COMPLETION", types) is None
    assert one_of("I would search the graph.", types) is None
