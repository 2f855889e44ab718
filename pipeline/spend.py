"""LLM spend, counted per attempt as it happens: what the provider bills, whatever became of the task.

Each request a pipeline step sends to the LLM is recorded in a `SpendLedger` before it is sent
(one call, with the tokens it is expected to cost), and its tokens billed once it is answered
(none when it failed). Retries are attempts of their own, and the
attempts of a task killed mid-call are already recorded: so a run's spend, summed from the
ledger, is what the provider saw, not what the tasks that finished reported.

A step is charged to its run by `charged_to(job)` (the plan's `Step.run` does it); the LLM
client asks `current_charge()` for whom it sends. Requests outside any run (a search's
completion) are not recorded here.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol


@dataclass(frozen=True)
class Charge:
    """Whom an LLM request is charged to: a run of a dataset."""

    run_id: str
    dataset_id: str


@dataclass(frozen=True)
class Spend:
    """Requests sent, and tokens billed for those answered."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def __add__(self, other: Spend) -> Spend:
        return Spend(
            self.calls + other.calls,
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
        )


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
        """The spend of each run that has any attempt recorded."""
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


_charge: ContextVar[Charge | None] = ContextVar("kenning_charge", default=None)


@contextmanager
def charged_to(run_id: str, dataset_id: str) -> Iterator[None]:
    """Charge the LLM requests made in this block (and this context) to the run."""
    token = _charge.set(Charge(run_id=run_id, dataset_id=dataset_id))
    try:
        yield
    finally:
        _charge.reset(token)


def breaker_key(base_url: str, model: str) -> str:
    """The name an endpoint's breaker is recorded under: `base_url model`."""
    return f"{base_url} {model}"


def current_charge() -> Charge | None:
    """The run the LLM requests made now are charged to, or None outside any run."""
    return _charge.get()
