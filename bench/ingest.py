"""Ingestion throughput, embedded, offline extractor, local embeddings.

Ingests the first N paragraphs of the 2WikiMultihopQA corpus (one document each),
then replays exactly the texts the pipeline embedded through the embedder alone, so
the pipeline's embedding rate can be compared with the embedder's raw rate.

    python -m bench.ingest --documents 200
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from kenning.pipeline.ingest import Source
from kenning.pipeline.offline import OfflineExtractor
from kenning.storage.embedder import LocalEmbedder
from kenning.workers.memory import Kenning
from kenning.workers.settings import load_settings
from kenning.workers.wiring import Wiring

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


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--documents", type=int, default=200)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "ingest.json")
    args = parser.parse_args(argv)
    if not CORPUS.exists():
        sys.exit(f"the corpus is missing: {CORPUS}")
    print(json.dumps(run(args.documents, args.out), indent=2))


if __name__ == "__main__":
    main()
