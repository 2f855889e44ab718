"""One contract for the LLM breakers' failure tallies: the Redis tally and its in-process twin.

Two handles on one tally (two Redis clients; the twin's one object, whose users are threads)
see the same count: the failures of every worker add up. The twin runs on a clock the test
advances past a cooldown; Redis's cooldowns pass on its own clock, which the test polls.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from kenning.pipeline.spend import FailureTally, Tally, breaker_key
from kenning.storage.coordination.breaker_memory import MemoryFailureTally
from kenning.storage.coordination.breaker_redis import RedisFailureTally
from tests.clock import FakeClock

KEY = breaker_key("http://127.0.0.1:9/v1", "model-a")
OTHER = breaker_key("http://127.0.0.1:9/v1", "model-b")
COOLDOWN_S = 0.2
WAIT_S = 10.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def tallies(
    request: pytest.FixtureRequest, key_prefix: str, clock: FakeClock
) -> Iterator[tuple[FailureTally, FailureTally]]:
    if request.param == "memory":
        twin = MemoryFailureTally(clock)
        yield twin, twin
        return
    url = request.getfixturevalue("redis_url")
    first, second = redis.Redis.from_url(url), redis.Redis.from_url(url)
    yield RedisFailureTally(first, key_prefix), RedisFailureTally(second, key_prefix)
    keys = list(first.scan_iter(match=key_prefix + "*", count=100))
    if keys:
        first.delete(*keys)
    first.close()
    second.close()


def test_failures_of_every_holder_add_up_and_open_the_breaker_once(
    tallies: tuple[FailureTally, FailureTally],
) -> None:
    one, two = tallies
    # Given a breaker that opens after four failures in a row
    assert one.tally(KEY) == Tally("closed", 0, "")
    # When two holders fail twice each
    opened = [one.failed(KEY, "timeout 1", 4, 60), two.failed(KEY, "timeout 2", 4, 60)]
    opened += [one.failed(KEY, "timeout 3", 4, 60), two.failed(KEY, "timeout 4", 4, 60)]
    # Then the fourth failure opened it, and both see it open, with the last cause
    assert opened == [False, False, False, True]
    assert one.tally(KEY) == two.tally(KEY) == Tally("open", 4, "timeout 4")
    # And a failure while it is open does not open it again; another endpoint is untouched
    assert one.failed(KEY, "timeout 5", 4, 60) is False
    assert two.tally(OTHER) == Tally("closed", 0, "")


def test_an_answer_closes_it_and_resets_the_count(tallies: tuple[FailureTally, FailureTally]) -> None:
    one, two = tallies
    one.failed(KEY, "refused", 2, 60)
    # An answer before the breaker opened: nothing to report, the count starts over
    assert two.succeeded(KEY) is False
    assert one.failed(KEY, "refused", 2, 60) is False
    assert one.failed(KEY, "refused", 2, 60) is True
    # An answer once it opened: it was open, now it is closed
    assert two.succeeded(KEY) is True
    assert one.tally(KEY) == Tally("closed", 0, "")


def test_after_its_cooldown_it_is_half_open_and_one_failure_opens_it_again(
    tallies: tuple[FailureTally, FailureTally], clock: FakeClock
) -> None:
    one, two = tallies
    for _ in range(3):
        one.failed(KEY, "timeout", 3, COOLDOWN_S)
    if isinstance(two, MemoryFailureTally):  # the twin's clock: just short of the cooldown, still open
        clock.advance(COOLDOWN_S * 0.9)
        assert two.tally(KEY).state == "open"
    clock.advance(COOLDOWN_S)  # (Redis's clock moves by itself)
    deadline = time.monotonic() + WAIT_S
    while two.tally(KEY).state == "open" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert two.tally(KEY).state == "half-open"
    assert two.failed(KEY, "still no answer", 3, 60) is True
    assert one.tally(KEY) == Tally("open", 4, "still no answer")
