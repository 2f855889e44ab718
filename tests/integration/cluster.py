"""A distributed kenning on this machine for tests: its environment and its worker processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from workers.memory import Kenning
from workers.settings import Settings, load_settings

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

    def cognify_command(self, dataset: str) -> list[str]:
        return [sys.executable, "-m", "workers.cli", "cognify", "--distributed", "--dataset", dataset]

    def cognify(self, dataset: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.cognify_command(dataset),
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
        )


class Workers:
    """`kenning worker` processes (by default two: A with pipeline+extract, B with extract+load),
    logging to files; stopped with SIGTERM, then SIGKILL."""

    TWO = {"a": "pipeline,extract", "b": "extract,load"}

    def __init__(self, deployment: Deployment, logs: Path, queues: dict[str, str] | None = None) -> None:
        self._deployment = deployment
        self._logs = logs
        self.queues = queues or self.TWO
        self._processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self) -> None:
        for name, queues in self.queues.items():
            command = [sys.executable, "-m", "workers.cli", "worker", "--queues", queues, "--concurrency=2"]
            with self._log(name).open("wb") as log:
                self._processes[name] = subprocess.Popen(
                    command,
                    cwd=ROOT,
                    env=self._deployment.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        for name in self.queues:
            self._wait_ready(name)

    def _log(self, name: str) -> Path:
        return self._logs / f"worker-{name}.log"

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
        for process in self._processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self._processes.values():
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
            path = self._log(name)
            text = path.read_text(errors="replace") if path.exists() else ""
            tails.append(f"--- worker {name} ---\n{text[-4000:]}")
        return "\n".join(tails)


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
