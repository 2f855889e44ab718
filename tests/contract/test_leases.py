"""One contract for the run leases: the Redis leases and their in-process twin.

Each test gets two handles on one lease state: two Redis clients, or the twin itself twice (its
users are threads). The twin runs on a clock the test advances to expire a lease or a claim; in
Redis they expire on the server's clock, with the shortest leases the test can keep, which the
test waits for by polling (bounded).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import NamedTuple

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from kenning.pipeline.errors import TransientStoreError
from kenning.pipeline.lease import Leases, stall_reason
from kenning.storage.coordination.lease_memory import MemoryLeases
from kenning.storage.coordination.lease_redis import RedisLeases
from tests.clock import FakeClock
from tests.services import free_port

SHORT_S = 0.2
LONG_S = 60.0
POLL_S = 0.02
WITHIN_S = 10.0


class Handles(NamedTuple):
    first: Leases
    second: Leases
    clock: FakeClock | None  # None: the real clock (Redis)

    def passes(self, seconds: float) -> None:
        """Move the twin's clock on; Redis's moves by itself (`until` polls for what it brings)."""
        if self.clock is not None:
            self.clock.advance(seconds)

    def until(self, condition: Callable[[], bool]) -> bool:
        """Whether `condition` comes true, polling a bounded time on the real clock."""
        deadline = time.monotonic() + WITHIN_S
        while not condition():
            if time.monotonic() >= deadline:
                return False
            if self.clock is None:
                time.sleep(POLL_S)
        return True


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def leases(request: pytest.FixtureRequest, key_prefix: str) -> Iterator[Handles]:
    if request.param == "memory":
        clock = FakeClock()
        twin = MemoryLeases(clock)
        yield Handles(twin, twin, clock)
        return
    url = request.getfixturevalue("redis_url")
    clients = [redis.Redis.from_url(url), redis.Redis.from_url(url)]
    yield Handles(RedisLeases(clients[0], key_prefix), RedisLeases(clients[1], key_prefix), None)
    keys = list(clients[0].scan_iter(match=key_prefix + "*", count=100))
    if keys:
        clients[0].delete(*keys)
    for client in clients:
        client.close()


@pytest.fixture
def run() -> str:
    return f"run-{uuid.uuid4().hex[:12]}"


def units(names: list[str]) -> list[str]:
    """The units of `names`, as a state lists them (each is recorded as `unit@holder`)."""
    return sorted(unit.partition("@")[0] for unit in names)


def test_a_run_nobody_renewed_is_unknown_and_not_dead(leases: Handles, run: str) -> None:
    state = leases.first.state(run)
    assert (state.known, state.live, state.dead, state.failure) == (False, [], False, "")
    assert stall_reason(state).startswith("no lease held")


def test_a_renewed_lease_is_live_for_its_length_on_every_handle(leases: Handles, run: str) -> None:
    # When a task renews its lease on a unit for a minute
    leases.first.renew(run, "extract:3", LONG_S)
    # Then every handle sees it live, held by the task's host and process, until a minute from now
    state = leases.second.state(run)
    assert units(state.live) == ["extract:3"] and state.known and not state.dead
    assert all(unit.startswith("extract:3@") and unit != "extract:3@" for unit in state.live)
    (expiry,) = state.leases.values()
    assert state.now_ms < expiry <= state.now_ms + LONG_S * 1000
    assert stall_reason(state) == ""


def test_renewing_moves_the_expiry_to_the_lease_length_from_now(leases: Handles, run: str) -> None:
    leases.first.renew(run, "load", SHORT_S)
    leases.second.renew(run, "load", LONG_S)
    state = leases.first.state(run)
    (expiry,) = state.leases.values()
    assert len(state.live) == 1
    assert expiry > state.now_ms + (LONG_S - WITHIN_S) * 1000


def test_a_lease_nobody_renews_expires_and_the_run_is_dead(leases: Handles, run: str) -> None:
    # Given a unit's lease, never renewed
    leases.first.renew(run, "chunk", SHORT_S)
    if leases.clock is not None:  # just short of its length, it is live
        leases.passes(SHORT_S * 0.9)
        assert leases.second.state(run).live
    # When its length has gone by
    leases.passes(SHORT_S)
    # Then the run is known, with no lease live: dead, since then
    assert leases.until(lambda: leases.second.state(run).dead)
    state = leases.second.state(run)
    assert units(state.expired) == ["chunk"] and state.live == []
    assert state.expired_for_s() >= 0
    assert stall_reason(state).startswith("leases expired")


def test_a_run_lives_while_any_of_its_leases_does(leases: Handles, run: str) -> None:
    leases.first.renew(run, "short", SHORT_S)
    leases.second.renew(run, "long", LONG_S)
    leases.passes(SHORT_S)
    assert leases.until(lambda: bool(leases.first.state(run).expired))
    state = leases.first.state(run)
    assert units(state.live) == ["long"] and units(state.expired) == ["short"]
    assert not state.dead


def test_runs_are_kept_apart(leases: Handles, run: str) -> None:
    other = run + "-other"
    leases.first.renew(run, "load", LONG_S)
    leases.first.note_failure(run, "boom")
    assert not leases.second.state(other).known and leases.second.state(other).failure == ""
    assert leases.second.grant_grace(other, LONG_S)
    assert units(leases.first.state(run).live) == ["load"]


def test_grace_is_given_only_to_a_run_with_no_lease_known(leases: Handles, run: str) -> None:
    # Given a run whose leases the store does not know (lost, or never begun)
    # When a supervisor grants it grace, it gets one lease, held by the supervisor
    assert leases.first.grant_grace(run, LONG_S)
    state = leases.second.state(run)
    assert state.live == ["grace@supervisor"]
    # Then it is not granted again, nor to a run whose leases all expired
    assert not leases.second.grant_grace(run, LONG_S)
    expired = run + "-expired"
    leases.first.renew(expired, "load", SHORT_S)
    leases.passes(SHORT_S)
    assert leases.until(lambda: leases.first.state(expired).dead)
    assert not leases.second.grant_grace(expired, LONG_S)


def test_a_failure_noted_is_kept_and_told_with_the_stall(leases: Handles, run: str) -> None:
    leases.first.renew(run, "extract:0", SHORT_S)
    leases.first.note_failure(run, "metadata store away: " + "x" * 5000)
    leases.passes(SHORT_S)
    assert leases.until(lambda: leases.second.state(run).dead)
    state = leases.second.state(run)
    assert state.failure.startswith("metadata store away: ") and len(state.failure) == 2000
    assert "it failed with metadata store away" in stall_reason(state)


def test_one_supervisor_at_a_time_claims_a_run_until_its_claim_expires(leases: Handles, run: str) -> None:
    # Given a run one supervisor claimed
    assert leases.first.claim(run, SHORT_S)
    # When another, or the same, claims it, it is refused; another run is claimed apart
    assert not leases.second.claim(run, LONG_S)
    assert not leases.first.claim(run, LONG_S)
    assert leases.second.claim(run + "-other", LONG_S)
    # Then once the claim's time is over, the next claim gets it
    leases.passes(SHORT_S)
    assert leases.until(lambda: leases.second.claim(run, LONG_S))
    assert not leases.first.claim(run, LONG_S)


def test_forgetting_a_run_drops_its_leases_and_failure(leases: Handles, run: str) -> None:
    leases.first.renew(run, "load", LONG_S)
    leases.first.note_failure(run, "boom")
    leases.second.forget(run)
    state = leases.first.state(run)
    assert (state.known, state.failure) == (False, "")
    assert leases.second.grant_grace(run, LONG_S)
    leases.first.forget(run + "-never")


def test_a_redis_failure_is_a_transient_store_error() -> None:
    # (a port nobody listens on, asked once per call: no retries)
    client = redis.Redis(
        host="127.0.0.1", port=free_port(), socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )
    leases = RedisLeases(client, "test:leases:")
    calls: list[Callable[[], object]] = [
        lambda: leases.renew("r", "u", 1.0),
        lambda: leases.state("r"),
        lambda: leases.grant_grace("r", 1.0),
        lambda: leases.note_failure("r", "e"),
        lambda: leases.claim("r", 1.0),
        lambda: leases.forget("r"),
    ]
    for call in calls:
        with pytest.raises(TransientStoreError, match="run leases"):
            call()
    client.close()
