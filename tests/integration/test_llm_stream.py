"""Streamed answers against the simulator: a slow server is not a dead one, and a busy server is
asked no more than it takes at once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from typing import Any

from kenning.pipeline.offline import OfflineExtractor
from kenning.storage.inference.llm_openai import LLMConfig, OpenAIExtractor
from tests.simulator import Simulator, StartSimulator

TEXT = "Ada Lovelace worked with Charles Babbage in London. She published her notes in 1843."
OTHER = "Grace Hopper worked at Harvard University in 1944 on the Mark I computer."


def extractor_for(simulator: Simulator, **overrides: Any) -> OpenAIExtractor:
    settings: dict[str, Any] = {
        "base_url": simulator.base_url,
        "model": "sim-model",
        "timeout_s": 1.0,
        "max_retries": 4,
        "backoff_base_s": 0.01,
        # One timeout counted against the breaker opens it: none may be
        "breaker_failures": 1,
        "breaker_cooldown_s": 600,
    }
    return OpenAIExtractor(LLMConfig(**(settings | overrides)))


def both_at_once(extractor: OpenAIExtractor) -> list[str]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        return [extraction.summary for extraction in pool.map(extractor.extract, [TEXT, OTHER])]


def expected() -> list[str]:
    return [OfflineExtractor().extract(text).summary for text in (TEXT, OTHER)]


def test_an_answer_streaming_for_longer_than_the_timeout_is_alive(start_simulator: StartSimulator) -> None:
    # Given a server that streams a token every 10 ms: a reply of hundreds of tokens takes seconds
    simulator = start_simulator(token_ms=10)
    with closing(extractor_for(simulator, timeout_s=0.5)) as extractor:
        # When a chunk is extracted with a timeout of half a second
        extraction = extractor.extract(TEXT)
        usage, state = extractor.usage, extractor.breaker_state

    # Then the reply came whole, at its first attempt, and the breaker is closed
    assert extraction.summary == OfflineExtractor().extract(TEXT).summary
    assert usage.calls == 1 and usage.retries == 0 and state == "closed"
    assert usage.completion_tokens == simulator.stats()["completion_tokens"] > 50


def test_a_request_waiting_silently_behind_another_is_not_a_dead_server(
    start_simulator: StartSimulator,
) -> None:
    # Given a server answering one request at a time, sending nothing to those waiting, in ~2 s
    simulator = start_simulator(serial=True, ping_s=0, token_ms=6)
    with closing(extractor_for(simulator)) as extractor:
        extractor.extract(TEXT)  # the server took one: the window tries two
        assert extractor.window.limit == 2
        # When two chunks are extracted at once, the second waiting past its timeout of 1 s
        summaries = both_at_once(extractor)
        usage, state, window = extractor.usage, extractor.breaker_state, extractor.window

    # Then both were extracted, the wait was retried without counting against the breaker,
    # and the window is back to one request at a time
    assert summaries == expected()
    assert usage.retries >= 1 and state == "closed"
    assert window.limit == 1 and window.ceiling == 1


def test_a_stream_broken_off_for_another_request_is_retried_in_turn(start_simulator: StartSimulator) -> None:
    # Given a server answering one request at a time that ends a stream when another comes in
    simulator = start_simulator(serial=True, interrupts=True, token_ms=2)
    with closing(extractor_for(simulator)) as extractor:
        extractor.extract(TEXT)
        # When two chunks are extracted at once
        summaries = both_at_once(extractor)
        more = [extractor.extract(text).summary for text in (TEXT, OTHER)]
        usage, state, window = extractor.usage, extractor.breaker_state, extractor.window

    # Then one stream was broken off, once: its retry waited for its turn, and so did the next calls
    assert summaries == more == expected()
    assert simulator.stats()["interrupted"] == 1 and usage.retries == 1
    assert state == "closed" and window.limit == 1


def test_a_server_that_answers_a_stream_request_in_one_piece_is_read(start_simulator: StartSimulator) -> None:
    simulator = start_simulator(streams=False)
    with closing(extractor_for(simulator)) as extractor:
        extraction = extractor.extract(TEXT)
        usage = extractor.usage

    assert extraction.summary == OfflineExtractor().extract(TEXT).summary
    assert usage.completion_tokens == simulator.stats()["completion_tokens"] > 0
