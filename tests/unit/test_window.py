"""The calls in flight a server takes at once, learnt from synthetic observations of its calls."""

from __future__ import annotations

import threading
from collections import deque
from contextlib import AbstractContextManager

import pytest

from kenning.pipeline.errors import TransientLLMError
from kenning.pipeline.pacing import (
    PROBE_AFTER,
    QUEUE_FACTOR,
    QUEUE_MARGIN_S,
    Observation,
    Outcome,
    Pacer,
    Turn,
    Window,
    in_flight,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def answered(window: Window, clock: Clock, in_flight: int, first_token_s: float = 1.0) -> None:
    """One call answered, sent with `in_flight` calls in flight (itself included) just now."""
    clock.now += 1.0
    window.observe(Observation(Outcome.ANSWERED, in_flight, clock.now, first_token_s))


class Flow:
    """Calls kept in flight as the window allows (each held in a turn of it), answered oldest first."""

    def __init__(self, window: Window, clock: Clock) -> None:
        self.window, self.clock = window, clock
        self.open: deque[tuple[AbstractContextManager[Turn], Turn]] = deque()
        self.fill()

    def fill(self) -> None:
        while self.window.busy < self.window.limit:
            held = self.window.turn(wait_s=0)
            self.open.append((held, held.__enter__()))

    def answer(self, first_token_s: float = 1.0, outcome: Outcome = Outcome.ANSWERED) -> None:
        held, turn = self.open.popleft()
        self.clock.now += 1.0
        self.window.observe(Observation(outcome, turn.in_flight, turn.sent_at, first_token_s))
        held.__exit__(None, None, None)
        self.fill()


def test_it_starts_at_one_call_and_grows_by_one_an_answer_while_the_server_takes_them() -> None:
    # Given a new window over a server that answers every call as fast as the first
    clock = Clock()
    window = Window(cap=32, clock=clock)
    assert window.limit == 1
    # When calls are answered one after another, the window kept full
    flow = Flow(window, clock)
    limits = []
    for _ in range(40):
        flow.answer()
        limits.append(window.limit)
    # Then each answer added a call (the window doubles each round), up to the cap
    assert limits == [min(32, answers + 1) for answers in range(1, 41)]
    assert window.ceiling is None


def test_calls_fewer_than_the_window_do_not_grow_it() -> None:
    clock = Clock()
    window = Window(cap=32, start=4, clock=clock)
    for _ in range(50):
        answered(window, clock, in_flight=2)  # the caller never had more than two to send
    assert window.limit == 4


def test_a_one_at_a_time_server_that_queues_brings_it_to_one_and_keeps_it_there() -> None:
    # Given a server answering one call at a time: the second call of two waits for the first,
    # whose reply takes a minute, before its first token (two seconds of prompt)
    clock = Clock()
    window = Window(cap=32, clock=clock)
    answered(window, clock, in_flight=1, first_token_s=2.0)
    assert window.limit == 2
    answered(window, clock, in_flight=2, first_token_s=2.0)
    answered(window, clock, in_flight=2, first_token_s=62.0)  # it queued
    # Then the window is back to one, and one is what the server was seen to take
    assert window.limit == 1 and window.ceiling == 1
    # And calm answers one at a time keep it at one, until a probe after PROBE_AFTER of them
    limits = []
    for _ in range(PROBE_AFTER):
        answered(window, clock, in_flight=1, first_token_s=2.0)
        limits.append(window.limit)
    assert limits[:-1] == [1] * (PROBE_AFTER - 1) and limits[-1] == 2
    # When the probe queues again, the window is one again
    answered(window, clock, in_flight=2, first_token_s=60.0)
    assert window.limit == 1 and window.ceiling == 1


def test_a_first_token_within_the_queue_margin_is_no_queue() -> None:
    # Given a hosted API whose first token takes 0.3 s at best and varies within a second or two
    clock = Clock()
    window = Window(cap=32, clock=clock)
    jitter = [0.3, 0.9, 1.4, 0.5, QUEUE_FACTOR * 0.3 + QUEUE_MARGIN_S - 0.01, 0.4]
    flow = Flow(window, clock)
    for index in range(60):
        flow.answer(jitter[index % len(jitter)])
    # Then the window grew to the cap and stays there
    assert window.limit == 32 and window.ceiling is None


@pytest.mark.parametrize("outcome", [Outcome.DROPPED, Outcome.STALLED])
def test_a_dropped_or_stalled_call_halves_the_window(outcome: Outcome) -> None:
    clock = Clock()
    window = Window(cap=32, start=16, clock=clock)
    clock.now = 5.0
    window.observe(Observation(outcome, 16, clock.now))
    assert window.limit == 8 and window.ceiling == 15


def test_the_calls_of_one_episode_cut_the_window_once() -> None:
    # Given eight calls sent together at t=1, and the server overwhelmed by them
    clock = Clock()
    window = Window(cap=32, start=8, clock=clock)
    clock.now = 2.0
    # When each of them comes back dropped
    for _ in range(8):
        window.observe(Observation(Outcome.DROPPED, 8, sent_at=1.0))
        clock.now += 0.1
    # Then the window was halved once, not eight times
    assert window.limit == 4
    # And a call sent after the cut that is dropped too cuts again
    window.observe(Observation(Outcome.DROPPED, 4, sent_at=clock.now))
    assert window.limit == 2


def test_below_the_ceiling_it_grows_about_one_call_a_round() -> None:
    # Given a window of 32 cut in two by a dropped call
    clock = Clock()
    window = Window(cap=64, start=32, clock=clock)
    window.observe(Observation(Outcome.DROPPED, 32, clock.now))
    assert window.limit == 16 and window.ceiling == 31
    # When a hundred calls are answered, the window kept full
    flow = Flow(window, clock)
    for _ in range(100):
        flow.answer()
    # Then it grew by about a call for each window's worth of answers (16, 17, 18, 19, 20, ...)
    assert 19 <= window.limit <= 21


def test_a_full_window_makes_the_next_call_wait_for_a_turn() -> None:
    # Given a window of one call, held
    window = Window(cap=4)
    entered = threading.Event()
    release = threading.Event()
    second: list[int] = []

    def hold() -> None:
        with window.turn(wait_s=5) as turn:
            assert turn.in_flight == 1
            entered.set()
            release.wait(timeout=5)

    holder = threading.Thread(target=hold)
    holder.start()
    assert entered.wait(timeout=5)
    # Then a second call gets no turn while it is held
    with pytest.raises(TransientLLMError, match="no turn to call the LLM within 0.05 s"):
        with window.turn(wait_s=0.05):
            pass

    # And gets one once it is given back
    def wait() -> None:
        with window.turn(wait_s=5) as turn:
            second.append(turn.in_flight)

    waiter = threading.Thread(target=wait)
    waiter.start()
    release.set()
    holder.join(timeout=5)
    waiter.join(timeout=5)
    assert second == [1] and window.busy == 0


def test_the_pacer_keeps_the_lower_of_the_rate_limit_and_the_window() -> None:
    clock = Clock()
    window = Window(cap=32, clock=clock)
    # Without a rate limit, the window
    assert Pacer(0, 32, window=window).limit == 1
    flow = Flow(window, clock)
    for _ in range(3):
        flow.answer()
    assert Pacer(0, 32, window=window).limit == 4
    # Under a rate limit that needs fewer, the limit's
    assert Pacer(60, 32, latency_s=1.0, window=window).limit == in_flight(60, 1.0, 32) == 2
    # And no window: the rate limit's alone, as before
    assert Pacer(0, 32).limit == 32


def test_a_full_round_answered_at_once_doubles_the_window_in_slow_start() -> None:
    # Given a window of four over a server that answers every call of a round together
    clock = Clock()
    window = Window(cap=32, start=4, clock=clock)
    held = [window.turn(wait_s=0) for _ in range(4)]
    turns = [each.__enter__() for each in held]
    # When all four are answered before any other call is sent
    for each, turn in zip(held, turns, strict=True):
        clock.now += 0.01
        window.observe(Observation(Outcome.ANSWERED, turn.in_flight, turn.sent_at, 1.0, turn.limit))
        each.__exit__(None, None, None)
    # Then each of them counted: the window doubled, as four answers one by one double it
    assert window.limit == 8
