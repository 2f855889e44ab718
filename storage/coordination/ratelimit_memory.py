"""The in-process twin of the Redis rate limiter: the same buckets, penalties and factor,
on a monotonic clock behind a lock. For embedded mode (one process) and tests, which may give
it a clock of their own (and a sleep that advances it) to refill a bucket without waiting."""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kenning.pipeline.ratelimit import (
    FACTOR_FLOOR,
    PENALTY_CUT,
    RECOVERY_PERIOD_S,
    RECOVERY_STEP,
    Limits,
    Turn,
    limits_for,
    wait_until_admitted,
)


@dataclass
class _Bucket:
    """One key's state; None levels mean full buckets."""

    requests: float | None = None
    tokens: float | None = None
    at: float = 0.0
    factor: float = 1.0
    since: float = 0.0
    until: float = 0.0
    penalties: int = 0

    def factor_at(self, now: float) -> float:
        clean_periods = math.floor(max(0.0, now - self.since) / RECOVERY_PERIOD_S)
        return min(1.0, self.factor + RECOVERY_STEP * clean_periods)


class MemoryRateLimiter:
    """A `RateLimiter` for the threads of one process."""

    def __init__(
        self,
        limits_by_key: Mapping[str, Limits],
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._limits = dict(limits_by_key)
        self._clock = clock
        self._sleep = sleep
        self._buckets: dict[str, _Bucket] = {}
        self._mutex = threading.Lock()

    def acquire(self, key: str, tokens: int, deadline_s: float) -> None:
        limits = limits_for(self._limits, key)
        take_turn = functools.partial(self._take_turn, key, limits, tokens)
        mark = functools.partial(self._mark, key)
        wait_until_admitted(take_turn, mark, key, deadline_s, sleep=self._sleep, clock=self._clock)

    def penalize(self, key: str, retry_after_s: float) -> None:
        with self._mutex:
            now = self._clock()
            bucket = self._buckets.setdefault(key, _Bucket(at=now, since=now))
            factor = bucket.factor_at(now)
            if now >= bucket.until:  # a new 429 episode, not another answer from the same one
                factor = max(FACTOR_FLOOR, factor * PENALTY_CUT)
            bucket.until = max(bucket.until, now + max(0.0, retry_after_s))
            bucket.factor, bucket.since = factor, bucket.until
            # Emptied: what was taken beyond them is turns the penalty voids, which ask again.
            bucket.requests, bucket.tokens = 0.0, 0.0
            bucket.at = bucket.until
            bucket.penalties += 1

    def factor(self, key: str) -> float:
        """The share of the key's full rate it refills at now (1.0 when never penalized)."""
        with self._mutex:
            bucket = self._buckets.get(key)
            return bucket.factor_at(self._clock()) if bucket else 1.0

    def _mark(self, key: str) -> int:
        with self._mutex:
            bucket = self._buckets.get(key)
            return bucket.penalties if bucket else 0

    def _take_turn(self, key: str, limits: Limits, tokens: int, left_s: float) -> Turn:
        with self._mutex:
            now = self._clock()
            bucket = self._buckets.setdefault(key, _Bucket(at=now, since=now))
            if now < bucket.until:
                return Turn(bucket.until - now, held=False, mark=bucket.penalties)
            if limits.unlimited:
                return Turn(0.0, held=True, mark=bucket.penalties)
            wait = self._debit(bucket, limits, tokens, now, left_s)
            return Turn(wait, held=wait <= left_s, mark=bucket.penalties)

    @staticmethod
    def _debit(bucket: _Bucket, limits: Limits, tokens: int, now: float, left_s: float) -> float:
        """The wait until the buckets hold what the request takes; debited (maybe below zero)
        unless that wait is longer than `left_s`."""
        factor = bucket.factor_at(now)
        elapsed = max(0.0, now - bucket.at)
        request_rate, token_rate = limits.request_rate * factor, limits.token_rate * factor
        requests = _refill(bucket.requests, limits.request_capacity, request_rate, elapsed)
        held = _refill(bucket.tokens, limits.token_capacity, token_rate, elapsed)
        wait = 0.0
        if limits.rpm and requests < 1:
            wait = (1 - requests) / request_rate
        needed = min(float(tokens), limits.token_capacity)
        if limits.tpm and held < needed:
            wait = max(wait, (needed - held) / token_rate)
        if wait > left_s:
            return wait
        bucket.requests = requests - 1 if limits.rpm else requests
        bucket.tokens = held - tokens if limits.tpm else held
        bucket.at = now
        return wait


def _refill(level: float | None, capacity: float, rate: float, elapsed: float) -> float:
    return capacity if level is None else min(capacity, level + elapsed * rate)
