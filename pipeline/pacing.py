"""How many LLM calls to keep in flight: as many as the server takes at once, and no more than
reach the rate limit.

Two rules bound the calls in flight, and the lower one holds:

- **The rate limit** (`in_flight`). By Little's law a provider admitting `rpm / 60` requests a
  second, each taking `latency` seconds to answer, is kept busy by `rpm / 60 * latency` calls in
  flight. Fewer leave part of the limit unused; more only queue at the rate limiter. The latency
  is observed as calls are answered, so the number follows it as it changes.
- **What the server takes** (`Window`). A hosted API answers dozens of calls at once; a model
  on a laptop's CPU answers one at a time and queues the rest, each waiting for those before it
  (minutes apiece); some local servers even drop the request they are streaming when another
  arrives. Nothing says which one is at the other end, so the window is learnt from the calls,
  as TCP learns a path: additive increase, multiplicative decrease (AIMD), with a delay signal
  taken from TCP Vegas. It starts at one call and, while the server takes every call sent,
  grows by one per answer (doubling each round, "slow start"); a sign of saturation halves it
  and remembers the level the server could not take (its ceiling); below the ceiling it grows by
  one per round again, and it tries the ceiling itself only after `PROBE_AFTER` calm answers.

  The signs of saturation are: a call answered after a wait for its first token far above the
  least seen (`QUEUE_FACTOR` times it plus `QUEUE_MARGIN_S`: it queued behind the others in
  flight, as Vegas reads a round trip above the base one); a call the server gave up on for
  another (a stream ended before its finish, a 429 or 503); a call silent past its timeout (a
  busy server, or a dead one, which the circuit breaker tells apart). Several calls of one
  episode report it: only the first, and those sent after the cut, cut again.

  Why AIMD with a delay signal rather than either alone: loss alone (timeouts) comes minutes late
  from a server that queues quietly, and costs a whole call each time; delay alone cannot tell a
  server that drops a stream for another one. Why the time to the first token, not the whole
  call: a reply's length varies tenfold from chunk to chunk, while the time to its first token is
  the queue plus the prompt, and a queue behind a CPU model is minutes where a prompt is seconds.
  Why a ceiling: against a one-at-a-time server each probe beyond one costs a call's wait (or,
  where the server drops a stream for a newcomer, the prompt it was reading), so the window
  returns there rarely; a hosted API, which does not push back, is never held by it.

The window counts calls where each is sent (`Window.turn`): a retry waits for a turn like a first
attempt, so a window that shrinks holds back the calls already in flight too.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from kenning.pipeline.errors import TransientLLMError

# Calls in flight beyond Little's law: a slot's cycle is more than the latency observed (the
# pipeline's own work between calls, the limiter's wake-ups, latency varying from call to call).
# Calls beyond the limit's need only wait at the limiter, which admits no more than the limit.
HEADROOM = 1.5
# The weight of the newest observation in the moving average of latency.
SMOOTHING = 0.3
# What a call is assumed to take before any has been answered.
INITIAL_LATENCY_S = 1.0

# The window's first size: one call, until the server is seen to take more.
START = 1
# A first token this much later than the least seen (times, plus seconds) waited in a queue. A
# hosted API's first token varies within a second or two; a queue behind a CPU model is minutes.
QUEUE_FACTOR = 3.0
QUEUE_MARGIN_S = 2.0
# Calm answers at the ceiling before the window tries one call more.
PROBE_AFTER = 16
# The least time to a first token is taken over this many answers (the base, as Vegas's).
BASE_ANSWERS = 32


def in_flight(rpm: int, latency_s: float, cap: int) -> int:
    """Calls to keep in flight under `rpm` requests a minute (0: no limit) when a call takes
    `latency_s` seconds: ceil(rpm / 60 * latency * HEADROOM), between 1 and `cap`."""
    if rpm <= 0:
        return cap
    return max(1, min(cap, math.ceil(rpm / 60 * latency_s * HEADROOM)))


class Outcome(enum.Enum):
    """How a call to the server ended, as the window reads it."""

    ANSWERED = "answered"
    # The server gave the call up for another, or said it is too busy (a stream ended before its
    # finish, 429, 503).
    DROPPED = "dropped"
    # No byte within the call's timeout.
    STALLED = "stalled"


@dataclass(frozen=True)
class Observation:
    """One call as the window reads it: how it ended, the most calls in flight while it was (itself
    included), when it was sent (the window's clock), and the seconds to its first token, if any."""

    outcome: Outcome
    in_flight: int
    sent_at: float
    first_token_s: float | None = None
    # The window's size when the call was sent (None: as it is now).
    limit: int | None = None


@dataclass(eq=False)
class Turn:
    """A call's turn in the window: the most calls in flight while it is (itself included), when
    it began, and the window's size then."""

    in_flight: int
    sent_at: float
    limit: int = 1


class Window:
    """The calls a server takes at once, learnt from how its calls end (AIMD; see the module), and
    a gate of that many turns, shared by every thread of a process. Thread-safe."""

    def __init__(self, cap: int, start: int = START, clock: Callable[[], float] = time.monotonic) -> None:
        self._cap = max(1, cap)
        self._size = float(max(1, min(start, self._cap)))
        self._ceiling = math.inf  # none until the server pushes back
        self._calm = 0
        self._first_tokens: deque[float] = deque(maxlen=BASE_ANSWERS)
        self._cut_at = -math.inf
        self._clock = clock
        self._turns: set[Turn] = set()
        self._changed = threading.Condition()

    @property
    def limit(self) -> int:
        """The calls to keep in flight now, between 1 and the cap."""
        return max(1, min(self._cap, int(self._size)))

    @property
    def ceiling(self) -> int | None:
        """The calls the server last could not take, less one; None while it never pushed back."""
        return None if self._ceiling == math.inf else int(self._ceiling)

    @property
    def busy(self) -> int:
        return len(self._turns)

    @contextmanager
    def turn(self, wait_s: float) -> Iterator[Turn]:
        """Hold a turn while the block sends one call; wait for one first while the window is full,
        at most `wait_s` seconds (then `TransientLLMError`). The turn counts the most calls in
        flight while it is held."""
        with self._changed:
            if not self._changed.wait_for(lambda: len(self._turns) < self.limit, timeout=wait_s):
                raise TransientLLMError(
                    f"no turn to call the LLM within {wait_s:g} s: {len(self._turns)} calls in flight, "
                    f"the {self.limit} it takes at once"
                )
            taken = Turn(len(self._turns) + 1, self._clock(), self.limit)
            self._turns.add(taken)
            for other in self._turns:
                other.in_flight = max(other.in_flight, len(self._turns))
        try:
            yield taken
        finally:
            with self._changed:
                self._turns.discard(taken)
                self._changed.notify_all()

    def observe(self, seen: Observation) -> None:
        """Learn from one call's end: grow while the server takes every call sent, cut at a sign of
        saturation."""
        with self._changed:
            if seen.outcome is not Outcome.ANSWERED or self._queued(seen):
                self._cut(seen)
            elif seen.in_flight >= (seen.limit or self.limit):
                self._grow()
            if seen.first_token_s is not None:
                self._first_tokens.append(seen.first_token_s)
            self._changed.notify_all()

    def _queued(self, seen: Observation) -> bool:
        """Whether the call waited for its first token behind the others in flight."""
        if seen.first_token_s is None or seen.in_flight < 2 or not self._first_tokens:
            return False
        return seen.first_token_s > QUEUE_FACTOR * min(self._first_tokens) + QUEUE_MARGIN_S

    def _grow(self) -> None:
        # Only a call sent while the window was full grows it: calls fewer than it say nothing
        # about more. Each such answer counts, however many came back together: a round of w
        # calls answered at once doubles the window in slow start, as w answers one by one do.
        self._calm += 1
        if self._ceiling == math.inf:
            self._size = min(self._cap, self._size + 1)  # slow start: one more per answer
            return
        if self._calm >= PROBE_AFTER:
            self._ceiling, self._calm = self._ceiling + 1, 0
        self._size = min(self._cap, self._ceiling, self._size + 1 / self._size)

    def _cut(self, seen: Observation) -> None:
        if seen.sent_at < self._cut_at:
            return  # sent before the last cut: the same episode, already answered
        self._ceiling = max(1, seen.in_flight - 1)
        self._size = max(1.0, min(self._size, seen.in_flight) / 2)
        self._calm = 0
        self._cut_at = self._clock()


@runtime_checkable
class Metered(Protocol):
    """A client that tells how long its answered requests took."""

    def answered(self) -> tuple[int, float]:
        """Requests answered so far, and the seconds they took in all (waits for admission excluded)."""
        ...


@runtime_checkable
class Windowed(Protocol):
    """A client that learns how many calls its server takes at once."""

    @property
    def window(self) -> Window: ...


class Pacer:
    """The calls to keep in flight: those the rate limit needs at the latency observed (an
    exponential moving average), within `cap` and within the server's `window` when one is given."""

    def __init__(
        self, rpm: int, cap: int, latency_s: float = INITIAL_LATENCY_S, window: Window | None = None
    ) -> None:
        self._rpm = rpm
        self._cap = cap
        self._latency_s = latency_s
        self._window = window
        self._seen: tuple[int, float] | None = None
        self._mutex = threading.Lock()

    @property
    def latency_s(self) -> float:
        return self._latency_s

    @property
    def limit(self) -> int:
        limit = in_flight(self._rpm, self._latency_s, self._cap)
        return limit if self._window is None else min(limit, self._window.limit)

    def observe(self, calls: int, seconds: float) -> None:
        """`calls` more requests were answered, taking `seconds` in all."""
        if calls <= 0:
            return
        with self._mutex:
            self._latency_s += SMOOTHING * (seconds / calls - self._latency_s)

    def follow(self, client: Metered) -> None:
        """Observe what `client` answered since the previous call (the first only takes note)."""
        calls, seconds = client.answered()
        with self._mutex:
            seen, self._seen = self._seen, (calls, seconds)
        if seen is not None:
            self.observe(calls - seen[0], seconds - seen[1])


def window_of(client: object) -> Window | None:
    """The window of a client that keeps one, else None."""
    return client.window if isinstance(client, Windowed) else None


class Slots:
    """A gate of calls in flight shared by every thread of a process: as many as `pacer` allows
    at the latency it observes (`client`'s answers, followed as each call ends).

    A free slot goes to the waiter of least rank, not to whichever thread wakes first: the items
    of the batch that started first are called first, so its batch ends (and is loaded) while
    later ones wait, rather than every batch ending together at the last."""

    def __init__(self, pacer: Pacer, client: Metered | None = None) -> None:
        self._pacer = pacer
        self._client = client
        self._busy = 0
        self._waiting: list[tuple[float, int, int]] = []  # a heap of ranks, each made unique
        self._tickets = itertools.count()
        self._changed = threading.Condition()
        if client is not None:
            pacer.follow(client)

    @property
    def limit(self) -> int:
        return self._pacer.limit

    @property
    def busy(self) -> int:
        return self._busy

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @contextmanager
    def taken(self, rank: tuple[float, int] | None = None) -> Iterator[None]:
        """Hold a slot while the block runs; wait for one first when all are busy, behind the
        waiters of lower `rank` (by default, those that came before)."""
        ticket = next(self._tickets)
        mine = (*(rank or (time.monotonic(), 0)), ticket)
        with self._changed:
            heapq.heappush(self._waiting, mine)
            self._changed.notify_all()
            try:
                # Each slot is given back when its call ends, which its deadline bounds. A window
                # that grows meanwhile is seen when the next slot is given back.
                self._changed.wait_for(lambda: self._busy < self._pacer.limit and self._waiting[0] == mine)
            finally:
                self._waiting.remove(mine)
                heapq.heapify(self._waiting)
                self._changed.notify_all()
            self._busy += 1
        try:
            yield
        finally:
            if self._client is not None:
                self._pacer.follow(self._client)
            with self._changed:
                self._busy -= 1
                self._changed.notify_all()
