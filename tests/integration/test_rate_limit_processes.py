"""Three worker processes share one Redis rate limiter in front of the simulator; and how
the OpenAI-compatible adapters and the wiring use a limiter.

The simulator counts over a 1-second sliding window (10 requests per window), so that
the limit binds within a few seconds; the limiter allows 500 a minute (about 8 a second,
burst 1), which no 1-second window can exceed. With the shared limiter the simulator
answers (almost) no 429; with one limiter per process, the same load is refused often.
Each process makes one call before the run, outside the limiter, so that its first
call's setup does not delay a limited one; the simulator starts over after those.
"""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import pytest
import redis

from kenning.pipeline.errors import LLMError, TransientLLMError
from kenning.pipeline.ratelimit import Limits, RateLimiter, provider_key
from kenning.storage.coordination.ratelimit_memory import MemoryRateLimiter
from kenning.storage.coordination.ratelimit_redis import RedisRateLimiter
from kenning.storage.inference.embedder import OpenAIEmbedder
from kenning.storage.inference.llm_openai import LLMConfig, OpenAICompleter, OpenAIExtractor
from kenning.workers.runtime.settings import load_settings
from kenning.workers.runtime.wiring import Wiring, llm_limit_key
from tests.simulator import EMBEDDING_DIMENSION, Simulator

PROCESSES = 3
RUN_S = 3.0
LIMITS = Limits(rpm=500, burst=1)
SIMULATOR_LIMIT = 10  # requests per 1-second window
START_TIMEOUT_S = 60.0
TEXT = "Ada Lovelace worked with Charles Babbage in London on the Analytical Engine."


def call_for(
    base_url: str, redis_url: str, prefix: str, shared: bool, ready: Barrier, start: Barrier, results: Any
) -> None:
    """One worker process: extract as fast as the limiter allows for RUN_S seconds; report successes."""
    client = redis.Redis.from_url(redis_url)
    key = provider_key(base_url, "sim-model")
    limiter: RateLimiter = (
        RedisRateLimiter(client, {key: LIMITS}, prefix) if shared else MemoryRateLimiter({key: LIMITS})
    )
    config = LLMConfig(base_url=base_url, model="sim-model", timeout_s=10, max_retries=3, backoff_base_s=0.05)
    OpenAIExtractor(config).extract(TEXT)
    extractor = OpenAIExtractor(config, limiter=limiter)
    extractor.extract(TEXT)
    done = failed = 0
    ready.wait(timeout=START_TIMEOUT_S)
    start.wait(timeout=START_TIMEOUT_S)
    end = time.monotonic() + RUN_S
    for _ in range(10_000):
        if time.monotonic() >= end:
            break
        try:
            extractor.extract(TEXT)
            done += 1
        except LLMError:
            failed += 1
    extractor.close()
    client.close()
    results.put((done, failed))


@pytest.fixture
def simulator() -> Iterator[Simulator]:
    with Simulator(rpm=SIMULATOR_LIMIT, window_s=1.0, rpm_scope="chat") as started:
        yield started


def run_workers(simulator: Simulator, redis_url: str, prefix: str, shared: bool) -> list[tuple[int, int]]:
    context = multiprocessing.get_context("spawn")
    ready, start = context.Barrier(PROCESSES + 1), context.Barrier(PROCESSES + 1)
    results = context.Queue()
    args = (simulator.base_url, redis_url, prefix, shared, ready, start, results)
    workers = [context.Process(target=call_for, args=args) for _ in range(PROCESSES)]
    for worker in workers:
        worker.start()
    try:
        ready.wait(timeout=START_TIMEOUT_S)
        simulator.reset()
        start.wait(timeout=START_TIMEOUT_S)
        return [results.get(timeout=RUN_S + 30) for _ in workers]
    except (queue.Empty, threading.BrokenBarrierError):
        pytest.fail("a worker process did not start or did not report")
    finally:
        for worker in workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.kill()
        client = redis.Redis.from_url(redis_url)
        keys = list(client.scan_iter(match=prefix + "*", count=100))
        if keys:
            client.delete(*keys)
        client.close()


@pytest.mark.slow
@pytest.mark.redis
def test_processes_sharing_the_redis_limiter_stay_within_the_limit(
    simulator: Simulator, redis_url: str, key_prefix: str
) -> None:
    # Given three processes that each extract as fast as the one shared limiter lets them
    results = run_workers(simulator, redis_url, key_prefix, shared=True)

    # Then every process got calls through, none failed, and the endpoint refused (almost) none
    stats = simulator.stats()
    assert all(done > 0 for done, _ in results)
    assert sum(failed for _, failed in results) == 0
    assert stats["rate_limited"] <= 1
    # and all of them together made no more calls than the limiter allows over the run
    admitted = stats["calls"]["chat"] - stats["rate_limited"]
    assert admitted == sum(done for done, _ in results)
    assert admitted <= LIMITS.burst + LIMITS.request_rate * (RUN_S + 1.0) + 1


@pytest.mark.slow
@pytest.mark.redis
def test_processes_limiting_themselves_alone_are_refused(
    simulator: Simulator, redis_url: str, key_prefix: str
) -> None:
    # Given the same load with one limiter per process: three times the rate the endpoint admits
    run_workers(simulator, redis_url, key_prefix, shared=False)

    # Then the endpoint answered many 429s: the shared limiter above is what prevents them
    assert simulator.stats()["rate_limited"] >= PROCESSES


class RecordingLimiter:
    """A `RateLimiter` that admits everything and remembers what it was asked."""

    def __init__(self, refuse: bool = False) -> None:
        self.acquired: list[tuple[str, int]] = []
        self.penalties: list[tuple[str, float]] = []
        self._refuse = refuse

    def acquire(self, key: str, tokens: int, deadline_s: float) -> None:
        if self._refuse:
            raise TransientLLMError("rate limit wait exceeded: test")
        self.acquired.append((key, tokens))

    def penalize(self, key: str, retry_after_s: float) -> None:
        self.penalties.append((key, retry_after_s))


def test_the_extractor_acquires_before_every_attempt_and_penalizes_a_429() -> None:
    # Given an endpoint admitting one request per half-second window
    limiter = RecordingLimiter()
    with Simulator(rpm=1, window_s=0.5) as simulator:
        config = LLMConfig(base_url=simulator.base_url, model="sim-model", max_retries=2, backoff_base_s=0.01)
        with closing(OpenAIExtractor(config, limiter=limiter)) as extractor:
            # When two calls come within one window
            extractor.extract(TEXT)
            extractor.extract(TEXT)
        stats = simulator.stats()

    # Then each of the three attempts was admitted first, with the prompt and answer estimate
    key = provider_key(simulator.base_url, "sim-model")
    assert stats["calls"]["chat"] == 3 and stats["rate_limited"] == 1
    assert [acquired_key for acquired_key, _ in limiter.acquired] == [key] * 3
    assert all(tokens > config.completion_tokens_estimate + len(TEXT) // 4 for _, tokens in limiter.acquired)
    # and the 429 penalized the key for as long as its Retry-After said
    ((penalized_key, wait),) = limiter.penalties
    assert penalized_key == key and 0 < wait <= 0.5


def test_a_limiter_wait_past_the_deadline_fails_the_call_without_sending_it() -> None:
    with Simulator() as simulator:
        config = LLMConfig(base_url=simulator.base_url, model="sim-model", max_retries=3)
        with closing(OpenAICompleter(config, RecordingLimiter(refuse=True), "shared-key")) as completer:
            with pytest.raises(TransientLLMError, match="rate limit wait exceeded"):
                completer.complete("Answer briefly.", "Who wrote the notes?")
        assert simulator.stats()["calls"]["chat"] == 0


def test_the_embedder_acquires_for_the_clients_own_retries_and_penalizes_429s() -> None:
    limiter = RecordingLimiter()
    with Simulator(rpm=1, window_s=0.5) as simulator:
        embedder = OpenAIEmbedder(
            simulator.base_url, "", "sim-embed", EMBEDDING_DIMENSION, max_retries=2, limiter=limiter
        )
        with closing(embedder):
            embedder.embed(["Ada Lovelace"])
            embedder.embed(["Charles Babbage"])
        stats = simulator.stats()

    key = provider_key(simulator.base_url, "sim-embed")
    assert stats["calls"]["embeddings"] == 3 and stats["rate_limited"] == 1
    assert [acquired_key for acquired_key, _ in limiter.acquired] == [key] * 3
    assert [penalized_key for penalized_key, _ in limiter.penalties] == [key]


@pytest.mark.redis
def test_the_wiring_shares_a_redis_limiter_only_when_distributed(tmp_path: Path, redis_url: str) -> None:
    settings = load_settings(
        home=tmp_path,
        llm_url="http://127.0.0.1:9/v1",
        llm_model="m",
        llm_rpm=600,
        llm_limit_per_tenant=True,
        tenant="acme",
        redis_url=redis_url,
    )
    embedded, distributed = Wiring(settings), Wiring(settings, distributed=True)
    try:
        assert isinstance(embedded.limiter, MemoryRateLimiter)
        assert isinstance(distributed.limiter, RedisRateLimiter)
        assert llm_limit_key(settings) == "127.0.0.1:9/m/acme"
        assert Wiring(load_settings(home=tmp_path, llm_url="http://127.0.0.1:9/v1")).limiter is None
    finally:
        embedded.close()
        distributed.close()
