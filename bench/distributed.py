"""Distributed cognify on `kenning worker` processes: the pipeline's overhead, and throughput at a rate limit.

Every run gets a fresh PostgreSQL database (created and dropped here), a unique queue
prefix on the local Redis, the LLM simulator on 127.0.0.1 and the hash embedder.

`--mode overhead`: the simulator answers at once and nothing is limited; two worker
processes as the README starts them (pipeline+extract, load) cognify the first
`--documents` paragraphs of the 2WikiMultihopQA corpus. Reported: chunks per second from
enqueue to the run's end, and the share of task time each step took (the run's `ms_<step>`
counters).

`--mode limit`: the simulator answers after 500 ms and admits 600 chat calls a minute
(429 + Retry-After beyond); the workers share KENNING_LLM_RPM=600 through Redis. For each
count in `--workers`, that many extract-only worker processes (`--concurrency` each) plus
one pipeline+load worker cognify the first `--documents` SciFact abstracts. Reported: chat
calls a minute the endpoint admitted in the steady state (from when 10% of the calls were
made to when 90% were), that rate as a fraction of the limit, and the 429s.

`--mode compare`: the same paragraphs cognified embedded (one process, its defaults) and
distributed (two `kenning worker` processes as the README starts them, their default
concurrency, PostgreSQL metadata), for each `--cases` entry `latency_ms:rpm` (rpm 0: no
limit). Reported per case: each mode's seconds, chat calls in flight at most, the fraction of
the ideal (calls / (rpm / 60) seconds) under a limit, over the whole run and in the steady
state (the admitted rate from 10% to 90% of the calls over the limit), and distributed's
throughput over embedded's.

    python -m bench.distributed --mode overhead --documents 200
    python -m bench.distributed --mode limit --documents 300 --workers 1,2,4
    python -m bench.distributed --mode compare --documents 200 --cases 0:0,500:0,500:600
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.ingest import CORPUS as TWOWIKI
from bench.ingest import documents as twowiki_documents
from bench.ratelimit import CORPUS as SCIFACT
from bench.ratelimit import abstracts
from kenning.pipeline.ingest import Source
from kenning.pipeline.models import PipelineRun, RunStatus
from kenning.pipeline.plan import PLAN
from kenning.workers.celery.canvas import current_run, enqueue
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from kenning.workers.runtime.wiring import Wiring
from tests.integration.cluster import Deployment, Workers, forget_keys, kenning_env, settings_of
from tests.services import REDIS_URL, ensure_services, scratch_database
from tests.simulator import Simulator

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DATASET = "bench"
SAMPLE_S = 0.1
# The two workers the README starts: one waits on the LLM, one writes the stores.
README_WORKERS = {"a": "pipeline,extract", "b": "load"}
STEADY = (0.1, 0.9)


def deployment(home: Path, postgres_url: str, llm_url: str, **extra: str) -> Deployment:
    prefix = f"kenning-bench-{uuid.uuid4().hex[:8]}"
    env = kenning_env(
        home=str(home),
        tenant=f"bench-{uuid.uuid4().hex[:6]}",
        metadata_url=postgres_url,
        graph_backend="sql",
        broker_url=REDIS_URL,
        result_backend=REDIS_URL,
        redis_url=REDIS_URL,
        queue_prefix=prefix,
        embedding_provider="hash",
        llm_url=llm_url,
        llm_api_key="bench",
        **extra,
    )
    return Deployment(env=env, settings=settings_of(env))


def cognify(
    target: Deployment, sources: list[Source], pools: list[Workers], simulator: Simulator, timeout_s: float
) -> tuple[PipelineRun, float, list[tuple[float, int]]]:
    """Add the sources, start the workers, run cognify on them; the run, its seconds and the call samples."""
    samples: list[tuple[float, int]] = []
    with target.memory() as memory, ExitStack() as stack:
        memory.add(sources, DATASET)
        for pool in pools:
            stack.callback(pool.stop)
            pool.start()
        started = time.monotonic()
        job = enqueue(memory.wiring, memory.settings, memory.scope(DATASET))
        run = current_run(memory.wiring, job)
        while run.status == RunStatus.STARTED and time.monotonic() - started < timeout_s:
            time.sleep(SAMPLE_S)
            samples.append((time.monotonic() - started, admitted(simulator.stats())))
            run = current_run(memory.wiring, job)
        elapsed = time.monotonic() - started
        if run.status != RunStatus.COMPLETED:
            print(f"run {run.id[:8]} ended {run.status.value}: {run.error}", file=sys.stderr)
            print("\n".join(pool.logs() for pool in pools)[-6000:], file=sys.stderr)
    forget_keys(REDIS_URL, target.settings.queue_prefix)
    return run, elapsed, samples


def admitted(stats: dict[str, Any]) -> int:
    """Chat calls the endpoint let through: every call it counted, less those it refused."""
    return int(stats["calls"]["chat"]) - int(stats["rate_limited"])


def step_shares(stats: dict[str, int]) -> dict[str, float]:
    """Each step's share of all the task time the run's steps took."""
    times = {step.name: stats.get(f"ms_{step.name}", 0) for step in PLAN}
    total = sum(times.values()) or 1
    return {name: round(ms / total, 4) for name, ms in times.items()}


def steady_rate(samples: list[tuple[float, int]]) -> float:
    """Admitted calls a minute between the samples where 10% and 90% of the calls had been made."""
    if not samples or samples[-1][1] == 0:
        return 0.0
    final = samples[-1][1]
    low = next(s for s in samples if s[1] >= STEADY[0] * final)
    high = next(s for s in samples if s[1] >= STEADY[1] * final)
    if high[0] <= low[0]:
        return 0.0
    return (high[1] - low[1]) / (high[0] - low[0]) * 60


def overhead(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    sources = twowiki_documents(args.documents)
    with scratch_database("kenning_bench") as url, Simulator() as simulator:
        target = deployment(home, url, simulator.base_url)
        pool = Workers(target, home, README_WORKERS, concurrency=args.concurrency)
        run, elapsed, _ = cognify(target, sources, [pool], simulator, args.timeout)
    stats = run.stats
    chunks = stats.get("chunks_to_extract", 0)
    task_s = sum(stats.get(f"ms_{step.name}", 0) for step in PLAN) / 1000
    return {
        "mode": "overhead",
        "status": run.status.value,
        "documents": args.documents,
        "chunks": chunks,
        "worker_processes": 2,
        "concurrency": args.concurrency,
        "seconds": round(elapsed, 2),
        "chunks_per_s": round(chunks / elapsed, 2),
        "task_seconds": round(task_s, 2),
        "step_share": step_shares(stats),
        "llm_calls": stats.get("llm_calls", 0),
        "prompt_tokens": stats.get("prompt_tokens", 0),
        "completion_tokens": stats.get("completion_tokens", 0),
    }


def limit(args: argparse.Namespace, home: Path, workers: int, sources: list[Source]) -> dict[str, Any]:
    with (
        scratch_database("kenning_bench") as url,
        Simulator(latency_ms=args.latency_ms, rpm=args.rpm, rpm_scope="chat") as simulator,
    ):
        target = deployment(home, url, simulator.base_url, llm_rpm=str(args.rpm), **batch_setting(args))
        pipeline = Workers(target, home, queues={"main": "pipeline,load"}, concurrency=2)
        extract = {f"x{number}": "extract" for number in range(workers)}
        extractors = Workers(target, home, queues=extract, concurrency=args.concurrency)
        run, elapsed, samples = cognify(target, sources, [pipeline, extractors], simulator, args.timeout)
        final = simulator.stats()
    rate = steady_rate(samples)
    calls = final["calls"]["chat"]
    return {
        "workers": workers,
        "concurrency_per_worker": args.concurrency or "default",
        "status": run.status.value,
        "chunks": run.stats.get("chunks_to_extract", 0),
        "seconds": round(elapsed, 2),
        "steady_calls_per_min": round(rate, 1),
        "fraction_of_limit": round(rate / args.rpm, 4),
        "chat_calls": calls,
        "rate_limited": final["rate_limited"],
        "rate_limited_fraction": round(final["rate_limited"] / calls, 4) if calls else 0.0,
        "failed_chunks": run.stats.get("failed_chunks", 0),
        "max_in_flight": final["max_in_flight"],
        "fraction_of_ideal": round(admitted(final) / (args.rpm / 60) / elapsed, 4),
    }


def embedded(sources: list[Source], latency_ms: float, rpm: int, home: Path) -> dict[str, Any]:
    """Cognify `sources` embedded, with its defaults but the endpoint and the limit."""
    with Simulator(latency_ms=latency_ms, rpm=rpm, rpm_scope="chat") as simulator:
        settings = load_settings(
            home=home, llm_url=simulator.base_url, llm_api_key="bench", llm_rpm=rpm, embedding_provider="hash"
        )
        with Kenning(settings, Wiring(settings)) as memory:
            memory.add(sources, DATASET)
            samples: list[tuple[float, int]] = []
            done = threading.Event()
            started = time.monotonic()
            sampler = threading.Thread(target=sample, args=(simulator, started, samples, done), daemon=True)
            sampler.start()
            try:
                run = memory.cognify(DATASET)
            finally:
                elapsed = time.monotonic() - started
                done.set()
                sampler.join(timeout=10.0)
        stats = simulator.stats()
    samples.append((elapsed, admitted(stats)))
    return figures_of(run, elapsed, stats, rpm, samples)


def sample(
    simulator: Simulator, started: float, samples: list[tuple[float, int]], done: threading.Event
) -> None:
    """Record (seconds since `started`, calls admitted) every `SAMPLE_S` until `done`."""
    while not done.wait(SAMPLE_S):
        samples.append((time.monotonic() - started, admitted(simulator.stats())))


def distributed(sources: list[Source], latency_ms: float, rpm: int, home: Path) -> dict[str, Any]:
    """Cognify `sources` on two workers started as the README starts them, at their defaults."""
    with (
        scratch_database("kenning_bench") as url,
        Simulator(latency_ms=latency_ms, rpm=rpm, rpm_scope="chat") as simulator,
    ):
        target = deployment(home, url, simulator.base_url, llm_rpm=str(rpm))
        pool = Workers(target, home, README_WORKERS, concurrency=None)
        run, elapsed, samples = cognify(target, sources, [pool], simulator, 600.0)
        stats = simulator.stats()
    samples.append((elapsed, admitted(stats)))
    return figures_of(run, elapsed, stats, rpm, samples)


def figures_of(
    run: PipelineRun, elapsed: float, stats: dict[str, Any], rpm: int, samples: list[tuple[float, int]]
) -> dict[str, Any]:
    """The run's figures; under a limit, the fraction of the ideal over the whole run (its steps
    before the first call and after the last included) and in the steady state."""
    calls = admitted(stats)
    ideal_s = calls / (rpm / 60) if rpm else None
    return {
        "steady_fraction_of_limit": round(steady_rate(samples) / rpm, 4) if rpm else None,
        "status": run.status.value,
        "chunks": run.stats.get("chunks_to_extract", 0),
        "seconds": round(elapsed, 2),
        "chat_calls": calls,
        "max_in_flight": stats["max_in_flight"],
        "rate_limited": stats["rate_limited"],
        "fraction_of_ideal": round(ideal_s / elapsed, 4) if ideal_s else None,
    }


def compare(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    sources = twowiki_documents(args.documents)
    cases: list[dict[str, Any]] = []
    for case in args.cases.split(","):
        latency_ms, rpm = float(case.split(":")[0]), int(case.split(":")[1])
        figures: dict[str, Any] = {"latency_ms": latency_ms, "rpm": rpm}
        for mode, runner in (("embedded", embedded), ("distributed", distributed)):
            folder = home / f"{mode}-{len(cases)}"
            folder.mkdir()
            # A process serves one Celery configuration, and each run has its own.
            with multiprocessing.get_context("spawn").Pool(1) as pool:
                figures[mode] = pool.apply(runner, (sources, latency_ms, rpm, folder))
        ratio = figures["embedded"]["seconds"] / figures["distributed"]["seconds"]
        figures["throughput_ratio"] = round(ratio, 3)
        print(json.dumps(figures), file=sys.stderr)
        cases.append(figures)
    return {"mode": "compare", "documents": args.documents, "cases": cases}


def batch_setting(args: argparse.Namespace) -> dict[str, str]:
    return {"extract_batch": str(args.extract_batch)} if args.extract_batch else {}


def scifact_sources(count: int) -> list[Source]:
    return [
        Source(name=f"scifact-{index}.txt", uri=f"scifact:{index}", data=text.encode())
        for index, text in enumerate(abstracts(count))
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mode", choices=("overhead", "limit", "compare"), required=True)
    parser.add_argument("--cases", default="0:0,500:0,500:600", help="compare: latency_ms:rpm, ...")
    parser.add_argument("--documents", type=int, default=None, help="default: 200 (overhead), 300 (limit)")
    parser.add_argument("--workers", default="1,2,4", help="limit: extract worker counts, comma-separated")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="per worker; default 4 (overhead), else the worker's own",
    )
    parser.add_argument("--rpm", type=int, default=600)
    parser.add_argument("--latency-ms", type=float, default=500.0)
    parser.add_argument("--extract-batch", type=int, default=None, help="limit: default the setting's")
    parser.add_argument("--timeout", type=float, default=600.0, help="longest wait for one run, seconds")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    corpus = TWOWIKI if args.mode == "overhead" else SCIFACT
    if not corpus.exists():
        sys.exit(f"the corpus is missing: {corpus}")
    args.documents = args.documents or (200 if args.mode == "overhead" else 300)
    if args.mode == "overhead":
        args.concurrency = args.concurrency or 4
    ensure_services()
    with tempfile.TemporaryDirectory(prefix="kenning-bench-") as folder:
        if args.mode == "overhead":
            figures = overhead(args, Path(folder))
        elif args.mode == "compare":
            figures = compare(args, Path(folder))
        else:
            sources = scifact_sources(args.documents)
            runs = []
            for count in (int(part) for part in args.workers.split(",")):
                home = Path(folder) / f"workers-{count}"
                home.mkdir()
                # A process serves one Celery configuration, and each run has its own.
                with multiprocessing.get_context("spawn").Pool(1) as pool:
                    runs.append(pool.apply(limit, (args, home, count, sources)))
            config = {key: vars(args)[key] for key in ("documents", "rpm", "latency_ms", "extract_batch")}
            figures = {"mode": "limit", "config": config, "runs": runs}
    out = args.out or RESULTS / f"distributed-{args.mode}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2))
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
