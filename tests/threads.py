"""Running test work on several threads at once."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence


def at_once(work: Sequence[Callable[[], object]], timeout_s: float = 60.0) -> list[BaseException]:
    """Runs each callable on a thread of its own, all released together; the errors they raised.
    The last thread to start is released first. Fails the test if any is still running after
    `timeout_s`."""
    start, errors = threading.Barrier(len(work), timeout=timeout_s), []

    def run(call: Callable[[], object]) -> None:
        try:
            start.wait()
            call()
        except BaseException as error:  # noqa: BLE001  (the caller reads them)
            errors.append(error)

    threads = [threading.Thread(target=run, args=(call,)) for call in work]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout_s)
    assert not any(thread.is_alive() for thread in threads), "work still running"
    return errors
