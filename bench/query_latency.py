"""Query latency on one embedded home: one client, then N clients as threads and as processes.

    python -m bench.query_latency --home /tmp/ql_home --documents 6119 --clients 8

Ingests the first `--documents` 2Wiki paragraphs into `--home` with the local embedder and
the offline extractor, unless the home already holds them (then it is reused as it is).
Then, for CHUNKS, HYBRID_COMPLETION and GRAPH_COMPLETION (context only), it runs the 101
twowiki questions:
- single: one client in this process, one question at a time;
- threads: `--clients` threads sharing one `Kenning` in this process;
- processes: `--clients` processes, each with its own `Kenning` on the same home (what
  users running several `kenning` commands or agents at once do), all asking at once;
- cold: `kenning search` in a new process, timed from its start to its printed result.
Each client asks every question once per type, starting at its own offset. A query's
embeddings are cached for that query alone: its lanes embed the question once, as with the
production cache, but no question is ever embedded by an earlier one. Prints
p50/p95/queries per second per type and mode, the milliseconds per query in each store call
and the CPU milliseconds per query, all processes together (single client and processes), the
load average, and the machine (its CPU, and the CPU milliseconds it takes to embed one
question: compare figures from two machines by it); writes bench/results/query_latency.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.ingest import documents
from bench.latency import QUESTIONS, Timed, percentile
from kenning.pipeline import collection
from kenning.pipeline.models import Scope
from kenning.pipeline.ports import Embedder
from kenning.workers.memory import Kenning
from kenning.workers.runtime.heap import settle
from kenning.workers.runtime.settings import load_settings
from kenning.workers.runtime.wiring import Wiring, open_embedder

ROOT = Path(__file__).resolve().parent.parent
TYPES = ("CHUNKS", "HYBRID_COMPLETION", "GRAPH_COMPLETION")
START_TIMEOUT_S = 300.0


class PerQuery:
    """An embedder whose cache lasts one query of one thread (`new_query` starts the next)."""

    _asked = threading.local()

    def __init__(self, inner: Embedder) -> None:
        self._inner = inner
        self.dimension, self.model = inner.dimension, inner.model

    @classmethod
    def new_query(cls) -> None:
        cls._asked.cache = {}

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        cache: dict[str, list[float]] = getattr(self._asked, "cache", {})
        missing = list(dict.fromkeys(text for text in texts if text not in cache))
        if missing:
            cache.update(zip(missing, self._inner.embed(missing), strict=True))
        return [cache[text] for text in texts]


def open_memory(home: Path) -> Kenning:
    """A `Kenning` on the home with local embeddings, cached for one query at a time."""
    settings = load_settings(home=home, embedding_provider="local")
    return Kenning(settings, Wiring(settings, {"embedder": PerQuery(open_embedder(settings))}))


def ingest(home: Path, count: int) -> dict[str, Any]:
    with open_memory(home) as memory:
        if memory.status():
            return {"reused_store": True}
        started = time.perf_counter()
        memory.add(documents(count))
        run = memory.cognify()
        return {
            "reused_store": False,
            "ingest_s": round(time.perf_counter() - started, 1),
            "ingest_stats": run.stats,
            "ingest_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        }


def summary(latencies: list[float], wall: float) -> dict[str, float]:
    return {
        "queries": len(latencies),
        "p50_ms": round(statistics.median(latencies) * 1000, 1),
        "p95_ms": round(percentile(latencies, 0.95) * 1000, 1),
        "max_ms": round(max(latencies) * 1000, 1),
        "queries_per_s": round(len(latencies) / wall, 1),
    }


def rotated(questions: list[str], client: int, clients: int) -> list[str]:
    offset = client * len(questions) // max(clients, 1)
    return questions[offset:] + questions[:offset]


def ask_all(memory: Kenning, kind: str, questions: Sequence[str]) -> list[float]:
    latencies = []
    for question in questions:
        PerQuery.new_query()
        started = time.perf_counter()
        memory.search(question, kind, only_context=True)
        latencies.append(time.perf_counter() - started)
    return latencies


SNAPSHOT_WAIT_S = 180.0


def warm_up(memory: Kenning) -> float:
    """One query of each type, every vector collection opened, then a wait (at most
    SNAPSHOT_WAIT_S) until the graph's shape and the lexical postings are held in memory, as in a
    query worker that has run a while: they load in the background from the second search of a
    dataset on. Then `kenning.settle`, as the API, MCP and worker processes do when they start.
    Returns the seconds waited."""
    for kind in TYPES:
        memory.search("warm up", kind, only_context=True)
    scope, graph, lexical = memory.scope(), memory.wiring.graph, memory.wiring.lexical
    # Every collection open, as in a worker whose searches have used them all: a question naming
    # an entity is the first to search the entities, and would pay for opening them.
    vector = memory.wiring.embedder.embed(["warm up"])[0]
    for name in collection.INDEXED:
        memory.wiring.vectors.search(scope, name, vector, 1, ())
    started = time.perf_counter()
    while time.perf_counter() - started < SNAPSHOT_WAIT_S:
        graph.neighbourhood(scope, [], shape_only=True)
        lexical.search(scope, "warm", 1)
        if _held(graph, "shape_held", scope) and _held(lexical, "held", scope):
            break
        time.sleep(0.5)
    waited = round(time.perf_counter() - started, 1)
    settle()
    return waited


def _held(store: Any, method: str, scope: Scope) -> bool:
    """Whether the store holds the scope's snapshot; a store with none to hold counts as holding."""
    check = getattr(store, method, None)
    return check is None or check(scope) is not None


def single(home: Path, questions: list[str]) -> dict[str, Any]:
    """One client; with the seconds spent in each store, as shares of the store time."""
    results: dict[str, Any] = {}
    with open_memory(home) as memory:
        table = timed_stores(memory)
        results["snapshots_waited_s"] = warm_up(memory)
        for kind in TYPES:
            table.clear()
            cpu, started = time.process_time(), time.perf_counter()
            latencies = ask_all(memory, kind, questions)
            results[kind] = summary(latencies, time.perf_counter() - started)
            results[kind].update(store_times(table, latencies))
            results[kind]["cpu_ms_per_query"] = round((time.process_time() - cpu) / len(latencies) * 1000, 2)
    return results


def timed_stores(memory: Kenning) -> dict[str, float]:
    """Wraps the memory's stores so that each call's seconds add up in the returned table."""
    table: dict[str, float] = defaultdict(float)
    lock = threading.Lock()
    for name in ("vectors", "graph", "lexical", "embedder", "metadata", "access"):
        memory.wiring._made[name] = Timed(getattr(memory.wiring, name), name, table, lock)
    return table


def store_times(table: dict[str, float], latencies: list[float]) -> dict[str, Any]:
    """Milliseconds per query in each store call, and the share of the queries' time in stores."""
    return {
        "ms_per_query_in": {
            key: round(seconds / len(latencies) * 1000, 2) for key, seconds in sorted(table.items())
        },
        "store_share_of_wall": round(sum(table.values()) / sum(latencies), 3),
    }


def threads(home: Path, questions: list[str], clients: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with open_memory(home) as memory:
        warm_up(memory)
        for kind in TYPES:
            started = time.perf_counter()
            work = [(memory, kind, rotated(questions, client, clients)) for client in range(clients)]
            with ThreadPoolExecutor(max_workers=clients) as pool:
                latencies = [t for part in pool.map(lambda job: ask_all(*job), work) for t in part]
            results[kind] = summary(latencies, time.perf_counter() - started)
    return results


def client_process(
    home: str, questions: list[str], client: int, clients: int, barrier: Any, out: Any
) -> None:
    """One process's client: opens its own `Kenning`, waits for the others, then asks. The CPU
    it spends on a type counts from the start of that type's round to the start of the next, once
    every client has asked: it includes the searches it answered for the others."""
    with open_memory(Path(home)) as memory:
        table = timed_stores(memory)
        warm_up(memory)
        barrier.wait(START_TIMEOUT_S)
        for kind in TYPES:
            table.clear()
            cpu, started = time.process_time(), time.perf_counter()
            latencies = ask_all(memory, kind, rotated(questions, client, clients))
            ended = time.perf_counter()
            barrier.wait(START_TIMEOUT_S)
            out.put((kind, dict(table), latencies, started, ended, time.process_time() - cpu))


def processes(home: Path, questions: list[str], clients: int) -> dict[str, Any]:
    context = mp.get_context("spawn")
    barrier = context.Barrier(clients)
    out = context.Queue()
    workers = [
        context.Process(target=client_process, args=(str(home), questions, n, clients, barrier, out))
        for n in range(clients)
    ]
    for worker in workers:
        worker.start()
    got: dict[str, list[tuple[list[float], float, float]]] = defaultdict(list)
    tables: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    cpu: dict[str, float] = defaultdict(float)
    deadline = time.monotonic() + START_TIMEOUT_S + 600
    while sum(len(parts) for parts in got.values()) < clients * len(TYPES):
        left_s = max(1.0, deadline - time.monotonic())
        kind, table, latencies, started, ended, cpu_s = out.get(timeout=left_s)
        got[kind].append((latencies, started, ended))
        cpu[kind] += cpu_s
        for key, seconds in table.items():
            tables[kind][key] += seconds
    for worker in workers:
        worker.join(timeout=60)
        if worker.exitcode != 0:
            raise RuntimeError(f"a client process ended with {worker.exitcode}")
    results: dict[str, Any] = {}
    for kind in TYPES:
        parts = got[kind]
        wall = max(end for _, _, end in parts) - min(start for _, start, _ in parts)
        latencies = [t for part, _, _ in parts for t in part]
        results[kind] = {**summary(latencies, wall), **store_times(tables[kind], latencies)}
        results[kind]["cpu_ms_per_query"] = round(cpu[kind] / len(latencies) * 1000, 2)
    return results


COLD_SEARCHES = 5
SEARCH = [sys.executable, "-m", "kenning.workers.cli", "search"]


def cold(home: Path, questions: list[str]) -> dict[str, Any]:
    """`kenning search` in a new process, as a user types it: the seconds from the command's
    start to its printed result (start-up, opening the stores, loading the model, the query),
    for the first COLD_SEARCHES questions, one type each in turn, after an untimed search of
    each type that leaves the modules it imports compiled (`cold_env`)."""
    with tempfile.TemporaryDirectory(prefix="kenning-bytecode-") as bytecode:
        env = cold_env(home, Path(bytecode))
        for kind in TYPES:
            search_once(env, "warm up", kind)
        results: dict[str, list[float]] = defaultdict(list)
        for index, question in enumerate(questions[:COLD_SEARCHES]):
            kind = TYPES[index % len(TYPES)]
            started = time.perf_counter()
            search_once(env, question, kind)
            results[kind].append(time.perf_counter() - started)
    every = [seconds for part in results.values() for seconds in part]
    return {
        "searches": len(every),
        "p50_s": round(statistics.median(every), 2),
        "max_s": round(max(every), 2),
        "by_type_s": {kind: [round(t, 2) for t in part] for kind, part in results.items()},
    }


def cold_env(home: Path, bytecode: Path) -> dict[str, str]:
    """The environment of a timed `kenning search`: bytecode written and read under `bytecode`,
    as an installed package has it (pip compiles it), even where PYTHONDONTWRITEBYTECODE is set
    here: without it every search compiled kenning's modules again, a second of its time."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    return {
        **env,
        "PYTHONPYCACHEPREFIX": str(bytecode),
        "KENNING_HOME": str(home),
        "KENNING_EMBEDDING_PROVIDER": "local",
    }


def search_once(env: dict[str, str], question: str, kind: str) -> None:
    command = [*SEARCH, question, "--type", kind.lower(), "--only-context", "--json"]
    done = subprocess.run(command, env=env, capture_output=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"kenning search failed: {done.stderr.decode()[-2000:]}")


def machine(questions: list[str]) -> dict[str, Any]:
    """What the figures depend on beyond the code: the CPU, and its speed at the one piece of work
    every query does, the question's embedding (CPU milliseconds, median over the questions, each
    embedded alone in this process): machines this bench ran on differed by 1.7 times."""
    model = ""
    flags: set[str] = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not model:
                model = value.strip()
            if key.strip() == "flags" and not flags:
                flags = set(value.split())
    embedder = open_embedder(load_settings(home=Path(tempfile.gettempdir()), embedding_provider="local"))
    embedder.embed(questions[:5])
    spent = []
    for question in questions:
        started = time.process_time()
        embedder.embed([question])
        spent.append(time.process_time() - started)
    return {
        "cpu": model or platform.processor(),
        "cpus": os.cpu_count(),
        "avx512": "avx512f" in flags,
        "embed_cpu_ms": round(statistics.median(spent) * 1000, 2),
    }


def load_average() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--home", type=Path, required=True)
    parser.add_argument("--documents", type=int, default=6119)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--questions", type=int, default=101, help="the first N questions")
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=["single", "threads", "processes", "cold"],
        default=["single", "threads", "processes", "cold"],
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "query_latency.json")
    args = parser.parse_args(argv)
    questions = [entry["question"] for entry in json.loads(QUESTIONS.read_text())][: args.questions]
    figures: dict[str, Any] = {"documents": args.documents, "clients": args.clients}
    figures["questions"] = len(questions)
    figures.update(ingest(args.home, args.documents))
    # After the ingest: the model it loads would count in the ingest's peak RSS.
    figures["machine"] = machine(questions)
    runs = {
        "single": lambda: single(args.home, questions),
        "threads": lambda: threads(args.home, questions, args.clients),
        "processes": lambda: processes(args.home, questions, args.clients),
        "cold": lambda: cold(args.home, questions),
    }
    for mode in args.modes:
        before = load_average()
        figures[mode] = runs[mode]()
        figures[mode]["load_average"] = {"before": before, "after": load_average()}
        print(json.dumps({mode: figures[mode]}), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2))
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
