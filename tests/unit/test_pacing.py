"""Calls in flight sized from the rate limit and the observed latency; load streaming behind extraction;
embedding requests sharing the LLM's limit."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from kenning.pipeline import collection
from kenning.pipeline.ingest import Source, add
from kenning.pipeline.models import Extraction, GraphNode, Scope
from kenning.pipeline.offline import OfflineExtractor
from kenning.pipeline.pacing import Metered, Pacer, in_flight
from kenning.storage.graph.memory import MemoryGraphStore
from kenning.workers.runtime.local_runner import BEHIND_BATCHES, LocalRunner
from kenning.workers.runtime.settings import Settings, load_settings
from kenning.workers.runtime.wiring import embeddings_share_llm_limit
from tests.twins import CountingExtractor, TwinServices

SCOPE = Scope(tenant="t1", dataset="stream")
TEXTS = [f"Person{n} Alpha met Person{n} Beta in City{n} during the year {1900 + n}." for n in range(8)]


def test_in_flight_follows_littles_law_within_the_cap() -> None:
    # 600 requests a minute at 500 ms a call: 10/s x 0.5 s = 5 calls, 8 with the headroom
    assert in_flight(600, 0.5, 32) == 8
    assert in_flight(600, 10.0, 32) == 32  # never past the cap
    assert in_flight(60, 0.01, 32) == 1  # never below one
    assert in_flight(0, 0.5, 32) == 32  # no limit: the cap


class FakeClient:
    def __init__(self) -> None:
        self.calls, self.seconds = 0, 0.0

    def answered(self) -> tuple[int, float]:
        return self.calls, self.seconds


def test_pacer_moves_with_the_observed_latency() -> None:
    # Given a pacer at 600 requests a minute, before any call was answered
    pacer = Pacer(600, 32)
    client = FakeClient()
    assert isinstance(client, Metered)
    pacer.follow(client)  # the first look only takes note
    first = pacer.limit
    # When calls are seen to take 500 ms, again and again
    for _ in range(30):
        client.calls, client.seconds = client.calls + 10, client.seconds + 5.0
        pacer.follow(client)
    # Then the calls in flight come down to what 500 ms needs
    assert first == in_flight(600, 1.0, 32) == 15
    assert pacer.latency_s == pytest.approx(0.5, rel=1e-3) and pacer.limit in (8, 9)
    # And when calls slow down to 2 s, they go up again
    for _ in range(30):
        client.calls, client.seconds = client.calls + 10, client.seconds + 20.0
        pacer.follow(client)
    assert pacer.latency_s == pytest.approx(2.0, rel=1e-3) and pacer.limit in (30, 31)


class Recorder:
    """The order in which extractions end and graph writes happen."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.written = threading.Event()
        self.mutex = threading.Lock()

    def note(self, event: str) -> None:
        with self.mutex:
            self.events.append(event)


class RecordingGraph(MemoryGraphStore):
    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def upsert_nodes(self, scope: Scope, nodes: Sequence[GraphNode]) -> None:
        super().upsert_nodes(scope, nodes)
        self.recorder.note("written")
        self.recorder.written.set()


class SlowExtractor(CountingExtractor):
    """Answers the first `quick` calls at once; every later one only once something was written
    (or after a bound, so that a runner that does not stream fails the test instead of hanging)."""

    def __init__(self, recorder: Recorder, quick: int, patience_s: float = 10.0) -> None:
        super().__init__()
        self.recorder, self.quick, self.patience_s = recorder, quick, patience_s
        self._slow_inner = OfflineExtractor()
        self._slow_mutex = threading.Lock()

    def extract(self, text: str) -> Extraction:
        with self._slow_mutex:
            self.calls += 1
            late = self.calls > self.quick
        if late:
            self.recorder.written.wait(timeout=self.patience_s)
        extraction = self._slow_inner.extract(text)
        self.recorder.note("extracted")
        return extraction


def ingest(services: TwinServices) -> None:
    add(
        services.metadata,
        services.blobs,
        SCOPE,
        [Source(name=f"{i}.txt", uri=f"t:{i}", data=t.encode()) for i, t in enumerate(TEXTS)],
    )


@pytest.mark.parametrize("rpm", [0, 6000])
def test_load_writes_while_extraction_goes_on(rpm: int) -> None:
    # Given chunks loaded two at a time, and an extractor whose later calls end only after a write
    recorder = Recorder()
    services = TwinServices(graph=RecordingGraph(recorder), extractor=SlowExtractor(recorder, quick=2))
    services.config.load_batch = 2
    ingest(services)
    # When the dataset is cognified, with and without a rate limit (batches still to send)
    run = LocalRunner(services, services.lock, concurrency=2, rpm=rpm).run(SCOPE)
    # Then the first write came before the last extraction ended
    events = recorder.events
    last_extraction = len(events) - 1 - events[::-1].index("extracted")
    assert run.status.value == "completed", run.error
    assert events.index("written") < last_extraction
    # And the graph is the one a single load after the extraction builds
    plain = TwinServices()
    plain.config.load_batch = 1000
    ingest(plain)
    LocalRunner(plain, plain.lock, concurrency=2).run(SCOPE)
    nodes, edges = services.graph.export(SCOPE)
    plain_nodes, plain_edges = plain.graph.export(SCOPE)
    assert {n.id for n in nodes} == {n.id for n in plain_nodes}
    assert {e.id for e in edges} == {e.id for e in plain_edges}
    for name in plain.vectors.list_collections():
        assert services.vectors.count(SCOPE, name) == plain.vectors.count(SCOPE, name)


@pytest.mark.parametrize("rpm", [6000, 0])
def test_under_a_rate_limit_no_pass_starts_that_would_end_after_the_last_extraction(rpm: int) -> None:
    # Given every chunk's extraction in flight at once, the first answered at once and the rest
    # only after a write (or after a bound, so that the test ends either way)
    recorder = Recorder()
    services = TwinServices(
        graph=RecordingGraph(recorder), extractor=SlowExtractor(recorder, quick=1, patience_s=1.0)
    )
    services.config.load_batch = 2
    ingest(services)
    # When the dataset is cognified, with and without a rate limit
    run = LocalRunner(services, services.lock, concurrency=len(TEXTS), rpm=rpm).run(SCOPE)
    # Then under the limit no pass ran beside the last extractions: one after them wrote it all
    # (a pass mostly waits there, and one begun beside them holds the last chunks back until it
    # ends); without it a pass wrote beside them (the writer does not idle)
    events = recorder.events
    last_extraction = len(events) - 1 - events[::-1].index("extracted")
    assert run.status.value == "completed", run.error
    assert (events.index("written") > last_extraction) == bool(rpm)
    assert services.vectors.count(SCOPE, collection.CHUNKS) == len(TEXTS)


class Lead:
    """How far extraction runs ahead of the graph writes, in chunks."""

    def __init__(self) -> None:
        self.extracted = self.written = self.most = 0
        self.mutex = threading.Lock()

    def extract(self) -> None:
        with self.mutex:
            self.extracted += 1
            self.most = max(self.most, self.extracted - self.written)


class SlowGraph(MemoryGraphStore):
    """Writes a chunk at a time, slowly."""

    def __init__(self, lead: Lead) -> None:
        super().__init__()
        self.lead = lead

    def upsert_nodes(self, scope: Scope, nodes: Sequence[GraphNode]) -> None:
        for node in nodes:
            if node.type == "DocumentChunk":
                time.sleep(0.01)
                with self.lead.mutex:
                    self.lead.written += 1
        super().upsert_nodes(scope, nodes)


class LeadingExtractor(CountingExtractor):
    def __init__(self, lead: Lead) -> None:
        super().__init__()
        self.lead = lead

    def extract(self, text: str) -> Extraction:
        self.lead.extract()
        return super().extract(text)


def test_without_a_rate_limit_extraction_waits_for_a_writer_that_falls_behind() -> None:
    # Given 120 chunks, extracted at once, written one load batch of 2 at a time, slowly
    lead = Lead()
    services = TwinServices(graph=SlowGraph(lead), extractor=LeadingExtractor(lead))
    services.config.load_batch = 2
    texts = [f"Person{n} Gamma moved to Town{n} in {1800 + n}." for n in range(120)]
    add(
        services.metadata,
        services.blobs,
        SCOPE,
        [Source(name=f"{n}.txt", uri=f"t:{n}", data=t.encode()) for n, t in enumerate(texts)],
    )
    # When the dataset is cognified with no rate limit
    run = LocalRunner(services, services.lock, concurrency=4).run(SCOPE)
    # Then extraction never ran further ahead of the writes than the items allowed to wait for a
    # pass, twice over (those of the pass running and those of the next), and a batch each
    assert run.status.value == "completed", run.error
    assert lead.written == len(texts)
    waiting = 2 * BEHIND_BATCHES * services.config.load_batch + services.config.extract_batch
    assert lead.most <= 2 * waiting < len(texts) / 2


def test_embedding_requests_to_the_llm_host_count_toward_its_limit(tmp_path: Path) -> None:
    def settings(embedding_url: str) -> Settings:
        return load_settings(
            home=tmp_path,
            llm_url="http://llm.example:8000/v1",
            llm_rpm=600,
            embedding_provider="openai",
            embedding_url=embedding_url,
        )

    assert embeddings_share_llm_limit(settings("http://llm.example:8000/v1"))
    assert not embeddings_share_llm_limit(settings("http://embed.example:8000/v1"))
    assert not embeddings_share_llm_limit(load_settings(home=tmp_path, embedding_provider="hash"))
