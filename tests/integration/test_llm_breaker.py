"""An endpoint that accepts connections and never answers: one deadline per call, then a breaker."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kenning.pipeline.errors import TransientLLMError
from kenning.storage.inference.llm_openai import CircuitOpen, LLMConfig, OpenAIExtractor
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings


class BlackHole:
    """Accepts every connection on 127.0.0.1 and never sends a byte; counts the connections."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.connections: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.getsockname()[1]}/v1"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                self.connections.append(self.server.accept()[0])
            except TimeoutError:
                continue

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for connection in self.connections:
            connection.close()
        self.server.close()


@pytest.fixture
def hole() -> Iterator[BlackHole]:
    server = BlackHole()
    yield server
    server.close()


def test_one_deadline_bounds_every_call_and_the_breaker_then_fails_fast(hole: BlackHole) -> None:
    config = LLMConfig(
        base_url=hole.url,
        model="m",
        timeout_s=0.3,
        max_retries=20,
        deadline_s=1.0,
        backoff_base_s=0.05,
        breaker_failures=4,
        breaker_cooldown_s=600,
    )
    extractor = OpenAIExtractor(config)
    # The first call gives up at its deadline, long before its 21 attempts
    with pytest.raises(TransientLLMError, match=r"gave up after [1-4] attempts"):
        extractor.extract("one")
    # Calls go on failing until 4 failures in a row open the breaker
    with pytest.raises(TransientLLMError):
        extractor.extract("two")
    assert extractor.breaker_state == "open"
    seen = len(hole.connections)
    # Then calls fail at once, without touching the endpoint
    for text in ("three", "four", "five"):
        with pytest.raises(CircuitOpen, match="unreachable: circuit breaker open"):
            extractor.extract(text)
    assert len(hole.connections) == seen
    extractor.close()


def test_a_run_against_a_black_hole_ends_with_every_chunk_failed_and_says_why(
    tmp_path: Path, hole: BlackHole
) -> None:
    settings = load_settings(
        home=tmp_path / "home",
        embedding_provider="hash",
        llm_url=hole.url,
        llm_timeout_s=0.3,
        llm_deadline_s=1.0,
        llm_breaker_failures=2,
        concurrency=1,
    )
    with Kenning(settings) as memory:
        for n in range(6):
            memory.add_text(f"Note number {n} about harbours.", "d", name=f"n{n}")
        run = memory.cognify("d")
        [status] = memory.status("d")

    assert run.status.value == "completed_with_errors" and run.stats["failed_chunks"] == 6
    # The run's error says, in one line, that the breaker opened, why, and what was not done
    assert run.error.startswith(f"LLM at {hole.url} unreachable: circuit breaker open after "), run.error
    assert "(last: no answer within " in run.error and "\n" not in run.error
    assert " s); 6 failed chunks: `kenning status` lists each" in run.error, run.error
    errors = [chunk["error"] for chunk in status["failed_chunks"]]
    assert sum("circuit breaker open" in error for error in errors) >= 4
    # At most a couple of calls ever reached the endpoint before the breaker opened
    assert len(hole.connections) <= 2 * (1.0 / 0.3 + 1)
