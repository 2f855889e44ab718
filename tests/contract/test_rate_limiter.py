"""One contract for the rate limiters: the Redis limiter and its in-process twin.

Limits are small (rpm 600: ten a second) so that each test runs in about a second. No
test asserts how fast anything went: they count what was admitted within a measured
span and compare it with what the limits allow over that span.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import pytest
import redis

from kenning.pipeline.errors import TransientLLMError, TransientStoreError
from kenning.pipeline.ratelimit import FACTOR_FLOOR, Limits, limits_for, provider_key, retry_after_s
from kenning.storage.coordination.ratelimit_memory import MemoryRateLimiter
from kenning.storage.coordination.ratelimit_redis import RedisRateLimiter
from tests.clock import FakeClock
from tests.services import free_port

Limiter = MemoryRateLimiter | RedisRateLimiter
# A limiter over the given limits, and a way to get another handle on the same shared state:
# a second Redis client for the Redis limiter, the same object for the twin (its users are threads).
MakeLimiter = Callable[[Mapping[str, Limits]], tuple[Limiter, Limiter]]

KEY = "llm.example:443/model-a"
WINDOW_S = 1.0
MAX_TRIES = 10_000


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def make_limiter(request: pytest.FixtureRequest, key_prefix: str) -> Iterator[MakeLimiter]:
    clients: list[redis.Redis] = []

    def make(limits: Mapping[str, Limits]) -> tuple[Limiter, Limiter]:
        if request.param == "memory":
            twin = MemoryRateLimiter(limits)
            return twin, twin
        url = request.getfixturevalue("redis_url")
        first, second = redis.Redis.from_url(url), redis.Redis.from_url(url)
        clients.extend([first, second])
        return RedisRateLimiter(first, limits, key_prefix), RedisRateLimiter(second, limits, key_prefix)

    yield make
    for client in clients[:1]:
        keys = list(client.scan_iter(match=key_prefix + "*", count=100))
        if keys:
            client.delete(*keys)
    for client in clients:
        client.close()


@dataclass
class Tally:
    admitted: int
    span_s: float


def admit_for(limiter: Limiter, key: str, tokens: int, threads: int = 4, window_s: float = WINDOW_S) -> Tally:
    """Threads acquire for `window_s`; how many got through, and the span from start to the last one."""
    start = time.monotonic()
    last = [start]
    admitted = [0]
    mutex = threading.Lock()

    def work() -> None:
        for _ in range(MAX_TRIES):
            if time.monotonic() - start >= window_s:
                return
            try:
                limiter.acquire(key, tokens, deadline_s=0.2)
            except TransientLLMError:
                continue
            with mutex:
                admitted[0] += 1
                last[0] = time.monotonic()

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=window_s + 10)
    return Tally(admitted[0], last[0] - start)


def immediate_admissions(limiter: Limiter, key: str, tokens: int, tries: int = 50) -> int:
    """How many acquisitions in a row succeed without waiting at all."""
    for count in range(tries):
        try:
            limiter.acquire(key, tokens, deadline_s=0.0)
        except TransientLLMError:
            return count
    return tries


def test_requests_beyond_the_burst_wait(make_limiter: MakeLimiter) -> None:
    # Given ten requests a second with a burst of five, and a fresh key
    limits = Limits(rpm=600, burst=5)
    limiter, _ = make_limiter({KEY: limits})

    # When requests go back to back, none allowed to wait
    started = time.monotonic()
    admitted = immediate_admissions(limiter, KEY, tokens=1)
    span = time.monotonic() - started

    # Then the burst went through, and little more than what refilled meanwhile
    assert limits.burst <= admitted <= limits.burst + limits.request_rate * span + 1
    # and the next request, allowed to wait, gets through after its wait
    limiter.acquire(KEY, 1, deadline_s=5.0)


def test_admissions_in_a_window_stay_within_burst_plus_rate(make_limiter: MakeLimiter) -> None:
    limits = Limits(rpm=600, burst=3)
    limiter, _ = make_limiter({KEY: limits})

    tally = admit_for(limiter, KEY, tokens=1)

    assert limits.burst <= tally.admitted <= limits.burst + limits.request_rate * tally.span_s + 1


def test_the_token_limit_applies_on_its_own(make_limiter: MakeLimiter) -> None:
    # Given 6000 tokens a minute (a bucket of 100) and no request limit
    limits = Limits(tpm=6000)
    limiter, _ = make_limiter({KEY: limits})

    # When requests of 50 tokens go back to back, then for a window
    assert immediate_admissions(limiter, KEY, tokens=50) == 2
    tally = admit_for(limiter, KEY, tokens=50)

    # Then what got through fits what the token bucket refilled
    assert tally.admitted <= (limits.token_capacity + limits.token_rate * tally.span_s) / 50 + 1


def test_a_request_larger_than_the_token_bucket_goes_when_it_is_full(make_limiter: MakeLimiter) -> None:
    limits = Limits(tpm=6000)
    limiter, _ = make_limiter({KEY: limits})

    limiter.acquire(KEY, 500, deadline_s=0.0)

    # It left a debt that the next request waits out.
    assert immediate_admissions(limiter, KEY, tokens=1) == 0


def test_both_limits_must_allow(make_limiter: MakeLimiter) -> None:
    # Given a generous request limit and a token bucket holding two requests of 50
    limiter, _ = make_limiter({KEY: Limits(rpm=600, tpm=6000, burst=10)})

    assert immediate_admissions(limiter, KEY, tokens=50) == 2


def test_waiters_are_admitted_in_the_order_they_asked(make_limiter: MakeLimiter) -> None:
    # Given a key kept at its limit by greedy callers, each asking again as soon as it is admitted
    limiter, other_user = make_limiter({KEY: Limits(rpm=600, burst=2)})
    events: list[tuple[str, float]] = []  # (who, when its call began), in the order of admission
    mutex = threading.Lock()
    stop = threading.Event()
    admitted_once: set[int] = set()  # the greedy callers admitted so far
    all_asking_again = threading.Event()

    def greedy(number: int) -> None:
        for _ in range(MAX_TRIES):
            if stop.is_set():
                return
            asked = time.monotonic()
            limiter.acquire(KEY, 1, deadline_s=5.0)
            with mutex:
                events.append(("greedy", asked))
                admitted_once.add(number)
                if len(admitted_once) == len(callers):
                    all_asking_again.set()

    callers = [threading.Thread(target=greedy, args=(number,)) for number in range(6)]
    for caller in callers:
        caller.start()
    # (every greedy caller admitted once, and asking again: the burst is spent, they queue)
    assert all_asking_again.wait(timeout=10)

    # When another caller asks, three times over
    asked_at = []
    for _ in range(3):
        asked_at.append(time.monotonic())
        other_user.acquire(KEY, 1, deadline_s=5.0)
        with mutex:
            events.append(("other", asked_at[-1]))
    stop.set()
    for caller in callers:
        caller.join(timeout=10)

    # Then no greedy call that began after it (by more than a thread may stall before it queues)
    # was admitted before it: the greedy callers could not overtake it however often they asked
    for asked in asked_at:
        position = events.index(("other", asked))
        overtaking = [when for who, when in events[:position] if who == "greedy" and when > asked + 0.09]
        assert overtaking == []


def test_penalize_blocks_everyone_until_retry_after(make_limiter: MakeLimiter) -> None:
    # Given two users of one key, with room to spare, and a neighbouring key
    limiter, other_user = make_limiter({KEY: Limits(rpm=600, burst=5)})
    neighbour = provider_key("https://llm.example", "model-b")

    # When one of them is answered 429 with Retry-After 1 s
    limiter.penalize(KEY, 1.0)

    # Then neither may send within 0.1 s, while the neighbouring key is untouched
    for user in (limiter, other_user):
        with pytest.raises(TransientLLMError, match="rate limit wait exceeded"):
            user.acquire(KEY, 1, deadline_s=0.1)
    other_user.acquire(neighbour, 1, deadline_s=0.0)
    # and both get through once the penalty is over
    limiter.acquire(KEY, 1, deadline_s=5.0)
    other_user.acquire(KEY, 1, deadline_s=5.0)


def test_penalize_applies_to_keys_without_limits(make_limiter: MakeLimiter) -> None:
    limiter, other_user = make_limiter({})
    other_user.acquire(KEY, 10**6, deadline_s=0.0)

    limiter.penalize(KEY, 5.0)

    with pytest.raises(TransientLLMError):
        other_user.acquire(KEY, 1, deadline_s=1.0)


def test_deadline_raises_a_transient_llm_error(make_limiter: MakeLimiter) -> None:
    limiter, _ = make_limiter({KEY: Limits(rpm=600, burst=1)})
    limiter.acquire(KEY, 1, deadline_s=0.0)

    # The next token is a tenth of a second away: beyond a 10 ms deadline.
    with pytest.raises(TransientLLMError, match="rate limit wait exceeded"):
        limiter.acquire(KEY, 1, deadline_s=0.01)


def test_adaptive_factor_drops_once_per_429_episode(make_limiter: MakeLimiter) -> None:
    limiter, other_user = make_limiter({KEY: Limits(rpm=600, burst=5)})
    assert other_user.factor(KEY) == 1.0

    # Two 429s of one episode: the second arrives within the first's Retry-After
    limiter.penalize(KEY, 30.0)
    other_user.penalize(KEY, 30.0)

    assert limiter.factor(KEY) == pytest.approx(0.5)
    assert other_user.factor(KEY) == pytest.approx(0.5)


def test_repeated_episodes_lower_the_factor_to_its_floor(make_limiter: MakeLimiter) -> None:
    limiter, other_user = make_limiter({KEY: Limits(rpm=600, burst=5)})

    factors = []
    for _ in range(5):
        limiter.penalize(KEY, 0.0)
        factors.append(other_user.factor(KEY))

    assert factors == pytest.approx([0.5, 0.25, 0.125, FACTOR_FLOOR, FACTOR_FLOOR])


def test_a_penalized_key_refills_at_the_lowered_rate(make_limiter: MakeLimiter) -> None:
    # Given a key answered 429 twice (factor 0.25), with its buckets emptied
    limits = Limits(rpm=600, burst=5)
    limiter, other_user = make_limiter({KEY: limits})
    limiter.penalize(KEY, 0.0)
    limiter.penalize(KEY, 0.0)

    tally = admit_for(other_user, KEY, tokens=1)

    assert tally.admitted <= limits.request_rate * 0.25 * tally.span_s + 1


def test_each_tenant_key_has_its_own_budget_under_the_model_limits(make_limiter: MakeLimiter) -> None:
    limits = Limits(rpm=600, burst=2)
    limiter, _ = make_limiter({KEY: limits})

    started = time.monotonic()
    first = immediate_admissions(limiter, KEY + "/tenant-a", tokens=1)
    second = immediate_admissions(limiter, KEY + "/tenant-b", tokens=1)
    refilled = limits.request_rate * (time.monotonic() - started)

    # Each tenant got a whole burst, as if alone
    assert limits.burst <= first <= limits.burst + refilled + 1
    assert limits.burst <= second <= limits.burst + refilled + 1


def test_a_redis_failure_is_a_transient_store_error() -> None:
    client = redis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.5)
    limiter = RedisRateLimiter(client, {KEY: Limits(rpm=600)}, "test:ratelimit:")

    with pytest.raises(TransientStoreError, match="rate limiter"):
        limiter.acquire(KEY, 1, deadline_s=1.0)
    with pytest.raises(TransientStoreError, match="rate limiter"):
        limiter.penalize(KEY, 1.0)
    client.close()


def test_the_twin_recovers_a_tenth_of_the_rate_per_clean_minute() -> None:
    # The Redis limiter runs on the server's clock, which a test cannot move; the twin's can be.
    now = [1000.0]
    limiter = MemoryRateLimiter({KEY: Limits(rpm=600)}, clock=lambda: now[0])
    limiter.penalize(KEY, 2.0)
    limiter.penalize(KEY, 0.0)
    now[0] += 2.0 + 0.1
    assert limiter.factor(KEY) == pytest.approx(0.5)

    now[0] += 60.0
    assert limiter.factor(KEY) == pytest.approx(0.6)
    now[0] += 5 * 60.0
    assert limiter.factor(KEY) == pytest.approx(1.0)
    now[0] += 60.0
    assert limiter.factor(KEY) == pytest.approx(1.0)


def test_a_429_voids_the_turns_taken_and_forgets_what_they_took() -> None:
    now = [1000.0]
    limits = Limits(tpm=6000)  # a bucket of 100 tokens
    limiter = MemoryRateLimiter({KEY: limits}, clock=lambda: now[0])
    # Given four callers holding turns of 100 tokens each: the bucket is 300 tokens in debt
    turns = [limiter._take_turn(KEY, limits, 100, 60.0) for _ in range(4)]
    assert all(turn.held for turn in turns)

    # When the provider answers 429 (no Retry-After), twice at the same instant
    limiter.penalize(KEY, 0.0)
    first = limiter._mark(KEY)
    limiter.penalize(KEY, 0.0)

    # Then every turn is void, by each 429,
    assert turns[0].mark != first != limiter._mark(KEY)
    # and asking again waits for the emptied bucket to refill at the lowered rate, not for the
    # voided turns' tokens as well
    again = limiter._take_turn(KEY, limits, 100, 60.0)
    assert again.wait_s == pytest.approx(100 / (limits.token_rate * limiter.factor(KEY)))


def test_limits_are_looked_up_by_key_then_by_parent_then_by_default() -> None:
    model, default = Limits(rpm=600), Limits(rpm=60)
    limits = {KEY: model, "": default}

    assert limits_for(limits, KEY) is model
    assert limits_for(limits, KEY + "/tenant-a") is model
    assert limits_for(limits, "other/model") is default
    assert limits_for({}, KEY).unlimited


def test_the_default_burst_is_one_second_of_the_limit_and_at_least_two() -> None:
    assert Limits(rpm=600).burst == 10
    assert Limits(rpm=6000, tpm=60_000).token_capacity == 1000
    assert Limits(rpm=100).burst == 2
    assert Limits(rpm=3).burst == 2
    assert Limits(rpm=600, burst=3).burst == 3
    assert Limits(tpm=6000).burst == 2
    with pytest.raises(ValueError, match="burst"):
        Limits(rpm=600, burst=0)


def test_a_fresh_key_admits_the_default_burst_at_once(make_limiter: MakeLimiter) -> None:
    # Given ten requests a second and the default burst
    limits = Limits(rpm=600)
    limiter, _ = make_limiter({KEY: limits})

    # When requests go back to back, none allowed to wait
    started = time.monotonic()
    admitted = immediate_admissions(limiter, KEY, tokens=1)

    # Then a second's worth went through at once
    refilled = limits.request_rate * (time.monotonic() - started)
    assert 10 <= admitted <= 10 + refilled + 1


def test_limits_refuse_a_burst_as_large_as_the_rate() -> None:
    with pytest.raises(ValueError, match="rpm must exceed burst"):
        Limits(rpm=5, burst=5)


def test_retry_after_prefers_milliseconds_and_ignores_dates() -> None:
    assert retry_after_s({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert retry_after_s({"retry-after": "2"}) == 2.0
    assert retry_after_s({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) is None


# The twin on a clock of the test's own: its waits take no real time


def test_the_twin_waits_on_its_clock_for_the_bucket_to_refill() -> None:
    # Given ten requests a second with a burst of five, its burst spent
    clock = FakeClock()
    limits = Limits(rpm=600, burst=5)
    limiter = MemoryRateLimiter({KEY: limits}, clock=clock, sleep=clock.sleep)
    assert immediate_admissions(limiter, KEY, tokens=1) == limits.burst
    # When the next request may wait, it is admitted once its clock has moved on a tenth of a second
    began = clock()
    limiter.acquire(KEY, 1, deadline_s=5.0)
    assert clock() - began == pytest.approx(1 / limits.request_rate)
    # And a request that may wait less than that is refused without the clock moving
    with pytest.raises(TransientLLMError, match="rate limit wait exceeded"):
        limiter.acquire(KEY, 1, deadline_s=0.05)
    assert clock() - began == pytest.approx(1 / limits.request_rate)


def test_the_twin_admits_again_once_its_clock_passes_the_penalty() -> None:
    # Given a key answered 429 with Retry-After 30 s
    clock = FakeClock()
    limiter = MemoryRateLimiter({KEY: Limits(rpm=600, burst=5)}, clock=clock, sleep=clock.sleep)
    limiter.penalize(KEY, 30.0)
    # When a request may wait less than the penalty, it is refused; then one that may wait it out
    with pytest.raises(TransientLLMError, match="rate limit wait exceeded"):
        limiter.acquire(KEY, 1, deadline_s=29.0)
    began = clock()
    limiter.acquire(KEY, 1, deadline_s=60.0)
    # Then it went once the penalty was over, by its clock
    assert clock() >= began + 30.0
