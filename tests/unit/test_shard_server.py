"""The search server a collection's holder runs: its answering threads and its stop."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kenning.pipeline.models import Scope, ScoredPoint
from kenning.storage.vectors.shard_server import ANSWERING_THREADS, SearchServer, search_remotely

SCOPE = Scope(tenant="t", dataset="d")


class SlowSearch:
    """Answers every search with one hit after a pause, noting the thread that answered."""

    def __init__(self) -> None:
        self.threads: set[str] = set()
        self._lock = threading.Lock()

    def __call__(
        self, scope: Scope, vector: Sequence[float], limit: int, fields: Sequence[str] | None
    ) -> list[ScoredPoint]:
        with self._lock:
            self.threads.add(threading.current_thread().name)
        time.sleep(0.02)
        return [ScoredPoint(id=f"{scope.dataset}-{limit}", score=float(vector[0]), payload={})]


def test_searches_are_answered_by_the_servers_own_threads_and_stop_ends_them(tmp_path: Path) -> None:
    # Given a server answering with a search that takes a while
    search = SlowSearch()
    server = SearchServer(tmp_path, search)
    server.start()
    try:
        # When 24 searches come at once from other threads
        with ThreadPoolExecutor(max_workers=12) as askers:
            answers = list(
                askers.map(lambda n: search_remotely(tmp_path, SCOPE, [float(n)], n, None), range(24))
            )
    finally:
        server.stop()
    # Then each gets its own answer, from the server's few answering threads, which stop ends
    assert [answer and (answer[0].id, answer[0].score) for answer in answers] == [
        (f"d-{n}", float(n)) for n in range(24)
    ]
    assert 1 <= len(search.threads) <= ANSWERING_THREADS
    assert all(name.startswith(f"kenning-search-{tmp_path.name}-") for name in search.threads)
    assert ended(f"kenning-search-{tmp_path.name}")
    assert not (tmp_path / ".sock").exists()
    # And nobody answers there any more
    assert search_remotely(tmp_path, SCOPE, [1.0], 1, None, timeout_s=1.0) is None


def ended(prefix: str, within_s: float = 5.0) -> bool:
    """Whether every thread named `prefix...` has ended, waiting at most `within_s`."""
    deadline = time.monotonic() + within_s
    while any(thread.name.startswith(prefix) for thread in threading.enumerate()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_stop_does_not_wait_for_a_search_that_waits_for_the_stopping_thread(tmp_path: Path) -> None:
    # Given a server whose search needs a lock that the thread stopping the server holds (a
    # collection's holder closes its shard holding the shard's state)
    held = threading.Lock()
    answering = threading.Event()

    def search(
        scope: Scope, vector: Sequence[float], limit: int, fields: Sequence[str] | None
    ) -> list[ScoredPoint]:
        answering.set()
        with held:
            return []

    server = SearchServer(tmp_path, search)
    server.start()
    with held:
        asker = threading.Thread(target=search_remotely, args=(tmp_path, SCOPE, [1.0], 1, None, 5.0))
        asker.start()
        assert answering.wait(timeout=5)  # the search is being answered, waiting for the lock
        # When the holder stops the server, holding that lock
        stopper = threading.Thread(target=server.stop)
        stopper.start()
        stopper.join(timeout=5)
        # Then stop has returned while that search still waits
        assert not stopper.is_alive()
        assert asker.is_alive()
    # And the search is answered once the lock is free, and the answering threads end
    asker.join(timeout=10)
    assert not asker.is_alive()
    assert ended(f"kenning-search-{tmp_path.name}")


def test_an_answer_that_cannot_be_encoded_sends_the_asker_to_search_itself_and_the_server_goes_on(
    tmp_path: Path,
) -> None:
    # Given a server whose search finds, for some vectors, a payload with a value JSON cannot hold
    def search(
        scope: Scope, vector: Sequence[float], limit: int, fields: Sequence[str] | None
    ) -> list[ScoredPoint]:
        payload: dict[str, object] = {"n": 2**70} if vector[0] < 0 else {"n": 1}
        return [ScoredPoint(id="p", score=0.0, payload=payload)]

    server = SearchServer(tmp_path, search)
    server.start()
    try:
        # When more such searches come than the server has answering threads
        bad = [
            search_remotely(tmp_path, SCOPE, [-1.0], 1, None, timeout_s=5.0)
            for _ in range(ANSWERING_THREADS + 1)
        ]
        # Then each asker is told at once to search on its own (no answer, not a wait)
        assert bad == [None] * (ANSWERING_THREADS + 1)
        # And the server still answers the next search
        good = search_remotely(tmp_path, SCOPE, [1.0], 1, None, timeout_s=5.0)
        assert good is not None and good[0].payload == {"n": 1}
    finally:
        server.stop()


def test_a_request_whose_vector_is_a_list_of_numbers_is_answered(tmp_path: Path) -> None:
    # Given a server, and a process that asks with the vector as a JSON list (as a kenning before
    # the base64 form did, still running beside this one on the same home)
    server = SearchServer(tmp_path, SlowSearch())
    server.start()
    try:
        request = {"scope": {"tenant": "t", "dataset": "d"}, "vector": [3.5, 0.0], "limit": 2, "fields": None}
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(5.0)
            connection.connect(str(tmp_path / ".sock"))
            connection.sendall(json.dumps(request).encode() + b"\n")
            with connection.makefile("rb") as answers:
                answer = json.loads(answers.readline())
    finally:
        server.stop()
    # Then it is answered, not sent to take the shard over
    assert answer == {"hits": [["d-2", 3.5, {}]]}
