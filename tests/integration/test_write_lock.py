"""The lock that lets one load write of a dataset at a time through, on real Redis."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
import redis

from kenning.pipeline.errors import TransientStoreError
from kenning.storage.coordination.write_lock import one_writer
from tests.services import free_port

pytestmark = [pytest.mark.redis]

WRITERS = 6
ROUNDS = 5


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    connected = redis.Redis.from_url(redis_url)
    yield connected
    connected.close()


def test_writers_in_many_threads_write_one_at_a_time(client: redis.Redis) -> None:
    # Given several writers of one dataset, each on a thread of its own
    name = f"kenning-test:writes:{uuid.uuid4().hex}"
    inside, most, done = [0], [0], []
    mutex = threading.Lock()

    def write(number: int) -> None:
        for _ in range(ROUNDS):
            with one_writer(client, name):
                with mutex:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                with mutex:
                    inside[0] -= 1
        done.append(number)

    threads = [threading.Thread(target=write, args=(number,)) for number in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    # Then every write went through, never two at once, and the lock is free again
    assert sorted(done) == list(range(WRITERS))
    assert most[0] == 1
    assert not client.exists(name)


def test_a_redis_that_is_away_fails_the_write_as_a_store_that_is_away_naming_no_password() -> None:
    # Given a Redis URL where nothing listens, with a password in it
    away = redis.Redis.from_url(f"redis://user:s3cret@127.0.0.1:{free_port()}/0", socket_connect_timeout=1)
    # When a write takes the lock
    with pytest.raises(TransientStoreError) as raised, one_writer(away, "kenning-test:writes:away"):
        pytest.fail("the block ran without the lock")
    # Then it is a store that is away (its task tries again), and the password is not in it
    assert "s3cret" not in str(raised.value)
    away.close()
