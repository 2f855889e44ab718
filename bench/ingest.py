"""Ingestion throughput and memory, embedded, on the first N 2WikiMultihopQA paragraphs.

    python -m bench.ingest --documents 200
    python -m bench.ingest --documents 1000 --llm simulator --embeddings simulator

With the offline extractor and local embeddings (the default), it then replays exactly
the texts the pipeline embedded through the embedder alone, so the pipeline's embedding
rate can be compared with the embedder's raw rate.

With `--llm simulator` the project's LLM simulator (0 ms, in a process of its own, so its
work is not counted here) extracts, and with `--embeddings simulator` it embeds too: the
pipeline's own overhead. Either way it reports chunks/s, each step's time as a share of
the wall time (`step_share`: load streams behind extraction, so shares overlap; `wall_share`:
what each step adds to the wall, the load's part being what runs on after extraction), the
seconds spent inside each store and client (`busy_s`, summed over threads), the CPU seconds
of this process and of the simulator over the cognify (`cpu_s`, `simulator_cpu_s`: on a small
machine they share the cores) and the peak RSS of this process; `--tracemalloc N` adds the N
source lines holding the most memory at the end of the run (tracing slows the run: do not read
its speed).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from kenning.pipeline.ingest import Source
from kenning.pipeline.offline import OfflineExtractor
from kenning.storage.inference.embedder import LocalEmbedder
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from kenning.workers.runtime.wiring import Wiring

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "data" / "twowiki_101" / "2wikimultihopqa_corpus.json"


class RecordingEmbedder:
    """Passes calls through, keeping each call's texts for the replay."""

    def __init__(self, inner: LocalEmbedder) -> None:
        self.inner = inner
        self.calls: list[list[str]] = []
        self.seconds = 0.0
        self._mutex = threading.Lock()

    @property
    def dimension(self) -> int:
        return self.inner.dimension

    @property
    def model(self) -> str:
        return self.inner.model

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        started = time.perf_counter()
        vectors = self.inner.embed(texts)
        with self._mutex:
            self.calls.append(list(texts))
            self.seconds += time.perf_counter() - started
        return vectors


def documents(count: int) -> list[Source]:
    paragraphs = json.loads(CORPUS.read_text())[:count]
    return [
        Source(name=f"{p['title']}.txt", uri=f"2wiki:{i}", data=f"{p['title']}\n\n{p['text']}".encode())
        for i, p in enumerate(paragraphs)
    ]


def replay(embedder: LocalEmbedder, calls: list[list[str]]) -> tuple[int, float]:
    started = time.perf_counter()
    for texts in calls:
        embedder.embed(texts)
    return sum(len(texts) for texts in calls), time.perf_counter() - started


def warm_up(embedder: LocalEmbedder, count: int) -> None:
    """Embed texts like the pipeline's (from other documents) once, before measuring anything.

    The first pass over new input shapes is much slower than later ones (measured here:
    about 1.6x), so without this the pipeline would pay the warm-up and the replay would not.
    """
    paragraphs = json.loads(CORPUS.read_text())[count : count + 100]
    extractor = OfflineExtractor()
    texts: list[str] = []
    for paragraph in paragraphs:
        text = f"{paragraph['title']}\n\n{paragraph['text']}"
        extraction = extractor.extract(text)
        texts += [text, extraction.summary, *(n.name for n in extraction.graph.nodes)]
        texts += [edge.description for edge in extraction.graph.edges]
    embedder.embed(list(dict.fromkeys(texts)))


def run(count: int, out: Path) -> dict[str, float]:
    embedder = LocalEmbedder()
    started = time.perf_counter()
    embedder.embed(["warm up"])
    load_s = time.perf_counter() - started
    warm_up(embedder, count)
    recording = RecordingEmbedder(embedder)
    with tempfile.TemporaryDirectory() as home:
        settings = load_settings(home=Path(home))
        with Kenning(settings, Wiring(settings, {"embedder": recording})) as memory:
            started = time.perf_counter()
            memory.wiring.vectors.list_collections()  # opening the stores is startup, like the model load
            memory.wiring.graph.counts(memory.scope())
            open_s = time.perf_counter() - started
            sources = documents(count)
            started = time.perf_counter()
            memory.add(sources)
            add_s = time.perf_counter() - started
            started = time.perf_counter()
            pipeline_run = memory.cognify()
            cognify_s = time.perf_counter() - started
    stats = pipeline_run.stats
    embedded, raw_s = replay(embedder, recording.calls)
    figures = {
        "documents": count,
        "chunks": stats.get("chunks_to_extract", 0),
        "add_s": round(add_s, 3),
        "cognify_s": round(cognify_s, 3),
        "documents_per_s": round(count / cognify_s, 2),
        "chunks_per_s": round(stats.get("chunks_to_extract", 0) / cognify_s, 2),
        "nodes_written_per_s": round(stats.get("nodes", 0) / cognify_s, 1),
        "edges_written_per_s": round(stats.get("edges", 0) / cognify_s, 1),
        "nodes": stats.get("nodes", 0),
        "edges": stats.get("edges", 0),
        "embeddings": stats.get("embeddings", 0),
        "embeddings_per_s": round(embedded / cognify_s, 1),
        "embedding_s_in_pipeline": round(recording.seconds, 3),
        "embedder_raw_per_s": round(embedded / raw_s, 1),
        "pipeline_vs_raw_embedder": round((embedded / cognify_s) / (embedded / raw_s), 3),
        "model_load_s": round(load_s, 3),
        "stores_open_s": round(open_s, 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2))
    return figures


@contextmanager
def simulator_process() -> Iterator[tuple[str, int]]:
    """The LLM simulator (0 ms, no limits) in a process of its own; its base URL and pid."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "tests.simulator", "--port", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{base_url}/models", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("the simulator did not start") from None
                time.sleep(0.2)
        yield base_url, server.pid
    finally:
        server.terminate()
        server.wait(timeout=30)


def cpu_seconds(pid: int) -> float:
    """The user and system CPU seconds a live process has used (Linux `/proc`)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class StepTimes:
    """When each step reported its first and last progress, from the start of the run.

    `step_share` sums each step's busy time over threads and over the load passes that stream
    behind extraction; `wall_share` is what each step adds to the wall: from the end of the
    step before it (or its own start, if later) to its own end, over the wall time.
    """

    def __init__(self, started: float) -> None:
        self._started = started
        self._span: dict[str, list[float]] = {}

    def __call__(self, step: str, done: int, total: int) -> None:
        now = time.perf_counter() - self._started
        self._span.setdefault(step, [now, now])[1] = now

    def shares(self, wall_s: float) -> dict[str, float]:
        shares: dict[str, float] = {}
        previous_end = 0.0
        for step, (first, last) in sorted(self._span.items(), key=lambda item: item[1][1]):
            shares[step] = round(max(0.0, last - max(first, previous_end)) / wall_s, 3)
            previous_end = max(previous_end, last)
        return shares


PORTS = ("vectors", "graph", "lexical", "embedder", "extractor", "metadata", "chunks", "cache")


def overhead(count: int, llm: str, embeddings: str, trace: int) -> dict[str, Any]:
    """Cognify with the simulator for the LLM and/or the embeddings: speed, step shares, memory."""
    from bench.latency import Timed

    with simulator_process() as (base_url, simulator_pid), tempfile.TemporaryDirectory() as home:
        overrides: dict[str, Any] = {"home": Path(home)}
        if llm == "simulator":
            overrides |= {"llm_url": base_url, "llm_model": "sim"}
        if embeddings == "simulator":
            overrides |= {"embedding_provider": "openai", "embedding_url": base_url}
        else:
            overrides |= {"embedding_provider": embeddings}
        settings = load_settings(**overrides)
        with Kenning(settings) as memory:
            memory.wiring.embedder.embed(["warm up"])
            busy: dict[str, float] = defaultdict(float)
            lock = threading.Lock()
            for name in (
                "vectors",
                "graph",
                "lexical",
                "embedder",
                "extractor",
                "metadata",
                "chunks",
                "cache",
            ):
                port = getattr(memory.wiring, name)
                memory.wiring._made[name] = Timed(port, name, busy, lock)
            memory.add(documents(count))
            if trace:
                tracemalloc.start()
            started, cpu_started = time.perf_counter(), time.process_time()
            simulator_started = cpu_seconds(simulator_pid)
            steps = StepTimes(started)
            pipeline_run = memory.cognify(progress=steps)
            wall_s = time.perf_counter() - started
            cpu_s = time.process_time() - cpu_started
            simulator_cpu_s = cpu_seconds(simulator_pid) - simulator_started
            top = tracemalloc.take_snapshot().statistics("lineno")[:trace] if trace else []
            tracemalloc.stop()
    stats = pipeline_run.stats
    chunks = stats.get("chunks_to_extract", 0)
    by_port: dict[str, float] = defaultdict(float)
    for key, seconds in busy.items():
        by_port[key.split(".")[0]] += seconds
    return {
        "documents": count,
        "llm": llm,
        "embeddings": embeddings,
        "status": pipeline_run.status.value,
        "chunks": chunks,
        "cognify_s": round(wall_s, 2),
        "chunks_per_s": round(chunks / wall_s, 1),
        # CPU seconds over the cognify: this process's, and the simulator's beside it.
        "cpu_s": round(cpu_s, 2),
        "cpu_ms_per_chunk": round(cpu_s * 1000 / max(chunks, 1), 2),
        "simulator_cpu_s": round(simulator_cpu_s, 2),
        "step_share": {k[3:]: round(v / 1000 / wall_s, 3) for k, v in stats.items() if k.startswith("ms_")},
        "wall_share": steps.shares(wall_s),
        "busy_s": {name: round(seconds, 2) for name, seconds in sorted(by_port.items())},
        "busy_s_by_call": {k: round(v, 2) for k, v in sorted(busy.items(), key=lambda kv: -kv[1])[:12]},
        "nodes": stats.get("nodes", 0),
        "edges": stats.get("edges", 0),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "tracemalloc_top": [f"{stat.size / 2**20:.1f} MiB {stat.traceback}" for stat in top],
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--documents", type=int, default=200)
    parser.add_argument("--llm", choices=("offline", "simulator"), default="offline")
    parser.add_argument("--embeddings", choices=("local", "simulator", "hash"), default="local")
    parser.add_argument("--tracemalloc", type=int, default=0, metavar="N", help="the N biggest lines")
    parser.add_argument("--out", type=Path, default=None, help="default: under bench/results")
    args = parser.parse_args(argv)
    if not CORPUS.exists():
        sys.exit(f"the corpus is missing: {CORPUS}")
    results = ROOT / "bench" / "results"
    if args.llm == "offline" and args.embeddings == "local" and not args.tracemalloc:
        print(json.dumps(run(args.documents, args.out or results / "ingest.json"), indent=2))
        return
    figures = overhead(args.documents, args.llm, args.embeddings, args.tracemalloc)
    out = args.out or results / f"ingest-{args.llm}-{args.embeddings}-{args.documents}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2))
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
