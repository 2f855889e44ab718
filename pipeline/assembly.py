"""Turn chunk extractions into deduplicated data points, edges and vector points."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kenning.pipeline.checks import (
    DEFAULT_ENTITY_TYPES,
    DESCRIPTIONS_DROPPED,
    ENTITIES_FROM_FACTS,
    FACTS_DROPPED,
    TYPES_MAPPED,
    entity_type,
    fact_end,
    mentions,
)
from kenning.pipeline.collection import EDGES, TRIPLETS, collection_name
from kenning.pipeline.linking import document_title, first_sentence, name_key, title_entity_name
from kenning.pipeline.models import (
    Chunk,
    ChunkRecord,
    DataPoint,
    Document,
    DocumentRecord,
    Edge,
    Entity,
    EntityType,
    Extraction,
    GraphEdge,
    GraphNode,
    Provenance,
    Scope,
    TextSummary,
    normalize_name,
)
from kenning.pipeline.temporal import Event, Timestamp, extract_events, stated_time
from kenning.pipeline.validity import SAID, merged_statements, statement

_RELATION = re.compile(r"[^a-z0-9]+")
MAX_RELATION_CHARS = 64
# Edges the pipeline itself draws between a document, its chunks, summaries, entities and types.
STRUCTURAL_RELATIONSHIPS = frozenset({"is_part_of", "contains", "is_a", "made_from", "is_about"})
# A titled document's chunk -> its title's entity, beside `contains`: the entity's own document,
# where a walk from a mention of it should go, apart from every other chunk that names it.
ABOUT_RELATIONSHIP = "is_about"
# A document's title entity -> the entities of its first sentence: a paragraph is about its title.
TITLE_RELATIONSHIP = "mentions"
_MAX_TITLE_LINKS = 8


def relation_name(text: str) -> str:
    """A safe snake_case relationship name; anything else becomes `related_to`."""
    name = _RELATION.sub("_", text.casefold()).strip("_")[:MAX_RELATION_CHARS]
    return name or "related_to"


@dataclass
class Assembly:
    """Everything one load batch writes, deduplicated by id in first-seen order; `checks` counts
    what was repaired or dropped of the extractions it was built from (`kenning.pipeline.checks`)."""

    nodes: dict[str, DataPoint] = field(default_factory=dict)
    edges: dict[str, Edge] = field(default_factory=dict)
    chunk_of: dict[str, str] = field(default_factory=dict)
    checks: Counter[str] = field(default_factory=Counter)

    def add_node(self, node: DataPoint, chunk_id: str) -> str:
        existing = self.nodes.setdefault(node.id, node)
        if existing is not node:
            if _source_of(node) < _source_of(existing):
                self.nodes[node.id], node, existing = node, existing, node
            _merge_sources(existing.data_ids, node.data_ids)
            _merge_sources(existing.node_sets, node.node_sets)
        self._seen_in(node.id, chunk_id)
        return node.id

    def add_edge(self, edge: Edge, chunk_id: str) -> None:
        existing = self.edges.setdefault(edge.id, edge)
        if existing is not edge:
            # The edge from the smallest chunk keeps its properties, as in the stores.
            if chunk_id < self.chunk_of[edge.id]:
                self.edges[edge.id], edge, existing = edge, existing, edge
            _merge_sources(existing.data_ids, edge.data_ids)
            existing.said = merged_statements(existing.said, edge.said)
        self._seen_in(edge.id, chunk_id)

    @property
    def chunk_ids(self) -> set[str]:
        """The chunks the batch's graph was built from (each at least adds its own node)."""
        return set(self.chunk_of.values())

    def _seen_in(self, element_id: str, chunk_id: str) -> None:
        # The smallest chunk id, whatever the order the chunks come in (see `edge_prevails`).
        self.chunk_of[element_id] = min(self.chunk_of.get(element_id, chunk_id), chunk_id)


def _source_of(node: DataPoint) -> tuple[str, str]:
    return (node.source.data_id, node.source.chunk_id) if node.source else ("", "")


# An element made from several data items or chunks keeps the properties written from the
# smallest (data item id, chunk id), whichever was loaded first: a run resumed after a fault, or
# with its batches in another order, ends with the same properties. A write from the same source
# (or one without a source: an update, such as a feedback weight) replaces them.
SOURCE_OF_NODE = ("source_data_id", "source_chunk")
SOURCE_OF_EDGE = ("chunk_id",)


def node_prevails(new: dict[str, Any], stored: dict[str, Any]) -> bool:
    """Whether a node's new properties replace its stored ones."""
    return _prevails(new, stored, SOURCE_OF_NODE)


def edge_prevails(new: dict[str, Any], stored: dict[str, Any]) -> bool:
    """Whether an edge's new properties replace its stored ones."""
    return _prevails(new, stored, SOURCE_OF_EDGE)


def over_edge(edge: GraphEdge, stored: GraphEdge) -> GraphEdge:
    """The edge to write over `stored`, as every graph store merges them: its data ids unioned,
    its statements too (each says when the fact began: `kenning.pipeline.validity`), the
    properties of the one that prevails. So they do not depend on the order of writes."""
    winner = edge if edge_prevails(edge.properties, stored.properties) else stored
    properties = dict(winner.properties)
    said = (edge.properties.get(SAID), stored.properties.get(SAID))
    if any(isinstance(value, list) for value in said):
        properties[SAID] = merged_statements(*(value for value in said if isinstance(value, list)))
    data_ids = sorted({*stored.data_ids, *edge.data_ids})
    return edge.model_copy(update={"properties": properties, "data_ids": data_ids})


def _prevails(new: dict[str, Any], stored: dict[str, Any], keys: tuple[str, ...]) -> bool:
    new_source = tuple(str(new.get(key) or "") for key in keys)
    stored_source = tuple(str(stored.get(key) or "") for key in keys)
    if not (new_source[0] and stored_source[0]):
        return True
    return new_source <= stored_source


def _merge_sources(target: list[str], extra: Iterable[str]) -> None:
    # Sorted: the same list whatever the order its parts were seen in.
    target[:] = sorted({*target, *extra})


def assemble(
    run_id: str,
    scope: Scope,
    chunks: list[tuple[ChunkRecord, DocumentRecord, Extraction]],
    content_hashes: dict[str, str],
    temporal: bool = False,
    node_sets: dict[str, list[str]] | None = None,
    titles: dict[str, str] | None = None,
    entity_types: Sequence[str] = DEFAULT_ENTITY_TYPES,
    times: dict[str, tuple[str, str]] | None = None,
) -> Assembly:
    """Build the graph of a batch of extracted chunks, in chunk order (with dated events, if `temporal`).

    `times` maps a data item's id to (its moment, when it was added): each fact of its chunks
    keeps its statement, with when the sentence says it began (`kenning.pipeline.validity`).

    `node_sets` maps a data item's id to the node sets its document, chunks, summaries and entities join.
    `titles` maps a document id to the title its text opens with (`linking.document_title`); a document
    not in it takes the title of its first chunk, if that chunk is in the batch. Every chunk of a titled
    document contains the title's entity.

    What a model returns is kept and checked: an entity's type is one of `entity_types` (another is
    mapped), its description is kept only when it speaks of the entity, and a fact whose end names no
    listed entity makes that entity; each change is counted in `Assembly.checks`.
    """
    assembly = Assembly()
    titles = {**_batch_titles(chunks), **(titles or {})}
    for record, document, extraction in chunks:
        source = Provenance(
            data_id=record.data_id,
            content_hash=content_hashes.get(record.data_id, ""),
            run_id=run_id,
            task="load",
            chunk_id=record.id,
        )
        sets = (node_sets or {}).get(record.data_id, [])
        title = titles.get(record.document_id, "")
        when = (times or {}).get(record.data_id)
        _add_chunk(assembly, scope, source, record, document, extraction, sets, title, entity_types, when)
        if temporal:
            _add_events(assembly, scope, source, record)
    return assembly


def _add_events(assembly: Assembly, scope: Scope, source: Provenance, record: ChunkRecord) -> None:
    """Event and Timestamp nodes for every sentence of the chunk that mentions a date."""
    common: dict[str, Any] = {"tenant": scope.tenant, "dataset": scope.dataset, "source": source}
    for sentence, start, end, label in extract_events(record.text):
        event = Event(name=sentence[:80], text=sentence, time_from=start, time_to=end, label=label, **common)
        stamp = Timestamp(label=label, time_from=start, time_to=end, **common)
        assembly.add_node(event, record.id)
        assembly.add_node(stamp, record.id)
        _link(assembly, scope, source, record.id, event.id, "mentions_event", record.id)
        _link(assembly, scope, source, event.id, stamp.id, "happened_at", record.id)


def _add_chunk(
    assembly: Assembly,
    scope: Scope,
    source: Provenance,
    record: ChunkRecord,
    document: DocumentRecord,
    extraction: Extraction,
    node_sets: list[str],
    title: str = "",
    entity_types: Sequence[str] = DEFAULT_ENTITY_TYPES,
    when: tuple[str, str] | None = None,
) -> None:
    common: dict[str, Any] = {"tenant": scope.tenant, "dataset": scope.dataset, "source": source}
    common["node_sets"] = node_sets
    doc = Document(
        name=document.name, kind=document.kind, data_id=document.data_id, mime=document.mime, **common
    )
    chunk = Chunk(
        text=record.text, index=record.index, document_id=doc.id, token_count=record.token_count, **common
    )
    assembly.add_node(doc, record.id)
    assembly.add_node(chunk, record.id)
    _link(assembly, scope, source, chunk.id, doc.id, "is_part_of", record.id)
    if extraction.summary.strip():
        summary = TextSummary(text=extraction.summary.strip(), chunk_id=chunk.id, **common)
        assembly.add_node(summary, record.id)
        _link(assembly, scope, source, summary.id, chunk.id, "made_from", record.id)
    ids = _add_knowledge(assembly, scope, source, chunk.id, extraction, common, entity_types, when)
    if title:
        _add_title(assembly, scope, source, (chunk.id, record), extraction, ids, title, common)


def _add_knowledge(
    assembly: Assembly,
    scope: Scope,
    source: Provenance,
    chunk_id: str,
    extraction: Extraction,
    common: dict[str, Any],
    entity_types: Sequence[str] = DEFAULT_ENTITY_TYPES,
    when: tuple[str, str] | None = None,
) -> dict[str, str]:
    """The chunk's entities and their facts, each with its statement when `when` gives the
    text's (moment, time added); returns extraction node id -> entity id."""
    place = _Place(assembly, scope, source, chunk_id, common, entity_types)
    ids: dict[str, str] = {}
    for node in extraction.graph.nodes:
        name = node.name.strip() or node.id.strip()
        if not name:
            continue
        kind, mapped = entity_type(node.type, entity_types)
        assembly.checks[TYPES_MAPPED] += mapped
        description = node.description.strip()
        if description and not mentions(description, name):
            assembly.checks[DESCRIPTIONS_DROPPED] += 1
            description = ""
        entity = Entity(name=name, entity_type=kind, description=description, **common)
        ids[node.id] = place.add_entity(entity)
        ids.setdefault(normalize_name(name), entity.id)
    listed = [(node.id, node.name) for node in extraction.graph.nodes]
    for fact in extraction.graph.edges:
        source_id, target_id = (place.end_of(ids, listed, end) for end in (fact.source, fact.target))
        if not source_id or not target_id or source_id == target_id:
            assembly.checks[FACTS_DROPPED] += 1
            continue
        edge = Edge(
            source_id=source_id,
            target_id=target_id,
            relationship=relation_name(fact.relationship),
            description=fact.description.strip(),
            data_ids=[source.data_id],
            tenant=scope.tenant,
            dataset=scope.dataset,
        )
        if when is not None:
            at = stated_time(edge.description, when[0])
            edge.said = [statement(source.data_id, source.chunk_id, at, when[1])]
        assembly.add_edge(edge, chunk_id)
    return ids


@dataclass(frozen=True)
class _Place:
    """Where a chunk's knowledge goes: the batch's assembly, for one chunk."""

    assembly: Assembly
    scope: Scope
    source: Provenance
    chunk_id: str
    common: dict[str, Any]
    entity_types: Sequence[str]

    def add_entity(self, entity: Entity) -> str:
        """The entity, contained by the chunk, and its type; its id."""
        entity_id = self.assembly.add_node(entity, self.chunk_id)
        self.link(self.chunk_id, entity_id, "contains")
        if entity.entity_type:
            kind = EntityType(name=entity.entity_type, **self.common)
            self.assembly.add_node(kind, self.chunk_id)
            self.link(entity_id, kind.id, "is_a")
        return entity_id

    def end_of(self, ids: dict[str, str], listed: list[tuple[str, str]], reference: str) -> str:
        """The entity a fact's end names: a listed one (by id, then name), else one made for it
        (typed by the end's hint, or left generic); "" for a key of the model's that names nothing."""
        found = ids.get(reference) or ids.get(normalize_name(reference))
        end = None if found else fact_end(reference, [name for _, name in listed], [key for key, _ in listed])
        if found or end is None:
            return found or ""
        name, hint = end
        found = ids.get(normalize_name(name))
        if not found:
            kind = entity_type(hint, self.entity_types)[0] if hint else ""
            found = self.add_entity(Entity(name=name, entity_type=kind, **self.common))
            self.assembly.checks[ENTITIES_FROM_FACTS] += 1
            ids[normalize_name(name)] = found
        ids[reference] = found
        return found

    def link(self, source_id: str, target_id: str, relationship: str) -> None:
        _link(self.assembly, self.scope, self.source, source_id, target_id, relationship, self.chunk_id)


def _batch_titles(chunks: list[tuple[ChunkRecord, DocumentRecord, Extraction]]) -> dict[str, str]:
    found = {record.document_id: document_title(record.text) for record, _, _ in chunks if record.index == 0}
    return {document_id: title for document_id, title in found.items() if title}


def _add_title(
    assembly: Assembly,
    scope: Scope,
    source: Provenance,
    chunk: tuple[str, ChunkRecord],
    extraction: Extraction,
    ids: dict[str, str],
    title: str,
    common: dict[str, Any],
) -> None:
    """The title's entity (the extraction's node of that name, if any), contained by the chunk;
    in the document's first chunk, it mentions the entities of the first sentence in no fact."""
    (chunk_id, record), name = chunk, title_entity_name(title)
    nodes = {node.id: node for node in extraction.graph.nodes if node.id in ids}
    title_id = next((ids[i] for i, node in nodes.items() if name_key(node.name) == name_key(name)), "")
    if not title_id:
        title_id = assembly.add_node(Entity(name=name, **common), chunk_id)
    _link(assembly, scope, source, chunk_id, title_id, "contains", chunk_id)
    _link(assembly, scope, source, chunk_id, title_id, ABOUT_RELATIONSHIP, chunk_id)
    if record.index != 0:
        return
    sentence = first_sentence(record.text)
    # An entity that takes part in a fact is reached through it; the title links the others.
    linked = {ids.get(fact.source) for fact in extraction.graph.edges}
    linked |= {ids.get(fact.target) for fact in extraction.graph.edges}
    mentioned = [
        ids[i]
        for i, node in nodes.items()
        if node.type.casefold() != "date" and node.name.casefold() in sentence.casefold()
    ]
    targets = [i for i in dict.fromkeys(mentioned) if i not in linked and i != title_id]
    for target_id in targets[:_MAX_TITLE_LINKS]:
        edge = Edge(
            source_id=title_id,
            target_id=target_id,
            relationship=TITLE_RELATIONSHIP,
            description=sentence,
            data_ids=[source.data_id],
            tenant=scope.tenant,
            dataset=scope.dataset,
        )
        assembly.add_edge(edge, chunk_id)


def _link(
    assembly: Assembly,
    scope: Scope,
    source: Provenance,
    source_id: str,
    target_id: str,
    relationship: str,
    chunk_id: str,
) -> None:
    edge = Edge(
        source_id=source_id,
        target_id=target_id,
        relationship=relationship,
        data_ids=[source.data_id],
        tenant=scope.tenant,
        dataset=scope.dataset,
    )
    assembly.add_edge(edge, chunk_id)


def graph_node(node: DataPoint) -> GraphNode:
    return GraphNode(id=node.id, type=node.type_name(), properties=node.properties(), data_ids=node.data_ids)


def graph_edge(edge: Edge, chunk_id: str) -> GraphEdge:
    properties: dict[str, Any] = {"description": edge.description, "chunk_id": chunk_id}
    if edge.said:
        properties[SAID] = edge.said
    # Unchecked: every field comes from the edge, checked when it was made; checking a batch's
    # thousand edges again cost the load worker more than writing them.
    return GraphEdge.model_construct(
        id=edge.id,
        source_id=edge.source_id,
        target_id=edge.target_id,
        relationship=edge.relationship,
        properties=properties,
        data_ids=list(edge.data_ids),
    )


@dataclass(frozen=True)
class IndexEntry:
    """One text to embed into one collection, with the payload its point carries."""

    collection: str
    point_id: str
    text: str
    payload: dict[str, Any]


def index_entries(assembly: Assembly) -> list[IndexEntry]:
    """The texts of every indexed field of the batch's nodes and edges."""
    entries: list[IndexEntry] = []
    for node in assembly.nodes.values():
        for field_name in node.index_fields:
            text = str(getattr(node, field_name) or "").strip()
            if text:
                payload = _payload(node, text, assembly.chunk_of[node.id])
                entries.append(IndexEntry(collection_name(type(node), field_name), node.id, text, payload))
    for edge in assembly.edges.values():
        if edge.description:
            payload = _edge_payload(assembly, edge, edge.description, "Edge")
            entries.append(IndexEntry(EDGES, edge.id, edge.description, payload))
        triplet = triplet_text(assembly, edge)
        if triplet:
            payload = _edge_payload(assembly, edge, triplet, "Triplet")
            entries.append(IndexEntry(TRIPLETS, edge.id, triplet, payload))
    return entries


def triplet_text(assembly: Assembly, edge: Edge) -> str:
    """`source -> relationship -> target: description` for a fact between two entities, else ""."""
    source, target = assembly.nodes.get(edge.source_id), assembly.nodes.get(edge.target_id)
    if edge.relationship in STRUCTURAL_RELATIONSHIPS:
        return ""
    if not isinstance(source, Entity) or not isinstance(target, Entity):
        return ""
    return triplet_of(source.name, edge.relationship, target.name, edge.description)


def triplet_of(source: str, relationship: str, target: str, description: str) -> str:
    """`source -> relationship -> target: description`, the text a triplet is searched by."""
    text = f"{source} -> {relationship.replace('_', ' ')} -> {target}"
    return f"{text}: {description}" if description else text


def _edge_payload(assembly: Assembly, edge: Edge, text: str, kind: str) -> dict[str, Any]:
    return {
        "text": text,
        "type": kind,
        "source_id": edge.source_id,
        "target_id": edge.target_id,
        "relationship": edge.relationship,
        "chunk_id": assembly.chunk_of[edge.id],
        "data_ids": edge.data_ids,
    }


def _payload(node: DataPoint, text: str, chunk_id: str) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "text": text,
        "type": node.type_name(),
        "chunk_id": chunk_id,
        "data_ids": node.data_ids,
        "node_sets": node.node_sets,
    }
    if isinstance(node, Chunk):
        payload.update(document_id=node.document_id, index=node.index)
    if isinstance(node, Event):
        payload.update(time_from=node.time_from, time_to=node.time_to, label=node.label)
    return payload
