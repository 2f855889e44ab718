"""Faults of a distributed run, each injected mid-extraction, for the tests and `bench.faults`.

Each scenario starts the two usual workers, adds a corpus, runs `kenning cognify --distributed`
in the background, waits until a share of the chunks is extracted, injects its fault, and
waits (bounded) for the follower to exit. Servers that a fault stops or wipes are private:
their own port, folder and files (`PostgresServer` here, `cluster.RedisServer`). A black-holed
LLM is the simulator's `black_hole` mode (`black_hole` here), on 127.0.0.1 like the others.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from kenning.pipeline.models import ChunkStatus, Dataset, PipelineRun, Scope, utcnow
from kenning.pipeline.spend import breaker_key
from kenning.workers.memory import Kenning
from tests.integration.cluster import ROOT, Deployment, RedisServer, Workers
from tests.simulator import Simulator

POLL_S = 0.1
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
# A server the tests start never runs as root (PostgreSQL refuses to): this user runs it then.
SERVER_USER = "postgres"


class PostgresServer:
    """A private PostgreSQL cluster (`initdb` + `pg_ctl`) on 127.0.0.1:`port`, in a folder of its own.

    Never the machine's server: a test may stop it and start it again. Trust authentication,
    no fsync (its data is thrown away), its socket in its folder.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self.folder = Path(tempfile.mkdtemp(prefix="kenning-pg-"))
        self._data = self.folder / "data"
        self._bin = postgres_binaries()

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def create(self) -> None:
        if os.geteuid() == 0:
            user = pwd.getpwnam(SERVER_USER)
            os.chown(self.folder, user.pw_uid, user.pw_gid)
        self._run(
            "initdb", "-D", str(self._data), "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = str(self.folder / "server.log")
        self._run("pg_ctl", "-D", str(self._data), "-o", options, "-l", log, "-w", "-t", "60", "start")
        self._wait_ready()

    def stop(self) -> None:
        """Stop at once (`-m immediate`): connections drop as when the server goes away."""
        if (self._data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self._data), "-m", "immediate", "-w", "-t", "60", "stop")

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _run(self, program: str, *args: str) -> None:
        command = [str(self._bin / program), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", SERVER_USER, "--", *command]
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=READY_TIMEOUT_S, cwd=self.folder
        )
        if result.returncode != 0:
            log = self.folder / "server.log"
            detail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise AssertionError(f"{program} failed: {result.stdout}{result.stderr}\n{detail}")

    def _wait_ready(self) -> None:
        engine = sa.create_engine(self.url)
        deadline = time.monotonic() + READY_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                try:
                    with engine.connect() as conn:
                        conn.execute(sa.text("SELECT 1"))
                    return
                except sa.exc.OperationalError:
                    time.sleep(0.2)
        finally:
            engine.dispose()
        raise AssertionError(f"PostgreSQL on port {self.port} did not start")


def postgres_binaries() -> Path:
    """The newest /usr/lib/postgresql/<version>/bin holding initdb and pg_ctl."""
    found = sorted(
        (path.parent for path in Path("/usr/lib/postgresql").glob("*/bin/initdb")),
        key=lambda folder: int(folder.parent.name) if folder.parent.name.isdigit() else 0,
    )
    if not found:
        raise AssertionError("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin")
    return found[-1]


@dataclass(frozen=True)
class Outcome:
    """How a run with a fault ended: the follower's exit code and output, and when, from the fault."""

    code: int
    output: str
    fault_to_end_s: float
    runs: list[PipelineRun]
    chunks: dict[ChunkStatus, int]


@contextmanager
def cognifying(
    deployment: Deployment, dataset: str, logs: Path
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """`kenning cognify --distributed` in the background, logging to a file; killed if still running."""
    path = logs / f"cognify-{time.monotonic_ns()}.log"
    with path.open("wb") as log:
        process = subprocess.Popen(
            deployment.cognify_command(dataset), cwd=ROOT, env=deployment.env, stdout=log, stderr=log
        )
    try:
        yield process, path
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=STOP_TIMEOUT_S)


def dataset_id(deployment: Deployment, dataset: str) -> str:
    return Dataset.of(Scope(tenant=deployment.settings.tenant, dataset=dataset)).id


def chunk_counts(memory: Kenning, of_dataset: str) -> dict[ChunkStatus, int]:
    return {status: len(memory.wiring.chunks.list_chunk_ids(of_dataset, status)) for status in ChunkStatus}


def wait_for_extraction(memory: Kenning, of_dataset: str, share: float, run: subprocess.Popen[bytes]) -> None:
    """Until more than `share` of the chunks are extracted while some are still pending."""
    deadline = time.monotonic() + READY_TIMEOUT_S * 2
    counts: dict[ChunkStatus, int] = {}
    while time.monotonic() < deadline and run.poll() is None:
        counts = chunk_counts(memory, of_dataset)
        total, pending = sum(counts.values()), counts[ChunkStatus.PENDING]
        if total and pending and total - pending > share * total:
            return
        time.sleep(POLL_S)
    raise AssertionError(
        f"the run ended or stalled before {share:.0%} of its chunks were extracted: {counts}"
    )


def run_with_fault(
    deployment: Deployment,
    dataset: str,
    logs: Path,
    fault: Callable[[], None],
    *,
    share: float = 0.3,
    timeout_s: float = 300.0,
) -> Outcome:
    """Cognify the dataset (already added) with the follower, inject `fault` once `share` of the
    chunks are extracted, and wait up to `timeout_s` from the fault for the follower to exit."""
    of_dataset = dataset_id(deployment, dataset)
    with cognifying(deployment, dataset, logs) as (run, log):
        with deployment.memory() as memory:
            wait_for_extraction(memory, of_dataset, share, run)
        started = time.monotonic()
        fault()
        try:
            code = run.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = -1
        ended = time.monotonic()
    with deployment.memory() as memory:
        runs = sorted(memory.wiring.metadata.list_runs(of_dataset), key=lambda run: run.started_at)
        counts = chunk_counts(memory, of_dataset)
    return Outcome(code, log.read_text(errors="replace"), ended - started, runs, counts)


def kill_both(workers: Workers) -> Callable[[], None]:
    """SIGKILL both workers (their whole process groups) and start them again at once."""

    def fault() -> None:
        for name in workers.queues:
            workers.kill(name)
        for name in workers.queues:
            workers.replace(name)

    return fault


def wipe_redis(server: RedisServer) -> Callable[[], None]:
    """Kill Redis, throw its files away, and start it empty on the same port: broker state lost."""

    def fault() -> None:
        server.stop(signal.SIGKILL)
        shutil.rmtree(server.folder, ignore_errors=True)
        server.start()

    return fault


def stop_postgres(server: PostgresServer, outage_s: float) -> Callable[[], None]:
    """Stop PostgreSQL, keep it away `outage_s`, start it again."""

    def fault() -> None:
        server.stop()
        time.sleep(outage_s)
        server.start()

    return fault


def black_hole(simulator: Simulator) -> Callable[[], None]:
    """Turn the LLM endpoint into a black hole: connections accepted, requests (those in flight
    too) never answered, until `simulator.black_hole` is set back."""

    def fault() -> None:
        simulator.black_hole = True

    return fault


def wait_for_breaker(deployment: Deployment, timeout_s: float = READY_TIMEOUT_S) -> str:
    """Until the LLM breaker, as status shows it, is no longer open (its cooldown is over): its state."""
    settings = deployment.settings
    key = breaker_key(settings.llm_url, settings.llm_model)
    deadline = time.monotonic() + timeout_s
    state = "open"
    with deployment.memory() as memory:
        while time.monotonic() < deadline:
            breaker = memory.wiring.spend.breaker(key)
            state = "closed" if breaker is None else breaker.now(utcnow())
            if state != "open":
                return state
            time.sleep(POLL_S)
    raise AssertionError(f"the LLM breaker was still open after {timeout_s:.0f} s")
