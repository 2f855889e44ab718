"""Memory records: each data item as a first-class record, with what it produced in the graph.

A record is a data item of a dataset, under an id that stays the same across its versions: an
item's id follows from its content (`DataItem.of`), a record's from what it is the content of (its
file, object or external id; a text with none, the first version's item). `get` gives its text
and the nodes and edges it supports (from the graph's provenance); `update` adds its new text as
the next version of the same record (the old version is superseded and forgotten by the cognify
that follows, shared facts kept), under the same record id; `delete` forgets it from every store.
A record is found by its record id, or by the data id of its current version.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from pydantic import BaseModel, Field

from kenning.pipeline.errors import InputError, StoreError
from kenning.pipeline.forget import REPLACEABLE_SOURCES
from kenning.pipeline.ingest import AddResult, Source
from kenning.pipeline.loaders import decode_text
from kenning.pipeline.models import DataItem, Dataset, ItemStatus, Scope, stable_id
from kenning.pipeline.permission import Caller
from kenning.workers.application.gate import may_read
from kenning.workers.application.lifecycle import Remembered, find_dataset
from kenning.workers.runtime.settings import Settings
from kenning.workers.runtime.wiring import Wiring

PAGE_LIMIT = 1000


class RecordNode(BaseModel):
    id: str
    type: str = Field(description="Entity, DocumentChunk, TextSummary, EntityType...")
    name: str = Field(description="An entity's name, a chunk's or summary's text")
    entity_type: str = ""


class RecordEdge(BaseModel):
    id: str
    relationship: str
    source_id: str
    target_id: str
    source: str = Field(description="The name of the node it starts from")
    target: str = Field(description="The name of the node it points to")


class MemoryRecord(BaseModel):
    id: str = Field(description="The record's id: the same across its versions")
    data_id: str = Field(description="The data item of its current version (its id follows its content)")
    content_hash: str = Field(description="SHA-256 of the current version's bytes")
    dataset: str
    name: str
    source: str
    status: str
    error: str = ""
    size: int
    created_at: str
    text: str | None = Field(default=None, description="Its text (get only; None for binary content)")
    node_ids: list[str] = Field(default_factory=list, description="Nodes it supports (get only)")
    edge_ids: list[str] = Field(default_factory=list, description="Edges it supports (get only)")
    nodes: list[RecordNode] = Field(default_factory=list, description="Those nodes (get only)")
    edges: list[RecordEdge] = Field(default_factory=list, description="Those edges, named (get only)")


class Page(BaseModel):
    records: list[MemoryRecord]
    total: int
    offset: int
    limit: int


class Memory(Protocol):
    """What records need of `Kenning` (a Protocol, so this module does not import it)."""

    settings: Settings
    wiring: Wiring

    @property
    def caller(self) -> Caller: ...

    def add(self, sources: Sequence[Source], dataset: str | None = None) -> AddResult: ...
    def cognify(self, dataset: str | None = None) -> Any: ...
    def remember(self, data: Sequence[dict[str, Any]], dataset: str | None = None) -> Remembered: ...
    def forget(self, dataset: str | None = None, data_ids: Sequence[str] | None = None) -> Any: ...


class Records:
    """CRUD over the memory records of the tenant's datasets."""

    def __init__(self, memory: Memory) -> None:
        self._memory = memory

    def create(self, text: str, dataset: str | None = None, external_id: str = "") -> MemoryRecord:
        """Remember a text as a record (add and cognify); an `external_id` names it for later updates."""
        done = self._memory.remember([{"text": text, "id": external_id}], dataset)
        return self.get(done.item_ids[0], dataset)

    def list(self, dataset: str | None = None, offset: int = 0, limit: int = 50) -> Page:
        """A page of the dataset's records, each at its current version."""
        if not 1 <= limit <= PAGE_LIMIT or offset < 0:
            raise InputError(f"a page is 1 to {PAGE_LIMIT} records from an offset of 0 or more")
        target = self._dataset(dataset)
        items = current_versions(self._memory.wiring.metadata.list_items(target.id))
        page = [record(item, target.name) for item in items[offset : offset + limit]]
        return Page(records=page, total=len(items), offset=offset, limit=limit)

    def get(self, record_id: str, dataset: str | None = None) -> MemoryRecord:
        """The record with its text, and the nodes and edges it supports."""
        target = self._dataset(dataset)
        return self._shown(target, self._item(target.id, record_id))

    def update(self, record_id: str, text: str, dataset: str | None = None) -> MemoryRecord:
        """The record's new text: cognified now, with what only the old text said forgotten; the
        record keeps its id (its `data_id` and `content_hash` are the new version's)."""
        target = self._dataset(dataset)
        old = self._item(target.id, record_id)
        new = Source(name=old.name, uri=record_key(old), data=text.encode(), mime="text/plain")
        added = self._memory.add([new], target.name)
        if not added.added:
            return self._shown(target, old)
        if old.status != ItemStatus.SUPERSEDED:
            self._memory.wiring.metadata.set_item_status(old.id, ItemStatus.SUPERSEDED, "updated")
        self._memory.cognify(target.name)
        return self._shown(target, self._item(target.id, added.added[0].id))

    def delete(self, record_id: str, dataset: str | None = None) -> None:
        """Forget the record: every version of it still kept."""
        target = self._dataset(dataset)
        current = self._item(target.id, record_id)
        versions = self._versions(target.id, record_of(current))
        self._memory.forget(target.name, [item.id for item in versions])

    def dataset_id_of(self, record_id: str) -> str | None:
        """The id of the tenant's dataset that holds the record (by record or data id), if any:
        for a caller that has the id alone (the HTTP API's `/records/{id}`)."""
        metadata = self._memory.wiring.metadata
        for item in metadata.get_items([record_id]):
            return item.dataset_id
        for dataset in metadata.list_datasets(self._memory.caller.tenant):
            if self._versions(dataset.id, record_id):
                return dataset.id
        return None

    def _shown(self, target: Dataset, item: DataItem) -> MemoryRecord:
        """The record of `item` with its text and what it supports in the graph."""
        wiring = self._memory.wiring
        node_ids, edge_ids = wiring.graph.supported_by(target.scope, [item.id])
        nodes, edges = named_elements(self._memory, target.scope, node_ids, edge_ids)
        shown = {"node_ids": node_ids, "edge_ids": edge_ids, "nodes": nodes, "edges": edges}
        return record(item, target.name).model_copy(update={**shown, "text": self._text(target, item)})

    def _text(self, target: Dataset, item: DataItem) -> str | None:
        """The item's text: its bytes decoded, or its chunks' text for a document kenning read
        (a PDF, say); None when there is neither."""
        wiring = self._memory.wiring
        try:
            return decode_text(wiring.blobs.get(item.content_hash), max(item.size, 1))
        except (InputError, StoreError):
            chunks = sorted(wiring.chunks.chunks_of(target.id, [item.id]), key=lambda chunk: chunk.index)
            return "\n".join(chunk.text for chunk in chunks) or None

    def _dataset(self, dataset: str | None) -> Dataset:
        """The dataset, if the caller may read it: the same InputError for one missing or not its."""
        memory = self._memory
        name = dataset or memory.settings.dataset
        return find_dataset(
            memory.wiring.metadata, memory.caller.tenant, name, lambda d: may_read(memory.caller, d.scope)
        )

    def _item(self, dataset_id: str, record_id: str) -> DataItem:
        """The current version of the record, found by its record id or its data id."""
        items = self._memory.wiring.metadata.get_items([record_id])
        found = [item for item in items if item.dataset_id == dataset_id]
        versions = self._versions(dataset_id, record_of(found[0]) if found else record_id)
        if not versions:
            raise InputError(f"no memory record {record_id!r} in this dataset")
        return current_versions(versions)[0]

    def _versions(self, dataset_id: str, record_id: str) -> Sequence[DataItem]:
        items = self._memory.wiring.metadata.list_items(dataset_id)
        return [item for item in items if record_of(item) == record_id]


def record_key(item: DataItem) -> str:
    """What a data item is a version of: its file, object or external id (a later version comes
    from the same), else the first version itself (`id:` and its id: the source its updates get)."""
    return item.source if item.source.startswith(REPLACEABLE_SOURCES) else f"id:{item.id}"


def record_of(item: DataItem) -> str:
    """The id of the record a data item is a version of: the same for all its versions."""
    return stable_id(item.dataset_id, "record", record_key(item))


def current_versions(items: Sequence[DataItem]) -> list[DataItem]:
    """One item per record, its current version (not superseded, else the newest), in the order
    of the items given."""
    best: dict[str, DataItem] = {}
    for item in items:
        key = record_of(item)
        held = best.get(key)
        rank = (item.status != ItemStatus.SUPERSEDED, item.created_at)
        if held is None or rank > (held.status != ItemStatus.SUPERSEDED, held.created_at):
            best[key] = item
    chosen = {item.id for item in best.values()}
    return [item for item in items if item.id in chosen]


def named_elements(
    memory: Memory, scope: Scope, node_ids: Sequence[str], edge_ids: Sequence[str]
) -> tuple[list[RecordNode], list[RecordEdge]]:
    """The nodes and edges of these ids, with what they say: names, types and relationships."""
    graph = memory.wiring.graph
    nodes = graph.get_nodes(scope, node_ids, provenance=False)
    wanted = set(edge_ids)
    edges = [e for e in graph.get_edges(scope, node_ids, provenance=False) if e.id in wanted]
    ends = {e.source_id for e in edges} | {e.target_id for e in edges}
    named = {node.id: node for node in nodes}
    named.update({n.id: n for n in graph.get_nodes(scope, sorted(ends - set(named)), provenance=False)})

    def name(node_id: str) -> str:
        node = named.get(node_id)
        return _name(node.properties) if node else node_id

    shown_nodes = [
        RecordNode(
            id=n.id,
            type=n.type,
            name=_name(n.properties),
            entity_type=str(n.properties.get("entity_type") or ""),
        )
        for n in nodes
    ]
    shown_edges = [
        RecordEdge(
            id=e.id,
            relationship=e.relationship,
            source_id=e.source_id,
            target_id=e.target_id,
            source=name(e.source_id),
            target=name(e.target_id),
        )
        for e in edges
    ]
    return shown_nodes, shown_edges


def _name(properties: dict[str, Any]) -> str:
    return str(properties.get("name") or properties.get("text") or "")


def record(item: DataItem, dataset: str) -> MemoryRecord:
    return MemoryRecord(
        id=record_of(item),
        data_id=item.id,
        content_hash=item.content_hash,
        dataset=dataset,
        name=item.name,
        source=item.source,
        status=item.status.value,
        error=item.error,
        size=item.size,
        created_at=item.created_at.isoformat(),
    )
