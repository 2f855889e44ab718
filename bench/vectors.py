"""Embedded vector engines side by side: Qdrant Edge against qdrant-client local mode.

Both run through kenning's `VectorStore` adapters on the same data: `--points` random
unit vectors of `--dim` dimensions, upserted in batches of `--batch` (each batch one of
`--datasets` datasets of one tenant, in turn), then `--queries` top-10 searches, each filtered to one dataset.
Each engine runs in a process of its own, twice: one builds the store and queries it,
a fresh one opens the built store and answers one query (the start of a CLI search).
For Qdrant Edge the queries run again after the HNSW index is built, with recall@10
against an exact search.

    python -m bench.vectors
    python -m bench.vectors --points 5000 --engines edge --time-limit 120

Prints one JSON object: per engine, upsert seconds (and points/s), query p50/p95 in ms,
peak and current RSS in MB, open-to-first-result seconds; plus the machine's load average.
An engine whose upsert passes `--time-limit` seconds stops there and reports what it wrote.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from kenning.pipeline.models import Scope, VectorPoint, stable_id
from kenning.pipeline.ports import VectorStore

ENGINES = ("edge", "qdrant-local")
COLLECTION = "DocumentChunk_text"
TENANT = "bench"
TOP_K = 10
SEED = 20_240


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--points", type=int, default=20_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--datasets", type=int, default=4)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--time-limit", type=float, default=600.0, help="upsert seconds per engine, at most")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("--child", choices=("build", "open"), help=argparse.SUPPRESS)
    parser.add_argument("--engine", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_child(args)))
        return
    report: dict[str, Any] = {
        "workload": {k: getattr(args, k) for k in ("points", "dim", "batch", "queries", "datasets")},
        "versions": {name: version(name) for name in ("qdrant-edge-py", "qdrant-client")},
        "machine": {"cpus": os.cpu_count(), "load_average_before": os.getloadavg()},
        "engines": {},
    }
    for engine in args.engines.split(","):
        with tempfile.TemporaryDirectory(prefix=f"kenning-bench-{engine}-") as folder:
            built = spawn(args, "build", engine, Path(folder))
            opened = spawn(args, "open", engine, Path(folder))
        report["engines"][engine] = {**built, **opened}
    report["machine"]["load_average_after"] = os.getloadavg()
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


def spawn(args: argparse.Namespace, phase: str, engine: str, folder: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.vectors", "--child", phase, "--engine", engine]
    command += ["--dir", str(folder)]
    for name in ("points", "dim", "batch", "queries", "datasets", "time_limit"):
        command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{engine} {phase} failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run_child(args: argparse.Namespace) -> dict[str, Any]:
    vectors = unit_vectors(args.points, args.dim, SEED)
    queries = unit_vectors(args.queries, args.dim, SEED + 1)
    if args.child == "open":
        return open_and_query(args, queries[0])
    store = make_store(args.engine, args.dir)
    store.ensure_collection(COLLECTION, args.dim)
    written, upsert_s = upsert(store, args, vectors)
    result: dict[str, Any] = {
        "points_written": written,
        "upsert_s": round(upsert_s, 2),
        "points_per_s": round(written / upsert_s) if upsert_s else None,
        "query": measure_queries(store, args, queries, vectors[:written]),
    }
    if args.engine == "edge":
        from kenning.storage.vectors.edge import EdgeVectorStore

        assert isinstance(store, EdgeVectorStore)
        started = time.perf_counter()
        store.optimize(COLLECTION)
        result["index_build_s"] = round(time.perf_counter() - started, 2)
        result["query_indexed"] = measure_queries(store, args, queries, vectors[:written])
    result["rss_mb"] = rss_mb()
    result["peak_rss_mb"] = peak_rss_mb()
    store.close()
    return result


def make_store(engine: str, folder: Path) -> VectorStore:
    if engine == "edge":
        from kenning.storage.vectors.edge import EdgeVectorStore

        # Indexing is measured on its own, after the upserts.
        return EdgeVectorStore(folder / "vectors", index_threshold=1_000, auto_index=False)
    from kenning.storage.vectors.qdrant import QdrantVectorStore

    return QdrantVectorStore(path=folder / "qdrant")


def upsert(
    store: VectorStore, args: argparse.Namespace, vectors: npt.NDArray[np.float32]
) -> tuple[int, float]:
    started = time.perf_counter()
    written = 0
    for start in range(0, len(vectors), args.batch):
        rows = range(start, min(start + args.batch, len(vectors)))
        points = [
            VectorPoint(id=point_id(i), vector=vectors[i].tolist(), payload={"text": f"paragraph {i} " * 20})
            for i in rows
        ]
        dataset = dataset_of(start, args)
        store.upsert(Scope(tenant=TENANT, dataset=f"d{dataset}"), COLLECTION, points)
        written = rows.stop
        if time.perf_counter() - started > args.time_limit:
            break
    return written, time.perf_counter() - started


def measure_queries(
    store: VectorStore,
    args: argparse.Namespace,
    queries: npt.NDArray[np.float32],
    stored: npt.NDArray[np.float32],
) -> dict[str, float]:
    timings: list[float] = []
    found = 0
    for n, query in enumerate(queries):
        dataset = n % args.datasets
        started = time.perf_counter()
        hits = store.search(Scope(tenant=TENANT, dataset=f"d{dataset}"), COLLECTION, query.tolist(), TOP_K)
        timings.append(time.perf_counter() - started)
        found += len({h.id for h in hits} & exact_top(stored, query, dataset, args))
    timings.sort()
    return {
        "p50_ms": round(statistics.median(timings) * 1000, 2),
        "p95_ms": round(timings[int(0.95 * (len(timings) - 1))] * 1000, 2),
        "recall_at_10": round(found / (TOP_K * len(queries)), 4),
    }


def open_and_query(args: argparse.Namespace, query: npt.NDArray[np.float32]) -> dict[str, Any]:
    started = time.perf_counter()
    store = make_store(args.engine, args.dir)
    hits = store.search(Scope(tenant=TENANT, dataset="d0"), COLLECTION, query.tolist(), TOP_K)
    opened = time.perf_counter() - started
    assert len(hits) == TOP_K
    result = {"open_to_first_result_s": round(opened, 3), "rss_after_open_mb": rss_mb()}
    store.close()
    return result


def exact_top(
    stored: npt.NDArray[np.float32], query: npt.NDArray[np.float32], dataset: int, args: argparse.Namespace
) -> set[str]:
    rows = np.flatnonzero((np.arange(len(stored)) // args.batch) % args.datasets == dataset)
    if not len(rows):
        return set()
    similarities = stored[rows] @ query
    best = rows[np.argsort(-similarities, kind="stable")[:TOP_K]]
    return {point_id(int(i)) for i in best}


def dataset_of(row: int, args: argparse.Namespace) -> int:
    """Each batch belongs to one dataset (a load writes one dataset's points); they take turns."""
    return (row // args.batch) % args.datasets


def unit_vectors(count: int, dim: int, seed: int) -> npt.NDArray[np.float32]:
    vectors = np.random.default_rng(seed).normal(size=(count, dim)).astype(np.float32)
    normalised: npt.NDArray[np.float32] = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    return normalised


def point_id(i: int) -> str:
    return stable_id("bench", str(i))


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


def peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


if __name__ == "__main__":
    main()
