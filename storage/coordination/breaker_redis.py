"""The failure tally shared by every worker process: each LLM endpoint's failures in a row and
its breaker in Redis, changed atomically by Lua scripts, the cooldown a key's expiry on the
server's clock. Four workers waiting on an endpoint that never answers open the breaker after
`failures` timeouts between them, not each after its own."""

from __future__ import annotations

import redis

from kenning.pipeline.errors import TransientStoreError
from kenning.pipeline.spend import Tally

# A count of failures in a row left by processes that all stopped calling is forgotten after
# this: the next failure, an hour on, says nothing about the endpoint now.
IDLE_TTL_MS = 3600 * 1000

# KEYS: the count (hash: in_a_row, last, tripped), the open flag (expires with the cooldown).
# ARGV: cause, failures, cooldown ms, idle ttl ms. Returns 1 when this failure opened it.
_FAILED = """
local n = redis.call('HINCRBY', KEYS[1], 'in_a_row', 1)
redis.call('HSET', KEYS[1], 'last', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
if n < tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'tripped', 1)
-- A failure while it is open (a request sent before it opened) does not hold it open longer.
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if tonumber(ARGV[3]) > 0 then redis.call('SET', KEYS[2], 1, 'PX', ARGV[3]) end
return 1
"""

_TALLY = """
local s = redis.call('HMGET', KEYS[1], 'in_a_row', 'last', 'tripped')
return {s[1] or '0', s[2] or '', s[3] or '0', redis.call('EXISTS', KEYS[2])}
"""

_SUCCEEDED = """
local tripped = redis.call('HGET', KEYS[1], 'tripped')
redis.call('DEL', KEYS[1], KEYS[2])
if tripped then return 1 end
return 0
"""


class RedisFailureTally:
    """A `FailureTally` shared by every process using the same Redis and `prefix`.

    A Redis failure raises `TransientStoreError`.
    """

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self._client = client
        self._prefix = prefix
        self._failed = client.register_script(_FAILED)
        self._tally = client.register_script(_TALLY)
        self._succeeded = client.register_script(_SUCCEEDED)

    def tally(self, key: str) -> Tally:
        reply = self._call(self._tally, key, [])
        assert isinstance(reply, list)
        in_a_row, last, tripped, is_open = (_text(part) for part in reply)
        state = "open" if int(is_open) else ("half-open" if int(tripped) else "closed")
        return Tally(state, int(in_a_row), last)

    def failed(self, key: str, cause: str, failures: int, cooldown_s: float) -> bool:
        args: list[str | int] = [cause[:500], failures, round(cooldown_s * 1000), IDLE_TTL_MS]
        return bool(self._call(self._failed, key, args))

    def succeeded(self, key: str) -> bool:
        return bool(self._call(self._succeeded, key, []))

    def _call(self, script: redis.commands.core.Script, key: str, args: list[str | int]) -> object:
        keys = [f"{self._prefix}{key}", f"{self._prefix}{key}:open"]
        try:
            return script(keys=keys, args=[str(arg) for arg in args])
        except redis.RedisError as exc:
            raise TransientStoreError(f"LLM breaker: {exc}") from exc


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
