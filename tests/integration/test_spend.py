"""Every LLM attempt is counted as it happens: `status` shows what the provider (the simulator) saw.

Retries are attempts of their own, and the calls of a task killed mid-call were recorded before
it died: status counts the simulator's chat requests exactly, plus at most the requests a killed
task recorded but never sent, and their tokens within 1% (5% for a killed call's completion).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kenning.pipeline.errors import StoreError
from kenning.pipeline.ingest import Source
from kenning.pipeline.models import ChunkStatus, RunStatus
from kenning.pipeline.spend import HeldLedger, SpendLedger
from kenning.storage.metadata.spend import SqlSpendLedger
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from tests.integration.cluster import ROOT, Deployment, Workers
from tests.integration.faults import chunk_counts, cognifying, dataset_id
from tests.integration.test_chaos import add_corpus, finished, write_corpus
from tests.integration.test_distributed import runs_of
from tests.simulator import Simulator

SEED = 4242
TOLERANCE = 0.01
# A call cut short by a kill is recorded with estimated completion tokens: the provider bills an
# answer the worker never read, so they are the estimate's error (seen: 1% to 2.2%, with at most
# four calls in flight on the killed worker: two tasks of two units).
KILLED_TOLERANCE = 0.05


def status_of(env: dict[str, str], dataset: str) -> dict[str, Any]:
    """`kenning status --json` of the dataset, as an operator runs it."""
    command = [*STATUS, "--dataset", dataset, "--json"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    entry: dict[str, Any] = json.loads(done.stdout)["datasets"][0]
    return entry


STATUS = [sys.executable, "-m", "kenning.workers.cli", "status"]


# A request recorded in the milliseconds before its worker was killed, but never sent, is
# counted: at most one per request in flight (2 workers, 2 processes each, 2 units a batch).
KILLED_UNSENT = 8


def assert_spend(
    status: dict[str, Any],
    billed: dict[str, Any],
    tolerance: float = TOLERANCE,
    unsent: int = 0,
    completion_tolerance: float | None = None,
) -> None:
    """Status shows every call the simulator answered, and its tokens within the tolerance;
    `unsent` more calls at most: requests recorded by a task killed before the provider got them
    (the client cannot tell them from requests the provider got), never fewer. Each such request
    may add up to twice a mean call's tokens."""
    calls = billed["calls"]["chat"]
    shown = (status["llm_calls"], status["tokens"]["prompt"], status["tokens"]["completion"])
    print(f"status: {shown}; simulator: {(calls, billed['prompt_tokens'], billed['completion_tokens'])}")
    extra = status["llm_calls"] - calls
    assert 0 <= extra <= unsent, (status["llm_calls"], billed["calls"])
    tolerances = {"prompt": tolerance, "completion": completion_tolerance or tolerance}
    for name, share in tolerances.items():
        seen = billed[f"{name}_tokens"]
        allowed = share * seen + extra * 2 * seen / max(calls, 1)
        assert abs(status["tokens"][name] - seen) <= allowed, (name, status["tokens"][name], seen, extra)


def embedded_env(tmp_path: Path, simulator: Simulator) -> dict[str, str]:
    return {
        **os.environ,
        "KENNING_HOME": str(tmp_path / "home"),
        "KENNING_EMBEDDING_PROVIDER": "hash",
        "KENNING_LLM_URL": simulator.base_url,
        "KENNING_LLM_API_KEY": "test",
        "KENNING_LLM_BACKOFF_BASE_S": "0.01",
        "KENNING_CHUNK_SIZE": "48",
        "KENNING_CHUNK_OVERLAP": "4",
        "KENNING_EXTRACTION_UNIT_TOKENS": "0",  # one chunk a call: many calls, many retried
    }


def test_retried_attempts_are_counted_as_the_provider_saw_them(tmp_path: Path) -> None:
    # Given an LLM that fails a third of its requests with a 500 or a malformed answer
    corpus = write_corpus(tmp_path / "corpus", documents=6, sentences=8)
    with Simulator(error_rate=0.2, malformed_rate=0.1, seed=SEED) as simulator:
        env = embedded_env(tmp_path, simulator)
        cli = [sys.executable, "-m", "kenning.workers.cli"]
        run = dict(cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert subprocess.run([*cli, "add", str(corpus), "--dataset", "faulty"], **run).returncode == 0  # type: ignore[call-overload]
        # When a run extracts every chunk, retrying the failures
        cognify = subprocess.run([*cli, "cognify", "--dataset", "faulty"], **run)  # type: ignore[call-overload]
        billed = simulator.stats()
    status = status_of(env, "faulty")
    # Then there were retries, and status counts every attempt and every token billed
    assert billed["server_errors"] + billed["malformed"] > 0, (billed, cognify.stderr)
    assert_spend(status, billed)
    [run] = status["runs"]
    assert run["llm_calls"] == status["llm_calls"] > run["stats"]["llm_calls"], run


LATENCY_MS = 300
VISIBILITY_S = 20
LOCK_TTL_S = 10
RUN_TIMEOUT_S = 420.0


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_attempts_of_a_worker_killed_mid_call_are_counted(
    deployment: Deployment,
    start_workers: Callable[[Deployment], Workers],
    tmp_path: Path,
) -> None:
    # Given a slow LLM, workers redelivering a dead worker's tasks soon, and a corpus of many chunks
    corpus = write_corpus(tmp_path / "corpus", documents=10, sentences=12)
    with Simulator(latency_ms=LATENCY_MS, seed=SEED) as simulator:
        chaos = deployment.configured(
            llm_url=simulator.base_url,
            llm_api_key="test",
            chunk_size="48",
            chunk_overlap="4",
            extraction_unit_tokens="0",  # one chunk a call: many calls, some in flight at the kill
            extract_batch="2",  # a task's two calls in flight together, as the tolerance counts
            broker_visibility_timeout_s=str(VISIBILITY_S),
            lock_ttl_s=str(LOCK_TTL_S),
            cognify_timeout_s=str(RUN_TIMEOUT_S),
        )
        add_corpus(chaos, corpus, "spend")
        workers = start_workers(chaos)
        # When a worker is killed while its LLM calls are in flight, and replaced
        with cognifying(chaos, "spend", tmp_path) as (run, _), chaos.memory() as memory:
            killed_at = kill_mid_extraction(workers, memory, dataset_id(chaos, "spend"), run, simulator)
            code = finished(run, workers)
            [outcome] = runs_of(memory, "spend")
        billed = simulator.stats()
    assert code == 0 and outcome.status == RunStatus.COMPLETED, (outcome.error, workers.logs())
    # Then status counts the killed worker's calls too, as the simulator saw them
    status = status_of(chaos.env, "spend")
    assert_spend(status, billed, unsent=KILLED_UNSENT, completion_tolerance=KILLED_TOLERANCE)
    # And the run's own counters (what finished tasks reported) missed them
    assert outcome.stats.get("llm_calls", 0) < billed["calls"]["chat"], (killed_at, outcome.stats, billed)


def kill_mid_extraction(
    workers: Workers, memory: Any, dataset: str, run: subprocess.Popen[bytes], simulator: Simulator
) -> int:
    """Kill worker a (SIGKILL) once a third of the chunks are extracted and the simulator is serving
    a call of worker a; replace it. The count of extracted chunks then."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline and run.poll() is None:
        counts = chunk_counts(memory, dataset)
        total, pending = sum(counts.values()), counts[ChunkStatus.PENDING]
        calling = simulator.open_ports() & workers.ports("a")
        if total and pending and total - pending > total / 3 and calling:
            workers.kill("a")
            workers.replace("a")
            return total - pending
        time.sleep(0.1)
    pytest.fail("the run ended before a third of its chunks were extracted")


def test_status_shows_the_llm_breaker_that_a_run_opened(tmp_path: Path) -> None:
    from datetime import timedelta

    from kenning.pipeline.models import utcnow
    from kenning.pipeline.spend import Breaker
    from tests.services import free_port

    # Given an LLM endpoint where nothing listens, and a breaker that opens after two failures
    corpus = write_corpus(tmp_path / "corpus", documents=3, sentences=8)
    env = {
        **os.environ,
        "KENNING_HOME": str(tmp_path / "home"),
        "KENNING_EMBEDDING_PROVIDER": "hash",
        "KENNING_LLM_URL": f"http://127.0.0.1:{free_port()}/v1",
        "KENNING_LLM_MAX_RETRIES": "0",
        "KENNING_LLM_BREAKER_FAILURES": "2",
    }
    cli = [sys.executable, "-m", "kenning.workers.cli"]
    run: dict[str, Any] = dict(cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert subprocess.run([*cli, "add", str(corpus), "--dataset", "dark"], **run).returncode == 0
    before = json.loads(subprocess.run([*cli, "status", "--json"], **run).stdout)["llm"]
    # When a run calls it, in another process than status
    subprocess.run([*cli, "cognify", "--dataset", "dark"], **run)
    # Then status shows the breaker open, with why, in JSON and in text
    after = json.loads(subprocess.run([*cli, "status", "--json"], **run).stdout)["llm"]
    text = subprocess.run([*cli, "status"], **run).stdout
    assert before["breaker"] == "closed" and before["since"] is None, before
    assert after["breaker"] == "open" and "connection failures in a row" in after["reason"], after
    assert "circuit breaker open" in text, text
    # And once its cooldown is over it is half-open: the next call may try
    opened = Breaker("open", after["reason"], 30.0, utcnow())
    assert opened.now(opened.changed_at + timedelta(seconds=31)) == "half-open"
    assert Breaker("closed", "", 30.0, utcnow()).now(utcnow()) == "closed"


class AwayUntilLoad:
    """A spend ledger whose store refuses every write until the load step begins: by then
    every LLM call of the run was made, so no later write drains what was held."""

    def __init__(self, ledger: SpendLedger) -> None:
        self.ledger = ledger
        self.away = True

    def progress(self, step: str, done: int, total: int) -> None:
        if step == "load":
            self.away = False

    def __getattr__(self, name: str) -> Any:
        if name in ("sent", "answered") and self.away:
            raise StoreError("the metadata database is away")
        return getattr(self.ledger, name)


def test_spend_held_while_the_store_was_away_is_written_before_an_embedded_cognify_returns(
    tmp_path: Path,
) -> None:
    # Given an embedded home whose spend store refuses writes while the LLM calls are made
    corpus = write_corpus(tmp_path / "corpus", documents=3, sentences=6)
    with Simulator(seed=SEED) as simulator:
        env = embedded_env(tmp_path, simulator)
        settings = load_settings(
            home=Path(env["KENNING_HOME"]),
            embedding_provider="hash",
            llm_url=simulator.base_url,
            llm_api_key="test",
            chunk_size=48,
            chunk_overlap=4,
            extraction_unit_tokens=0,
        )
        with Kenning(settings) as memory:
            store = AwayUntilLoad(SqlSpendLedger(memory.wiring.engine))
            memory.wiring._made["spend"] = HeldLedger(store)  # type: ignore[arg-type]
            files = sorted(corpus.iterdir())
            memory.add(
                [Source(name=f.name, uri=f.as_uri(), data=f.read_bytes()) for f in files], dataset="away"
            )
            # When the store is back only once the calls are done, and the run ends
            run = memory.cognify("away", progress=store.progress)
            held = memory.wiring.spend.held
        billed = simulator.stats()
    # Then nothing is left held, and status counts every call the provider saw
    assert run.status == RunStatus.COMPLETED and billed["calls"]["chat"] > 0, run.error
    assert held == 0
    assert_spend(status_of(env, "away"), billed)
