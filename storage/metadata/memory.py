"""The in-memory twin of the SQL metadata store: same contract, no database."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from kenning.pipeline.ladder import Rung, RungRecord
from kenning.pipeline.models import (
    RUNNING,
    ChunkRecord,
    ChunkStatus,
    DataItem,
    Dataset,
    DocumentRecord,
    Extraction,
    ItemStatus,
    PipelineRun,
    RunStatus,
    Scope,
    utcnow,
)


class MemoryMetadataStore:
    """MetadataStore, ChunkStore and ExtractionCache in dictionaries, safe across threads.

    Records go in and come out as copies, so callers never share state with the store.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._datasets: dict[str, Dataset] = {}
        self._items: dict[str, DataItem] = {}
        self._item_hashes: set[tuple[str, str]] = set()
        self._runs: dict[str, PipelineRun] = {}
        self._documents: dict[str, DocumentRecord] = {}
        self._chunks: dict[str, ChunkRecord] = {}
        self._extractions: dict[str, Extraction] = {}

    # Datasets

    def ensure_dataset(self, scope: Scope) -> Dataset:
        dataset = Dataset.of(scope)
        with self._lock:
            stored = self._datasets.setdefault(dataset.id, dataset)
            return stored.model_copy()

    def get_dataset(self, scope: Scope) -> Dataset | None:
        with self._lock:
            stored = self._datasets.get(Dataset.of(scope).id)
            return None if stored is None else stored.model_copy()

    def list_datasets(self, tenant: str) -> list[Dataset]:
        with self._lock:
            found = [dataset.model_copy() for dataset in self._datasets.values() if dataset.tenant == tenant]
        return sorted(found, key=lambda dataset: dataset.name)

    # Data items

    def add_item(self, item: DataItem) -> bool:
        """Store the item; False when the dataset already holds the same content."""
        content = (item.dataset_id, item.content_hash)
        with self._lock:
            if item.id in self._items or content in self._item_hashes:
                return False
            self._items[item.id] = item.model_copy(deep=True)
            self._item_hashes.add(content)
            return True

    def list_items(self, dataset_id: str, status: ItemStatus | None = None) -> list[DataItem]:
        with self._lock:
            found = [
                item.model_copy()
                for item in self._items.values()
                if item.dataset_id == dataset_id and (status is None or item.status == status)
            ]
        return sorted(found, key=lambda item: (item.created_at, item.id))

    def get_items(self, item_ids: Sequence[str]) -> list[DataItem]:
        """The items found, in the order of `item_ids`."""
        with self._lock:
            return [self._items[item_id].model_copy() for item_id in item_ids if item_id in self._items]

    def set_item_status(self, item_id: str, status: ItemStatus, error: str = "") -> None:
        """Set the item's status and error; an unknown id changes nothing."""
        self._set_status([item_id], status, error)

    def set_items_status(self, item_ids: Sequence[str], status: ItemStatus) -> None:
        self._set_status(item_ids, status, "")

    def _set_status(self, item_ids: Sequence[str], status: ItemStatus, error: str) -> None:
        with self._lock:
            for item_id in item_ids:
                item = self._items.get(item_id)
                if item is not None:
                    self._items[item_id] = item.model_copy(update={"status": status, "error": error})

    def delete_items(self, dataset_id: str, item_ids: Sequence[str]) -> None:
        gone = set(item_ids)
        with self._lock:
            for item_id in gone:
                item = self._items.get(item_id)
                if item is not None and item.dataset_id == dataset_id:
                    del self._items[item_id]
                    self._item_hashes.discard((dataset_id, item.content_hash))
            self._documents = {
                key: doc
                for key, doc in self._documents.items()
                if not (doc.dataset_id == dataset_id and doc.data_id in gone)
            }
            self._chunks = {
                key: chunk
                for key, chunk in self._chunks.items()
                if not (chunk.dataset_id == dataset_id and chunk.data_id in gone)
            }

    def contents_in_use(self, content_hashes: Sequence[str]) -> set[str]:
        with self._lock:
            held = {item.content_hash for item in self._items.values()}
        return held & set(content_hashes)

    def delete_dataset(self, dataset_id: str) -> None:
        with self._lock:
            self._datasets.pop(dataset_id, None)
            self._runs = {key: run for key, run in self._runs.items() if run.dataset_id != dataset_id}

    # Pipeline runs

    def save_run(self, run: PipelineRun) -> None:
        with self._lock:
            stored = self._runs.get(run.id)
            if stored is not None and stored.status == RunStatus.CANCELLED and run.status in RUNNING:
                # A cancelled run stays cancelled; the counters of a save as still running are taken.
                ended = {"status": stored.status, "error": stored.error, "finished_at": stored.finished_at}
                run = run.model_copy(update=ended)
            self._runs[run.id] = run.model_copy(deep=True)

    def get_run(self, run_id: str) -> PipelineRun | None:
        with self._lock:
            run = self._runs.get(run_id)
            return None if run is None else run.model_copy(deep=True)

    def list_runs(self, dataset_id: str) -> list[PipelineRun]:
        with self._lock:
            found = [run.model_copy(deep=True) for run in self._runs.values() if run.dataset_id == dataset_id]
        return sorted(found, key=lambda run: (run.started_at, run.id))

    def list_running_runs(self) -> list[tuple[Dataset, PipelineRun]]:
        with self._lock:
            found = [
                (self._datasets[run.dataset_id].model_copy(), run.model_copy(deep=True))
                for run in self._runs.values()
                if run.status in RUNNING and run.dataset_id in self._datasets
            ]
        return sorted(found, key=lambda pair: (pair[1].started_at, pair[1].id))

    # Documents and chunks

    def save_documents(self, documents: Sequence[DocumentRecord]) -> None:
        """Insert or overwrite the documents, by id."""
        with self._lock:
            self._documents.update((document.id, document.model_copy()) for document in documents)

    def list_documents(self, dataset_id: str, data_ids: Sequence[str] | None = None) -> list[DocumentRecord]:
        """The dataset's documents (of those data items only, when given), by data id then id."""
        wanted = None if data_ids is None else set(data_ids)
        with self._lock:
            found = [
                document.model_copy()
                for document in self._documents.values()
                if document.dataset_id == dataset_id and (wanted is None or document.data_id in wanted)
            ]
        return sorted(found, key=lambda document: (document.data_id, document.id))

    def save_chunks(self, chunks: Sequence[ChunkRecord]) -> None:
        """Insert new chunks; chunks already stored keep their text and status."""
        with self._lock:
            for chunk in chunks:
                self._chunks.setdefault(chunk.id, chunk.model_copy())

    def get_chunks(self, chunk_ids: Sequence[str]) -> list[ChunkRecord]:
        """The chunks found, in the order of `chunk_ids`."""
        with self._lock:
            return [self._chunks[chunk_id].model_copy() for chunk_id in chunk_ids if chunk_id in self._chunks]

    def list_chunk_ids(self, dataset_id: str, status: ChunkStatus | None = None) -> list[str]:
        """The dataset's chunk ids ordered by (document id, index)."""
        with self._lock:
            found = [
                chunk
                for chunk in self._chunks.values()
                if chunk.dataset_id == dataset_id and (status is None or chunk.status == status)
            ]
        return [chunk.id for chunk in sorted(found, key=lambda chunk: (chunk.document_id, chunk.index))]

    def data_ids_with_chunks(self, dataset_id: str, statuses: Sequence[ChunkStatus]) -> set[str]:
        wanted = set(statuses)
        with self._lock:
            return {
                chunk.data_id
                for chunk in self._chunks.values()
                if chunk.dataset_id == dataset_id and chunk.status in wanted
            }

    def chunks_of(self, dataset_id: str, data_ids: Sequence[str]) -> list[ChunkRecord]:
        wanted = set(data_ids)
        with self._lock:
            found = [
                chunk.model_copy()
                for chunk in self._chunks.values()
                if chunk.dataset_id == dataset_id and chunk.data_id in wanted
            ]
        return sorted(found, key=lambda chunk: (chunk.document_id, chunk.index))

    def text_hashes_in_use(self, text_hashes: Sequence[str], tenant: str | None = None) -> set[str]:
        with self._lock:
            datasets = {d.id for d in self._datasets.values() if tenant is None or d.tenant == tenant}
            held = {chunk.text_hash for chunk in self._chunks.values() if chunk.dataset_id in datasets}
        return held & set(text_hashes)

    def set_chunk_status(self, chunk_ids: Sequence[str], status: ChunkStatus, error: str = "") -> None:
        """Set status and error of every chunk listed; unknown ids are skipped."""
        with self._lock:
            for chunk_id in chunk_ids:
                chunk = self._chunks.get(chunk_id)
                if chunk is not None:
                    self._chunks[chunk_id] = chunk.model_copy(update={"status": status, "error": error})

    # Extraction cache

    def get_extractions(self, keys: Sequence[str]) -> dict[str, Extraction]:
        """The cached extractions of those keys that are present."""
        with self._lock:
            return {
                key: self._extractions[key].model_copy(deep=True) for key in keys if key in self._extractions
            }

    def put_extractions(self, extractions: dict[str, Extraction]) -> None:
        with self._lock:
            self._extractions.update((key, value.model_copy(deep=True)) for key, value in extractions.items())

    def delete_extractions(self, keys: Sequence[str]) -> None:
        with self._lock:
            for key in keys:
                self._extractions.pop(key, None)


class MemoryOutputRungs:
    """The in-memory twin of `kenning.storage.metadata.rungs.SqlOutputRungs`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rungs: dict[tuple[str, str], RungRecord] = {}

    def rung(self, endpoint: str, model: str) -> RungRecord | None:
        with self._lock:
            found = self._rungs.get((endpoint, model))
            return None if found is None else found.model_copy()

    def remember_rung(self, endpoint: str, model: str, rung: Rung) -> None:
        record = RungRecord(endpoint=endpoint, model=model, rung=rung, changed_at=utcnow())
        with self._lock:
            self._rungs[(endpoint, model)] = record
