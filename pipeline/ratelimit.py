"""Rate limits on LLM calls: the limiter port, the limits, and what its adapters share.

One limiter is shared by every process that calls a provider, so that a fleet of
workers stays under the provider's limits together instead of each process limiting
itself. A key names what is limited: `provider-host/model`, optionally `/tenant`.

Each key has two token buckets, one of requests and one of LLM tokens, and an adaptive
factor. A provider's 429 (`penalize`) stops every caller of the key until its
Retry-After has passed, empties the buckets and halves the factor (at most once per
429 episode, never below `FACTOR_FLOOR`); every clean minute after it gives back
`RECOVERY_STEP` of the full rate.

A caller that has to wait reserves its turn: the buckets are debited at once (they may go
below zero) and the caller sleeps until what it took has refilled. Callers are therefore
admitted in the order they asked, and one that asks once is never overtaken by others that
ask again and again, as it would be if every waiter polled and the first awake won. A 429
while it sleeps voids its turn (the buckets were emptied, and the key's penalty count, its
`mark`, went up): it notices within `MARK_CHECK_S` and asks again. A caller interrupted while
it waits for its turn leaves that turn unused: the callers after it wait as if it was used.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple, Protocol
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kenning.pipeline.errors import TransientLLMError
from kenning.pipeline.redact import redact_url

WINDOW_S = 60.0
# Between its acquisition and its arrival at the provider a request may be delayed
# (a new connection, a pause of the process); the buckets refill as if a window lasted
# this much longer, so that such a request still lands inside the provider's limit.
SKEW_S = 1.0
PENALTY_CUT = 0.5
FACTOR_FLOOR = 0.1
RECOVERY_STEP = 0.1
RECOVERY_PERIOD_S = 60.0
# A bucket's state lives this long after its last use: past the longest recovery
# (floor to full in nine periods), so forgetting an idle key changes nothing.
IDLE_TTL_S = 15 * 60.0
# The least a caller sleeps before asking again when it holds no turn (a penalty in force).
MIN_WAIT_S = 0.001
# How often a caller waiting for its turn checks that no 429 voided it.
MARK_CHECK_S = 0.5


class Limits(BaseModel):
    """Within any 60-second window at most `rpm` requests and `tpm` tokens start (0: unlimited).

    Up to `burst` requests may start back to back after a quiet spell; the token bucket
    holds the same share of `tpm` (one second's worth when requests are unlimited). The
    buckets refill at (limit - burst) per 61 seconds: that is what keeps a sliding 60-second
    window, as providers count, from ever seeing more than the limit, even when requests
    reach the provider up to `SKEW_S` later than they were admitted. A request asking more
    tokens than the token bucket holds starts when the bucket is full.

    The burst is by default one second of `rpm` (`default_burst`). A larger burst starts a
    run sooner and refills slower: at rpm 600, a burst of 10 against one of 2 has 8 requests
    more started at any time in a run's first minute, then 1.3% fewer a minute (96.7% of the
    limit instead of 98.0%).
    """

    model_config = ConfigDict(frozen=True)

    rpm: int = Field(default=0, ge=0)
    tpm: int = Field(default=0, ge=0)
    burst: int = Field(default_factory=lambda given: default_burst(given["rpm"]), ge=1)

    @model_validator(mode="after")
    def _check(self) -> Limits:
        if self.rpm and self.burst >= self.rpm:
            raise ValueError(f"rpm must exceed burst, got rpm {self.rpm} and burst {self.burst}")
        return self

    @property
    def unlimited(self) -> bool:
        return not self.rpm and not self.tpm

    @property
    def request_capacity(self) -> float:
        return float(self.burst) if self.rpm else 0.0

    @property
    def request_rate(self) -> float:
        """Requests per second the request bucket refills at full factor."""
        return (self.rpm - self.burst) / (WINDOW_S + SKEW_S) if self.rpm else 0.0

    @property
    def token_capacity(self) -> float:
        if not self.tpm:
            return 0.0
        return self.tpm * self.burst / self.rpm if self.rpm else self.tpm / WINDOW_S

    @property
    def token_rate(self) -> float:
        """Tokens per second the token bucket refills at full factor."""
        return (self.tpm - self.token_capacity) / (WINDOW_S + SKEW_S)


def default_burst(rpm: int) -> int:
    """One second of `rpm`, and at least two: a bucket of one loses whatever refills while the
    next waiter wakes up."""
    return max(2, rpm // 60)


class RateLimiter(Protocol):
    """Requests and tokens per minute per key, shared by everyone holding the same limiter."""

    def acquire(self, key: str, tokens: int, deadline_s: float) -> None:
        """Wait until a request of `tokens` tokens may start under `key`'s limits, and count it.

        Raises `TransientLLMError` ("rate limit wait exceeded") when that would take
        longer than `deadline_s` seconds from now; nothing is counted then.
        """
        ...

    def penalize(self, key: str, retry_after_s: float) -> None:
        """The provider answered 429: nobody sharing `key` starts a request for `retry_after_s`
        seconds, and the key's rate drops, to recover gradually."""
        ...


def limits_for(limits_by_key: Mapping[str, Limits], key: str) -> Limits:
    """The limits of `key`, else of its nearest parent (`host/model` for `host/model/tenant`),
    else of the "" key; no limits at all when none of them is configured."""
    parts = key.split("/")
    for end in range(len(parts), 0, -1):
        candidate = "/".join(parts[:end])
        if candidate in limits_by_key:
            return limits_by_key[candidate]
    return limits_by_key.get("", Limits())


def provider_key(base_url: str, model: str, tenant: str = "") -> str:
    """The limiter key of a model at an endpoint: `host[:port]/model`, plus `/tenant` if given."""
    address = redact_url(base_url)
    host = urlsplit(address).netloc or address
    return f"{host}/{model}" + (f"/{tenant}" if tenant else "")


def estimate_tokens(text_chars: int, completion_tokens: int = 0) -> int:
    """About four characters a token, plus what the answer may take."""
    return (text_chars + 3) // 4 + completion_tokens


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from `retry-after-ms` or `retry-after` (its delay-seconds form only)."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            value = float(headers.get(name) or "")
        except ValueError:
            continue
        if value >= 0:
            return value * scale
    return None


class Turn(NamedTuple):
    """A limiter's answer to a caller that may wait `left_s` more seconds.

    `held`: the buckets were debited for it and it may start after `wait_s` seconds, unless the
    key's `mark` (how many penalties it has had) has changed by then. Not held: nothing was
    debited; it would have to wait `wait_s` (longer than `left_s`, or a penalty in force).
    """

    wait_s: float
    held: bool
    mark: int


def wait_until_admitted(
    take_turn: Callable[[float], Turn],
    mark_of: Callable[[], int],
    key: str,
    deadline_s: float,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Wait for a turn from `take_turn` and sleep until it comes; ask again if a penalty
    (a new `mark_of`) voided it meanwhile or was in force. Gives up as soon as the wait would
    end past the deadline (on `clock`), before anything is debited."""
    give_up = clock() + deadline_s
    # Every round that does not admit sleeps at least a millisecond: bounded by the deadline.
    for _ in range(int(deadline_s * 1000) + 2):
        left = give_up - clock()
        turn = take_turn(max(0.0, left))
        if not turn.held:
            if turn.wait_s > left:
                break
            sleep(max(turn.wait_s, MIN_WAIT_S))
        elif turn.wait_s <= 0 or _kept(turn, mark_of, sleep, clock):
            return
    raise TransientLLMError(f"rate limit wait exceeded: {key} admits no request within {deadline_s:g} s")


def _kept(
    turn: Turn, mark_of: Callable[[], int], sleep: Callable[[float], None], clock: Callable[[], float]
) -> bool:
    """Sleep until the turn comes; False as soon as a penalty voids it."""
    due = clock() + turn.wait_s
    for _ in range(math.ceil(turn.wait_s / MARK_CHECK_S) + 1):
        sleep(max(0.0, min(MARK_CHECK_S, due - clock())))
        if mark_of() != turn.mark:
            return False
        if clock() >= due:
            return True
    return True
