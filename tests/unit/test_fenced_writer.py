"""The fenced writer: every write a pipeline step makes goes through it, and none passes a lost fence."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import pytest

from kenning.pipeline import fencing
from kenning.pipeline.errors import LockLost
from kenning.pipeline.fencing import Fenced, fenced_services
from kenning.pipeline.ingest import Source, add
from kenning.pipeline.lexical import LexicalIndex
from kenning.pipeline.locking import check_fence, fenced
from kenning.pipeline.models import ItemStatus, Scope
from kenning.pipeline.plan import PLAN, record_step, start_run
from kenning.pipeline.ports import (
    BlobStore,
    ChunkStore,
    ExtractionCache,
    GraphStore,
    MetadataStore,
    VectorStore,
)
from kenning.workers.runtime.local_runner import LocalRunner
from tests.twins import CountingExtractor, TwinServices

SCOPE = Scope(tenant="t1", dataset="fenced")
PORTS: list[tuple[str, type[Any], frozenset[str]]] = [
    ("metadata", MetadataStore, fencing.METADATA_UNFENCED),
    ("chunks", ChunkStore, fencing.CHUNK_UNFENCED),
    ("cache", ExtractionCache, fencing.CACHE_UNFENCED),
    ("blobs", BlobStore, fencing.BLOB_UNFENCED),
    ("graph", GraphStore, fencing.GRAPH_UNFENCED),
    ("vectors", VectorStore, fencing.VECTOR_UNFENCED),
    ("lexical", LexicalIndex, fencing.LEXICAL_UNFENCED),
]


def lost() -> None:
    raise LockLost("dataset:t1:fenced is held by another run")


def moving_fence() -> tuple[Callable[[], None], Callable[[], None]]:
    """A fence held under token 1 (the check a task makes), and a way to move it to token 2."""
    holder = [1]

    def check() -> None:
        if holder[0] != 1:
            raise LockLost(f"dataset:t1:fenced is no longer held under token 1 (now {holder[0]})")

    def move() -> None:
        holder[0] = 2

    return check, move


def state(services: TwinServices) -> bytes:
    """Everything the twins hold, as bytes: equal before and after when nothing was written."""
    stores = (services.metadata, services.blobs, services.graph, services.vectors, services.lexical)
    return pickle.dumps([{k: v for k, v in vars(store).items() if k != "_lock"} for store in stores])


def methods(port: type[Any]) -> set[str]:
    return {name for name, value in vars(port).items() if not name.startswith("_") and callable(value)}


def test_a_write_after_the_fence_moved_raises_what_the_fence_raises_and_writes_nothing() -> None:
    # Given a dataset item, and a step's fenced writer under a fence that holds
    services = TwinServices()
    item = add(
        services.metadata, services.blobs, SCOPE, [Source(name="a.txt", uri="test:a", data=b"a")]
    ).added[0]
    check, move = moving_fence()
    with fenced(check):
        writer = fenced_services(services)
        writer.metadata.set_item_status(item.id, ItemStatus.CLASSIFIED)

        # When the fence moves (another run took the lock), the next write raises
        move()
        with pytest.raises(LockLost) as raised:
            writer.metadata.set_item_status(item.id, ItemStatus.FAILED, "late")
        with pytest.raises(LockLost) as direct:
            check_fence()

    # Then the error is the fence's own, as a step checking the fence itself raised it, and the
    # write did not happen
    assert str(raised.value) == str(direct.value)
    assert "no longer held under token 1 (now 2)" in str(raised.value)
    assert [i.status for i in services.metadata.get_items([item.id])] == [ItemStatus.CLASSIFIED]


@pytest.mark.parametrize(("attribute", "port", "unfenced"), PORTS, ids=[p[0] for p in PORTS])
def test_every_write_method_of_a_port_is_fenced(
    attribute: str, port: type[Any], unfenced: frozenset[str]
) -> None:
    # Given a port that records what is called on it, behind the fenced writer of a lost fence
    called: list[str] = []

    class Recording:
        def __getattr__(self, name: str) -> Callable[..., None]:
            return lambda *args, **kwargs: called.append(name)

    services = TwinServices()
    wrapped = getattr(fenced_services(services), attribute)
    assert isinstance(wrapped, Fenced)
    assert (wrapped.port, wrapped.unfenced) == (getattr(services, attribute), unfenced)
    writer = Fenced(Recording(), unfenced)
    # The names left unfenced are the port's own (a misspelt one would leave a write fenced twice
    # in name only)
    assert unfenced <= methods(port) | {"close"}
    with fenced(lost):
        # When each method but the unfenced ones is called
        for name in sorted(methods(port) - unfenced):
            with pytest.raises(LockLost):
                getattr(writer, name)()
        # Then none reached the port, and the unfenced ones did
        for name in sorted(unfenced):
            getattr(writer, name)()
    assert called == sorted(unfenced)


def test_no_step_of_the_plan_writes_past_a_lost_fence() -> None:
    # Given a dataset that exercises every write path of the steps: an item that fails, a chunk
    # the extractor fails, a table for the foreign-key step, and a file replaced by a new version
    services = TwinServices(extractor=CountingExtractor(fail_on="Babbage"))
    first = [Source(name="ada.txt", uri="file:/docs/ada.txt", data=b"Ada Lovelace met Mary Somerville.")]
    add(services.metadata, services.blobs, SCOPE, first)
    LocalRunner(services, services.lock).run(SCOPE)
    later = [
        Source(name="ada.txt", uri="file:/docs/ada.txt", data=b"Ada Lovelace worked with Charles Babbage."),
        Source(name="turing.txt", uri="test:turing", data=b"Alan Turing worked at Bletchley Park."),
        Source(name="people.csv", uri="test:people", data=b"id,name\n1,Ada\n2,Alan\n"),
        Source(name="broken.pdf", uri="test:broken", data=b"%PDF-1.4 not really a pdf"),
    ]
    assert add(services.metadata, services.blobs, SCOPE, later).superseded
    job = start_run(services, SCOPE)
    items: list[str] = []
    for step in PLAN:
        # When each step runs under a fence already lost
        before = state(services)
        with fenced(lost), pytest.raises(LockLost):
            step.run(services, job, items)
        # Then it wrote nothing to any store
        assert state(services) == before, f"{step.name} wrote past a lost fence"
        # (and run unfenced, it moves the dataset on to the next step)
        result = step.run(services, job, items)
        record_step(services, job, step.name, result.counts)
        items = result.items
    run = services.metadata.get_run(job.run_id)
    assert run is not None
    assert run.stats["superseded_items"] == 1 and run.stats["failed_chunks"] >= 1 and run.stats["fk_nodes"]
    broken = [item for item in services.metadata.list_items(job.dataset_id) if item.name == "broken.pdf"]
    assert [item.status for item in broken] == [ItemStatus.FAILED]
