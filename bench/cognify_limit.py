"""Embedded cognify bound by the LLM: how close it comes to a provider's rate limit.

The simulator answers after `--latency-ms` and admits `--rpm` requests a minute over a
sliding minute, chat and embedding requests counted together (429 + Retry-After beyond).
kenning runs embedded with its default settings but for the endpoint and `KENNING_LLM_RPM`
at the same limit. The ideal is every request the endpoint received at exactly the limit:
(chat + embedding requests) / (rpm / 60) seconds; the figure is that ideal over the
cognify's wall time.

    python -m bench.cognify_limit --documents 200
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kenning.pipeline.ingest import Source
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from kenning.workers.runtime.wiring import Wiring
from tests.simulator import Simulator

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "data" / "twowiki_101" / "2wikimultihopqa_corpus.json"


def documents(count: int) -> list[Source]:
    paragraphs = json.loads(CORPUS.read_text())[:count]
    return [
        Source(name=f"{p['title']}.txt", uri=f"2wiki:{i}", data=f"{p['title']}\n\n{p['text']}".encode())
        for i, p in enumerate(paragraphs)
    ]


def run(args: argparse.Namespace) -> dict[str, Any]:
    with Simulator(latency_ms=args.latency_ms, rpm=args.rpm, rpm_scope="all") as simulator:
        overrides: dict[str, object] = {
            "llm_url": simulator.base_url,
            "llm_rpm": args.rpm,
            "llm_model": "sim",
        }
        if args.embeddings == "simulator":
            overrides |= {"embedding_provider": "openai", "embedding_url": simulator.base_url}
        else:
            overrides |= {"embedding_provider": "hash"}
        if args.concurrency:
            overrides["concurrency"] = args.concurrency
        with tempfile.TemporaryDirectory() as home:
            settings = load_settings(home=Path(home), **overrides)
            with Kenning(settings, Wiring(settings)) as memory:
                memory.add(documents(args.documents))
                simulator.reset()
                marks: dict[str, float] = {}

                def mark(step: str, done: int, total: int) -> None:
                    if done == 0:
                        marks.setdefault(f"{step}_start", time.perf_counter())
                    if done == total:
                        marks[f"{step}_end"] = time.perf_counter()

                started = time.perf_counter()
                pipeline_run = memory.cognify(progress=mark)
                wall_s = time.perf_counter() - started
        stats = simulator.stats()
    chat, embeddings = stats["calls"]["chat"], stats["calls"]["embeddings"]
    ideal_s = (chat + embeddings) / (args.rpm / 60)
    return {
        "documents": args.documents,
        "status": pipeline_run.status.value,
        "chunks": pipeline_run.stats.get("chunks_to_extract", 0),
        "latency_ms": args.latency_ms,
        "rpm": args.rpm,
        "embeddings": args.embeddings,
        "concurrency": settings.concurrency,
        "cognify_s": round(wall_s, 2),
        "chat_requests": chat,
        "embedding_requests": embeddings,
        "ideal_s": round(ideal_s, 2),
        "fraction_of_ideal": round(ideal_s / wall_s, 4),
        "rate_limited": stats["rate_limited"],
        "rate_limited_fraction": round(stats["rate_limited"] / max(1, chat + embeddings), 4),
        "max_in_flight": stats["max_in_flight"],
        "step_ms": {k[3:]: v for k, v in pipeline_run.stats.items() if k.startswith("ms_")},
        "seconds_at": {step: round(at - started, 2) for step, at in marks.items()},
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--documents", type=int, default=200)
    parser.add_argument("--latency-ms", type=float, default=500.0)
    parser.add_argument("--rpm", type=int, default=600)
    parser.add_argument("--embeddings", choices=("hash", "simulator"), default="hash")
    parser.add_argument("--concurrency", type=int, default=0, help="KENNING_CONCURRENCY; 0: the default")
    args = parser.parse_args(argv)
    if not CORPUS.exists():
        sys.exit(f"the corpus is missing: {CORPUS}")
    print(json.dumps(run(args), indent=2))


if __name__ == "__main__":
    main()
