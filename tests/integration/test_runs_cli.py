"""Operator controls: `kenning runs list | cancel | retry`, their Celery tasks, and stalled runs.

A cancelled run says so with its reason and frees its dataset lock; its tasks in flight on a
live worker stop at their next fenced write; a retry does only what is left. A run nobody can
work on (no worker consumes its queues) shows as stalled in `status`, never as live.
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
import redis
from celery import Celery
from click.testing import CliRunner, Result

from kenning.pipeline.errors import KenningError
from kenning.pipeline.models import ChunkStatus, RunStatus
from kenning.workers.celery.app import waiting
from kenning.workers.cli.main import main
from tests.integration.cluster import ROOT, Deployment, Workers
from tests.integration.faults import chunk_counts, dataset_id
from tests.integration.test_chaos import add_corpus, write_corpus
from tests.integration.test_distributed import lock_released
from tests.simulator import Simulator

CLI = [sys.executable, "-m", "kenning.workers.cli"]
LATENCY_MS = 800  # slow enough that a cancel lands while extraction goes on
WAIT_S = 180.0
INSPECT_S = 2.0  # how long the workers have to answer what they hold


def invoke(*args: str) -> Result:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def refused(*args: str) -> str:
    """The message of the error the command ends with (`kenning` prints it and exits 2)."""
    result = CliRunner().invoke(main, list(args))
    assert isinstance(result.exception, KenningError), result.output
    return str(result.exception)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KENNING_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KENNING_EMBEDDING_PROVIDER", "hash")
    (tmp_path / "a.txt").write_text("Ada Lovelace wrote the first program for the Analytical Engine.")
    return tmp_path


def test_runs_list_then_retry_of_an_ended_run_redoes_nothing_done(home: Path) -> None:
    # Given a dataset cognified once
    invoke("add", str(home / "a.txt"), "--dataset", "notes")
    invoke("cognify", "--dataset", "notes")
    [first] = json.loads(invoke("runs", "list", "--json").output)["runs"]
    assert (first["dataset"], first["status"], first["stalled"]) == ("notes", "completed", "")
    # When its run is retried, by a prefix of its id
    invoke("runs", "retry", first["id"][:10])
    # Then a new run completed, which extracted nothing again
    runs = json.loads(invoke("runs", "list", "--dataset", "notes", "--json").output)["runs"]
    assert [run["status"] for run in runs] == ["completed", "completed"]
    assert runs[1]["id"] == first["id"]
    assert runs[0]["stats"].get("extractions", 0) == 0, runs[0]
    # And an ended run cannot be cancelled, an unknown one is named
    assert "already ended" in refused("runs", "cancel", first["id"])
    assert "no run 'nope'" in refused("runs", "retry", "nope")


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=WAIT_S)


def status_runs(env: dict[str, str], dataset: str) -> list[dict[str, Any]]:
    done = cli(env, "status", "--dataset", dataset, "--json")
    assert done.returncode == 0, done.stderr
    runs: list[dict[str, Any]] = json.loads(done.stdout)["datasets"][0]["runs"]
    return runs


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() >= deadline:
            pytest.fail(f"not within {WAIT_S:.0f} s: {what}")
        time.sleep(0.2)


# Sends a cognify run of a dataset to the workers, from the settings in the environment.
ENQUEUE = """
import sys
from kenning.workers.celery.canvas import enqueue
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
settings = load_settings()
with Kenning(settings) as memory:
    print(enqueue(memory.wiring, settings, memory.scope(sys.argv[1])).run_id)
"""


def enqueue_elsewhere(env: dict[str, str], dataset: str) -> str:
    """The id of a run sent to the workers by a process of its own: one process, one Celery configuration."""
    sent = subprocess.run(
        [sys.executable, "-c", ENQUEUE, dataset],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert sent.returncode == 0, sent.stderr
    return sent.stdout.strip().splitlines()[-1]


def call_task(deployment: Deployment, name: str, payload: dict[str, Any]) -> Any:
    settings = deployment.settings
    client = Celery("client", broker=settings.broker_url, backend=settings.broker_url)
    try:
        queue = f"{settings.queue_prefix}.pipeline"
        return client.send_task(name, args=[payload], queue=queue).get(timeout=60)
    finally:
        client.close()


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_run_with_no_worker_is_stalled_and_a_cancelled_run_stops_on_a_live_worker(
    deployment: Deployment,
    start_workers: Callable[[Deployment], Workers],
    tmp_path: Path,
) -> None:
    corpus = write_corpus(tmp_path / "corpus", documents=16, sentences=12)
    with Simulator(latency_ms=LATENCY_MS) as simulator:
        slow = deployment.configured(
            llm_url=simulator.base_url,
            llm_api_key="test",
            chunk_size="48",
            chunk_overlap="4",
            extraction_unit_tokens="0",
        )
        env = {**slow.env, "PATH": os.environ.get("PATH", "")}
        add_corpus(slow, corpus, "ops")
        ds = dataset_id(slow, "ops")
        # Given a run sent while no worker runs
        run_id = enqueue_elsewhere(env, "ops")
        # Then status shows it stalled, saying that no worker consumes its queues
        [stalled] = status_runs(env, "ops")
        assert stalled["id"] == run_id and stalled["status"] == "started"
        assert "no worker consumes" in stalled["stalled"], stalled
        assert "stalled" in cli(env, "status", "--dataset", "ops").stderr

        # When workers start, it goes on, and is no longer stalled
        workers = start_workers(slow)
        with slow.memory() as memory:
            wait_for(lambda: chunk_counts(memory, ds)[ChunkStatus.EXTRACTED] >= 6, "six chunks extracted")
        assert status_runs(env, "ops")[0]["stalled"] == ""

        # When the operator cancels it, by a Celery task, while extraction is in flight
        cancelled = call_task(slow, "kenning.runs_cancel", {"run_id": run_id, "reason": "wrong corpus"})
        assert cancelled["status"] == "cancelled" and "wrong corpus" in cancelled["error"]

        # Then its lock is free and its tasks stop: no chunk changes status any more
        assert lock_released(slow, "ops")
        wait_for(lambda: workers_idle(slow, run_id), "the workers holding no task of the cancelled run")
        with slow.memory() as memory:
            settled = chunk_counts(memory, ds)
            run = memory.wiring.metadata.get_run(run_id)
        assert run is not None and run.status == RunStatus.CANCELLED, run
        assert "cancelled by the operator: wrong corpus" in run.error
        assert settled[ChunkStatus.PENDING] > 0, settled
        assert "LockLost" in workers.logs() or "has ended" in workers.logs()
        listed = call_task(slow, "kenning.runs_list", {"dataset": "ops"})["runs"]
        assert [(r["id"], r["status"]) for r in listed] == [(run_id, "cancelled")]
        calls_at_cancel = simulator.stats()["calls"]["chat"]

        # When the operator retries it
        retried = cli(env, "runs", "retry", run_id, "--distributed")
        billed = simulator.stats()["calls"]["chat"]
    assert retried.returncode == 0, retried.stderr + workers.logs()
    # Then a new run completed, extracting only the chunks left
    with slow.memory() as memory:
        counts = chunk_counts(memory, ds)
    assert counts[ChunkStatus.LOADED] == sum(counts.values()), counts
    assert billed - calls_at_cancel <= settled[ChunkStatus.PENDING] + 4, (billed, calls_at_cancel, settled)
    runs = status_runs(env, "ops")
    assert [run["status"] for run in runs] == ["completed", "cancelled"], runs


def workers_idle(deployment: Deployment, run_id: str) -> bool:
    """Whether every worker says it runs, holds and schedules no task, and no task of the run waits
    in the broker (looked at before and after asking them: a message taken meanwhile is held)."""
    settings = deployment.settings
    client = Celery("client", broker=settings.broker_url, backend=settings.broker_url)
    broker = redis.Redis.from_url(settings.broker_url)
    try:
        if waiting(settings, broker, run_id):
            return False
        inspect = client.control.inspect(timeout=INSPECT_S)
        held = [inspect.active(), inspect.reserved(), inspect.scheduled()]
        if any(answers is None for answers in held):  # no worker answered
            return False
        busy = any(tasks for answers in held if answers for tasks in answers.values())
        return not busy and not waiting(settings, broker, run_id)
    finally:
        broker.close()
        client.close()


def test_runs_over_http_list_retry_cancel_and_show_a_stalled_run(home: Path) -> None:
    import uuid

    from fastapi.testclient import TestClient

    from kenning.pipeline.plan import start_run
    from kenning.workers.api import create_app
    from kenning.workers.memory import Kenning
    from kenning.workers.runtime.settings import load_settings

    settings = load_settings(home=home / "home", queue_prefix=f"kenning-test-{uuid.uuid4().hex[:8]}")
    with Kenning(settings) as memory, TestClient(create_app(memory)) as client:
        writer, reader = (_key(memory, name, grants) for name, grants in (("w", "rw"), ("r", "r")))
        # Given a dataset cognified once
        memory.add_text("Ada Lovelace wrote the first program.", "notes")
        first = memory.cognify("notes")
        # Then both callers list its run, which is not stalled
        listed = client.get("/v1/runs?dataset=notes", headers=reader).json()["runs"]
        assert [(r["id"], r["status"], r["stalled"]) for r in listed] == [(first.id, "completed", "")]
        # When the writer retries it, a new run starts (202); the reader may not (403)
        assert client.post(f"/v1/runs/{first.id}/retry", headers=reader).status_code == 403
        retried = client.post(f"/v1/runs/{first.id}/retry", headers=writer)
        assert retried.status_code == 202 and retried.json()["id"] != first.id, retried.text
        # And an ended run cannot be cancelled (409, a conflict), an unknown one is not found (404)
        assert client.post(f"/v1/runs/{first.id}/cancel", headers=writer).status_code == 409
        assert client.post("/v1/runs/nope/cancel", headers=writer).status_code == 404
        # Given a run sent to workers, none of which consumes this deployment's queues
        sent = start_run(memory.wiring, memory.scope("notes"))
        # Then it shows as stalled, saying why, in the list and on its own
        view = client.get(f"/v1/runs/{sent.run_id}", headers=reader).json()
        assert view["status"] == "started" and "no worker consumes" in view["stalled"], view
        listed = client.get("/v1/runs", headers=reader).json()["runs"]
        assert "no worker consumes" in next(r for r in listed if r["id"] == sent.run_id)["stalled"]


def _key(memory: Any, name: str, grants: str) -> dict[str, str]:
    from kenning.pipeline.permission import Permission, User, issue_key

    store = memory.wiring.permissions
    user = User(tenant=memory.settings.tenant, name=name)
    store.add_user(user)
    chosen = [Permission.READ] + ([Permission.WRITE] if "w" in grants else [])
    store.grant(user, "notes", chosen)
    token, key = issue_key(user)
    store.add_key(key)
    return {"Authorization": f"Bearer {token}"}


def test_a_run_is_stalled_when_its_broker_does_not_answer(home: Path) -> None:
    from kenning.pipeline.plan import start_run
    from kenning.workers.memory import Kenning
    from kenning.workers.runtime.settings import load_settings
    from tests.services import free_port

    # Given a run sent to workers through a broker (and Redis) that went away
    gone = f"redis://127.0.0.1:{free_port()}/0"
    with Kenning(load_settings(home=home / "home")) as memory:
        memory.add_text("Ada Lovelace wrote the first program.", "notes")
        sent = start_run(memory.wiring, memory.scope("notes"))
    # Then the list (a process of its own: one process, one Celery configuration) shows it
    # stalled, naming the broker that does not answer
    env = {**os.environ, "KENNING_BROKER_URL": gone, "KENNING_REDIS_URL": gone}
    listed = cli(env, "runs", "list", "--dataset", "notes", "--json")
    assert listed.returncode == 0, listed.stderr
    [run] = json.loads(listed.stdout)["runs"]
    assert run["id"] == sent.run_id and run["status"] == "started"
    assert "did not answer" in run["stalled"] and gone in run["stalled"], run
