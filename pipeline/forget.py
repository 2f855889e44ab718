"""Forget data items: remove them and everything only they support, from every store.

A node, edge, vector point or lexical posting goes only when no remaining data item
supports it; shared facts stay, and the chunks of the items that still support them
are marked for loading again, so that their properties and payloads are rewritten
from what remains (the next load does it, with cached extractions: no LLM call).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel

from kenning.pipeline.assembly import STRUCTURAL_RELATIONSHIPS
from kenning.pipeline.collection import ENTITIES, ENTITY_TYPES
from kenning.pipeline.context import Job, Services
from kenning.pipeline.models import ChunkStatus, DataItem, Entity, EntityType, ItemStatus, extraction_key

# Entities and their types are shared by many items (a conversation's speakers by every
# message), and no search shows text of theirs but their name: reloading every item that
# mentions them would reload most of the dataset for nothing. Their vector payloads get the
# remaining provenance instead; facts (edges) and chunk-bound nodes are loaded again.
_NOT_RELOADED = frozenset({EntityType.type_name(), Entity.type_name()})
REPLACEABLE_SOURCES = ("file:", "s3:", "id:")
_TYPED_COLLECTIONS = {Entity.type_name(): ENTITIES, EntityType.type_name(): ENTITY_TYPES}


class Forgotten(BaseModel):
    """What one forget removed (counts), and the chunks marked for loading again."""

    items: list[str] = []
    nodes: int = 0
    edges: int = 0
    chunks: int = 0
    blobs: int = 0
    cache_entries: int = 0
    reload_chunks: int = 0


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
    removal = services.graph.remove_data(job.scope, ids)
    for name in services.vectors.list_collections():
        services.vectors.delete(job.scope, name, removal.deleted)
    services.lexical.remove(job.scope, [*removal.deleted_nodes, *(chunk.id for chunk in chunks)])
    services.metadata.delete_items(job.dataset_id, ids)
    return Forgotten(
        items=ids,
        nodes=len(removal.deleted_nodes),
        edges=len(removal.deleted_edges),
        chunks=len(chunks),
        cache_entries=_drop_cache(services, job, [chunk.text_hash for chunk in chunks]),
        blobs=0 if memory_only else _drop_blobs(services, items),
        reload_chunks=_mark_survivors(services, job, removal.kept),
    )


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


def _mark_survivors(services: Services, job: Job, kept: dict[str, list[str]]) -> int:
    if not kept:
        return 0
    nodes = services.graph.get_nodes(job.scope, list(kept))
    typed = {node.id for node in nodes if node.type in _NOT_RELOADED}
    for kind, name in _TYPED_COLLECTIONS.items():
        # A typed node's only point is in its type's collection, under its id.
        patch = {node.id: {"data_ids": kept[node.id]} for node in nodes if node.type == kind}
        if patch:
            services.vectors.set_payload(job.scope, name, patch)
    # Structural edges (a chunk in its document, an entity of its type) say nothing of their own.
    # Only the edges among the surviving nodes are read (an edge that lost support joins two
    # nodes that the same items supported): a speaker's entity touches every message, and all
    # its edges would be read for nothing. An edge not read counts as a fact: its items reload.
    among = sorted(node.id for node in nodes if node.type == Entity.type_name() or node.id in typed)
    edges = services.graph.get_edges(job.scope, among, among=True) if among else []
    bare = typed | {edge.id for edge in edges if edge.relationship in STRUCTURAL_RELATIONSHIPS}
    supporters = sorted({data_id for key, ids in kept.items() if key not in bare for data_id in ids})
    chunks = services.chunks.chunks_of(job.dataset_id, supporters)
    loaded = [chunk.id for chunk in chunks if chunk.status == ChunkStatus.LOADED]
    services.chunks.set_chunk_status(loaded, ChunkStatus.EXTRACTED)
    return len(loaded)


def _drop_cache(services: Services, job: Job, text_hashes: list[str]) -> int:
    unused = sorted(set(text_hashes) - services.chunks.text_hashes_in_use(text_hashes))
    model, version, tenant = services.extractor.model, services.extractor.prompt_version, job.scope.tenant
    keys = [extraction_key(tenant, model, version, text_hash) for text_hash in unused]
    services.cache.delete_extractions(keys)
    return len(keys)


def _drop_blobs(services: Services, items: list[DataItem]) -> int:
    hashes = [item.content_hash for item in items]
    unused = sorted(set(hashes) - services.metadata.contents_in_use(hashes))
    for key in unused:
        services.blobs.delete(key)
    return len(unused)
