"""Decay at search time, retrievals noted in batches, and prune by decay or age."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta

from kenning.pipeline.decay import DecayConfig, decay_factor, decayed
from kenning.pipeline.models import Dataset, utcnow
from kenning.pipeline.ports import AccessLog, ChunkStore, MetadataStore
from kenning.retrieval.contract import Hit, SearchResult

FLUSH_AT = 256


class AccessBuffer:
    """Retrievals noted in memory and written `FLUSH_AT` at a time (and on `flush`), so a search
    never writes once per hit."""

    def __init__(self, log: Callable[[], AccessLog], flush_at: int = FLUSH_AT) -> None:
        # A factory: the log (and its database) opens only once something was retrieved.
        self._log = log
        self._flush_at = flush_at
        self._pending: dict[str, Counter[str]] = {}
        self._lock = threading.Lock()

    def note(self, dataset_id: str, element_ids: list[str]) -> None:
        with self._lock:
            self._pending.setdefault(dataset_id, Counter()).update(element_ids)
            full = sum(sum(counts.values()) for counts in self._pending.values()) >= self._flush_at
        if full:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
        now = utcnow()
        for dataset_id, counts in pending.items():
            self._log().record(dataset_id, dict(counts), now)


def fade(
    result: SearchResult,
    datasets: dict[str, Dataset],
    log: AccessLog,
    metadata: MetadataStore,
    config: DecayConfig,
) -> SearchResult:
    """The result with each hit's score lowered by how far its chunk has faded, best first."""
    if config.half_life_days <= 0 or not result.results:
        return result
    now = utcnow()
    data_ids = sorted({hit.data_id for hit in result.results if hit.data_id})
    added = {item.id: item.created_at for item in metadata.get_items(data_ids)}
    seen = _accesses(result.results, datasets, log)
    hits = []
    for hit in result.results:
        last, count = seen.get((hit.dataset, hit.chunk_id or "")) or (added.get(hit.data_id or ""), 0)
        factor = decay_factor(last, count, now, config.half_life_days) if last else 1.0
        hits.append(hit.model_copy(update={"score": decayed(hit.score, factor, config.weight)}))
    return result.model_copy(update={"results": sorted(hits, key=lambda hit: -hit.score)})


def _accesses(
    hits: list[Hit], datasets: dict[str, Dataset], log: AccessLog
) -> dict[tuple[str, str], tuple[datetime, int]]:
    """(last access, count) of the hits' chunks, by (dataset name, chunk id): one read per dataset."""
    found: dict[tuple[str, str], tuple[datetime, int]] = {}
    for name, dataset in datasets.items():
        chunk_ids = sorted({hit.chunk_id for hit in hits if hit.dataset == name and hit.chunk_id})
        if chunk_ids:
            found.update(((name, key), seen) for key, seen in log.accesses(dataset.id, chunk_ids).items())
    return found


def stale_items(
    dataset: Dataset,
    metadata: MetadataStore,
    chunks: ChunkStore,
    log: AccessLog,
    older_than: timedelta | None,
    below: float | None,
    config: DecayConfig,
) -> list[str]:
    """Items not retrieved (nor added) within `older_than`, or whose decay factor fell below `below`."""
    now = utcnow()
    items = metadata.list_items(dataset.id)
    chunk_of: dict[str, list[str]] = {}
    for chunk in chunks.chunks_of(dataset.id, [item.id for item in items]):
        chunk_of.setdefault(chunk.data_id, []).append(chunk.id)
    accesses = log.accesses(dataset.id, [c for ids in chunk_of.values() for c in ids])
    stale = []
    for item in items:
        seen = [accesses[c] for c in chunk_of.get(item.id, []) if c in accesses]
        last = max([item.created_at, *(at for at, _ in seen)])
        count = sum(n for _, n in seen)
        too_old = older_than is not None and now - last > older_than
        faded = below is not None and decay_factor(last, count, now, config.half_life_days) < below
        if too_old or faded:
            stale.append(item.id)
    return stale
