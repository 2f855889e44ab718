"""The LLM circuit breaker over a failure tally, shared or its own."""

from __future__ import annotations

import pytest

from kenning.pipeline.errors import LLMUnreachable, TransientStoreError
from kenning.pipeline.spend import Tally
from kenning.storage.coordination.breaker_memory import MemoryFailureTally
from kenning.storage.inference.llm_openai import CircuitBreaker


class AwayTally:
    """A shared tally whose store does not answer."""

    def tally(self, key: str) -> Tally:
        raise TransientStoreError("redis away")

    def failed(self, key: str, cause: str, failures: int, cooldown_s: float) -> bool:
        raise TransientStoreError("redis away")

    def succeeded(self, key: str) -> bool:
        raise TransientStoreError("redis away")


def test_breakers_sharing_a_tally_open_together_and_say_why_in_one_line() -> None:
    # Given two workers' breakers over one tally, opening after three failures
    shared = MemoryFailureTally()
    changes: list[tuple[str, str]] = []
    first = CircuitBreaker(3, 60, tally=shared, key="k", on_change=lambda *change: changes.append(change))
    second = CircuitBreaker(3, 60, tally=shared, key="k", on_change=lambda *change: changes.append(change))
    # When one fails twice and the other once
    first.failed("no answer within 60 s")
    first.failed("no answer within 60 s")
    second.failed("no answer within 60 s")
    # Then both fail fast, naming the endpoint, the breaker and the last cause
    for breaker in (first, second):
        with pytest.raises(LLMUnreachable) as raised:
            breaker.check("http://llm/v1")
        assert str(raised.value) == (
            "LLM at http://llm/v1 unreachable: circuit breaker open after 3 failures in a row "
            "(last: no answer within 60 s)"
        )
    assert second.state == "open"
    # And the opening was reported once, by the breaker whose failure opened it
    assert changes == [("open", "3 connection failures in a row (last: no answer within 60 s)")]
    # And an answer to either closes both
    first.failed("no answer within 60 s")
    second.succeeded()
    assert first.state == "closed" and changes[-1] == ("closed", "")


def test_a_breaker_whose_shared_tally_is_away_counts_alone() -> None:
    breaker = CircuitBreaker(2, 60, tally=AwayTally(), key="k")
    breaker.check("http://llm/v1")
    breaker.failed("connection refused")
    breaker.failed("connection refused")
    with pytest.raises(LLMUnreachable, match="after 2 failures"):
        breaker.check("http://llm/v1")
