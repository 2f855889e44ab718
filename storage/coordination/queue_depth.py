"""How many tasks wait in Celery's queues on Redis: kombu keeps a list per queue and priority step."""

from __future__ import annotations

from collections.abc import Sequence

import redis

from kenning.pipeline.errors import TransientStoreError

# kombu's Redis transport: priority steps 0, 3, 6 and 9; step 0 is the queue's own list.
PRIORITY_LISTS = ("", "\x06\x163", "\x06\x166", "\x06\x169")


def queue_depths(client: redis.Redis, queues: Sequence[str]) -> dict[str, int]:
    """Each queue's waiting tasks (all priorities), in one round trip."""
    pipe = client.pipeline(transaction=False)
    for queue in queues:
        for suffix in PRIORITY_LISTS:
            pipe.llen(queue + suffix)
    try:
        lengths = pipe.execute()
    except redis.RedisError as exc:
        raise TransientStoreError(f"Celery queue depths: {exc}") from exc
    width = len(PRIORITY_LISTS)
    return {
        queue: sum(int(n) for n in lengths[i * width : (i + 1) * width]) for i, queue in enumerate(queues)
    }


def waiting_with(client: redis.Redis, queues: Sequence[str], needle: str, page: int = 500) -> int:
    """How many tasks waiting in the queues hold `needle` in their message (body or headers, as
    stored), read a page at a time so that a long queue never blocks Redis for long."""
    wanted, found = needle.encode(), 0
    try:
        for key in (queue + suffix for queue in queues for suffix in PRIORITY_LISTS):
            for start in range(0, int(client.llen(key)), page):
                found += sum(wanted in message for message in client.lrange(key, start, start + page - 1))
    except redis.RedisError as exc:
        raise TransientStoreError(f"Celery queues: {exc}") from exc
    return found
