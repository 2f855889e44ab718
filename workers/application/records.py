"""Memory records: each data item as a first-class record, with what it produced in the graph.

A record is a data item of a dataset. `get` lists the nodes and edges it supports (from the
graph's provenance); `update` adds its new text as the next version of the same record (the
old version is superseded and forgotten by the cognify that follows, shared facts kept);
`delete` forgets it from every store.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from pydantic import BaseModel, Field

from kenning.pipeline.errors import InputError
from kenning.pipeline.forget import REPLACEABLE_SOURCES
from kenning.pipeline.ingest import AddResult, Source
from kenning.pipeline.models import DataItem, Dataset, ItemStatus
from kenning.pipeline.permission import Caller
from kenning.workers.application.gate import may_read
from kenning.workers.application.lifecycle import Remembered, find_dataset
from kenning.workers.runtime.settings import Settings
from kenning.workers.runtime.wiring import Wiring

PAGE_LIMIT = 1000


class MemoryRecord(BaseModel):
    id: str
    dataset: str
    name: str
    source: str
    status: str
    error: str = ""
    size: int
    created_at: str
    node_ids: list[str] = Field(default_factory=list, description="Nodes it supports (get only)")
    edge_ids: list[str] = Field(default_factory=list, description="Edges it supports (get only)")


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
        if not 1 <= limit <= PAGE_LIMIT or offset < 0:
            raise InputError(f"a page is 1 to {PAGE_LIMIT} records from an offset of 0 or more")
        target = self._dataset(dataset)
        items = self._memory.wiring.metadata.list_items(target.id)
        page = [record(item, target.name) for item in items[offset : offset + limit]]
        return Page(records=page, total=len(items), offset=offset, limit=limit)

    def get(self, record_id: str, dataset: str | None = None) -> MemoryRecord:
        target = self._dataset(dataset)
        item = self._item(target.id, record_id)
        nodes, edges = self._memory.wiring.graph.supported_by(target.scope, [item.id])
        return record(item, target.name).model_copy(update={"node_ids": nodes, "edge_ids": edges})

    def update(self, record_id: str, text: str, dataset: str | None = None) -> MemoryRecord:
        """The record's new text: cognified now, with what only the old text said forgotten."""
        target = self._dataset(dataset)
        old = self._item(target.id, record_id)
        source = old.source if old.source.startswith(REPLACEABLE_SOURCES) else f"id:{old.id}"
        new = Source(name=old.name, uri=source, data=text.encode(), mime="text/plain")
        added = self._memory.add([new], target.name)
        if not added.added:
            return self.get(old.id, target.name)
        if old.status != ItemStatus.SUPERSEDED:
            self._memory.wiring.metadata.set_item_status(old.id, ItemStatus.SUPERSEDED, "updated")
        self._memory.cognify(target.name)
        return self.get(added.added[0].id, target.name)

    def delete(self, record_id: str, dataset: str | None = None) -> None:
        target = self._dataset(dataset)
        self._memory.forget(target.name, [self._item(target.id, record_id).id])

    def _dataset(self, dataset: str | None) -> Dataset:
        """The dataset, if the caller may read it: the same InputError for one missing or not its."""
        memory = self._memory
        name = dataset or memory.settings.dataset
        return find_dataset(
            memory.wiring.metadata, memory.caller.tenant, name, lambda d: may_read(memory.caller, d.scope)
        )

    def _item(self, dataset_id: str, record_id: str) -> DataItem:
        items = self._memory.wiring.metadata.get_items([record_id])
        found = [item for item in items if item.dataset_id == dataset_id]
        if not found:
            raise InputError(f"no memory record {record_id!r} in this dataset")
        return found[0]


def record(item: DataItem, dataset: str) -> MemoryRecord:
    return MemoryRecord(
        id=item.id,
        dataset=dataset,
        name=item.name,
        source=item.source,
        status=item.status.value,
        error=item.error,
        size=item.size,
        created_at=item.created_at.isoformat(),
    )
