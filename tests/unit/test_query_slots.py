"""Query slots: at most N searches of a home at once, across threads and processes, never held
while a search waits for an LLM."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from kenning.pipeline.ingest import Source, add
from kenning.pipeline.models import Scope
from kenning.retrieval.contract import SearchRequest, SearchType
from kenning.retrieval.registry import search
from kenning.storage.embedder import HashEmbedder
from kenning.storage.query_slots import FileQuerySlots
from kenning.workers.local import LocalRunner
from kenning.workers.settings import load_settings
from kenning.workers.wiring import Wiring, query_slot_count
from tests.twins import TwinServices

HELD_S = 0.03
START_TIMEOUT_S = 60.0
SCOPE = Scope(tenant="t1", dataset="slots")


def hold_in_turn(folder: str, slots: int, times: int, start: object, out: str) -> None:
    """A client process: waits for `start`, then holds a slot `times` times, writing when it held it."""
    chosen = FileQuerySlots(Path(folder), slots)
    start.wait(START_TIMEOUT_S)  # type: ignore[attr-defined]
    with open(out, "w") as intervals:
        for _ in range(times):
            with chosen.slot():
                began = time.monotonic()
                time.sleep(HELD_S)
                intervals.write(f"{began} {time.monotonic()}\n")


def hold_until_killed(folder: str, ready: object) -> None:
    slots = FileQuerySlots(Path(folder), 1)
    with slots.slot():
        ready.set()  # type: ignore[attr-defined]
        time.sleep(START_TIMEOUT_S)


def most_at_once(intervals: Sequence[tuple[float, float]]) -> int:
    moments = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = peak = 0
    for _, step in moments:
        running += step
        peak = max(peak, running)
    return peak


def test_threads_of_one_process_take_turns(tmp_path: Path) -> None:
    slots = FileQuerySlots(tmp_path, 2)
    inside, peak, mutex = [0], [0], threading.Lock()

    def client() -> None:
        for _ in range(3):
            with slots.slot():
                with mutex:
                    inside[0] += 1
                    peak[0] = max(peak[0], inside[0])
                time.sleep(HELD_S)
                with mutex:
                    inside[0] -= 1

    threads = [threading.Thread(target=client) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(START_TIMEOUT_S)
    assert inside == [0] and 1 <= peak[0] <= 2


@pytest.mark.parametrize(("slots", "clients"), [(1, 3), (2, 4)])
def test_processes_of_one_home_hold_at_most_the_slots_at_once(
    tmp_path: Path, slots: int, clients: int
) -> None:
    context = mp.get_context("spawn")
    start = context.Event()
    outs = [str(tmp_path / f"client-{n}.txt") for n in range(clients)]
    workers = [
        context.Process(target=hold_in_turn, args=(str(tmp_path / "slots"), slots, 4, start, out))
        for out in outs
    ]
    for worker in workers:
        worker.start()
    start.set()
    for worker in workers:
        worker.join(START_TIMEOUT_S)
        assert worker.exitcode == 0
    intervals = [
        (float(began), float(ended))
        for out in outs
        for began, ended in (line.split() for line in Path(out).read_text().splitlines())
    ]
    assert len(intervals) == 4 * clients
    assert most_at_once(intervals) <= slots


def test_a_search_within_a_search_holds_the_slot_it_has(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    slots = FileQuerySlots(tmp_path, 1, wait_s=0.2)
    with caplog.at_level(logging.WARNING), slots.slot(), slots.slot():
        assert slots.holds_slot
    assert not slots.holds_slot
    assert "no query slot" not in caplog.text


def test_released_lets_another_search_in_and_takes_the_slot_again(tmp_path: Path) -> None:
    slots = FileQuerySlots(tmp_path, 1)
    entered, waited = threading.Event(), []

    def other() -> None:
        with slots.slot():
            entered.set()

    with slots.slot():
        thread = threading.Thread(target=other)
        with slots.released():
            assert not slots.holds_slot
            thread.start()
            waited.append(entered.wait(START_TIMEOUT_S))
        assert slots.holds_slot
    thread.join(START_TIMEOUT_S)
    assert waited == [True]


def test_a_dead_holder_frees_its_slot_and_a_held_one_is_waited_for_only_so_long(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    context = mp.get_context("spawn")
    ready = context.Event()
    holder = context.Process(target=hold_until_killed, args=(str(tmp_path), ready))
    holder.start()
    try:
        assert ready.wait(START_TIMEOUT_S)
        slots = FileQuerySlots(tmp_path, 1, wait_s=0.2)
        with caplog.at_level(logging.WARNING), slots.slot():
            assert not slots.holds_slot  # ran without one
        assert "no query slot came free in 0.2 s" in caplog.text
    finally:
        holder.kill()
        holder.join(START_TIMEOUT_S)
    with slots.slot():
        assert slots.holds_slot


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")
def test_a_forked_child_does_not_take_its_parents_slot(tmp_path: Path) -> None:
    slots = FileQuerySlots(tmp_path, 1, wait_s=0.2)
    with slots.slot():
        child = os.fork()
        if child == 0:  # pragma: no cover - the child reports through its exit code
            with slots.slot():
                os._exit(1 if slots.holds_slot else 0)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert slots.holds_slot
    child = os.fork()
    if child == 0:  # pragma: no cover
        with slots.slot():
            os._exit(0 if slots.holds_slot else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


class SlotWatch:
    """Records, at each call, whether the search held its slot."""

    def __init__(self, slots: FileQuerySlots) -> None:
        self.slots = slots
        self.seen: list[tuple[str, bool]] = []

    def complete(self, system: str, prompt: str) -> str:
        self.seen.append(("llm", self.slots.holds_slot))
        return "Grace Hopper" if "answer" in system.lower() else "DONE"


class WatchedEmbedder(HashEmbedder):
    def __init__(self, watch: SlotWatch) -> None:
        super().__init__()
        self.watch = watch

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.watch.seen.append(("embed", self.watch.slots.holds_slot))
        return super().embed(texts)


@pytest.mark.parametrize("kind", [SearchType.GRAPH_COMPLETION, SearchType.GRAPH_COMPLETION_COT])
def test_a_search_holds_its_slot_for_retrieval_and_never_while_it_waits_for_the_llm(
    tmp_path: Path, kind: SearchType
) -> None:
    services = TwinServices()
    text = b"Grace Hopper built the first compiler in 1952. Grace Hopper worked at Remington Rand."
    add(services.metadata, services.blobs, SCOPE, [Source(name="hopper.txt", uri="test:hopper", data=text)])
    assert LocalRunner(services, services.lock).run(SCOPE).status.value == "completed"
    slots = FileQuerySlots(tmp_path, 1)
    watch = SlotWatch(slots)
    services.completer, services.embedder = watch, WatchedEmbedder(watch)  # type: ignore[assignment]
    request = SearchRequest(query="Who built the first compiler?", type=kind, scopes=[SCOPE])
    result = search(services, request, slots)
    assert result.answer == "Grace Hopper"
    assert ("embed", True) in watch.seen and ("llm", True) not in watch.seen
    assert sum(1 for call, _ in watch.seen if call == "llm") >= (
        2 if kind == SearchType.GRAPH_COMPLETION_COT else 1
    )
    assert not slots.holds_slot


def test_an_embedded_home_with_local_embeddings_gets_one_slot_more_than_its_cpus(tmp_path: Path) -> None:
    cpus = len(os.sched_getaffinity(0))
    assert query_slot_count(load_settings(home=tmp_path)) == cpus + 1
    assert query_slot_count(load_settings(home=tmp_path, query_slots=3)) == 3
    assert query_slot_count(load_settings(home=tmp_path, query_slots=0)) == 0
    remote = load_settings(home=tmp_path, embedding_provider="openai", embedding_url="http://127.0.0.1:9/v1")
    assert query_slot_count(remote) == 0
    assert query_slot_count(load_settings(home=tmp_path, qdrant_url="http://127.0.0.1:6333")) == 0
    wiring = Wiring(load_settings(home=tmp_path, query_slots=2))
    try:
        assert isinstance(wiring.query_slots, FileQuerySlots)
    finally:
        wiring.close()
