"""Ports: the narrow interfaces the pipeline needs from the outside world.

Adapters in `storage/` implement them; in-memory twins ship beside the real
adapters and pass the same contract suites.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar, runtime_checkable

from kenning.pipeline.models import (
    ChunkRecord,
    ChunkStatus,
    DataItem,
    Dataset,
    DocumentRecord,
    EdgeShape,
    Extraction,
    GraphEdge,
    GraphNode,
    ItemStatus,
    PipelineRun,
    Removal,
    Scope,
    ScoredPoint,
    VectorPoint,
)


class MetadataStore(Protocol):
    """Datasets, data items and pipeline runs."""

    def ensure_dataset(self, scope: Scope) -> Dataset: ...
    def get_dataset(self, scope: Scope) -> Dataset | None: ...
    def list_datasets(self, tenant: str) -> list[Dataset]: ...
    def add_item(self, item: DataItem) -> bool:
        """Store the item; False when the dataset already holds the same content."""
        ...

    def list_items(self, dataset_id: str, status: ItemStatus | None = None) -> list[DataItem]: ...
    def get_items(self, item_ids: Sequence[str]) -> list[DataItem]: ...
    def set_item_status(self, item_id: str, status: ItemStatus, error: str = "") -> None: ...
    def set_items_status(self, item_ids: Sequence[str], status: ItemStatus) -> None:
        """Set each item's status and clear its error, in one transaction; unknown ids change nothing."""
        ...

    def delete_items(self, dataset_id: str, item_ids: Sequence[str]) -> None:
        """Delete the items with their documents and chunks; unknown ids are ignored."""
        ...

    def contents_in_use(self, content_hashes: Sequence[str]) -> set[str]:
        """Those of the hashes that some item, in any dataset, still holds."""
        ...

    def delete_dataset(self, dataset_id: str) -> None:
        """Delete the dataset record and its runs (its items must be gone already)."""
        ...

    def save_run(self, run: PipelineRun) -> None: ...
    def get_run(self, run_id: str) -> PipelineRun | None: ...
    def list_runs(self, dataset_id: str) -> list[PipelineRun]: ...
    def list_running_runs(self) -> list[tuple[Dataset, PipelineRun]]:
        """Every run not ended, of any tenant, with its dataset; oldest first."""
        ...


class ChunkStore(Protocol):
    """Documents and chunks between steps, with per-chunk status."""

    def save_documents(self, documents: Sequence[DocumentRecord]) -> None: ...
    def list_documents(
        self, dataset_id: str, data_ids: Sequence[str] | None = None
    ) -> list[DocumentRecord]: ...
    def save_chunks(self, chunks: Sequence[ChunkRecord]) -> None:
        """Insert new chunks; chunks already stored keep their status."""
        ...

    def get_chunks(self, chunk_ids: Sequence[str]) -> list[ChunkRecord]: ...
    def list_chunk_ids(self, dataset_id: str, status: ChunkStatus | None = None) -> list[str]: ...
    def data_ids_with_chunks(self, dataset_id: str, statuses: Sequence[ChunkStatus]) -> set[str]:
        """The data items of the dataset that have a chunk in any of these statuses."""
        ...

    def chunks_of(self, dataset_id: str, data_ids: Sequence[str]) -> list[ChunkRecord]:
        """The chunks of those data items, by (document id, index)."""
        ...

    def text_hashes_in_use(self, text_hashes: Sequence[str], tenant: str | None = None) -> set[str]:
        """Those of the chunk text hashes that some chunk still has, in any dataset (or in a
        dataset of `tenant`, when given)."""
        ...

    def set_chunk_status(self, chunk_ids: Sequence[str], status: ChunkStatus, error: str = "") -> None: ...


class AccessLog(Protocol):
    """When elements of a dataset were last retrieved, and how often."""

    def record(self, dataset_id: str, counts: dict[str, int], at: datetime) -> None:
        """Add `counts[id]` retrievals of each element, the last at `at`."""
        ...

    def accesses(self, dataset_id: str, element_ids: Sequence[str]) -> dict[str, tuple[datetime, int]]:
        """(last access, count) of those elements ever retrieved."""
        ...

    def forget_access(self, dataset_id: str, element_ids: Sequence[str] | None = None) -> None:
        """Drop those elements' records (every one of the dataset's when None)."""
        ...


class ExtractionCache(Protocol):
    """LLM responses keyed by (model, prompt version, chunk hash)."""

    def get_extractions(self, keys: Sequence[str]) -> dict[str, Extraction]: ...
    def put_extractions(self, extractions: dict[str, Extraction]) -> None: ...
    def delete_extractions(self, keys: Sequence[str]) -> None: ...


class BlobStore(Protocol):
    """Raw bytes of data items, by content hash."""

    def put(self, key: str, data: bytes) -> None: ...
    def get(self, key: str) -> bytes: ...
    def exists(self, key: str) -> bool: ...
    def delete(self, key: str) -> None:
        """Remove the bytes; an unknown key is ignored."""
        ...

    def keys(self, older_than_s: float = 0.0) -> Iterator[str]:
        """Every stored key last written more than `older_than_s` seconds ago (for collection)."""
        ...


@runtime_checkable
class Erasing(Protocol):
    """A store that keeps copies of deleted data on its disk or server (segment pages, logs,
    query telemetry) until told to erase them."""

    def erase_deleted(self, scope: Scope) -> int:
        """Rewrite or drop what may still hold the scope's deleted data; how many places
        (collections, logs, keys) were rewritten or dropped."""
        ...


class StoredObject(Protocol):
    """One object of a bucket listing."""

    @property
    def key(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def etag(self) -> str: ...


class ObjectSource(Protocol):
    """A bucket of objects to add from (S3 or any S3-compatible store)."""

    def list_objects(self, prefix: str) -> Iterator[StoredObject]:
        """Every object under the prefix, page by page."""
        ...

    def read(self, key: str, max_bytes: int) -> bytes:
        """The object's bytes, streamed; InputError when it is larger than `max_bytes`."""
        ...


@dataclass(frozen=True)
class Neighbourhood:
    """A bounded subgraph: its edges, and the degree in the whole graph of every node they touch.
    Its edges are `EdgeShape`s when it was asked for with `shape_only`, else `GraphEdge`s."""

    edges: Sequence[GraphEdge | EdgeShape]
    degrees: dict[str, int]


class GraphStore(Protocol):
    """Nodes and edges of one or more scoped graphs.

    Upserts merge: properties are overwritten, `data_ids` are unioned. Edges whose
    endpoints are missing are skipped, never half-written.
    """

    def upsert_nodes(self, scope: Scope, nodes: Sequence[GraphNode]) -> None: ...
    def upsert_edges(self, scope: Scope, edges: Sequence[GraphEdge]) -> None: ...
    def get_nodes(self, scope: Scope, node_ids: Sequence[str], *, provenance: bool = True) -> list[GraphNode]:
        """The nodes of these ids that exist. Without `provenance` their `data_ids` are left
        empty: a read that does not use them skips gathering them (a node many data items
        support has as many)."""
        ...

    def get_edges(
        self, scope: Scope, node_ids: Sequence[str], among: bool = False, *, provenance: bool = True
    ) -> list[GraphEdge]:
        """Every edge with at least one endpoint among `node_ids` (both, when `among`); without
        `provenance`, their `data_ids` are left empty."""
        ...

    def edge_shapes(self, scope: Scope, node_ids: Sequence[str]) -> list[EdgeShape]:
        """The edges `get_edges` gives for `node_ids`, as `EdgeShape`s (id, endpoints, relationship),
        in no set order: no costlier than `get_edges(provenance=False)`, and read from memory where
        the store holds the scope's shape."""
        ...

    def neighbourhood(
        self,
        scope: Scope,
        node_ids: Sequence[str],
        hops: int = 1,
        limit: int = 1000,
        max_degree: int = 200,
        skip: Sequence[str] = (),
        shape_only: bool = False,
    ) -> Neighbourhood:
        """The edges around `node_ids`, breadth first: a bounded subgraph to compute on.

        Hop by hop, the frontier (first the given nodes, then the nodes the previous hop
        reached) is expanded, the nodes with fewest edges first: each brings all its edges.
        A node with more than `max_degree` edges is not expanded (its edges to expanded nodes
        still come with theirs). Edges whose relationship is in `skip` are neither counted,
        returned nor followed. It stops before passing `limit` edges: a node's edges come
        whole or not at all. Degrees count distinct edges, skipped kinds left out; a loop
        counts once. Every node the edges touch has its degree, and so does every given node
        that has edges. With `shape_only`, the same edges come as `EdgeShape`s, with only their
        id, endpoints and relationship: cheaper to read and to hold, enough to walk.
        """
        ...

    def export(self, scope: Scope) -> tuple[list[GraphNode], list[GraphEdge]]: ...
    def remove_data(self, scope: Scope, data_ids: Sequence[str]) -> Removal:
        """Take these data items' support away: each node and edge loses them from its `data_ids`;
        one left with none is deleted, and so is every edge that loses an endpoint."""
        ...

    def supported_by(self, scope: Scope, data_ids: Sequence[str]) -> tuple[list[str], list[str]]:
        """(node ids, edge ids) that any of these data items supports: what they produced."""
        ...

    def delete_elements(self, scope: Scope, node_ids: Sequence[str], edge_ids: Sequence[str]) -> None:
        """Delete those edges, and those nodes with every edge touching them; unknown ids are ignored."""
        ...

    def counts(self, scope: Scope) -> tuple[int, int]:
        """(node count, edge count) of the scope."""
        ...

    def close(self) -> None: ...


class VectorStore(Protocol):
    """One collection per indexed field; points scoped by tenant and dataset payload."""

    def ensure_collection(self, name: str, dimension: int) -> None:
        """Create the collection, or check that an existing one has this dimension."""
        ...

    def upsert(self, scope: Scope, collection: str, points: Sequence[VectorPoint]) -> None: ...
    def search(
        self,
        scope: Scope,
        collection: str,
        vector: Sequence[float],
        limit: int,
        fields: Sequence[str] | None = None,
    ) -> list[ScoredPoint]:
        """Closest points first; an unknown collection gives no hits. With `fields`, each
        payload holds only those keys (and the scope's), which is cheaper to read."""
        ...

    def retrieve(
        self, scope: Scope, collection: str, ids: Sequence[str], fields: Sequence[str] | None = None
    ) -> list[VectorPoint]:
        """The scope's points with these ids, with their stored (normalized) vectors; unknown ids,
        other scopes' points and unknown collections are left out. `fields` as in `search`."""
        ...

    def delete(self, scope: Scope, collection: str, ids: Sequence[str]) -> None:
        """Remove the scope's points with these ids; unknown ids and collections are ignored."""
        ...

    def set_payload(self, scope: Scope, collection: str, values: dict[str, dict[str, Any]]) -> None:
        """Merge `values[id]` into the payload of each of the scope's points; others are ignored."""
        ...

    def list_collections(self) -> list[str]: ...
    def count(self, scope: Scope, collection: str) -> int: ...
    def close(self) -> None: ...


class Embedder(Protocol):
    @property
    def dimension(self) -> int: ...
    @property
    def model(self) -> str: ...
    def embed(self, texts: Sequence[str]) -> list[list[float]]: ...


class Extractor(Protocol):
    """Turns one chunk of text into a knowledge graph and a summary."""

    @property
    def model(self) -> str: ...
    @property
    def prompt_version(self) -> str: ...
    def extract(self, text: str) -> Extraction: ...


class Completer(Protocol):
    """Answers a question from a context with an LLM."""

    def complete(self, system: str, prompt: str) -> str: ...


class Lock(Protocol):
    """A cross-process lock per dataset, with a fencing token that grows with every acquisition."""

    def acquire(self, name: str, ttl_s: float) -> int | None:
        """Take the lock if it is free: its fencing token, or None when someone holds it."""
        ...

    def release(self, name: str, token: int) -> None:
        """Let go, only if still held with this token."""
        ...


class RunLock(Lock, Protocol):
    """A dataset lock that a pipeline run holds as a whole, across its tasks and worker processes.

    It is taken, kept and released by the run's id; a lock nobody keeps expires after its ttl.
    """

    def take(self, name: str, run_id: str, ttl_s: float) -> int | None:
        """For the run: a new, larger token when the lock is free; the current one, extended, when the
        run holds it already; None when someone else holds it."""
        ...

    def keep(self, name: str, run_id: str, ttl_s: float) -> int | None:
        """Extend the lock if the run holds it: its token; None when it is free or someone else's."""
        ...

    def release_run(self, name: str, run_id: str) -> None:
        """Let go, only if the run holds the lock."""
        ...

    def holder(self, name: str) -> int | None:
        """The token the lock is held under, or None when it is free."""
        ...


Item = TypeVar("Item")


def chunked(items: Sequence[Item], size: int) -> Iterator[list[Item]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])
