"""An LLM that accepts connections and never answers, mid-way through a distributed run.

The usual two `kenning worker` processes (concurrency 2 each), real Redis and PostgreSQL, the
LLM simulator in its `black_hole` mode: requests received, those in flight included, are never
answered. Attempts time out after 3 s here (60 s by default) and the breaker's cooldown is 5 s
(30 s); the breaker's failures are shared by every worker through Redis, so five timeouts
between them open it, and every later call fails at once.

The run ends visibly: completed with errors, its error one line naming the LLM and its
breaker, the follower exiting non-zero. Once the LLM answers again and the breaker's cooldown
is over, a new cognify extracts what was left and completes: the memory an undisturbed
embedded run builds. Status counts every request the simulator received: a black-holed one is
a call sent, with no tokens, since nothing answered it (a provider that never answers never
generates, and bills nothing for it; the simulator bills nothing for one it holds).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kenning.pipeline.models import ChunkStatus, RunStatus
from tests.integration.cluster import ROOT, Deployment, Workers, small_chunks
from tests.integration.faults import black_hole, chunk_counts, dataset_id, run_with_fault, wait_for_breaker
from tests.integration.test_chaos import add_corpus, assert_same_as_embedded, write_corpus
from tests.integration.test_distributed import lock_released
from tests.integration.test_spend import STATUS, assert_spend, status_of
from tests.simulator import Simulator

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

LATENCY_MS = 300
SHORT = {
    "lease_s": "10",
    "supervise_every_s": "5",
    "llm_timeout_s": "3",
    "llm_breaker_cooldown_s": "5",
}
# From the black hole to the follower's exit: two rounds of timeouts, then the rest at once.
BOUND_S = 90.0


@pytest.fixture
def shared() -> dict[str, str]:
    """Small chunks from a small corpus; the embedded reference run uses the same settings."""
    return small_chunks()


def llm_status(deployment: Deployment) -> dict[str, Any]:
    """The `llm` part of `kenning status --json`: the endpoint and its breaker."""
    command = [*STATUS, "--json"]
    done = subprocess.run(command, cwd=ROOT, env=deployment.env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    llm: dict[str, Any] = json.loads(done.stdout)["llm"]
    return llm


def test_a_black_holed_llm_ends_the_run_visibly_and_a_retry_completes_it(
    deployment: Deployment, tmp_path: Path, shared: dict[str, str]
) -> None:
    corpus = write_corpus(tmp_path / "corpus", documents=8, sentences=12)
    with Simulator(latency_ms=LATENCY_MS, seed=7) as simulator:
        # Given two workers cognifying a corpus with an LLM that answers
        faulty = deployment.configured(llm_url=simulator.base_url, llm_api_key="test", **SHORT)
        add_corpus(faulty, corpus, "dark")
        logs = tmp_path / "logs"
        logs.mkdir()
        workers = Workers(faulty, logs)
        workers.start()
        try:
            # When the LLM turns into a black hole mid-extraction
            outcome = run_with_fault(faulty, "dark", tmp_path, black_hole(simulator))

            # Then the run ends within the bound, completed with errors, and says why in one line
            detail = f"{outcome.output[-3000:]}\n{[(r.status, r.error) for r in outcome.runs]}"
            assert outcome.code not in (0, -1) and outcome.fault_to_end_s < BOUND_S, detail
            [run] = outcome.runs
            assert run.status == RunStatus.COMPLETED_WITH_ERRORS, detail
            unreachable = f"LLM at {simulator.base_url} unreachable: circuit breaker open after "
            assert run.error.startswith(unreachable) and "\n" not in run.error, run.error
            failed = outcome.chunks[ChunkStatus.FAILED]
            assert failed and f"; {failed} failed chunks" in run.error, (run.error, outcome.chunks)
            assert outcome.chunks[ChunkStatus.PENDING] == 0, outcome.chunks
            # And the follower printed it, and status shows the breaker that opened, with why
            assert "circuit breaker open" in outcome.output, outcome.output[-3000:]
            llm = llm_status(faulty)
            assert llm["breaker"] in ("open", "half-open") and "no answer within" in llm["reason"], llm
            held = simulator.stats()["held"]
            assert held > 0

            # When the LLM answers again, and once the breaker's cooldown is over, a new cognify runs
            simulator.black_hole = False
            assert wait_for_breaker(faulty) == "half-open"
            retried = faulty.cognify("dark")
        finally:
            workers.stop()
        billed = simulator.stats()

    # Then it completes: every chunk loaded, the lock free
    assert retried.returncode == 0, f"{retried.stdout}\n{retried.stderr}\n{workers.logs()}"
    with faulty.memory() as memory:
        counts = chunk_counts(memory, dataset_id(faulty, "dark"))
    assert counts[ChunkStatus.LOADED] == sum(counts.values()) > 0, counts
    assert lock_released(faulty, "dark")
    # And status counts every request the LLM received, the black-holed ones as calls without tokens
    assert billed["held"] == held
    assert_spend(status_of(faulty.env, "dark"), billed)
    # And the memory is the one an undisturbed run builds
    assert_same_as_embedded(faulty, tmp_path, shared, corpus, "dark")
