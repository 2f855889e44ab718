"""LLM spend, counted per attempt as it happens: what the provider bills, whatever became of the task.

Each request a pipeline step sends to the LLM is recorded in a `SpendLedger` before it is sent
(one call, with the tokens it is expected to cost), and its tokens billed once it is answered
(none when it failed). Retries are attempts of their own, and the
attempts of a task killed mid-call are already recorded: so a run's spend, summed from the
ledger, is what the provider saw, not what the tasks that finished reported.

A step is charged to its run by `charged_to(job)` (the plan's `Step.run` does it); a search is
charged as an operation of its own (`kind="completion"`, its id in `run_id`) to every dataset it
read: each dataset's spend (`by_dataset`) counts it, and every sum over several datasets
(`across`), over the search (`totals`) or over a session (`by_session`) counts it once, so those
equal what the provider saw. The LLM client asks `current_charge()` for whom it sends. An
operation with an agent session (`in_session`) charges every request made in it (in this thread)
to that session too.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol

from kenning.pipeline.errors import StoreError
from kenning.pipeline.redact import redact_url
from kenning.pipeline.session import SessionKey

log = logging.getLogger(__name__)

HELD_LIMIT = 100_000

ChargeKind = Literal["extraction", "completion"]
KINDS: tuple[ChargeKind, ...] = ("extraction", "completion")


@dataclass(frozen=True)
class Charge:
    """Whom an LLM request is charged to: a run of a dataset (an extraction), or a search
    (a completion: `run_id` is the search's own id), and the agent session it was made for. A
    search of several datasets names the first in `dataset_id` and the others in `shared`: it is
    charged to each of them."""

    run_id: str
    dataset_id: str
    kind: ChargeKind = "extraction"
    session: SessionKey | None = None
    shared: tuple[str, ...] = ()


@dataclass(frozen=True)
class Spend:
    """Requests sent, tokens billed for those answered, and the requests that failed: ended with
    nothing billed (no answer in time, no connection, a 429 or 5xx), each retried unless its
    call gave up."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    failed: int = 0

    def __add__(self, other: Spend) -> Spend:
        return Spend(
            self.calls + other.calls,
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.failed + other.failed,
        )

    @property
    def answered(self) -> int:
        """The requests not failed."""
        return self.calls - self.failed

    @property
    def label(self) -> str:
        """What a progress bar of these requests (not failed, of sent) says: how many failed. Each
        failed request is retried, unless its call gave up (attempts or deadline spent, breaker open)."""
        return f"LLM requests, {self.failed} failed"


class SpendLedger(Protocol):
    """Where attempts are recorded (the metadata database), and summed per run."""

    def sent(
        self, attempt_id: str, charge: Charge, model: str, prompt_tokens: int = 0, completion_tokens: int = 0
    ) -> None:
        """Record a request about to be sent: one call, and the tokens it is expected to cost."""
        ...

    def answered(self, attempt_id: str, prompt_tokens: int, completion_tokens: int) -> None:
        """Replace the attempt's expected tokens with those billed (0 for a request not answered)."""
        ...

    def totals(self, run_ids: Sequence[str]) -> dict[str, Spend]:
        """The spend of each run that has any attempt recorded; an attempt answered with no
        tokens billed is one `failed`."""
        ...

    def by_dataset(self, dataset_ids: Sequence[str]) -> dict[str, dict[ChargeKind, Spend]]:
        """The spend charged to each dataset that has any, by kind (extraction, completion): an
        attempt charged to several (a search of several datasets) counts in each."""
        ...

    def across(self, dataset_ids: Sequence[str]) -> dict[ChargeKind, Spend]:
        """The spend charged to any of the datasets, by kind, each attempt counted once."""
        ...

    def by_session(self, keys: Sequence[SessionKey]) -> dict[SessionKey, dict[str, Spend]]:
        """The spend charged to each session that has any, by model."""
        ...

    def charge_run(self, run_id: str, session: SessionKey) -> None:
        """Charge the run's attempts that no session was charged for to this one (a run that an
        operation of the session started, and that ran where the session was not known)."""
        ...

    def breaker_changed(self, endpoint: str, state: str, reason: str, cooldown_s: float) -> None:
        """Keep the endpoint's circuit breaker as it now is: `open` (with why) or `closed`."""
        ...

    def breaker(self, endpoint: str) -> Breaker | None:
        """The endpoint's circuit breaker as its last change left it; None if it never changed."""
        ...


@dataclass(frozen=True)
class Breaker:
    """An LLM endpoint's circuit breaker as its last change left it, in whichever process."""

    state: str
    reason: str
    cooldown_s: float
    changed_at: datetime

    def now(self, at: datetime) -> str:
        """`closed`, `open` (calls fail fast) or `half-open` (its cooldown is over: a call may try)."""
        if self.state != "open":
            return "closed"
        return "open" if (at - self.changed_at).total_seconds() < self.cooldown_s else "half-open"


@dataclass(frozen=True)
class Tally:
    """An endpoint's circuit breaker as a `FailureTally` holds it: `closed`, `open` (calls fail
    fast) or `half-open` (its cooldown is over: a call may try), the connection failures in a row,
    and the last one's cause."""

    state: str = "closed"
    in_a_row: int = 0
    last: str = ""


class FailureTally(Protocol):
    """Connection failures in a row of each LLM endpoint, and its breaker: held by one process
    (`kenning.storage.coordination.breaker_memory`), or shared through Redis by every worker of a deployment
    (`kenning.storage.coordination.breaker_redis`), so that their failures add up and one opening
    stops them all."""

    def tally(self, key: str) -> Tally:
        """The breaker of the endpoint `key` (`breaker_key`) now."""
        ...

    def failed(self, key: str, cause: str, failures: int, cooldown_s: float) -> bool:
        """Count one failure in a row; from `failures` in a row, (re)open the breaker for
        `cooldown_s`. Whether this failure opened a breaker that was not open."""
        ...

    def succeeded(self, key: str) -> bool:
        """The endpoint answered: no failures in a row, the breaker closed. Whether it was not."""
        ...


Write = Callable[[SpendLedger], None]


class HeldLedger:
    """A `SpendLedger` that holds the writes its store refused, and writes them, in order, once
    the store answers again: a request sent or answered while the metadata database is away is
    still counted, with its billed tokens.

    Each write first drains what is held (one try); `flush()` drains it all or raises
    `StoreError`. A task flushes before it returns, so its run's spend is whole when the run
    ends. A process killed while the store is away loses what it held. At most `limit` writes
    are held: past that the oldest is dropped, with a warning, and counted in `dropped`.
    """

    def __init__(self, ledger: SpendLedger, limit: int = HELD_LIMIT) -> None:
        self._ledger = ledger
        self._limit = limit
        self._held: deque[Write] = deque()
        self._lock = threading.Lock()  # guards _held
        self._draining = threading.Lock()  # one drainer at a time: only it pops
        self.dropped = 0

    @property
    def held(self) -> int:
        """How many writes wait for the store."""
        with self._lock:
            return len(self._held)

    def sent(
        self, attempt_id: str, charge: Charge, model: str, prompt_tokens: int = 0, completion_tokens: int = 0
    ) -> None:
        self._write(lambda ledger: ledger.sent(attempt_id, charge, model, prompt_tokens, completion_tokens))

    def answered(self, attempt_id: str, prompt_tokens: int, completion_tokens: int) -> None:
        self._write(lambda ledger: ledger.answered(attempt_id, prompt_tokens, completion_tokens))

    def totals(self, run_ids: Sequence[str]) -> dict[str, Spend]:
        self._try_drain()
        return self._ledger.totals(run_ids)

    def by_dataset(self, dataset_ids: Sequence[str]) -> dict[str, dict[ChargeKind, Spend]]:
        self._try_drain()
        return self._ledger.by_dataset(dataset_ids)

    def across(self, dataset_ids: Sequence[str]) -> dict[ChargeKind, Spend]:
        self._try_drain()
        return self._ledger.across(dataset_ids)

    def by_session(self, keys: Sequence[SessionKey]) -> dict[SessionKey, dict[str, Spend]]:
        self._try_drain()
        return self._ledger.by_session(keys)

    def charge_run(self, run_id: str, session: SessionKey) -> None:
        self._write(lambda ledger: ledger.charge_run(run_id, session))

    def breaker_changed(self, endpoint: str, state: str, reason: str, cooldown_s: float) -> None:
        self._ledger.breaker_changed(endpoint, state, reason, cooldown_s)

    def breaker(self, endpoint: str) -> Breaker | None:
        return self._ledger.breaker(endpoint)

    def flush(self) -> None:
        """Write everything held; `StoreError` if the store is still away (what is left stays held)."""
        with self._draining:
            self._drain()

    def _write(self, write: Write) -> None:
        # An attempt's request and answer are written by one thread, one after the other: once
        # anything is held, new writes queue behind it, so an answer never precedes its request.
        with self._lock:
            queued = bool(self._held)
            if queued:
                self._hold(write)
        if not queued:
            try:
                write(self._ledger)
                return
            except StoreError as error:
                log.warning("spend ledger away, the write is held until it is back: %s", error)
                with self._lock:
                    self._hold(write)
        self._try_drain()

    def _hold(self, write: Write) -> None:
        if len(self._held) >= self._limit:
            self._held.popleft()
            self.dropped += 1
            log.warning("spend ledger away: %d writes held, the oldest dropped", self._limit)
        self._held.append(write)

    def _try_drain(self) -> None:
        if not self._draining.acquire(blocking=False):
            return  # another thread drains
        try:
            self._drain()
        except StoreError:
            pass  # still away: held for the next write or the flush
        finally:
            self._draining.release()

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._held:
                    return
                write = self._held[0]
            write(self._ledger)
            with self._lock:
                if self._held and self._held[0] is write:
                    self._held.popleft()


_charge: ContextVar[Charge | None] = ContextVar("kenning_charge", default=None)
_session: ContextVar[SessionKey | None] = ContextVar("kenning_charge_session", default=None)


@contextmanager
def charged_to(
    run_id: str, dataset_id: str, kind: ChargeKind = "extraction", shared: Sequence[str] = ()
) -> Iterator[None]:
    """Charge the LLM requests made in this block (and this context) to the run, or to the
    search whose id is `run_id` (`kind="completion"`), of the dataset (and of the `shared` ones: the
    other datasets a search read); and to the session it is `in_session` of."""
    others = tuple(dict.fromkeys(d for d in shared if d != dataset_id))
    charge = Charge(run_id=run_id, dataset_id=dataset_id, kind=kind, session=_session.get(), shared=others)
    token = _charge.set(charge)
    try:
        yield
    finally:
        _charge.reset(token)


@contextmanager
def in_session(session: SessionKey) -> Iterator[None]:
    """Charge the LLM requests of the runs and searches begun in this block (and this context)
    to the session too."""
    token = _session.set(session)
    try:
        yield
    finally:
        _session.reset(token)


def breaker_key(base_url: str, model: str) -> str:
    """The name an endpoint's breaker is recorded under: `base_url model`, without the URL's
    user and password."""
    return f"{redact_url(base_url)} {model}"


def current_charge() -> Charge | None:
    """The run the LLM requests made now are charged to, or None outside any run."""
    return _charge.get()
