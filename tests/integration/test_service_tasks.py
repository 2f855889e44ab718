"""Other services enqueue work by task name; the query worker answers; Flower watches the workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from tests.integration.cluster import CLI_TIMEOUT_S, ROOT, Deployment, Workers
from tests.services import free_port

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

CLIENT = textwrap.dedent(
    """
    import json, sys, time
    from celery import Celery

    broker, prefix, tenant = sys.argv[1:4]
    app = Celery("client", broker=broker, backend=broker)

    def call(name, payload, kind):
        return app.send_task(name, args=[payload], queue=f"{prefix}.{kind}").get(timeout=120)

    texts = [
        {"name": "ada.txt", "text": "Ada Lovelace wrote the first published algorithm."},
        {"name": "hopper.txt", "text": "Grace Hopper built the first compiler at Remington Rand."},
    ]
    added = call("kenning.add", {"dataset": "svc", "tenant": tenant, "texts": texts}, "pipeline")
    run_id = call("kenning.cognify", {"dataset": "svc", "tenant": tenant}, "pipeline")["run_id"]
    deadline = time.monotonic() + 120
    run = call("kenning.run", {"run_id": run_id}, "pipeline")
    ended = ("completed", "completed_with_errors", "errored")
    while run["status"] not in ended and time.monotonic() < deadline:
        time.sleep(0.5)
        run = call("kenning.run", {"run_id": run_id}, "pipeline")
    query = {"query": "Who built the first compiler?", "type": "CHUNKS",
             "datasets": ["svc"], "tenant": tenant}
    found = call("kenning.search", query, "query")
    try:
        call("kenning.search", {"type": "CHUNKS"}, "query")
        invalid = "accepted"
    except Exception as error:
        invalid = f"{type(error).__name__}: {error}"
    forgotten = call("kenning.forget", {"dataset": "svc", "tenant": tenant}, "load")
    try:
        after = call("kenning.search", query, "query")
    except Exception as error:
        after = f"{type(error).__name__}: {error}"
    leaked = sorted(name for name in sys.modules if name.split(".")[0] in ("kenning", "workers", "pipeline"))
    print(json.dumps({"added": added, "run": run, "found": found, "invalid": invalid, "leaked": leaked,
                      "forgotten": forgotten, "after": after}))
    """
)


def test_a_service_with_only_celery_ingests_and_queries_by_task_name(
    deployment: Deployment, worker: Workers, tmp_path: Path
) -> None:
    # Given a client script that imports celery and nothing of kenning, run outside the repository
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    settings = deployment.settings
    # When it adds texts, starts a cognify run, follows it and searches, all with send_task
    done = subprocess.run(
        [sys.executable, "-I", str(script), settings.broker_url, settings.queue_prefix, settings.tenant],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr + worker.logs()
    reply = json.loads(done.stdout.strip().splitlines()[-1])
    # Then the work was done and the answer came back, without the client importing kenning
    assert reply["added"]["added"] == 2 and reply["run"]["status"] == "completed"
    assert "Grace Hopper" in reply["found"]["results"][0]["text"]
    assert "ValueError" in reply["invalid"] and "query" in reply["invalid"]
    assert reply["leaked"] == []
    # And forgetting the dataset by task name leaves nothing to find: the dataset is gone
    assert len(reply["forgotten"]["items"]) == 2 and reply["forgotten"]["nodes"] > 0
    assert reply["after"] == "InputError: no dataset 'svc' (datasets: none)"


def test_search_remote_runs_on_the_query_worker(deployment: Deployment, worker: Workers) -> None:
    with deployment.memory() as memory:
        memory.add_text("Rosalind Franklin photographed DNA with X-rays.", "remote")
        assert memory.cognify("remote").status.value == "completed"
    command = [
        sys.executable,
        "-m",
        "kenning.workers.cli",
        "search",
        "Who photographed DNA?",
        "--remote",
        "--type",
        "CHUNKS",
        "--dataset",
        "remote",
        "--json",
    ]
    done = subprocess.run(
        command, cwd=ROOT, env=deployment.env, capture_output=True, text=True, timeout=CLI_TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr + worker.logs()
    result = json.loads(done.stdout)
    assert "Rosalind Franklin" in result["results"][0]["text"]
    assert "succeeded" in worker.logs() and "kenning.search" in worker.logs()


def test_flower_lists_the_workers(deployment: Deployment, worker: Workers, tmp_path: Path) -> None:
    port = free_port()
    env = {**deployment.env, "FLOWER_UNAUTHENTICATED_API": "true"}
    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "kenning.workers.celery.app",
        "flower",
        "--address=127.0.0.1",
        f"--port={port}",
    ]
    with (tmp_path / "flower.log").open("wb") as log:
        flower = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        workers = _poll_workers(f"http://127.0.0.1:{port}/api/workers?refresh=1", deadline_s=60)
    finally:
        stop(flower)
    assert any(name.startswith("kenning-") for name in workers), (tmp_path / "flower.log").read_text()


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, and SIGKILL if it has not exited after 20 s (a loaded machine is slow to shut down)."""
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=20)


def _poll_workers(url: str, deadline_s: float) -> dict[str, object]:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                workers = json.loads(response.read())
            if workers:
                return dict(workers)
        except OSError:
            pass
        time.sleep(1)
    return {}


def test_maintenance_starts_runs_for_datasets_with_work_left(deployment: Deployment, worker: Workers) -> None:
    from celery import Celery

    from kenning.workers.celery.app import queue_name

    # Given one dataset with new data and one already cognified
    with deployment.memory() as memory:
        memory.add_text("Barbara McClintock discovered transposons.", "fresh")
        memory.add_text("Lise Meitner explained fission.", "done")
        assert memory.cognify("done").status.value == "completed"
    # When the scheduled maintenance job runs (sent by a client app of its own: the process-wide
    # app may already serve another test's configuration)
    settings = deployment.settings
    client = Celery("beat-client", broker=settings.broker_url, backend=settings.result_backend)
    try:
        sent = client.send_task("kenning.maintenance", queue=queue_name(settings, "pipeline"))
        started = sent.get(timeout=CLI_TIMEOUT_S)["started"]
    finally:
        client.close()
    # Then it starts a run for the dataset with work left, and only for it
    assert list(started) == ["fresh"]
    with deployment.memory() as memory:
        runs = memory.wiring.metadata.list_runs(
            memory.wiring.metadata.ensure_dataset(memory.scope("fresh")).id
        )
        job = next(run for run in runs if run.id == started["fresh"])
        assert job.status.value in ("started", "completed")


def test_beat_schedule_comes_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from kenning.workers.celery.app import celery_config
    from kenning.workers.runtime.settings import load_settings

    monkeypatch.setenv(
        "KENNING_SCHEDULE",
        json.dumps(
            {
                "nightly": {
                    "task": "kenning.maintenance",
                    "cron": "0 3 * * *",
                    "arguments": {"datasets": ["a"]},
                }
            }
        ),
    )
    schedule = celery_config(load_settings())["beat_schedule"]
    assert list(schedule) == ["nightly"]
    assert schedule["nightly"]["task"] == "kenning.maintenance" and schedule["nightly"]["kwargs"] == {
        "datasets": ["a"]
    }
    assert "3" in str(schedule["nightly"]["schedule"].hour)
    monkeypatch.setenv("KENNING_SCHEDULE", json.dumps({"bad": {"task": "kenning.maintenance"}}))
    with pytest.raises(Exception, match="every_s or cron"):
        load_settings()


def test_improve_runs_on_a_worker_and_a_second_run_changes_nothing(
    deployment: Deployment, worker: Workers
) -> None:
    from celery import Celery

    from kenning.workers.celery.app import queue_name

    # Given a cognified dataset whose graph names one city two ways
    with deployment.memory() as memory:
        memory.add_text("Maria Lopez moved to the Big Apple, New York City, in 2019.", "city")
        memory.add_text("Maria Lopez loves NYC.", "city")
        memory.cognify("city")
    settings = deployment.settings
    client = Celery("beat-client", broker=settings.broker_url, backend=settings.result_backend)
    try:
        # When the scheduled improve job runs twice on the worker
        first = client.send_task("kenning.improve", queue=queue_name(settings, "load"))
        first_done = first.get(timeout=CLI_TIMEOUT_S)
        second = client.send_task("kenning.improve", queue=queue_name(settings, "load"))
        second_done = second.get(timeout=CLI_TIMEOUT_S)
    finally:
        client.close()
    # Then the first reports its work for the dataset, and the second changes nothing
    assert set(first_done) == {"city"} and set(first_done["city"]) >= {"merged_entities", "weighted"}
    assert second_done["city"]["merged_entities"] == second_done["city"]["weighted"] == 0
