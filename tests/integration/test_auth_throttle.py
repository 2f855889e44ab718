"""Guessing API keys meets a throttle: after `MAX_FAILURES` wrong keys from one address within the
window, that address gets 429 with Retry-After until the window passes; other addresses, and a
right key from another address, are not held back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from kenning.pipeline.permission import User, issue_key
from kenning.workers.api import create_app
from kenning.workers.api.access import AuthThrottle
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings

WRONG = {"Authorization": "Bearer kn_0123456789abcdef_wrong"}


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Kenning]:
    with Kenning(load_settings(home=tmp_path / "home", embedding_provider="hash")) as memory:
        yield memory


@pytest.fixture
def app(memory: Kenning) -> FastAPI:
    return create_app(memory)


def right_key(memory: Kenning) -> dict[str, str]:
    store = memory.wiring.permissions
    user = User(tenant=memory.settings.tenant, name="ada")
    store.add_user(user)
    token, key = issue_key(user)
    store.add_key(key)
    return {"Authorization": f"Bearer {token}"}


def client_at(app: FastAPI, address: str) -> TestClient:
    return TestClient(app, client=(address, 40000))


def test_many_wrong_keys_from_one_address_are_throttled_until_the_window_passes(
    app: FastAPI, memory: Kenning
) -> None:
    # Given the API, with its throttle on a clock the test moves
    clock = Clock()
    throttle = AuthThrottle(clock=clock)
    good = right_key(memory)
    with client_at(app, "203.0.113.7") as guesser, client_at(app, "198.51.100.2") as other:
        app.state.kenning.throttle = throttle
        # When one address sends 300 wrong keys
        answers = [guesser.get("/v1/me", headers=WRONG) for _ in range(300)]
        # Then the first MAX_FAILURES are 401, and every one after is 429 with Retry-After
        codes = [answer.status_code for answer in answers]
        assert codes[: throttle.max_failures] == [401] * throttle.max_failures
        assert set(codes[throttle.max_failures :]) == {429}
        last = answers[-1]
        assert last.json()["error"]["code"] == "too_many_requests"
        assert 0 < int(last.headers["Retry-After"]) <= throttle.window_s
        # And a right key from that address is held back too (a 429 tells nothing of the key)
        assert guesser.get("/v1/me", headers=good).status_code == 429
        # And another address is not: a wrong key is 401, a right one succeeds
        assert other.get("/v1/me", headers=WRONG).status_code == 401
        assert other.get("/v1/me", headers=good).status_code == 200
        # And once the window has passed, the address is heard again
        clock.now += throttle.window_s
        assert guesser.get("/v1/me", headers=good).status_code == 200
        assert guesser.get("/v1/me", headers=WRONG).status_code == 401


def test_a_success_does_not_reset_the_count_of_its_address() -> None:
    # Given an address one failure short of the limit
    throttle = AuthThrottle(max_failures=3, window_s=60, clock=Clock())
    for _ in range(2):
        throttle.failed("a")
    # When it then succeeds (`retry_after` is asked first), and fails once more
    assert throttle.retry_after("a") == 0
    throttle.failed("a")
    # Then it is throttled: a right key cannot be used to clear the count between guesses
    assert throttle.retry_after("a") > 0


def test_the_throttle_keeps_a_bounded_number_of_addresses() -> None:
    # Given a throttle that keeps at most 100 addresses
    clock = Clock()
    throttle = AuthThrottle(max_failures=1, window_s=60, max_addresses=100, clock=clock)
    # When 10,000 addresses fail once each
    for number in range(10_000):
        throttle.failed(f"10.0.{number // 256}.{number % 256}")
    # Then it keeps no more than 100, the most recent ones
    assert len(throttle) <= 100
    assert throttle.retry_after("10.0.39.15") > 0
