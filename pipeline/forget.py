"""Forget data items: remove them and everything only they support, from every store.

A node, edge, vector point or lexical posting goes only when no remaining data item
supports it; shared ones stay, and are rebuilt from what remains: their properties lose
their source and their vector points go, and the chunks of every item that still supports
them are marked for loading again, so that the next load (with cached extractions: no LLM
call) writes them as a clean ingest of the remaining items would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from pydantic import BaseModel, PrivateAttr

from kenning.pipeline.assembly import SOURCE_OF_EDGE, SOURCE_OF_NODE
from kenning.pipeline.context import Job, Services
from kenning.pipeline.models import ChunkStatus, DataItem, GraphEdge, GraphNode, ItemStatus, extraction_key
from kenning.pipeline.validity import settle_facts

REPLACEABLE_SOURCES = ("file:", "s3:", "id:")


class Forgotten(BaseModel):
    """What one forget removed (counts), and the chunks marked for loading again."""

    items: list[str] = []
    nodes: int = 0
    edges: int = 0
    chunks: int = 0
    blobs: int = 0
    cache_entries: int = 0
    reload_chunks: int = 0
    _rebuilt: list[str] = PrivateAttr(default_factory=list)

    @property
    def rebuilt(self) -> list[str]:
        """The surviving nodes and edges that the reload is to write again (`drop_unrebuilt`)."""
        return self._rebuilt

    erased: dict[str, int] = {}  # what was wiped after it, by place (see workers.application.erasure)


def forget_items(
    services: Services, job: Job, data_ids: Sequence[str], memory_only: bool = False
) -> Forgotten:
    """Remove the dataset's items `data_ids` from the graph, vectors, lexical index, metadata,
    extraction cache and (unless `memory_only`) blob store. Run under the dataset's lock, then load."""
    items = [item for item in services.metadata.get_items(data_ids) if item.dataset_id == job.dataset_id]
    ids = [item.id for item in items]
    if not ids:
        return Forgotten()
    chunks = services.chunks.chunks_of(job.dataset_id, ids)
    # The entities the items spoke of: their facts may hold again once what ended them is gone.
    spoken_of, _ = services.graph.supported_by(job.scope, ids)
    removal = services.graph.remove_data(job.scope, ids)
    for name in services.vectors.list_collections():
        services.vectors.delete(job.scope, name, removal.deleted)
    services.lexical.remove(job.scope, [*removal.deleted_nodes, *(chunk.id for chunk in chunks)])
    services.metadata.delete_items(job.dataset_id, ids)
    rebuilt: list[str] = []
    forgotten = Forgotten(
        items=ids,
        nodes=len(removal.deleted_nodes),
        edges=len(removal.deleted_edges),
        chunks=len(chunks),
        cache_entries=_drop_cache(services, job, [chunk.text_hash for chunk in chunks]),
        blobs=0 if memory_only else _drop_blobs(services, items),
        reload_chunks=_rebuild_survivors(services, job, removal.kept, rebuilt),
    )
    forgotten._rebuilt = rebuilt
    gone = set(removal.deleted_nodes)
    kept = [node_id for node_id in spoken_of if node_id not in gone]
    settle_facts(services.graph, services.vectors, job.scope, services.config.facts, kept)
    return forgotten


def forget_superseded(services: Services, job: Job) -> Forgotten:
    """Forget the items that a newer version of the same source replaced."""
    superseded = services.metadata.list_items(job.dataset_id, ItemStatus.SUPERSEDED)
    return forget_items(services, job, [item.id for item in superseded])


def previous_versions(item: DataItem, known: dict[str, list[DataItem]]) -> list[DataItem]:
    """Items of the same replaceable source (a file, an object, an external id) with other content."""
    if not item.source.startswith(REPLACEABLE_SOURCES):
        return []
    return [
        other
        for other in known.get(item.source, [])
        if other.id != item.id and other.status != ItemStatus.SUPERSEDED
    ]


def _rebuild_survivors(services: Services, job: Job, kept: dict[str, list[str]], rebuilt: list[str]) -> int:
    """Make every element that lost support be written again from the items that remain, as a
    clean ingest of them writes it: its properties and vector points are taken from their source,
    so the next write from a remaining chunk prevails, and every chunk of every item that still
    supports it is marked for loading again (from the cached extractions: no LLM call)."""
    if not kept:
        return 0
    nodes, edges = _from_chunks(*_elements(services, job, list(kept)))
    # Node sets too: a write unions them with the stored ones, which would keep the forgotten item's.
    node_fields = (*SOURCE_OF_NODE, NODE_SETS)
    services.graph.upsert_nodes(job.scope, [_unsourced(node, node_fields, kept) for node in nodes])
    services.graph.upsert_edges(job.scope, [_unsourced(edge, SOURCE_OF_EDGE, kept) for edge in edges])
    rebuilt += sorted([*(node.id for node in nodes), *(edge.id for edge in edges)])
    for name in services.vectors.list_collections():
        services.vectors.delete(job.scope, name, rebuilt)
    supporters = sorted({data_id for data_ids in kept.values() for data_id in data_ids})
    chunks = services.chunks.chunks_of(job.dataset_id, supporters)
    loaded = [chunk.id for chunk in chunks if chunk.status == ChunkStatus.LOADED]
    services.chunks.set_chunk_status(loaded, ChunkStatus.EXTRACTED)
    return len(loaded)


Element = TypeVar("Element", GraphNode, GraphEdge)
NODE_SETS = "node_sets"
CHUNK_OF_NODE, CHUNK_OF_EDGE = SOURCE_OF_NODE[1], SOURCE_OF_EDGE[0]


def _elements(services: Services, job: Job, ids: list[str]) -> tuple[list[GraphNode], list[GraphEdge]]:
    """The nodes of these ids, and the edges of these ids among them (an edge's items made both
    of its ends: a speaker's entity touches every message, and all its edges are not read)."""
    wanted = set(ids)
    nodes = services.graph.get_nodes(job.scope, sorted(wanted), provenance=False)
    among = sorted(node.id for node in nodes)
    edges = services.graph.get_edges(job.scope, among, among=True, provenance=False) if among else []
    return nodes, [edge for edge in edges if edge.id in wanted]


def _from_chunks(nodes: list[GraphNode], edges: list[GraphEdge]) -> tuple[list[GraphNode], list[GraphEdge]]:
    """Those a chunk's extraction made, which a load writes again (the rows of a table and their
    foreign keys are written by `fk_edges` alone, and keep their properties)."""
    return (
        [node for node in nodes if node.properties.get(CHUNK_OF_NODE)],
        [edge for edge in edges if edge.properties.get(CHUNK_OF_EDGE)],
    )


def _unsourced(element: Element, fields: tuple[str, ...], kept: dict[str, list[str]]) -> Element:
    """The element with no source: the first write from a remaining chunk replaces its properties
    (see `assembly.node_prevails`), whichever item wrote them before."""
    properties = {key: value for key, value in element.properties.items() if key not in fields}
    return element.model_copy(update={"properties": properties, "data_ids": kept[element.id]})


def drop_unrebuilt(services: Services, job: Job, forgotten: Forgotten) -> int:
    """Delete the survivors that the reload did not write again: no remaining chunk makes them
    (an entity that `improve` merged another into, named as only a forgotten item named it),
    so what they hold came from the forgotten items. How many nodes and edges went."""
    if not forgotten.rebuilt:
        return 0
    nodes, edges = _elements(services, job, forgotten.rebuilt)
    node_ids = sorted(node.id for node in nodes if not node.properties.get(CHUNK_OF_NODE))
    edge_ids = sorted(edge.id for edge in edges if not edge.properties.get(CHUNK_OF_EDGE))
    if node_ids or edge_ids:
        services.graph.delete_elements(job.scope, node_ids, edge_ids)
        for name in services.vectors.list_collections():
            services.vectors.delete(job.scope, name, [*node_ids, *edge_ids])
    return len(node_ids) + len(edge_ids)


def _drop_cache(services: Services, job: Job, text_hashes: list[str]) -> int:
    # The cache is kept per tenant: an entry goes once no chunk of the tenant has the text.
    model, version, tenant = services.extractor.model, services.extractor.prompt_version, job.scope.tenant
    unused = sorted(set(text_hashes) - services.chunks.text_hashes_in_use(text_hashes, tenant))
    keys = [extraction_key(tenant, model, version, text_hash) for text_hash in unused]
    services.cache.delete_extractions(keys)
    return len(keys)


def _drop_blobs(services: Services, items: list[DataItem]) -> int:
    hashes = [item.content_hash for item in items]
    unused = sorted(set(hashes) - services.metadata.contents_in_use(hashes))
    for key in unused:
        services.blobs.delete(key)
    return len(unused)
