"""What `kenning remember --session` leaves running after it returns: the graph write of the
messages it wrote to the session (add, cognify, index the turns), in a process of its own.

`start` hands the work to `python -m kenning.workers.cli.background` on its stdin (the messages
never touch the disk outside the home); that process forks, the fork detaches from the terminal
(Ctrl-C there does not stop it) and works, and the first one exits at once, so the command that
started it waits for nothing. The run it starts is seen in `kenning status` like any other; it
acts with the settings of the environment it was started in. It makes memory of the items the
command added and only those still there: a forget in between is not undone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence

from kenning.pipeline.errors import KenningError
from kenning.workers.application.lifecycle import Message


def start(messages: Sequence[Message], dataset: str | None, session_id: str) -> None:
    """Start the graph write of `messages` in a detached process; returns once it is handed over."""
    work = {
        "dataset": dataset,
        "session_id": session_id,
        "messages": [m.model_dump(mode="json") for m in messages],
    }
    command = [sys.executable, "-m", "kenning.workers.cli.background"]
    handed = subprocess.run(  # the first process exits as soon as its fork has the work
        command,
        input=json.dumps(work).encode(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        check=False,
    )
    if handed.returncode != 0:
        why = handed.stderr.decode(errors="replace").strip().splitlines()
        raise KenningError(
            f"could not start the background graph write: {why[-1] if why else handed.returncode}"
        )


def main() -> None:
    work = json.loads(sys.stdin.buffer.read())
    if os.fork() != 0:
        return  # the first process: the fork has the work
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for stream in (0, 1, 2):
        os.dup2(null, stream)
    try:
        make_memory(work)  # a run that fails says so in its record, which status shows
    finally:
        os._exit(0)


def make_memory(work: dict[str, object]) -> None:
    from kenning.workers.memory import Kenning
    from kenning.workers.runtime.settings import load_settings

    raw = work["messages"]
    assert isinstance(raw, list)
    messages = [Message.model_validate(message) for message in raw]
    dataset = work["dataset"]
    with Kenning(load_settings()) as memory:
        into = dataset if isinstance(dataset, str) else None
        memory.make_memory(messages, into, str(work["session_id"]), added=True)


if __name__ == "__main__":
    main()
