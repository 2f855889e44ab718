"""Opening a Redis client: the one place that decides how long a call to Redis may wait.

Every client of kenning's coordination state (run locks, leases, breakers, limiters, sessions,
the broker's queues) is opened here, so that all of them share one timeout policy: a Redis that
does not answer fails a call after `timeout_s` (connecting and each reply alike) with a
`redis.RedisError`, which the adapters translate; a call never hangs.

The policy: `DEFAULT_TIMEOUT_S` for every client, but `QUICK_TIMEOUT_S` for those whose caller
goes on without Redis's answer: the LLM breaker's tally, asked around every LLM request (a Redis
away costs each call this much before its breaker counts alone), and the looks a status page
takes every half second (Redis is then shown as away). The rate limiter is on an LLM call's path
too but waits the default: without its answer the call cannot go, or it could pass the
provider's limit.
"""

from __future__ import annotations

import redis

# Long enough for a loaded server, short enough that a caller waiting on a lock notices it is gone.
DEFAULT_TIMEOUT_S = 5.0
# For a caller that goes on without the answer (see above): little time lost when Redis is away.
QUICK_TIMEOUT_S = 2.0
# An idle pooled connection is checked before use after this, so a restarted Redis is noticed.
HEALTH_CHECK_S = 30


def open_redis(url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> redis.Redis:
    """A client of the Redis at `url` (redis://, rediss:// or unix://), connecting lazily; the
    caller closes it."""
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        health_check_interval=HEALTH_CHECK_S,
    )
