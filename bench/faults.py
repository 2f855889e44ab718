"""Faults of a distributed cognify with every default setting: time from the fault to the run's end.

Each fault gets a fresh deployment: a private PostgreSQL cluster (`initdb` + `pg_ctl` on a port
of its own), a private redis-server, the LLM simulator on 127.0.0.1, the hash embedder, and the
two usual `kenning worker` processes (pipeline+extract, extract+load, concurrency 2 each).
Settings are the defaults: lease 60 s, supervisor every 30 s, stores ridden out 60 s, broker
visibility timeout 2 h, lock ttl 10 min. The follower `kenning cognify --distributed` runs
in the background; once `--share` of the chunks are extracted, the fault lands:

- `kill`: both workers SIGKILLed and started again at once (batches left unacknowledged);
- `redis`: Redis SIGKILLed and started again without its data (queues, chords, lock, leases);
- `postgres`: PostgreSQL stopped for `--outage` seconds, then started again;
- `blackhole`: the LLM accepts connections and never answers (those in flight included). The
  run ends visibly, its chunks not extracted failed; then the LLM answers again, and once its
  breaker's cooldown is over a new `kenning cognify --distributed` does what is left.

Reported for each: seconds from the fault to the follower's exit, its exit code, the runs'
statuses (an interrupted run and the run that resumed it), the chunks loaded, the simulator's
chat calls; and the undisturbed run's seconds on the same corpus, for scale. For `blackhole`
also: seconds from the LLM's return to the retry's completion, and from the fault to it.

    python -m bench.faults --documents 20 --sentences 20
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kenning.pipeline.models import ChunkStatus
from kenning.pipeline.spend import Spend
from tests.integration.cluster import Deployment, RedisServer, Workers, kenning_env, settings_of
from tests.integration.faults import (
    Outcome,
    PostgresServer,
    black_hole,
    chunk_counts,
    cognifying,
    dataset_id,
    kill_both,
    run_with_fault,
    stop_postgres,
    wait_for_breaker,
    wipe_redis,
)
from tests.integration.test_chaos import add_corpus, write_corpus
from tests.services import free_port
from tests.simulator import Simulator

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DATASET = "faults"
LATENCY_MS = 300
TIMEOUT_S = 600.0


@contextmanager
def servers(folder: Path) -> Iterator[tuple[PostgresServer, RedisServer]]:
    postgres, redis_server = PostgresServer(free_port()), RedisServer(folder / "redis", free_port())
    postgres.create()
    postgres.start()
    try:
        redis_server.start()
        try:
            yield postgres, redis_server
        finally:
            redis_server.stop()
    finally:
        postgres.remove()


def deployment(folder: Path, postgres: PostgresServer, redis_server: RedisServer, llm_url: str) -> Deployment:
    env = kenning_env(
        home=str(folder / "home"),
        tenant=f"bench-{uuid.uuid4().hex[:6]}",
        metadata_url=postgres.url,
        graph_backend="sql",
        broker_url=redis_server.url,
        result_backend=redis_server.url,
        redis_url=redis_server.url,
        embedding_provider="hash",
        llm_url=llm_url,
        llm_api_key="bench",
        extract_batch="2",
        chunk_size="48",
        chunk_overlap="4",
    )
    return Deployment(env=env, settings=settings_of(env))


Fault = Callable[[Workers, PostgresServer, RedisServer], Callable[[], None]]


def faults(outage_s: float) -> dict[str, Fault]:
    return {
        "kill": lambda workers, _pg, _redis: kill_both(workers),
        "redis": lambda _workers, _pg, redis_server: wipe_redis(redis_server),
        "postgres": lambda _workers, postgres, _redis: stop_postgres(postgres, outage_s),
        "blackhole": lambda _workers, _pg, _redis: lambda: None,  # see `blackhole_scenario`
    }


@dataclass(frozen=True)
class Cluster:
    """A fresh deployment with its corpus added and two workers started."""

    target: Deployment
    workers: Workers
    logs: Path
    simulator: Simulator
    postgres: PostgresServer
    redis_server: RedisServer


@contextmanager
def cluster(args: argparse.Namespace) -> Iterator[Cluster]:
    """Private PostgreSQL and Redis, the simulator, the corpus added, two workers (stopped after)."""
    with tempfile.TemporaryDirectory(prefix="kenning-bench-faults-") as tmp:
        folder = Path(tmp)
        corpus = write_corpus(folder / "corpus", documents=args.documents, sentences=args.sentences)
        with servers(folder) as (postgres, redis_server), Simulator(latency_ms=LATENCY_MS) as simulator:
            target = deployment(folder, postgres, redis_server, simulator.base_url)
            add_corpus(target, corpus, DATASET)
            logs = folder / "logs"
            logs.mkdir()
            workers = Workers(target, logs)
            workers.start()
            try:
                yield Cluster(target, workers, logs, simulator, postgres, redis_server)
            finally:
                workers.stop()


def blackhole_scenario(args: argparse.Namespace) -> dict[str, Any]:
    """The LLM goes black mid-extraction: the run's visible end; then the LLM back and a retry."""
    with cluster(args) as running:
        target, logs, simulator = running.target, running.logs, running.simulator
        outcome = run_with_fault(target, DATASET, logs, black_hole(simulator), share=args.share)
        simulator.black_hole = False
        restored = time.monotonic()
        wait_for_breaker(target, timeout_s=TIMEOUT_S)
        waited = time.monotonic() - restored
        with cognifying(target, DATASET, logs) as (run, _log):
            code = run.wait(timeout=TIMEOUT_S)
        retried = time.monotonic() - restored
        billed = simulator.stats()
        final = settled(target, outcome)
        spend = spend_shown(target, final)
    return report("blackhole", outcome) | {
        "breaker_wait_s": round(waited, 1),
        "retry_exit_code": code,
        "restore_to_completion_s": round(retried, 1),
        "fault_to_completion_s": round(outcome.fault_to_end_s + retried, 1),
        "final_runs": [{"status": run.status.value, "error": run.error[:300]} for run in final.runs],
        "final_chunks_loaded": final.chunks[ChunkStatus.LOADED],
        "chat_calls": billed["calls"]["chat"],
        "held_by_black_hole": billed["held"],
        "spend": compared(spend, billed),
    }


def settled(target: Deployment, outcome: Outcome) -> Outcome:
    """The outcome with the dataset's runs and chunks as they stand now."""
    of_dataset = dataset_id(target, DATASET)
    with target.memory() as memory:
        runs = sorted(memory.wiring.metadata.list_runs(of_dataset), key=lambda run: run.started_at)
        chunks = chunk_counts(memory, of_dataset)
    return Outcome(outcome.code, outcome.output, outcome.fault_to_end_s, runs, chunks)


def scenario(args: argparse.Namespace, name: str, fault: Fault | None) -> dict[str, Any]:
    """One deployment, one run, one fault (None: undisturbed)."""
    if name == "blackhole":
        return blackhole_scenario(args)
    with cluster(args) as running:
        target, logs, simulator = running.target, running.logs, running.simulator
        if fault is None:
            return undisturbed(target, logs) | {"chat_calls": simulator.stats()["calls"]["chat"]}
        injected = fault(running.workers, running.postgres, running.redis_server)
        outcome = run_with_fault(target, DATASET, logs, injected, share=args.share)
        billed = simulator.stats()
        spend = spend_shown(target, outcome)
    return report(name, outcome) | {"chat_calls": billed["calls"]["chat"], "spend": compared(spend, billed)}


def spend_shown(target: Deployment, outcome: Outcome) -> Spend:
    """The LLM spend that status shows for the runs of the dataset, summed."""
    with target.memory() as memory:
        totals = memory.wiring.spend.totals([run.id for run in outcome.runs])
    return sum(totals.values(), Spend())


def compared(shown: Spend, billed: dict[str, Any]) -> dict[str, Any]:
    """Status's spend beside the simulator's, with the difference in % of what it billed."""
    pairs = {
        "calls": (shown.calls, billed["calls"]["chat"]),
        "prompt_tokens": (shown.prompt_tokens, billed["prompt_tokens"]),
        "completion_tokens": (shown.completion_tokens, billed["completion_tokens"]),
    }
    return {
        name: {"status": mine, "simulator": seen, "diff_pct": round(100 * (mine - seen) / max(seen, 1), 2)}
        for name, (mine, seen) in pairs.items()
    }


def undisturbed(target: Deployment, logs: Path) -> dict[str, Any]:
    started = time.monotonic()
    with cognifying(target, DATASET, logs) as (run, _log):
        code = run.wait(timeout=TIMEOUT_S)
    elapsed = time.monotonic() - started
    with target.memory() as memory:
        chunks = len(memory.wiring.chunks.list_chunk_ids(dataset_id(target, DATASET)))
    return {"fault": "none", "seconds": round(elapsed, 1), "exit_code": code, "chunks": chunks}


def report(name: str, outcome: Outcome) -> dict[str, Any]:
    return {
        "fault": name,
        "fault_to_end_s": round(outcome.fault_to_end_s, 1),
        "exit_code": outcome.code,
        "runs": [{"status": run.status.value, "error": run.error[:300]} for run in outcome.runs],
        "chunks": sum(outcome.chunks.values()),
        "chunks_loaded": outcome.chunks[ChunkStatus.LOADED],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--documents", type=int, default=20)
    parser.add_argument("--sentences", type=int, default=20)
    parser.add_argument(
        "--share", type=float, default=0.4, help="share of chunks extracted when the fault lands"
    )
    parser.add_argument("--outage", type=float, default=20.0, help="seconds PostgreSQL stays stopped")
    parser.add_argument("--only", default="", help="comma-separated faults to run (default: all)")
    args = parser.parse_args()
    chosen = [name for name in args.only.split(",") if name] or list(faults(args.outage))
    results: dict[str, Any] = {"undisturbed": scenario(args, "none", None)}
    for name in chosen:
        results[name] = scenario(args, name, faults(args.outage)[name])
        print(json.dumps(results[name]), flush=True)
    summary = {
        "settings": "defaults (lease 60 s, supervisor every 30 s, store ride-out 60 s)",
        "documents": args.documents,
        "sentences": args.sentences,
        "share_at_fault": args.share,
        "results": results,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "faults.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
