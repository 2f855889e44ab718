"""Load parts on the workers: a part whose write falls behind the extraction takes more chunks."""

from __future__ import annotations

from collections.abc import Sequence

from kenning.pipeline import tasks
from kenning.pipeline.chunking import ChunkingConfig
from kenning.pipeline.context import Job, PipelineConfig
from kenning.pipeline.ingest import Source, add
from kenning.pipeline.models import ChunkStatus, Scope
from kenning.pipeline.plan import STEPS, start_run
from kenning.pipeline.unit import chunk_ids_of
from tests.twins import CountingExtractor, TwinServices

SCOPE = Scope(tenant="t1", dataset="claims")
LOAD_BATCH = 5


class Claims:
    """The run's claims as a set, as the workers keep them in Redis."""

    def __init__(self) -> None:
        self.taken: set[str] = set()

    def __call__(self, ids: Sequence[str], limit: int | None = None) -> list[str]:
        new: list[str] = []
        for chunk_id in ids:
            if limit is not None and len(new) >= limit:
                break
            if chunk_id not in self.taken:
                self.taken.add(chunk_id)
                new.append(chunk_id)
        return new


def extracted_run(documents: int) -> tuple[TwinServices, Job, list[str]]:
    """A run whose documents (a chunk each) are all extracted and none loaded; its units."""
    config = PipelineConfig(chunking=ChunkingConfig(unit_tokens=1), load_batch=LOAD_BATCH)
    services = TwinServices(config=config, extractor=CountingExtractor())
    sources = [
        Source(name=f"d{n}.txt", uri=f"test:d{n}", data=f"Keeper Ivo{n} guarded Tower Elda{n}.".encode())
        for n in range(documents)
    ]
    add(services.metadata, services.blobs, SCOPE, sources)
    job = start_run(services, SCOPE)
    STEPS["classify"].run(services, job, [])
    units = STEPS["chunk"].run(services, job, []).items
    STEPS["extract"].run(services, job, units)
    return services, job, units


def loaded(services: TwinServices, job: Job) -> set[str]:
    return set(services.chunks.list_chunk_ids(job.dataset_id, ChunkStatus.LOADED))


def test_a_part_fills_its_write_with_chunks_no_part_took_and_their_parts_then_pass() -> None:
    # Given twelve extracted units of a chunk each, none loaded, and the run's claims
    services, job, units = extracted_run(12)
    assert len(units) == 12
    claims = Claims()
    # When the first unit's part runs
    first = tasks.load_part(services, job, units[:1], claim=claims)
    # Then it loaded its own chunk and others no part took, a load batch in all
    assert first["streamed_chunks"] == LOAD_BATCH
    assert len(loaded(services, job)) == LOAD_BATCH
    assert set(chunk_ids_of(units[:1])) <= loaded(services, job)
    # And when the parts of the others run in turn, each chunk is loaded once in all: a part whose
    # chunk was taken loads it no more, and takes others still waiting
    counts = [tasks.load_part(services, job, [unit], claim=claims)["streamed_chunks"] for unit in units[1:]]
    assert sum(counts) == 12 - LOAD_BATCH
    assert counts.count(0) >= 12 - 1 - 2  # the twelve loaded by three parts: the rest passed
    assert loaded(services, job) == set(chunk_ids_of(units))


def test_a_part_leaves_its_chunks_to_the_part_that_took_them_and_the_run_loads_them_if_it_died() -> None:
    # Given a part that took every chunk of the run and died before writing
    services, job, units = extracted_run(4)
    claims = Claims()
    claims(chunk_ids_of(units))
    # When the units' own parts run
    counts = [tasks.load_part(services, job, [unit], claim=claims)["streamed_chunks"] for unit in units]
    # Then none loads again what another part took (no chunk is written twice)
    assert counts == [0, 0, 0, 0]
    # And the run's load step, after the fan-out, loads every chunk left
    tasks.load(services, job)
    assert loaded(services, job) == set(chunk_ids_of(units))


def test_without_claims_a_part_loads_only_its_own_chunks() -> None:
    services, job, units = extracted_run(4)
    assert tasks.load_part(services, job, units[:1])["streamed_chunks"] == 1
    assert loaded(services, job) == set(chunk_ids_of(units[:1]))
