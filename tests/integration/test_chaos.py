"""The distributed pipeline in a hostile world: killed workers, a restarted Redis, a faulty LLM.

The LLM is the simulator (`tests.simulator` on 127.0.0.1, answering what the offline
extractor answers), PostgreSQL and Redis are real. Every run is checked against an
undisturbed embedded run of the same input: same node, edge and vector point ids, none
duplicated, none missing. Each test bounds its waits; its workers are stopped whatever
happens (`start_workers` stops them when the test ends).
"""

from __future__ import annotations

import random
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from kenning.pipeline.errors import LockLost
from kenning.pipeline.locking import lock_name
from kenning.pipeline.models import ChunkRecord, ChunkStatus, ItemStatus, PipelineRun, RunStatus, Scope
from kenning.pipeline.plan import fail_run, start_run
from kenning.pipeline.unit import units_of
from kenning.storage.coordination.run_lock import Deliveries
from kenning.workers.celery.app import Resources
from kenning.workers.celery.tasks import Message, Redelivered, check_redelivery, hold
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from tests.integration.cluster import Deployment, RedisServer, Workers, small_chunks
from tests.integration.faults import chunk_counts, cognifying, dataset_id
from tests.integration.test_distributed import embedded_memory, graph_of, lock_released, runs_of, vector_ids
from tests.simulator import Simulator

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

LATENCY_MS = 250  # long enough for a kill to land while a chunk's extraction is in flight
CONCURRENCY = 2  # tasks at once per worker (what `start_workers` starts)
EXTRACT_BATCH = 2  # units to an extraction task, whose calls are in flight together
VISIBILITY_S = 20  # the broker redelivers a dead worker's tasks after this
LOCK_TTL_S = 10  # shorter than VISIBILITY_S: a redelivered load finds the lock expired
LOAD_BATCH = 8  # the load of the whole corpus takes well under VISIBILITY_S
UNIT_TOKENS = 96  # about two chunks an LLM call: the extract fan-out's items are units of several
KILL_PHASES = ("extraction", "extraction", "extraction", "load", "load")
KILLS = len(KILL_PHASES)
RUN_TIMEOUT_S = 420.0
POLL_S = 0.1
SEED = 20240607

PEOPLE = (
    "Ada Lovelace",
    "Charles Babbage",
    "Mara Quill",
    "Tomas Reed",
    "Iris Vale",
    "Grace Hopper",
    "Alan Turing",
    "Rosalind Franklin",
    "Lise Meitner",
    "Barbara McClintock",
    "Emmy Noether",
    "Niels Bohr",
)
PLACES = ("London", "Lancaster", "Harrow Point", "Kew", "Gull Beach", "Cambridge", "Vienna", "Dublin")
MARKER = "Quarantined Archive"


def write_corpus(folder: Path, documents: int, sentences: int) -> Path:
    """Documents of short sentences about people and places, many shared across documents.

    Every sentence holds a word of its own to this corpus: the LLM response cache, shared by
    every dataset of a database, never answers for it from an earlier test's extractions.
    """
    folder.mkdir()
    word = uuid.uuid4().hex[:10].translate(str.maketrans("0123456789", "ghijklmnop"))
    for number in range(documents):
        lines = []
        for index in range(sentences):
            person = PEOPLE[(number * 7 + index) % len(PEOPLE)]
            place = PLACES[(number * 5 + index * 3) % len(PLACES)]
            year = 1800 + (number * 13 + index * 17) % 200
            lines.append(f"{person} travelled to {place} in {year} for the {word} survey.")
            if index % 4 == 3:
                lines.append("\n\n")
        (folder / f"doc-{number:03}.txt").write_text(" ".join(lines))
    return folder


@pytest.fixture
def shared() -> dict[str, str]:
    """Small chunks, so that a modest corpus makes many of them; the embedded run uses the same."""
    return small_chunks(
        load_batch=str(LOAD_BATCH), extraction_unit_tokens=str(UNIT_TOKENS), extract_batch=str(EXTRACT_BATCH)
    )


def finished(process: subprocess.Popen[bytes], workers: Workers) -> int:
    try:
        return process.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the run did not finish within {RUN_TIMEOUT_S:.0f} s\n{workers.logs()}")


def chunks_of(memory: Kenning, dataset_id: str) -> list[ChunkRecord]:
    return memory.wiring.chunks.get_chunks(memory.wiring.chunks.list_chunk_ids(dataset_id))


def units_in(chunks: list[ChunkRecord]) -> list[list[ChunkRecord]]:
    """The extraction units a run cuts from these chunks (whole documents'): one LLM call each."""
    return units_of(chunks, UNIT_TOKENS)


def add_corpus(deployment: Deployment, corpus: Path, dataset: str) -> None:
    with deployment.memory() as memory:
        result = memory.add_paths([str(corpus)], dataset)
    assert result.added and not result.errors


def assert_same_as_embedded(
    deployment: Deployment, tmp_path: Path, shared: dict[str, str], corpus: Path, dataset: str
) -> None:
    """The memory built on the workers (stopped by now) is the one an undisturbed embedded run builds,
    with an LLM that answers as the workers' did: it reads the same extraction units."""
    with deployment.memory() as memory:
        distributed = graph_of(memory, dataset)
    with Simulator() as simulator:
        llm = {"llm_url": simulator.base_url, "llm_api_key": "test"}
        embedded = embedded_memory(tmp_path, {**shared, **llm}, corpus, dataset)
    with Kenning(embedded) as memory:
        expected = graph_of(memory, dataset)
    assert set(distributed[0]) == set(expected[0]), "node ids differ from the embedded run's"
    assert set(distributed[1]) == set(expected[1]), "edge ids differ from the embedded run's"
    assert distributed == expected, "node types or provenance differ from the embedded run's"
    assert vector_ids(deployment.settings) == vector_ids(embedded)
    with deployment.memory() as memory:
        distributed_properties = properties_of(memory, dataset)
    with Kenning(embedded) as memory:
        expected_properties = properties_of(memory, dataset)
    assert_same_properties(distributed_properties, expected_properties)


Properties = dict[str, dict[str, object]]


def assert_same_properties(found: Properties, expected: Properties) -> None:
    differing = {
        element: {
            key: (found.get(element, {}).get(key), value)
            for key, value in properties.items()
            if found.get(element, {}).get(key) != value
        }
        for element, properties in expected.items()
        if found.get(element) != properties
    }
    assert not differing, f"{len(differing)} elements differ, e.g. {list(differing.items())[:3]}"


# Properties that say when and by which run, not what: they differ between any two runs. A fact's
# statements and periods say when kenning learned them (the item's adding), as its own fields.
WHEN = frozenset(
    {"created_at", "updated_at", "last_accessed_at", "accessed_at", "source_run", "recorded_at", "retired_at"}
)


def properties_of(memory: Kenning, dataset: str) -> dict[str, dict[str, object]]:
    """Node and edge id -> its properties (without timestamps, at any depth), whatever order they
    were loaded in."""
    nodes, edges = memory.wiring.graph.export(memory.scope(dataset))
    found = {node.id: node.properties for node in nodes} | {edge.id: edge.properties for edge in edges}
    return {element: _timeless(properties) for element, properties in found.items()}


def _timeless(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _timeless(item) for key, item in value.items() if key not in WHEN}
    if isinstance(value, list):
        return [_timeless(item) for item in value]
    return value


def assert_resumed_by(before: list[PipelineRun], outcome: PipelineRun) -> None:
    """Each earlier run was interrupted by the supervisor and says that `outcome` resumes its work."""
    for run in before:
        assert run.status == RunStatus.INTERRUPTED and outcome.id in run.error, (run.status, run.error)


def fencing_token(deployment: Deployment, dataset: str) -> int:
    """The last fencing token the dataset lock gave: how many times it was taken."""
    settings = deployment.settings
    name = lock_name(Scope(tenant=settings.tenant, dataset=dataset))
    client = redis.Redis.from_url(settings.redis_url)
    try:
        value = client.get(f"{settings.queue_prefix}:lock:{name}:fence")
    finally:
        client.close()
    return int(value or 0)


# 1. Workers killed with SIGKILL during extraction and during load.


def wait_for_moment(
    memory: Kenning, dataset: str, phase: str, extracted: float, loaded: int, run: subprocess.Popen[bytes]
) -> str:
    """Poll the chunk statuses until the run is in `phase`: extraction with more than a share
    `extracted` of the chunks extracted, or load with more than `loaded` chunks loaded and some
    extracted ones still to load (each extraction batch's load part follows it, so load goes on
    during extraction too). When extraction ends first, the moment is one in load. Returns the
    phase of the moment."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    counts: dict[ChunkStatus, int] = {}
    for _ in range(int(RUN_TIMEOUT_S / POLL_S)):
        counts = chunk_counts(memory, dataset)
        total, pending = sum(counts.values()), counts[ChunkStatus.PENDING]
        if phase == "extraction" and total and pending and total - pending > extracted * total:
            return "extraction"
        if total and counts[ChunkStatus.EXTRACTED] and counts[ChunkStatus.LOADED] > loaded:
            return "load"
        if run.poll() is not None or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    pytest.fail(f"the run ended (or stalled) before a moment in {phase} came: {counts}")


def kill_five_times(
    workers: Workers, memory: Kenning, dataset: str, run: subprocess.Popen[bytes]
) -> list[str]:
    """Kill a worker (SIGKILL to its process group) at random moments, replacing it each time;
    the phase each kill landed in."""
    rng = random.Random(SEED)
    shares = sorted(rng.uniform(0.05, 0.7) for _ in KILL_PHASES)
    phases: list[str] = []
    loaded = 0
    for number, planned in enumerate(KILL_PHASES):
        phase = wait_for_moment(
            memory, dataset, planned, shares[number], loaded + rng.randint(0, LOAD_BATCH), run
        )
        # Both workers extract, in turn the victim; only b consumes the load queue.
        victim = "ab"[number % 2] if phase == "extraction" else "b"
        workers.kill(victim)
        phases.append(phase)
        loaded = chunk_counts(memory, dataset)[ChunkStatus.LOADED]
        workers.replace(victim)
    return phases


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_run_survives_workers_killed_during_extraction_and_load(
    deployment: Deployment,
    start_workers: Callable[[Deployment], Workers],
    tmp_path: Path,
    shared: dict[str, str],
) -> None:
    # Given a slow LLM, a short visibility timeout and lock ttl, and a corpus of many chunks
    corpus = write_corpus(tmp_path / "corpus", documents=25, sentences=25)
    with Simulator(latency_ms=LATENCY_MS, seed=SEED) as simulator:
        chaos = deployment.configured(
            llm_url=simulator.base_url,
            llm_api_key="test",
            broker_visibility_timeout_s=str(VISIBILITY_S),
            lock_ttl_s=str(LOCK_TTL_S),
            cognify_timeout_s=str(RUN_TIMEOUT_S),
        )
        add_corpus(chaos, corpus, "killed")
        workers = start_workers(chaos)

        # When a worker is killed five times during the run, each time replaced
        with cognifying(chaos, "killed", tmp_path) as (run, _), chaos.memory() as memory:
            phases = kill_five_times(workers, memory, dataset_id(chaos, "killed"), run)
            code = finished(run, workers)
        chat_calls = simulator.stats()["calls"]["chat"]

    # Then the run completes, every chunk is loaded and every item done, the lock is free
    assert code == 0, workers.logs()
    assert "extraction" in phases and "load" in phases, phases
    with chaos.memory() as memory:
        *before, outcome = runs_of(memory, "killed")
        chunks = chunks_of(memory, dataset_id(chaos, "killed"))
        items = memory.wiring.metadata.list_items(outcome.dataset_id)
    assert outcome.status == RunStatus.COMPLETED, outcome.error
    # (A run whose every lease expired while its tasks waited for redelivery on a slow machine is
    # interrupted by the supervisor and resumed by a new run: visibly, naming that run.)
    assert_resumed_by(before, outcome)
    assert {chunk.status for chunk in chunks} == {ChunkStatus.LOADED}
    assert {item.status for item in items} == {ItemStatus.DONE}
    assert lock_released(chaos, "killed")
    # And a redelivered task found the lock expired and took it again for its run: a larger token
    assert fencing_token(chaos, "killed") >= 2
    # And every unit of chunks was paid for once, but for the calls in flight when a worker died
    # (an interruption can cut short the calls in flight on both workers): at most a batch's
    # units a task
    in_flight = (KILLS + len(before) * 2) * CONCURRENCY * EXTRACT_BATCH
    units = len(units_in(chunks))
    assert units < len(chunks)
    assert units <= chat_calls <= units + in_flight, (
        f"{chat_calls} LLM calls for {units} units: at most {in_flight} more were allowed, "
        f"one per unit in flight ({CONCURRENCY} tasks of {EXTRACT_BATCH} a worker) "
        f"at each of the {KILLS} kills "
        f"and {len(before)} interruptions"
    )
    # And the memory is the one an undisturbed embedded run builds
    workers.stop()
    assert_same_as_embedded(chaos, tmp_path, shared, corpus, "killed")


# 2. The Redis that is broker, result backend and lock store stops mid-run and starts again.

OUTAGE_S = 3.0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_run_survives_a_restart_of_its_redis(
    deployment: Deployment,
    private_redis: RedisServer,
    start_workers: Callable[[Deployment], Workers],
    tmp_path: Path,
    shared: dict[str, str],
) -> None:
    # Given workers whose broker, result backend and dataset lock live in a private Redis
    corpus = write_corpus(tmp_path / "corpus", documents=15, sentences=25)
    with Simulator(latency_ms=LATENCY_MS, seed=SEED) as simulator:
        chaos = deployment.configured(
            llm_url=simulator.base_url,
            llm_api_key="test",
            broker_url=private_redis.url,
            result_backend=private_redis.url,
            redis_url=private_redis.url,
            broker_visibility_timeout_s=str(VISIBILITY_S),
            lock_ttl_s=str(LOCK_TTL_S),
            cognify_timeout_s=str(RUN_TIMEOUT_S),
        )
        add_corpus(chaos, corpus, "restarted")
        workers = start_workers(chaos)

        # When Redis stops mid-extraction (SIGTERM: it writes its append-only file and exits),
        # stays away a few seconds and starts again on the same port
        with cognifying(chaos, "restarted", tmp_path) as (run, _), chaos.memory() as memory:
            wait_for_moment(memory, dataset_id(chaos, "restarted"), "extraction", 0.2, 0, run)
            private_redis.stop(signal.SIGTERM)
            time.sleep(OUTAGE_S)
            private_redis.start()
            code = finished(run, workers)
        chat_calls = simulator.stats()["calls"]["chat"]

    # Then the run completes (Redis kept its queues, unacknowledged tasks, chord counts and lock
    # in its append-only file; tasks that finished while it was away waited to store their
    # results and send the next task), with every chunk loaded and every item done
    with chaos.memory() as memory:
        *before, outcome = runs_of(memory, "restarted")
        chunks = chunks_of(memory, dataset_id(chaos, "restarted"))
        items = memory.wiring.metadata.list_items(outcome.dataset_id)
    assert code == 0 and outcome.status == RunStatus.COMPLETED, (
        outcome.status,
        outcome.error,
        workers.logs(),
    )
    # (A task message a worker popped from its queue just as Redis stopped, before the worker
    # could record it as unacknowledged, is lost: the broker's transport takes and records it in
    # two steps. Nothing then works on the run, its leases expire, and the supervisor interrupts
    # it and resumes its work in a new run: visibly, naming that run.)
    assert len(before) <= 1, [(earlier.status, earlier.error) for earlier in before]
    assert_resumed_by(before, outcome)
    assert {chunk.status for chunk in chunks} == {ChunkStatus.LOADED}
    assert {item.status for item in items} == {ItemStatus.DONE}
    assert lock_released(chaos, "restarted")
    # And no unit of chunks was paid for twice, but for those in flight when Redis went away
    # (and when the run was interrupted, if it was)
    in_flight = (1 + len(before)) * len(Workers.TWO) * CONCURRENCY * EXTRACT_BATCH
    units = len(units_in(chunks))
    assert units <= chat_calls <= units + in_flight, (
        f"{chat_calls} LLM calls for {units} units; at most {in_flight} more were allowed"
    )
    # And the memory is the one an undisturbed embedded run builds
    workers.stop()
    assert_same_as_embedded(chaos, tmp_path, shared, corpus, "restarted")


# 3. An LLM that fails, stalls, answers malformed JSON, and refuses some texts for good.

RETRIES = 3
REFUSED = 2


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_llm_faults_are_retried_within_budget_and_refused_chunks_fail_alone(
    deployment: Deployment,
    start_workers: Callable[[Deployment], Workers],
    tmp_path: Path,
    shared: dict[str, str],
) -> None:
    # Given an LLM that fails a fifth of the calls, stalls past the client's timeout on some,
    # answers malformed JSON on others, and refuses every text holding MARKER
    corpus = write_corpus(tmp_path / "corpus", documents=16, sentences=10)
    for number in range(REFUSED):
        (corpus / f"refused-{number}.txt").write_text(
            f"The {MARKER} number {number} keeps letters of Emmy Noether, {corpus.parent.name}."
        )
    faulty_llm = Simulator(
        latency_ms=20,
        error_rate=0.2,
        timeout_rate=0.05,
        malformed_rate=0.1,
        stall_s=3.0,
        seed=SEED,
        fail_on=MARKER,
    )
    with faulty_llm as simulator:
        faulty = deployment.configured(
            llm_url=simulator.base_url,
            llm_api_key="test",
            llm_timeout_s="2",
            llm_max_retries=str(RETRIES),
            cognify_timeout_s=str(RUN_TIMEOUT_S),
        )
        add_corpus(faulty, corpus, "faulty")
        workers = start_workers(faulty)

        # When the dataset is cognified
        with cognifying(faulty, "faulty", tmp_path) as (run, _):
            first_code = finished(run, workers)
        first_stats = simulator.stats()
        with faulty.memory() as memory:
            first_chunks = chunks_of(memory, dataset_id(faulty, "faulty"))

        # And cognified again once the faults are gone
        simulator.fail_on = None
        simulator.error_rate = simulator.timeout_rate = simulator.malformed_rate = 0.0
        simulator.reset()
        with cognifying(faulty, "faulty", tmp_path) as (run, _):
            second_code = finished(run, workers)
        second_stats = simulator.stats()

    # Then the first run completes with errors (the CLI exits 1); the refused chunks failed with the
    # refusal, any other failed chunk only after its whole retry budget, and every other chunk is loaded
    assert first_code == 1, workers.logs()
    failed = [chunk for chunk in first_chunks if chunk.status == ChunkStatus.FAILED]
    refused = [chunk for chunk in first_chunks if MARKER in chunk.text]
    assert len(refused) == REFUSED
    assert all(chunk.status == ChunkStatus.FAILED and "HTTP 400" in chunk.error for chunk in refused)
    assert all(f"after {RETRIES + 1} attempts" in chunk.error for chunk in failed if chunk not in refused)
    assert {chunk.status for chunk in first_chunks if chunk not in failed} == {ChunkStatus.LOADED}
    # And the LLM was called within the budget: a refusal once, any other unit at most 1 + RETRIES times
    units = units_in(first_chunks)
    budget = REFUSED + (len(units) - REFUSED) * (1 + RETRIES)
    assert first_stats["refused"] == REFUSED
    assert len(units) <= first_stats["calls"]["chat"] <= budget, first_stats
    assert first_stats["server_errors"] and first_stats["malformed"], "the faults did not happen"
    # And the second run completes, extracting the failed chunks and nothing else
    assert second_code == 0, workers.logs()
    with faulty.memory() as memory:
        first, second = runs_of(memory, "faulty")
        chunks = chunks_of(memory, dataset_id(faulty, "faulty"))
        items = memory.wiring.metadata.list_items(first.dataset_id)
    assert (first.status, second.status) == (RunStatus.COMPLETED_WITH_ERRORS, RunStatus.COMPLETED)
    assert first.stats["failed_chunks"] == len(failed)
    failed_units = [unit for unit in units if unit[0].status == ChunkStatus.FAILED]
    assert second.stats["llm_calls"] == second_stats["calls"]["chat"] == len(failed_units)
    assert second.stats.get("cache_hits", 0) == 0
    assert {chunk.status for chunk in chunks} == {ChunkStatus.LOADED}
    assert {item.status for item in items} == {ItemStatus.DONE}
    # And the memory is the one an undisturbed embedded run builds
    workers.stop()
    assert_same_as_embedded(faulty, tmp_path, shared, corpus, "faulty")


# 4. The rules a task follows, checked directly: redeliveries and the dataset lock.

LIMIT = 5


def test_a_task_redelivered_more_than_the_limit_is_given_up_naming_it(
    redis_url: str, key_prefix: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    deliveries = Deliveries(client, prefix=key_prefix, expiry_s=60)
    try:
        # Given a task whose worker was lost each time it ran it, redelivered LIMIT times
        for _ in range(LIMIT):
            check_redelivery(deliveries, "kenning.extract", "task-1", 0, LIMIT)

        # When it is redelivered once more, it is given up with an error naming it
        with pytest.raises(Redelivered, match=r"kenning\.extract \[task-1\] was redelivered 6 times"):
            check_redelivery(deliveries, "kenning.extract", "task-1", 0, LIMIT)

        # Then a retry of it (a new attempt) and other tasks are counted on their own
        check_redelivery(deliveries, "kenning.extract", "task-1", 1, LIMIT)
        check_redelivery(deliveries, "kenning.extract", "task-2", 0, LIMIT)
        # And the counts expire
        assert 0 < client.ttl(f"{key_prefix}task-1:0") <= 60
    finally:
        keys = list(client.scan_iter(match=f"{key_prefix}*", count=100))
        if keys:
            client.delete(*keys)
        client.close()


def test_a_run_takes_its_expired_lock_again_but_never_another_runs(
    tmp_path: Path, redis_url: str, key_prefix: str
) -> None:
    prefix = key_prefix.rstrip(":")
    settings = load_settings(home=str(tmp_path), redis_url=redis_url, queue_prefix=prefix, lock_ttl_s=60)
    resources = Resources(settings)
    client = redis.Redis.from_url(redis_url)
    scope = Scope(tenant="t1", dataset="locked")
    name = lock_name(scope)
    try:
        # Given a run holding the dataset lock, and a second run of the same dataset
        first, second = start_run(resources.wiring, scope), start_run(resources.wiring, scope)
        token = resources.lock.take(name, first.run_id, 60)
        assert token is not None
        mine, theirs = Message(job=first, token=token), Message(job=second)
        assert hold(resources, mine) == token

        # When the lock expires because every task holding it died
        client.delete(f"{prefix}:lock:{name}")
        # Then a task of the run takes it again, with a larger fencing token, for the whole run
        again = hold(resources, mine)
        assert again > token and hold(resources, mine) == again

        # And the other run can neither take it nor work under it
        assert resources.lock.take(name, second.run_id, 60) is None
        with pytest.raises(LockLost, match="another run"):
            hold(resources, theirs)

        # And once the run has ended and let go, its late tasks stop instead of taking it again
        fail_run(resources.wiring, first, "stopped")
        resources.lock.release_run(name, first.run_id)
        with pytest.raises(LockLost, match="has ended"):
            hold(resources, mine)
        assert resources.lock.holder(name) is None
    finally:
        resources.close()
        keys = list(client.scan_iter(match=f"{key_prefix}*", count=100))
        if keys:
            client.delete(*keys)
        client.close()
