"""Calls in flight on a worker: the process's slots, and a batch whose items run at once under them."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import cast

import pytest

from kenning.pipeline.context import Job, Services
from kenning.pipeline.locking import check_fence, fenced
from kenning.pipeline.pacing import Pacer, Slots
from kenning.pipeline.plan import Step, StepResult
from kenning.workers.celery.paced import run_paced

WAIT_S = 10.0
JOB = Job(run_id="r", dataset_id="d", tenant="t", dataset="s")
NO_SERVICES = cast(Services, object())  # the steps here use none


class Meter:
    """A client that says what it answered: `calls` requests, `seconds` in all."""

    def __init__(self) -> None:
        self.calls, self.seconds = 0, 0.0

    def answered(self) -> tuple[int, float]:
        return self.calls, self.seconds


class Gate:
    """Items that enter and wait until let go; counts how many were inside at once."""

    def __init__(self) -> None:
        self.inside = 0
        self.most = 0
        self.entered: list[str] = []
        self.go = threading.Event()
        self._changed = threading.Condition()

    def enter(self, item: str) -> None:
        with self._changed:
            self.inside += 1
            self.most = max(self.most, self.inside)
            self.entered.append(item)
            self._changed.notify_all()
        assert self.go.wait(WAIT_S), "never let go"
        with self._changed:
            self.inside -= 1

    def wait_inside(self, count: int) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self.inside >= count, timeout=WAIT_S)


def gated_step(gate: Gate, fail_first: bool = False) -> Step:
    def function(_services: Services, _job: Job, items: Sequence[str]) -> StepResult:
        [item] = items
        check_fence()
        gate.enter(item)
        if fail_first and gate.entered[0] == item:
            raise RuntimeError(f"{item} failed")
        return StepResult(counts={"extractions": 1})

    return Step("extract", function, fan_out=True)


def run_in_thread(target: object) -> tuple[threading.Thread, list[object]]:
    outcome: list[object] = []

    def body() -> None:
        try:
            outcome.append(target())  # type: ignore[operator]
        except BaseException as error:  # the test reads it
            outcome.append(error)

    thread = threading.Thread(target=body)
    thread.start()
    return thread, outcome


def test_the_slots_admit_as_many_calls_as_the_limit_needs_at_the_latency_observed() -> None:
    # Given a limit of 600 requests a minute and a client whose calls take 0.5 s
    meter = Meter()
    slots = Slots(Pacer(rpm=600, cap=32), meter)
    for _ in range(20):
        with slots.taken():
            meter.calls, meter.seconds = meter.calls + 1, meter.seconds + 0.5
    # Then the slots follow it: 10 a second x 0.5 s x 1.5 headroom
    assert slots.limit == 8
    # And with no limit, the cap
    assert Slots(Pacer(rpm=0, cap=5)).limit == 5


def test_a_batch_runs_its_items_at_once_up_to_the_slots_and_merges_their_counts() -> None:
    # Given slots for three calls and a batch of seven items
    gate, slots = Gate(), Slots(Pacer(rpm=0, cap=3))
    items = [f"u{number}" for number in range(7)]
    thread, outcome = run_in_thread(lambda: run_paced(slots, gated_step(gate), NO_SERVICES, JOB, items))
    # Then three run at once, no more
    assert gate.wait_inside(3)
    assert slots.busy == 3
    gate.go.set()
    thread.join(WAIT_S)
    assert gate.most == 3
    # And the batch's counters are the sum of its items'
    [counts] = outcome
    assert isinstance(counts, dict) and counts["extractions"] == 7
    assert sorted(gate.entered) == items


def test_each_item_writes_behind_the_fence_of_the_task_that_runs_the_batch() -> None:
    # Given a task whose fence says its lock is lost
    gate, slots = Gate(), Slots(Pacer(rpm=0, cap=4))
    gate.go.set()

    def lost() -> None:
        raise RuntimeError("lock lost")

    # When it runs a batch
    with fenced(lost), pytest.raises(RuntimeError, match="lock lost"):
        run_paced(slots, gated_step(gate), NO_SERVICES, JOB, ["a", "b", "c"])
    # Then no item got past the fence, on any thread
    assert gate.entered == []
    assert slots.busy == 0


def test_the_first_item_that_fails_stops_those_not_started_and_the_batch_raises_it() -> None:
    # Given one slot and a batch whose first item to run fails
    gate, slots = Gate(), Slots(Pacer(rpm=0, cap=1))
    gate.go.set()
    step = gated_step(gate, fail_first=True)
    # When the batch runs
    with pytest.raises(RuntimeError, match="failed"):
        run_paced(slots, step, NO_SERVICES, JOB, ["a", "b", "c", "d"])
    # Then the items waiting for the slot did not start, and the slot was given back
    assert len(gate.entered) == 1
    assert slots.busy == 0


def test_a_free_slot_goes_to_the_waiter_of_least_rank_the_batch_that_started_first() -> None:
    # Given one slot, held, and waiters of two batches, the later batch's waiter first in line
    slots, order, holding = Slots(Pacer(rpm=0, cap=1)), [], threading.Event()
    release = threading.Event()

    def hold() -> None:
        with slots.taken():
            holding.set()
            assert release.wait(WAIT_S)

    def wait_for_slot(rank: tuple[float, int]) -> None:
        with slots.taken(rank):
            order.append(rank)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(WAIT_S)
    waiters = []
    for rank in [(2.0, 0), (1.0, 1), (1.0, 0)]:
        waiter = threading.Thread(target=wait_for_slot, args=(rank,))
        waiter.start()
        waiters.append(waiter)
        assert in_line(slots, len(waiters))
    # When the slot is given back
    release.set()
    for thread in [holder, *waiters]:
        thread.join(WAIT_S)
    # Then the earlier batch's items went first, in their order, then the later batch's
    assert order == [(1.0, 0), (1.0, 1), (2.0, 0)]
    assert slots.busy == 0 and slots.waiting == 0


def in_line(slots: Slots, count: int) -> bool:
    """Wait until `count` threads wait for a slot (woken as each gets in line)."""
    with slots._changed:  # noqa: SLF001
        return slots._changed.wait_for(lambda: slots.waiting == count, timeout=WAIT_S)  # noqa: SLF001
