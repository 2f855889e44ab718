"""With no worker to take the work, `cognify --distributed` and `search --remote` say so at once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.cluster import ROOT, Deployment, Workers

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]
# Far below the waits the commands had before (6 h and 120 s), with room for a loaded machine.
FAIL_FAST_S = 60.0


def kenning(deployment: Deployment, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "kenning.workers.cli", *args]
    return subprocess.run(
        command, cwd=ROOT, env=deployment.env, capture_output=True, text=True, timeout=FAIL_FAST_S
    )


def test_cognify_distributed_with_no_worker_names_the_queues_and_makes_no_run(
    deployment: Deployment,
) -> None:
    # Given a dataset with an item, and no worker listening on the deployment's queues
    with deployment.memory() as memory:
        memory.add_text("Barbara McClintock found jumping genes.", "idle")

    # When it is cognified on the workers
    done = kenning(deployment, "cognify", "--distributed", "--dataset", "idle")

    # Then the command fails with one line naming every queue and how to start a worker
    prefix = deployment.settings.queue_prefix
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = done.stderr.splitlines()
    assert f"no worker consumes {prefix}.pipeline, {prefix}.extract, {prefix}.load " in line
    assert "kenning worker --queues pipeline,extract,load" in line
    # And no run was left waiting for a worker
    with deployment.memory() as memory:
        dataset = memory.dataset("idle")
        assert memory.wiring.metadata.list_runs(dataset.id) == []


def test_search_remote_with_no_query_worker_says_so(deployment: Deployment, tmp_path: Path) -> None:
    # Given a worker for every queue but the query queue
    workers = Workers(deployment, tmp_path, {"ingest": "pipeline,extract,load"})
    workers.start()
    try:
        # When a search is sent to a query worker
        done = kenning(deployment, "search", "anything", "--remote", "--type", "CHUNKS")
    finally:
        workers.stop()

    # Then it fails at once, naming only the query queue, with no traceback
    prefix = deployment.settings.queue_prefix
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = done.stderr.splitlines()
    assert f"no worker consumes {prefix}.query " in line
    assert "kenning worker --queues query`" in line
