"""A forget over HTTP (`kenning serve --distributed`) and one from the CLI, sent while a Celery
cognify of their dataset holds its lock: both wait for the run to let go, and the memory ends as
if the three had run one after the other.

Two workers (A: pipeline and extract, B: extract and load) on PostgreSQL and Redis. The server and
the CLI run as the `kenning` command does, with every take of the dataset lock journaled (holder,
token, time): the journal shows when each forget asked for the lock and when it got it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from kenning.pipeline.forget import Forgotten
from kenning.pipeline.ingest import text_source
from kenning.pipeline.locking import lock_name
from kenning.pipeline.models import RunStatus, Scope
from kenning.workers.memory import Kenning
from kenning.workers.runtime.keys import lock_prefix
from kenning.workers.runtime.wiring import Wiring
from tests.integration.cluster import CLI_TIMEOUT_S, ROOT, STOP_TIMEOUT_S, Deployment, Workers
from tests.integration.test_memory_distributed import Client, corpus, lock_taken
from tests.services import free_port

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(300)]

WAIT_S = 60.0
RACE, SERIAL = "race", "serial"
# Which third of the texts (by number, modulo 3) each forget takes out.
WAYS = {"http": 0, "cli": 1}

# The `kenning` command, its lock's takes journaled to the file named by LOCK_JOURNAL, one line a
# take: process id, lock name, holder, token ("None" when refused: held by another), Unix time.
JOURNALED = """
import os, time
from kenning.storage.coordination.run_lock import RedisRunLock
take = RedisRunLock.take
def journaled(lock, name, holder, ttl_s):
    token = take(lock, name, holder, ttl_s)
    with open(os.environ["LOCK_JOURNAL"], "a") as journal:
        journal.write(f"{os.getpid()} {name} {holder} {token} {time.time()}\\n")
    return token
RedisRunLock.take = journaled
from kenning.workers.cli.main import run
run()
"""


@pytest.fixture
def shared() -> dict[str, str]:
    """As the package's fixture, with larger extraction batches: a few hundred texts stay quick."""
    return {"tenant": f"t-{uuid.uuid4().hex[:8]}", "embedding_provider": "hash", "extract_batch": "16"}


@pytest.fixture
def cluster(deployment: Deployment, tmp_path: Path) -> Iterator[tuple[Workers, Client]]:
    """Two Celery workers, as the README starts them, and a service that sends them tasks by name."""
    running, service = Workers(deployment, tmp_path), Client(deployment)
    try:
        running.start()
        yield running, service
    finally:
        service.close()
        running.stop()


@dataclass(frozen=True)
class Take:
    """One take of the dataset lock, as a journaled process wrote it; `token` None when refused."""

    pid: int
    name: str
    holder: str
    token: int | None
    at: datetime


def journal(path: Path) -> list[Take]:
    """The takes journaled so far (whole lines only: a process may be writing one)."""
    lines = path.read_text().split("\n")[:-1] if path.exists() else []
    takes = []
    for line in lines:
        pid, name, holder, token, at = line.split()
        taken = None if token == "None" else int(token)
        takes.append(Take(int(pid), name, holder, taken, datetime.fromtimestamp(float(at), UTC)))
    return takes


def kenning(deployment: Deployment, *args: str) -> str:
    """`kenning <args>` in the deployment's environment; its standard output."""
    command = [sys.executable, "-m", "kenning.workers.cli", *args]
    done = subprocess.run(
        command, cwd=ROOT, env=deployment.env, capture_output=True, text=True, timeout=CLI_TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def admin_key(deployment: Deployment) -> dict[str, str]:
    """The header of a key of a new admin, both made with `kenning user` and `kenning key`."""
    kenning(deployment, "user", "create", "ada", "--admin")
    token = kenning(deployment, "key", "create", "--user", "ada").strip().splitlines()[-1]
    return {"Authorization": f"Bearer {token}"}


@dataclass(frozen=True)
class Journaled:
    """A `kenning` process whose takes of the lock go to `journal`, its output to `log`."""

    process: subprocess.Popen[bytes]
    journal: Path
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def journaled(deployment: Deployment, folder: Path, what: str, *args: str) -> Journaled:
    """`kenning <args>` started in a process group of its own, journaling its takes of the lock."""
    journal, log = folder / f"{what}.journal", folder / f"{what}.log"
    env = {**deployment.env, "LOCK_JOURNAL": str(journal)}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", JOURNALED, *args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Journaled(process, journal, log)


def stop(process: subprocess.Popen[bytes]) -> None:
    """Terminate the process and, whatever happens to it, every process of its group."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=STOP_TIMEOUT_S)


@contextlib.contextmanager
def served(deployment: Deployment, folder: Path) -> Iterator[tuple[Journaled, str]]:
    """`kenning serve --distributed` on a free port of 127.0.0.1, answering; its base URL."""
    port = free_port()
    server = journaled(deployment, folder, "serve", "serve", "--distributed", "--port", str(port))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + WAIT_S
        while not answers(base):
            if time.monotonic() >= deadline or server.process.poll() is not None:
                raise AssertionError(f"kenning serve did not answer:\n{server.output()[-4000:]}")
            time.sleep(0.2)
        yield server, base
    finally:
        stop(server.process)


def answers(base: str) -> bool:
    try:
        return httpx.get(f"{base}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def forget_over_http(
    base: str, auth: dict[str, str], body: dict[str, Any]
) -> tuple[threading.Thread, list[Any]]:
    """`POST /v1/forget` sent from a thread; the thread, and the list its answer (or error) goes to."""
    answer: list[Any] = []

    def post() -> None:
        try:
            answer.append(httpx.post(f"{base}/v1/forget", headers=auth, json=body, timeout=CLI_TIMEOUT_S))
        except httpx.HTTPError as error:  # told by the assertion on the answer
            answer.append(error)

    sending = threading.Thread(target=post)
    sending.start()
    return sending, answer


def cognify_sent(client: Client, dataset: str) -> str:
    """Send a cognify of the dataset to the workers; its run's id."""
    return str(
        dict(client.send("kenning.cognify", {"dataset": dataset}, "pipeline").get(timeout=WAIT_S))["run_id"]
    )


def refused(forget: Journaled) -> bool:
    """Wait (bounded) until the process was refused the lock once: it is waiting for it."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if any(take.pid == forget.process.pid and take.token is None for take in journal(forget.journal)):
            return True
        time.sleep(0.05)
    return False


@contextlib.contextmanager
def held_still(workers: Workers) -> Iterator[None]:
    """The workers stopped (SIGSTOP) for the block: their run keeps what it holds, and waits."""
    for name in workers.queues:
        workers.pause(name)
    try:
        yield
    finally:
        for name in workers.queues:
            workers.resume(name)


def lock_keys(deployment: Deployment, name: str) -> tuple[int | None, str, int]:
    """The dataset lock as Redis holds it: the token it is held under (None when free), the run
    that holds it, and the last token it gave out."""
    settings = deployment.settings
    key = lock_prefix(settings.queue_prefix) + name
    client = redis.Redis.from_url(settings.redis_url)
    try:
        token, run, last = client.mget(key, key + ":run", key + ":fence")
    finally:
        client.close()
    return (int(token) if token else None), (run.decode() if run else ""), int(last or 0)


def forgotten_by_cli(output: str) -> tuple[int, int, int]:
    """(items, nodes, edges) that `kenning forget` reported."""
    found = re.search(r"forgot (\d+) items: (\d+) nodes, (\d+) edges", output)
    assert found, output
    return int(found[1]), int(found[2]), int(found[3])


def state_of(memory: Kenning, dataset: str) -> dict[str, Any]:
    """What the dataset's stores hold, named so that two datasets compare: items by name, graph
    nodes by type and name (or text), edges by their ends and relationship, each with the names
    of the items behind it; chunks by status; vector points per collection."""
    scope = memory.scope(dataset)
    wiring = memory.wiring
    found = wiring.metadata.get_dataset(scope)
    assert found is not None
    items = wiring.metadata.list_items(found.id)
    names = {item.id: item.name for item in items}
    nodes, edges = wiring.graph.export(scope)
    label = {
        node.id: (node.type, str(node.properties.get("name", node.properties.get("text", ""))))
        for node in nodes
    }

    def behind(data_ids: list[str]) -> tuple[str, ...]:
        return tuple(sorted(names.get(data_id, f"unknown {data_id}") for data_id in data_ids))

    chunks = Counter(chunk.status.value for chunk in wiring.chunks.chunks_of(found.id, list(names)))
    return {
        "items": sorted((item.name, item.status.value) for item in items),
        "chunks": dict(chunks),
        "counts": wiring.graph.counts(scope),
        "nodes": Counter((*label[node.id], behind(node.data_ids)) for node in nodes),
        "edges": Counter(
            (label.get(e.source_id), e.relationship, label.get(e.target_id), behind(e.data_ids))
            for e in edges
        ),
        "vectors": {
            name: wiring.vectors.count(scope, name) for name in sorted(wiring.vectors.list_collections())
        },
    }


def added(deployment: Deployment, texts: dict[str, str]) -> dict[str, dict[str, str]]:
    """The texts added to both datasets; item ids by dataset and name."""
    ids = {}
    with Kenning(deployment.settings) as memory:
        for dataset in (RACE, SERIAL):
            done = memory.add([text_source(text, name) for name, text in texts.items()], dataset).added
            ids[dataset] = {item.name: item.id for item in done}
    return ids


def serially(
    deployment: Deployment, client: Client, forgets: list[list[str]]
) -> tuple[list[Forgotten], dict[str, Any], dict[str, Any]]:
    """The same work on the second dataset, one after the other: a cognify on the workers to its
    end, then each forget (of item ids) in turn; the forgets, and the two datasets' states."""
    run = client.follow(cognify_sent(client, SERIAL))
    assert run["status"] == "completed", run
    settings = deployment.settings
    with Kenning(settings, Wiring(settings, distributed=True)) as memory:
        done = [memory.forget(SERIAL, data_ids)[0] for data_ids in forgets]
        return done, state_of(memory, RACE), state_of(memory, SERIAL)


def test_an_http_and_a_cli_forget_wait_for_a_celery_cognify_and_end_as_one_after_the_other(
    deployment: Deployment, cluster: tuple[Workers, Client], tmp_path: Path
) -> None:
    workers, client = cluster
    # Given a dataset of a few hundred short texts (the same texts in a second one, for later)
    texts = corpus()
    ids = added(deployment, texts)
    thirds = {
        way: sorted(name for name in texts if int(name.split()[1]) % 3 == rest) for way, rest in WAYS.items()
    }
    # And `kenning serve --distributed`, with an admin's key made by the CLI
    auth, name = admin_key(deployment), lock_name(Scope(tenant=deployment.settings.tenant, dataset=RACE))
    with contextlib.ExitStack() as stack:
        server, base = stack.enter_context(served(deployment, tmp_path))
        # When a cognify of it is sent to the workers, and holds the dataset's lock
        run_id = cognify_sent(client, RACE)
        assert lock_taken(deployment, RACE), workers.logs()
        with held_still(workers):  # the run keeps its lock while the forgets come to it
            run_token, holder, _last = lock_keys(deployment, name)
            assert run_token is not None and holder == run_id
            # And meanwhile a third of its items is forgotten over HTTP, another by `kenning forget`
            body = {"dataset": RACE, "data_ids": [ids[RACE][item] for item in thirds["http"]]}
            sending, answer = forget_over_http(base, auth, body)
            options = [option for item in thirds["cli"] for option in ("--data-id", ids[RACE][item])]
            command = ["forget", "--dataset", RACE, *options, "--yes"]
            forgetting = journaled(deployment.configured(mode="distributed"), tmp_path, "forget", *command)
            stack.callback(stop, forgetting.process)
            # Then each is refused the lock the run holds: it waits
            waited = {"http": refused(server), "cli": refused(forgetting)}
        assert waited == {"http": True, "cli": True}, (server.output(), forgetting.output())
        # And the run completes, and both forgets end well
        run = client.follow(run_id)
        sending.join(CLI_TIMEOUT_S)
        assert not sending.is_alive(), server.output()
        assert forgetting.process.wait(timeout=CLI_TIMEOUT_S) == 0, forgetting.output()
    assert run["status"] == "completed" and not run["error"], workers.logs()
    assert run["stats"]["documents"] == len(texts)
    [response] = answer
    assert isinstance(response, httpx.Response) and response.status_code == 200, response
    by_server = Forgotten.model_validate(response.json())
    by_cli = forgotten_by_cli(forgetting.output())

    # And the lock put them one after the other: the run took it once and kept it to its end
    # (two tokens given out after the run's, one to each forget, none to the run again), and
    # each forget got it only after the run had finished (its `finished_at` in the metadata)
    takes = {
        way: [take for take in journal(forget.journal) if take.name == name and take.token is not None]
        for way, forget in (("http", server), ("cli", forgetting))
    }
    assert [len(takes["http"]), len(takes["cli"])] == [1, 1], takes
    tokens = {way: found[0].token or 0 for way, found in takes.items()}
    assert sorted(tokens.values()) == [run_token + 1, run_token + 2], (run_token, tokens)
    assert lock_keys(deployment, name) == (None, "", run_token + 2)
    with Kenning(deployment.settings) as memory:
        finished = memory.wiring.metadata.get_run(run_id)
    assert finished is not None and finished.status == RunStatus.COMPLETED
    assert finished.finished_at is not None
    assert all(found[0].at >= finished.finished_at for found in takes.values()), (finished, takes)
    # And each took out the part of the graph the run had written for its items
    assert sorted(by_server.items) == sorted(ids[RACE][item] for item in thirds["http"])
    assert by_server.chunks == len(thirds["http"]) and by_server.nodes > 0
    assert by_cli[0] == len(thirds["cli"]) and by_cli[1] > 0

    # And the memory is what the same work makes one after the other, in the order the lock gave:
    # the cognify to its end, then the forget that got the lock first, then the other
    order = sorted(tokens, key=tokens.__getitem__)
    done, raced, serial = serially(
        deployment, client, [[ids[SERIAL][n] for n in thirds[way]] for way in order]
    )
    alone = dict(zip(order, done, strict=True))
    assert (by_server.nodes, by_server.edges, by_server.chunks) == (
        alone["http"].nodes,
        alone["http"].edges,
        alone["http"].chunks,
    )
    assert by_cli == (len(alone["cli"].items), alone["cli"].nodes, alone["cli"].edges)
    kept = sorted(set(texts) - set(thirds["http"]) - set(thirds["cli"]))
    assert [item for item, _status in raced["items"]] == kept
    for part in ("items", "chunks", "counts", "nodes", "edges", "vectors"):
        assert raced[part] == serial[part], part
