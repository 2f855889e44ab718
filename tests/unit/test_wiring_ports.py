"""The composition root makes each port once, and one port in the making holds up no other."""

from __future__ import annotations

import threading
from pathlib import Path

from kenning.workers.runtime.settings import load_settings
from kenning.workers.runtime.wiring import Wiring

WAIT_S = 10.0


def wiring(tmp_path: Path) -> Wiring:
    return Wiring(load_settings(home=tmp_path / "home", embedding_provider="hash"))


def test_a_port_being_made_holds_up_no_other_port(tmp_path: Path) -> None:
    # Given a thread inside the making of one port, held there
    made = wiring(tmp_path)
    inside, release = threading.Event(), threading.Event()

    def slow() -> str:
        inside.set()
        release.wait(WAIT_S)
        return "slow"

    maker = threading.Thread(target=made._once, args=("slow", slow))
    maker.start()
    assert inside.wait(WAIT_S)

    # When another thread asks for another port meanwhile
    got: list[Path] = []
    other = threading.Thread(target=lambda: got.append(made.home()))
    other.start()
    other.join(WAIT_S / 2)
    still_waiting = other.is_alive()
    release.set()
    maker.join(WAIT_S)
    other.join(WAIT_S)

    # Then it got that port without waiting for the first
    assert not still_waiting
    assert got == [tmp_path / "home"]


def test_threads_asking_for_one_port_at_once_get_the_same_one(tmp_path: Path) -> None:
    made = wiring(tmp_path)
    calls: list[int] = []
    start = threading.Barrier(8)

    def make() -> object:
        calls.append(1)
        return object()

    got: list[object] = []

    def ask() -> None:
        start.wait(WAIT_S)
        got.append(made._once("port", make))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)

    assert len(calls) == 1
    assert len(got) == 8 and all(port is got[0] for port in got)


def test_warming_makes_the_ports_named_and_keeps_errors_for_their_use(tmp_path: Path) -> None:
    # Given a home that cannot be used (a file where the directory should be)
    blocked = tmp_path / "file"
    blocked.write_text("")
    made = Wiring(load_settings(home=blocked / "home", embedding_provider="hash"))

    # When the embedder (which needs no home) and the home are warmed
    made.warm("embedder", "home")
    for thread in [t for t in threading.enumerate() if t.name == "kenning-warm"]:
        thread.join(WAIT_S)

    # Then the embedder is made, and the home's error waits for its use
    assert "embedder" in made._made
    assert "home" not in made._made


def test_closing_waits_for_a_port_being_made(tmp_path: Path) -> None:
    # Given a thread inside the making of a port that has a closer
    made = wiring(tmp_path)
    inside, release = threading.Event(), threading.Event()
    closed: list[str] = []

    def slow() -> str:
        inside.set()
        release.wait(WAIT_S)
        made._closers.append(lambda: closed.append("slow"))
        return "slow"

    maker = threading.Thread(target=made._once, args=("slow", slow))
    maker.start()
    assert inside.wait(WAIT_S)

    # When the wiring is closed meanwhile, and the make then ends
    closer = threading.Thread(target=made.close)
    closer.start()
    closer.join(0.5)
    waited = closer.is_alive()
    release.set()
    closer.join(WAIT_S)
    maker.join(WAIT_S)

    # Then the close waited for it, and closed it with the rest
    assert waited
    assert closed == ["slow"]
    assert "slow" not in made._made


def test_the_pipeline_config_is_made_once(tmp_path: Path) -> None:
    # Given a composition root
    made = wiring(tmp_path)

    # When tasks read its pipeline config again and again
    first, again = made.config, made.config

    # Then they get the one config, with its fact rules compiled once
    assert first is again
    assert first.facts is again.facts
