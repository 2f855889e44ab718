"""Spend written while the metadata store is away is held and written once it is back.

A call sent and answered during an outage must end with its billed tokens in the ledger, in
order (the answer after the request), and `flush` says plainly when the store is still away.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kenning.pipeline.errors import StoreError, TransientStoreError
from kenning.pipeline.spend import Breaker, Charge, HeldLedger, Spend
from kenning.storage.metadata.spend import MemorySpendLedger

RUN = Charge(run_id="r1", dataset_id="d1")


class Flaky:
    """A ledger whose store can be switched off: every write then fails as a store away."""

    def __init__(self) -> None:
        self.inner = MemorySpendLedger()
        self.away = False
        self.writes = 0

    def _check(self) -> None:
        if self.away:
            raise TransientStoreError("metadata store: connection refused")

    def sent(
        self, attempt_id: str, charge: Charge, model: str, prompt_tokens: int = 0, completion_tokens: int = 0
    ) -> None:
        self._check()
        self.writes += 1
        self.inner.sent(attempt_id, charge, model, prompt_tokens, completion_tokens)

    def answered(self, attempt_id: str, prompt_tokens: int, completion_tokens: int) -> None:
        self._check()
        self.writes += 1
        self.inner.answered(attempt_id, prompt_tokens, completion_tokens)

    def totals(self, run_ids: Sequence[str]) -> dict[str, Spend]:
        self._check()
        return self.inner.totals(run_ids)

    def breaker_changed(self, endpoint: str, state: str, reason: str, cooldown_s: float) -> None:
        self._check()
        self.inner.breaker_changed(endpoint, state, reason, cooldown_s)

    def breaker(self, endpoint: str) -> Breaker | None:
        self._check()
        return self.inner.breaker(endpoint)


def test_an_answer_written_during_an_outage_lands_once_the_store_is_back() -> None:
    store = Flaky()
    ledger = HeldLedger(store)
    ledger.sent("a1", RUN, "m", 100, 10)
    store.away = True
    ledger.answered("a1", 120, 33)  # held, not lost
    store.away = False
    ledger.flush()
    assert store.inner.totals(["r1"]) == {"r1": Spend(1, 120, 33)}


def test_a_request_sent_during_an_outage_is_counted_with_its_answer() -> None:
    store = Flaky()
    ledger = HeldLedger(store)
    store.away = True
    ledger.sent("a1", RUN, "m", 100, 10)
    ledger.answered("a1", 120, 33)
    ledger.sent("a2", RUN, "m", 50, 10)
    store.away = False
    ledger.answered("a2", 60, 7)  # the next write drains what was held first, in order
    assert store.inner.totals(["r1"]) == {"r1": Spend(2, 180, 40)}
    ledger.flush()  # nothing left: no write again
    assert store.writes == 4


def test_flush_raises_while_the_store_is_away_and_keeps_what_it_holds() -> None:
    store = Flaky()
    ledger = HeldLedger(store)
    store.away = True
    ledger.sent("a1", RUN, "m", 100, 10)
    with pytest.raises(StoreError):
        ledger.flush()
    assert ledger.held == 1
    store.away = False
    ledger.flush()
    assert ledger.held == 0
    assert store.inner.totals(["r1"]) == {"r1": Spend(1, 100, 10)}


def test_beyond_its_bound_the_oldest_held_write_is_dropped() -> None:
    store = Flaky()
    ledger = HeldLedger(store, limit=2)
    store.away = True
    for n in range(3):
        ledger.sent(f"a{n}", RUN, "m", 10, 1)
    assert ledger.held == 2
    assert ledger.dropped == 1
    store.away = False
    ledger.flush()
    assert store.inner.totals(["r1"]) == {"r1": Spend(2, 20, 2)}
