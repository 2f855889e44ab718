"""The HTTP API under load: `POST /v1/search` on 127.0.0.1 at several client counts.

    python -m bench.api_load --documents 1000 --seconds 10 --clients 1 8 32

Ingests the first `--documents` 2Wiki paragraphs (hash embeddings) into a temporary home,
measures the same queries in process (`Kenning.search`, one at a time), then starts
`kenning serve` on a free port of 127.0.0.1 and drives `POST /v1/search` (CHUNKS_LEXICAL and
CHUNKS, context only) from an asyncio load generator with keep-alive connections, each client
sending its next request when the last is answered, for `--seconds` per level. Prints requests/s
and p50/p95 per type and level, and the API's overhead at one client (HTTP p50 minus in-process
p50); writes bench/results/api_load.json.

With `--home`, an existing home is used as it is, with its own settings (e.g. the full corpus
that `bench.query_latency` ingested with local embeddings); `--types` picks the search types and
`--workers` is `kenning serve --workers`:

    python -m bench.api_load --home /tmp/ql_home --types CHUNKS HYBRID_COMPLETION --clients 1 8 --workers 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from itertools import cycle
from pathlib import Path
from typing import Any

import httpx

from bench.ingest import documents
from bench.latency import QUESTIONS, percentile
from kenning.pipeline.permission import User, issue_key
from kenning.retrieval.contract import SearchType
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings

ROOT = Path(__file__).resolve().parent.parent
TYPES = ("CHUNKS_LEXICAL", "CHUNKS")


def ingest(home: Path, count: int) -> tuple[str, float]:
    """The store with `count` paragraphs cognified, and an admin's API key; the seconds it took."""
    started = time.perf_counter()
    with Kenning(load_settings(home=home, embedding_provider="hash")) as memory:
        memory.add(documents(count))
        memory.cognify()
        token, _ = admin_key(memory)
    return token, time.perf_counter() - started


def admin_key(memory: Kenning) -> tuple[str, User]:
    """A new admin user of the home, and its API key."""
    user = User(tenant=memory.settings.tenant, name=f"bench-{uuid.uuid4().hex[:8]}", admin=True)
    memory.wiring.permissions.add_user(user)
    token, key = issue_key(user)
    memory.wiring.permissions.add_key(key)
    return token, user


@contextmanager
def bench_user(home: Path) -> Iterator[str]:
    """An admin's key on an existing home, for the run; the user is deleted after it."""
    with Kenning(load_settings(home=home)) as memory:
        token, user = admin_key(memory)
    try:
        yield token
    finally:
        with Kenning(load_settings(home=home)) as memory:
            memory.wiring.permissions.delete_user(user.id)


def in_process(
    home: Path, questions: list[str], types: Sequence[str], settings: dict[str, str]
) -> dict[str, Any]:
    """p50/p95 of each type's queries through `Kenning.search`, one at a time."""
    figures: dict[str, dict[str, float]] = {}
    with Kenning(load_settings(home=home, **settings)) as memory:
        for kind in types:
            memory.search(questions[0], kind, only_context=True)  # opens the stores
            latencies = []
            for question in questions:
                started = time.perf_counter()
                memory.search(question, kind, only_context=True)
                latencies.append(time.perf_counter() - started)
            figures[kind] = summary(latencies, sum(latencies))
    return figures


def summary(latencies: list[float], wall_s: float) -> dict[str, float]:
    return {
        "requests": len(latencies),
        "requests_per_s": round(len(latencies) / wall_s, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 2),
        "p95_ms": round(percentile(latencies, 0.95) * 1000, 2),
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(home: Path, port: int, workers: int, settings: dict[str, str]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "KENNING_HOME": str(home)}
    env.update({f"KENNING_{name.upper()}": value for name, value in settings.items()})
    kenning = str(Path(sys.executable).parent / "kenning")
    server = subprocess.Popen(
        [kenning, "serve", "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return server
        except httpx.TransportError:
            pass
        if server.poll() is not None:
            raise RuntimeError("kenning serve exited")
        time.sleep(0.2)
    server.terminate()
    raise RuntimeError("kenning serve did not answer in 60 s")


async def load(
    url: str, token: str, kind: str, questions: list[str], clients: int, seconds: float
) -> dict[str, Any]:
    """`clients` closed-loop clients for `seconds`: each sends its next search when one returns."""
    latencies: list[float] = []
    errors = 0
    bodies = cycle([{"query": q, "type": kind, "only_context": True} for q in questions])
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=60) as client:
        await client.post(f"{url}/v1/search", json=next(bodies))  # a connection, and the stores open
        deadline = time.perf_counter() + seconds

        async def one_client() -> None:
            nonlocal errors
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                answer = await client.post(f"{url}/v1/search", json=next(bodies))
                if answer.status_code == 200:
                    latencies.append(time.perf_counter() - started)
                else:
                    errors += 1

        started = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        wall = time.perf_counter() - started
    return {"clients": clients, **summary(latencies, wall), "errors": errors}


def run(args: argparse.Namespace) -> dict[str, Any]:
    questions = [entry["question"] for entry in json.loads(QUESTIONS.read_text())]
    with tempfile.TemporaryDirectory(prefix="kenning-api-load-") as tmp, ExitStack() as stack:
        if args.home is None:
            home, settings = Path(tmp) / "home", {"embedding_provider": "hash"}
            token, ingest_s = ingest(home, args.documents)
        else:
            home, settings, ingest_s = args.home, {}, 0.0
            token = stack.enter_context(bench_user(home))
        local = in_process(home, questions, args.types, settings)
        port = free_port()
        server = start_server(home, port, args.workers, settings)
        try:
            url = f"http://127.0.0.1:{port}"
            http = {
                kind: [asyncio.run(load(url, token, kind, questions, n, args.seconds)) for n in args.clients]
                for kind in args.types
            }
        finally:
            server.terminate()
            server.wait(30)
    one = {kind: next((level for level in http[kind] if level["clients"] == 1), None) for kind in args.types}
    return {
        "home": str(args.home) if args.home else None,
        "documents": args.documents if args.home is None else None,
        "embedder": settings.get("embedding_provider", "the home's"),
        "workers": args.workers,
        "queries": len(questions),
        "seconds_per_level": args.seconds,
        "ingest_s": round(ingest_s, 1),
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "in_process": local,
        "http": http,
        "api_overhead_p50_ms": {
            kind: round(level["p50_ms"] - local[kind]["p50_ms"], 2) for kind, level in one.items() if level
        },
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--documents", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10.0, help="per type and client count")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--home", type=Path, default=None, help="an existing home, used as it is")
    parser.add_argument(
        "--types", nargs="+", default=list(TYPES), choices=[t.value for t in SearchType], help="search types"
    )
    parser.add_argument("--workers", type=int, default=1, help="kenning serve --workers")
    args = parser.parse_args(argv)
    figures = run(args)
    out = ROOT / "bench" / "results" / "api_load.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2))
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
