"""Ctrl-C stops a long embedded `kenning cognify` or `kenning remember` at once: no batch is sent
after it, the LLM requests in flight are abandoned, the run is recorded as interrupted (the next
cognify does the rest), and the command says so in one line and exits 130, with no traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from tests.integration.cluster import ROOT
from tests.simulator import Simulator

CLI = [sys.executable, "-m", "kenning.workers.cli"]
# Far longer than the test waits for the command to end: without the fix, it waits for the
# requests in flight, which the simulator never answers, for this long.
LLM_TIMEOUT_S = 900
WAIT_S = 120.0
PARAGRAPHS = 40


@pytest.fixture
def simulator() -> Iterator[Simulator]:
    with Simulator() as running:
        yield running


@pytest.fixture
def env(tmp_path: Path, simulator: Simulator) -> dict[str, str]:
    return {
        **os.environ,
        "KENNING_HOME": str(tmp_path / "home"),
        "KENNING_LLM_URL": simulator.base_url,
        "KENNING_LLM_API_KEY": "test",
        "KENNING_EMBEDDING_PROVIDER": "hash",
        "KENNING_LLM_TIMEOUT_S": str(LLM_TIMEOUT_S),
        # One batch in flight, of one chunk, one LLM request each: many batches, one sent at a time
        "KENNING_CONCURRENCY": "1",
        "KENNING_EXTRACT_BATCH": "1",
        "KENNING_EXTRACTION_UNIT_TOKENS": "0",
        "KENNING_CHUNK_SIZE": "60",
    }


def write_notes(folder: Path) -> Path:
    """A document of many chunks: many batches of extraction."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "notes.txt"
    lines = (
        f"Keeper {n} of Harrow Point trimmed the lamp in the year {1800 + n} and logged the ship Osprey {n}."
        for n in range(PARAGRAPHS)
    )
    path.write_text("\n\n".join(lines))
    return path


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def interruptible() -> None:
    """In the command's process before it starts: Ctrl-C acts on it, even where the tests run
    with SIGINT ignored (a shell starts its background jobs so, and they pass that on)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=WAIT_S, check=False
    )


@pytest.mark.parametrize("command", ["cognify", "remember"])
def test_ctrl_c_stops_a_long_run_at_once_and_records_it_interrupted(
    tmp_path: Path, env: dict[str, str], simulator: Simulator, command: str
) -> None:
    # Given a document of many chunks (added first, for cognify), and an LLM that answers nothing
    notes = write_notes(tmp_path / "corpus")
    if command == "cognify":
        added = run_cli(env, "add", str(notes), "--dataset", "notes")
        assert added.returncode == 0, added.stderr
        args = ["cognify", "--dataset", "notes"]
    else:
        args = ["remember", str(notes), "--dataset", "notes"]
    simulator.black_hole = True
    process = subprocess.Popen(
        [*CLI, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,
    )
    try:
        # When Ctrl-C comes while a batch waits for its LLM requests
        wait_until(
            lambda: simulator.stats()["held"] >= 1 or process.poll() is not None, "a request in flight"
        )
        assert process.poll() is None, process.communicate()
        sent = simulator.stats()["calls"]["chat"]
        process.send_signal(signal.SIGINT)
        try:
            out, err = process.communicate(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"`kenning {command}` still ran {WAIT_S:.0f} s after Ctrl-C")
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    # Then it ends with 130 and one line saying what happened, no traceback
    assert process.returncode == 130, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1].startswith("error: interrupted"), err
    assert "resume" in lines[-1], err
    # And no batch was sent after it: the requests the provider saw are those in flight then
    assert simulator.stats()["calls"]["chat"] == sent
    # And its run is recorded as interrupted, not completed nor failed
    settings = load_settings(
        home=Path(env["KENNING_HOME"]), embedding_provider="hash", llm_url=simulator.base_url
    )
    with Kenning(settings) as memory:
        [run] = memory.status("notes")[0]["runs"]
    assert run["status"] == "interrupted" and "Ctrl-C" in run["error"], run
    # And the next cognify, with the LLM answering again, does the rest
    simulator.black_hole = False
    resumed = run_cli(env, "cognify", "--dataset", "notes")
    assert resumed.returncode == 0, resumed.stderr
