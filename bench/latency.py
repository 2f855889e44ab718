"""Context-retrieval latency under concurrent clients, embedded, with the store calls that take the time.

    python -m bench.latency --documents 6119 --clients 8 --embedder hash

Ingests the 2Wiki corpus (kept under --home and reused on the next run), then runs the
twowiki questions from `--clients` threads at once for CHUNKS, HYBRID_COMPLETION and
GRAPH_COMPLETION (context only), and prints p50/p95 per type and the share of time in
each store call. Results go to bench/results/latency.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.ingest import CORPUS, documents
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = CORPUS.parent / "results_vdb_2wikimultihopqa_101.json"
TYPES = ("CHUNKS", "HYBRID_COMPLETION", "GRAPH_COMPLETION")


class Timed:
    """Wraps a store, adding each method call's seconds to a shared table."""

    def __init__(self, inner: Any, name: str, table: dict[str, float], lock: threading.Lock) -> None:
        self._inner, self._name, self._table, self._lock = inner, name, table, lock

    def __getattr__(self, attribute: str) -> Any:
        value = getattr(self._inner, attribute)
        if not callable(value):
            return value
        return self._timed(f"{self._name}.{attribute}", value)

    def _timed(self, key: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                with self._lock:
                    self._table[key] += time.perf_counter() - started

        return call


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def measure(memory: Kenning, kind: str, questions: list[str], clients: int) -> dict[str, Any]:
    latencies: list[float] = []

    def ask(question: str) -> None:
        started = time.perf_counter()
        memory.search(question, kind, only_context=True)
        latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        list(pool.map(ask, questions))
    wall = time.perf_counter() - started
    return {
        "queries": len(latencies),
        "p50_ms": round(statistics.median(latencies) * 1000, 1),
        "p95_ms": round(percentile(latencies, 0.95) * 1000, 1),
        "queries_per_s": round(len(latencies) / wall, 2),
    }


def run(count: int, clients: int, embedder: str, home: Path) -> dict[str, Any]:
    settings = load_settings(home=home, embedding_provider=embedder)
    memory = Kenning(settings)
    fresh = not memory.status()
    started = time.perf_counter()
    if fresh:
        memory.add(documents(count))
        memory.cognify()
    ingest_s = time.perf_counter() - started
    table: dict[str, float] = defaultdict(float)
    lock = threading.Lock()
    for name in ("vectors", "graph", "lexical", "embedder"):
        memory.wiring._made[name] = Timed(getattr(memory.wiring, name), name, table, lock)
    questions = [entry["question"] for entry in json.loads(QUESTIONS.read_text())]
    memory.search("warm up", "GRAPH_COMPLETION", only_context=True)
    results: dict[str, Any] = {}
    for kind in TYPES:
        table.clear()
        results[kind] = measure(memory, kind, questions, clients)
        total = sum(table.values()) or 1.0
        results[kind]["store_time_share"] = {k: round(v / total, 3) for k, v in sorted(table.items())}
    memory.close()
    return {
        "documents": count,
        "clients": clients,
        "embedder": embedder,
        "ingest_s": round(ingest_s, 1),
        "reused_store": not fresh,
        "results": results,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--documents", type=int, default=6119)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--embedder", choices=["local", "hash"], default="local")
    parser.add_argument("--home", type=Path, default=ROOT / "bench" / "results" / "latency-home")
    args = parser.parse_args(argv)
    figures = run(args.documents, args.clients, args.embedder, args.home)
    out = ROOT / "bench" / "results" / "latency.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2))
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
