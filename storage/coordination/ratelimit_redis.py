"""The rate limiter shared by every worker process: token buckets in Redis, checked and
debited atomically by one Lua script on the server's clock."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import cast

import redis

from kenning.pipeline.errors import TransientStoreError
from kenning.pipeline.ratelimit import (
    FACTOR_FLOOR,
    IDLE_TTL_S,
    PENALTY_CUT,
    RECOVERY_PERIOD_S,
    RECOVERY_STEP,
    Limits,
    Turn,
    limits_for,
    wait_until_admitted,
)

# One hash per key: req/tok (levels; absent = full), at (last refill, ms), factor, since
# (when recovery started counting, ms), until (end of the penalty, ms), penalties (how many).
# All times are the server's TIME, so that the clocks of the clients never matter.
_PRELUDE = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + tonumber(clock[2]) / 1000
local function factor_at(factor, since, step, period)
  local f = tonumber(factor) or 1
  local s = tonumber(since) or now
  return math.min(1, f + step * math.floor(math.max(0, now - s) / period))
end
"""

# ARGV: request capacity, requests/ms, token capacity, tokens/ms, tokens asked, step, period ms,
# ttl ms, ms the caller may wait. Returns {held (1/0), ms to wait, the key's mark}: held, the
# buckets were debited (maybe below zero) and the caller starts after the wait; not held,
# nothing was debited (a penalty in force, or a wait longer than the caller may wait).
_TAKE_TURN = (
    _PRELUDE
    + """
local s = redis.call('HMGET', KEYS[1], 'req', 'tok', 'at', 'factor', 'since', 'until', 'penalties')
local penalty_end = tonumber(s[6]) or 0
local mark = tonumber(s[7]) or 0
if now < penalty_end then return {0, math.ceil(penalty_end - now), mark} end
local req_cap, req_rate = tonumber(ARGV[1]), tonumber(ARGV[2])
local tok_cap, tok_rate, want = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
if req_cap == 0 and tok_cap == 0 then return {1, 0, mark} end
local factor = factor_at(s[4], s[5], tonumber(ARGV[6]), tonumber(ARGV[7]))
local elapsed = math.max(0, now - (tonumber(s[3]) or now))
local req = math.min(req_cap, (tonumber(s[1]) or req_cap) + elapsed * req_rate * factor)
local tok = math.min(tok_cap, (tonumber(s[2]) or tok_cap) + elapsed * tok_rate * factor)
local wait = 0
if req_cap > 0 and req < 1 then wait = (1 - req) / (req_rate * factor) end
local needed = math.min(want, tok_cap)
if tok_cap > 0 and tok < needed then wait = math.max(wait, (needed - tok) / (tok_rate * factor)) end
if wait > tonumber(ARGV[9]) then return {0, math.ceil(wait), mark} end
if req_cap > 0 then req = req - 1 end
if tok_cap > 0 then tok = tok - want end
redis.call('HSET', KEYS[1], 'req', req, 'tok', tok, 'at', now)
redis.call('PEXPIRE', KEYS[1], ARGV[8])
return {1, math.ceil(wait), mark}
"""
)

# The key's mark: how many penalties it has had.
_MARK = """
return tonumber(redis.call('HGET', KEYS[1], 'penalties')) or 0
"""

# ARGV: penalty ms, cut, floor, step, period ms, ttl ms. Halves the factor once per 429 episode.
_PENALIZE = (
    _PRELUDE
    + """
local s = redis.call('HMGET', KEYS[1], 'factor', 'since', 'until')
local penalty_end = tonumber(s[3]) or 0
local factor = factor_at(s[1], s[2], tonumber(ARGV[4]), tonumber(ARGV[5]))
if now >= penalty_end then factor = math.max(tonumber(ARGV[3]), factor * tonumber(ARGV[2])) end
penalty_end = math.max(penalty_end, now + tonumber(ARGV[1]))
redis.call('HSET', KEYS[1], 'factor', factor, 'since', penalty_end, 'until', penalty_end,
  'req', 0, 'tok', 0, 'at', penalty_end)
redis.call('HINCRBY', KEYS[1], 'penalties', 1)
redis.call('PEXPIRE', KEYS[1], math.ceil(penalty_end - now) + tonumber(ARGV[6]))
return 0
"""
)

# ARGV: step, period ms.
_FACTOR = (
    _PRELUDE
    + """
local s = redis.call('HMGET', KEYS[1], 'factor', 'since')
return tostring(factor_at(s[1], s[2], tonumber(ARGV[1]), tonumber(ARGV[2])))
"""
)

_TTL_MS = int(IDLE_TTL_S * 1000)
_PERIOD_MS = RECOVERY_PERIOD_S * 1000


class RedisRateLimiter:
    """A `RateLimiter` shared by every process using the same Redis and `prefix`.

    Each process passes its own `limits_by_key`; processes sharing a key should agree
    on its limits. A Redis failure raises `TransientStoreError`.
    """

    def __init__(self, client: redis.Redis, limits_by_key: Mapping[str, Limits], prefix: str) -> None:
        self._client = client
        self._limits = dict(limits_by_key)
        self._prefix = prefix
        self._take_turn = client.register_script(_TAKE_TURN)
        self._mark = client.register_script(_MARK)
        self._penalize = client.register_script(_PENALIZE)
        self._factor = client.register_script(_FACTOR)

    def acquire(self, key: str, tokens: int, deadline_s: float) -> None:
        limits = limits_for(self._limits, key)
        args: list[float | int] = [
            limits.request_capacity,
            limits.request_rate / 1000,
            limits.token_capacity,
            limits.token_rate / 1000,
            tokens,
            RECOVERY_STEP,
            _PERIOD_MS,
            _TTL_MS,
        ]
        wait_until_admitted(
            lambda left_s: self._turn(key, [*args, math.floor(left_s * 1000)]),
            lambda: int(str(self._call(self._mark, key, []))),
            key,
            deadline_s,
        )

    def penalize(self, key: str, retry_after_s: float) -> None:
        pause_ms = math.ceil(max(0.0, retry_after_s) * 1000)
        args: list[float | int] = [pause_ms, PENALTY_CUT, FACTOR_FLOOR, RECOVERY_STEP, _PERIOD_MS, _TTL_MS]
        self._call(self._penalize, key, args)

    def factor(self, key: str) -> float:
        """The share of the key's full rate it refills at now (1.0 when never penalized)."""
        reply = self._call(self._factor, key, [RECOVERY_STEP, _PERIOD_MS])
        return float(reply.decode() if isinstance(reply, bytes) else str(reply))

    def _turn(self, key: str, args: list[float | int]) -> Turn:
        reply = cast(list[int], self._call(self._take_turn, key, args))
        held, wait_ms, mark = (int(part) for part in reply)
        return Turn(wait_ms / 1000, held=held == 1, mark=mark)

    def _call(self, script: redis.commands.core.Script, key: str, args: list[float | int]) -> object:
        try:
            return script(keys=[self._prefix + key], args=[str(arg) for arg in args])
        except redis.RedisError as exc:
            raise TransientStoreError(f"rate limiter: {exc}") from exc
