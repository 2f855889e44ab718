"""Erasure after a forget: what the stores deleted is wiped from their disks and servers too.

A delete leaves copies behind: SQLite keeps old pages in its `-wal` (and in free pages, which
`secure_delete` overwrites), Qdrant Edge keeps deleted points' payloads in its segment files and
WAL, FalkorDB keeps recent queries with their parameters in a telemetry stream, and the blob
store keeps bytes that no item refers to any more (after a `memory_only` forget). This runs
once at the end of every forget, under the dataset's lock.
"""

from __future__ import annotations

import logging
import time

from kenning.pipeline.models import Dataset
from kenning.pipeline.ports import BlobStore, Erasing, MetadataStore
from kenning.storage.sql.engine import checkpoint, is_sqlite
from kenning.workers.runtime.wiring import Wiring

log = logging.getLogger(__name__)


def erase(wiring: Wiring, dataset: Dataset, memory_only: bool) -> dict[str, int]:
    """Wipe what the forget just deleted from `dataset` wherever copies stay; the count by place:
    `blobs` (unreferenced bytes removed; none when `memory_only`, which keeps them),
    `graph_telemetry`, `vector_collections` (rewritten), `sqlite_wal` (1 when checkpointed)."""
    started = time.perf_counter()
    erased: dict[str, int] = {}
    if not memory_only:
        erased["blobs"] = collect_blobs(wiring.blobs, wiring.metadata, wiring.settings.blob_grace_s)
    graph, vectors = wiring.graph, wiring.vectors
    if isinstance(graph, Erasing):
        erased["graph_telemetry"] = graph.erase_deleted(dataset.scope)
    if isinstance(vectors, Erasing):
        erased["vector_collections"] = vectors.erase_deleted(dataset.scope)
    if is_sqlite(wiring.engine):
        erased["sqlite_wal"] = int(checkpoint(wiring.engine))
    log.debug("erasure after forgetting from %s: %s in %.0f ms", dataset.name, erased, _ms(started))
    return erased


def collect_blobs(blobs: BlobStore, metadata: MetadataStore, grace_s: float) -> int:
    """Remove every blob older than `grace_s` whose content hash no item of any dataset refers to;
    how many. A younger one may be an add's, written just before its item."""
    keys = sorted(blobs.keys(older_than_s=grace_s))
    unused = sorted(set(keys) - metadata.contents_in_use(keys))
    for key in unused:
        blobs.delete(key)
    return len(unused)


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000
