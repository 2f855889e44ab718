"""The lock that lets one load write of a dataset at a time through, on real Redis."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator

import pytest
import redis

from kenning.pipeline.errors import TransientStoreError
from kenning.storage.coordination import write_lock
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


HOLDER = """
import sys, time, redis
from kenning.storage.coordination.write_lock import one_writer
client = redis.Redis.from_url(sys.argv[1])
with one_writer(client, sys.argv[2]):
    print("in", flush=True)
    time.sleep(120)  # killed long before
"""


def test_a_writer_killed_while_it_writes_holds_the_others_off_for_the_lock_ttl_at_most(
    client: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a writer in another process, inside its write
    name = f"kenning-test:writes:{uuid.uuid4().hex}"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, redis_url, name], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "in"
        # When it is killed there (a worker lost with its process)
        holder.kill()
        holder.wait(timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
        if holder.stdout is not None:
            holder.stdout.close()
    # Then another writer gets in once the dead one's short ttl is over, well before its wait ends
    monkeypatch.setattr(write_lock, "WRITE_WAIT_S", 3 * write_lock.WRITE_LOCK_TTL_S)
    with write_lock.one_writer(client, name):
        assert client.exists(name)
