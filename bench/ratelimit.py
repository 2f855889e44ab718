"""Throughput and 429s under one shared Redis rate limiter, against a rate-limited endpoint.

The simulator answers after 500 ms and admits 600 requests a minute over a sliding
minute (chat and embeddings counted together), answering 429 + Retry-After beyond.
For each worker count (1, 2, 4 processes of `--threads` threads each), every thread runs
`OpenAIExtractor.extract` on SciFact abstracts (read from ../shared/data/scifact, never
copied) through one `RedisRateLimiter` at rpm 600, for `--seconds`. Printed as JSON per
worker count: chat calls a minute the endpoint admitted in steady state (the first
`--skip` seconds left out), that rate as a fraction of the limit, and the 429s.

The limiter refills at (rpm - burst) per 61 s, so its own ceiling is 96.7% of the limit
at rpm 600 and its default burst of 10 (`limiter_ceiling_fraction`); a thread waits 500 ms per call, so
even 1 process x 8 threads could make 960 calls a minute without a limit.

    python -m bench.ratelimit --seconds 60
"""

from __future__ import annotations

import argparse
import ast
import csv
import io
import json
import multiprocessing
import os
import sys
import threading
import time
import tokenize
import uuid
from collections.abc import Sequence
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import redis

from kenning.pipeline.errors import LLMError
from kenning.pipeline.ratelimit import Limits, provider_key
from kenning.storage.coordination.ratelimit_redis import RedisRateLimiter
from kenning.storage.inference.llm_openai import LLMConfig, OpenAIExtractor
from tests.simulator import Simulator

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "data" / "scifact" / "corpus_train.csv"
MODEL = "sim-model"
START_TIMEOUT_S = 120.0


def abstracts(count: int) -> list[str]:
    """The first `count` abstracts; the CSV holds each as the printed form of a list of sentences."""
    csv.field_size_limit(sys.maxsize)
    texts: list[str] = []
    with CORPUS.open(newline="") as handle:
        for row in csv.DictReader(handle):
            texts.append(f"{row['title']}\n\n{sentences(row['abstract'])}")
            if len(texts) >= count:
                break
    return texts


def sentences(printed: str) -> str:
    """The sentences of "['First.' 'Second.']" (no commas between items), joined by spaces."""
    tokens = tokenize.generate_tokens(io.StringIO(printed).readline)
    try:
        return " ".join(ast.literal_eval(token.string) for token in tokens if token.type == tokenize.STRING)
    except (tokenize.TokenError, SyntaxError, ValueError):
        return printed.strip("[]")


def work(
    base_url: str,
    redis_url: str,
    prefix: str,
    limits: Limits,
    threads: int,
    seconds: float,
    texts: list[str],
    start: Barrier,
    results: Any,
) -> None:
    """One worker process: `threads` threads extracting through the shared limiter for `seconds`."""
    client = redis.Redis.from_url(redis_url)
    limiter = RedisRateLimiter(client, {provider_key(base_url, MODEL): limits}, prefix)
    config = LLMConfig(base_url=base_url, model=MODEL, timeout_s=30.0, max_retries=4)
    extractor = OpenAIExtractor(config, limiter=limiter)
    counts = {"extractions": 0, "failed": 0}
    mutex = threading.Lock()
    start.wait(timeout=START_TIMEOUT_S)
    end = time.monotonic() + seconds

    def run(offset: int) -> None:
        for index in range(offset, offset + 1_000_000, threads):
            if time.monotonic() >= end:
                return
            try:
                extractor.extract(texts[index % len(texts)])
                outcome = "extractions"
            except LLMError:
                outcome = "failed"
            with mutex:
                counts[outcome] += 1

    pool = [threading.Thread(target=run, args=(offset,)) for offset in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(timeout=seconds + 120)
    results.put({**counts, "retries": extractor.usage.retries})
    extractor.close()
    client.close()


def measure(workers: int, args: argparse.Namespace, texts: list[str]) -> dict[str, Any]:
    """One run with `workers` processes against a fresh simulator and fresh limiter keys."""
    context = multiprocessing.get_context("spawn")
    prefix = f"kenning-bench:{uuid.uuid4().hex[:8]}:"
    limits = limits_of(args)
    start = context.Barrier(workers + 1)
    results = context.Queue()
    with Simulator(latency_ms=args.latency_ms, rpm=args.rpm, rpm_scope="all") as simulator:
        shares = [texts[index::workers] for index in range(workers)]
        processes = [
            context.Process(
                target=work,
                args=(
                    simulator.base_url,
                    args.redis_url,
                    prefix,
                    limits,
                    args.threads,
                    args.seconds,
                    share,
                    start,
                    results,
                ),
            )
            for share in shares
        ]
        for process in processes:
            process.start()
        start.wait(timeout=START_TIMEOUT_S)
        began = time.monotonic()
        time.sleep(args.skip)
        first, first_at = simulator.stats(), time.monotonic()
        time.sleep(max(0.0, began + args.seconds - time.monotonic()))
        last, last_at = simulator.stats(), time.monotonic()
        reports = [results.get(timeout=args.seconds + 180) for _ in processes]
        for process in processes:
            process.join(timeout=30)
        final = simulator.stats()
    forget(args.redis_url, prefix)
    return figures(workers, args, limits, (first, first_at), (last, last_at), final, reports)


def figures(
    workers: int,
    args: argparse.Namespace,
    limits: Limits,
    first: tuple[dict[str, Any], float],
    last: tuple[dict[str, Any], float],
    final: dict[str, Any],
    reports: list[dict[str, int]],
) -> dict[str, Any]:
    per_min = (admitted(last[0]) - admitted(first[0])) / (last[1] - first[1]) * 60
    calls = final["calls"]["chat"]
    return {
        "workers": workers,
        "threads_per_worker": args.threads,
        "steady_calls_per_min": round(per_min, 1),
        "fraction_of_limit": round(per_min / args.rpm, 4),
        "limiter_ceiling_fraction": round(limits.request_rate * 60 / args.rpm, 4),
        "chat_calls": calls,
        "rate_limited": final["rate_limited"],
        "rate_limited_fraction": round(final["rate_limited"] / calls, 4) if calls else 0.0,
        "extractions": sum(report["extractions"] for report in reports),
        "failed": sum(report["failed"] for report in reports),
        "retries": sum(report["retries"] for report in reports),
        "max_in_flight": final["max_in_flight"],
    }


def admitted(stats: dict[str, Any]) -> int:
    """Chat calls the endpoint let through: every call it counted, less those it refused."""
    return int(stats["calls"]["chat"]) - int(stats["rate_limited"])


def forget(redis_url: str, prefix: str) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=prefix + "*", count=100))
    if keys:
        client.delete(*keys)
    client.close()


def limits_of(args: argparse.Namespace) -> Limits:
    return Limits(rpm=args.rpm) if args.burst is None else Limits(rpm=args.rpm, burst=args.burst)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each run")
    parser.add_argument("--skip", type=float, default=5.0, help="start-up seconds left out of the rate")
    parser.add_argument("--workers", default="1,2,4", help="worker process counts, comma-separated")
    parser.add_argument("--threads", type=int, default=8, help="threads per worker process")
    parser.add_argument("--rpm", type=int, default=600)
    parser.add_argument("--burst", type=int, help="the limiter's burst (default: one second of --rpm)")
    parser.add_argument("--latency-ms", type=float, default=500.0)
    parser.add_argument("--texts", type=int, default=2000, help="abstracts to cycle through")
    parser.add_argument(
        "--redis-url", default=os.environ.get("KENNING_TEST_REDIS", "redis://127.0.0.1:6379/0")
    )
    args = parser.parse_args(argv)
    if args.skip >= args.seconds:
        sys.exit("--skip must be shorter than --seconds")
    if not CORPUS.exists():
        sys.exit(f"the corpus is missing: {CORPUS}")
    texts = abstracts(args.texts)
    runs = [measure(int(count), args, texts) for count in args.workers.split(",")]
    config = {key: vars(args)[key] for key in ("seconds", "skip", "rpm", "latency_ms", "threads")}
    config["burst"] = limits_of(args).burst
    print(json.dumps({"config": config, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
