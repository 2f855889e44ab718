"""Retrieval quality without an LLM: supporting-paragraph recall on multi-hop QA sets.

Ingests a corpus, each paragraph its own document named by its title (text: the title, a
blank line, the paragraph), embedded, with the offline extractor and the local embedder;
then asks every question with several search types (context only) and measures how many
of its gold supporting paragraphs the hits come from: recall@2, @5, @10, and the share of
questions whose gold paragraphs are all within the first 5. A hit counts for the paragraph
of the document its chunk belongs to; repeated paragraphs count once, at their best rank.

    python -m bench.retrieval --dataset hotpotqa
    python -m bench.retrieval --dataset twowiki --home /tmp/twowiki --split test
    python -m bench.retrieval --dataset twowiki --home /tmp/twowiki --tune
    python -m bench.retrieval --dataset hotpotqa --home /tmp/hotpot --tune-facts --split dev

Every question set is split in two by question with a fixed seed: a development half, on
which settings may be chosen (`--tune` picks HYBRID_COMPLETION's lane weights there, from a
small grid; `--tune-walk` the walk's chunk and title weights, `--tune-facts` its name links and
fact seeds), and a test half, which only reports. `--split` says which halves to report.

Data is read from ../shared/data, never copied. 2Wiki uses all its paragraphs unless
`--limit N` keeps every gold paragraph of the questions plus N distractors taken at an even
stride through the rest of the corpus (which is grouped by question, so each question keeps
some of its own). `--home DIR` keeps the stores there: a second run with the same DIR skips
ingestion.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kenning.pipeline.ingest import Source
from kenning.pipeline.models import Scope
from kenning.retrieval.contract import Hit, SearchRequest, SearchType
from kenning.retrieval.fusion import LANES, FusionConfig
from kenning.retrieval.registry import search
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data"
RESULTS = ROOT / "bench" / "results"
CUTOFFS = (2, 5, 10)
TYPES = (
    SearchType.CHUNKS,
    SearchType.CHUNKS_LEXICAL,
    SearchType.HYBRID_COMPLETION,
    SearchType.GRAPH_COMPLETION,
    SearchType.GRAPH_PPR,
)
SPLITS = ("dev", "test")
SPLIT_SEED = 10
# The lane weights --tune tries on the development half; the other lanes keep their defaults.
GRID = {"lexical": (0.5, 0.75, 1.0), "graph": (0.0, 0.5, 1.0, 2.0, 4.0)}
# The walk's restart share of the dense chunk seeds, and the weight of a chunk's edge to its title.
WALK_GRID = {"chunk_weight": (0.0, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0), "about_weight": (0.0, 1.0, 4.0, 8.0)}
# How far a question name may be from an entity's, and the facts closest to the question the walk
# restarts at (how many, and their share beside the names).
FACT_GRID = {"link_distance": (0.15, 0.2, 0.25), "fact_seeds": (0, 2, 3, 5), "fact_share": (0.25, 0.5, 1.0)}
# The types whose chunks come from the walk.
WALKING = (SearchType.GRAPH_PPR, SearchType.GRAPH_COMPLETION, SearchType.HYBRID_COMPLETION)


@dataclass(frozen=True)
class Question:
    text: str
    gold: frozenset[str]


@dataclass(frozen=True)
class Benchmark:
    name: str
    paragraphs: dict[str, str]
    questions: list[Question]
    selection: str


def hotpotqa() -> Benchmark:
    folder = DATA / "hotpotqa_100"
    corpus: dict[str, list[str]] = json.loads((folder / "hotpotqa_train_corpus.json").read_text())
    records = json.loads((folder / "hotpotqa_train.json").read_text())
    questions = [
        Question(record["question"], frozenset(title for title, _ in record["supporting_facts"]))
        for record in records
    ]
    paragraphs = {title: "".join(sentences).strip() for title, sentences in corpus.items()}
    return Benchmark("hotpotqa", paragraphs, questions, f"all {len(paragraphs)} paragraphs")


def twowiki(limit: int | None) -> Benchmark:
    folder = DATA / "twowiki_101"
    corpus = json.loads((folder / "2wikimultihopqa_corpus.json").read_text())
    records = json.loads((folder / "results_vdb_2wikimultihopqa_101.json").read_text())
    questions = [Question(record["question"], frozenset(record["ground_truth"])) for record in records]
    paragraphs = {p["title"]: p["text"] for p in corpus}
    if limit is None or limit >= len(paragraphs):
        return Benchmark("twowiki", paragraphs, questions, f"all {len(paragraphs)} paragraphs")
    gold = set().union(*(question.gold for question in questions))
    others = [title for title in paragraphs if title not in gold]
    stride = max(1, len(others) // max(limit, 1))
    kept = gold | set(others[::stride][:limit])
    selection = (
        f"{len(gold)} gold paragraphs + {len(kept) - len(gold)} distractors "
        f"(one in {stride} of the other paragraphs, in corpus order) of {len(paragraphs)}"
    )
    return Benchmark("twowiki", {t: x for t, x in paragraphs.items() if t in kept}, questions, selection)


def split(questions: list[Question]) -> dict[str, list[Question]]:
    """Development and test halves, by question, the same for every run (a fixed seed)."""
    order = list(range(len(questions)))
    random.Random(SPLIT_SEED).shuffle(order)
    half = len(order) // 2
    return {
        "dev": [questions[i] for i in sorted(order[:half])],
        "test": [questions[i] for i in sorted(order[half:])],
    }


def sources(benchmark: Benchmark) -> list[Source]:
    return [
        Source(name=title, uri=f"{benchmark.name}:{title}", data=f"{title}\n\n{text}".encode())
        for title, text in benchmark.paragraphs.items()
    ]


def chunk_titles(memory: Kenning, scope: Scope) -> dict[str, str]:
    """Chunk id -> the title (document name) of the paragraph it belongs to."""
    metadata, chunks = memory.wiring.metadata, memory.wiring.chunks
    dataset = metadata.get_dataset(scope)
    if dataset is None:
        return {}
    names = {document.id: document.name for document in chunks.list_documents(dataset.id)}
    records = chunks.get_chunks(chunks.list_chunk_ids(dataset.id))
    return {record.id: names[record.document_id] for record in records}


def ranked_titles(hits: Sequence[Hit], titles: dict[str, str]) -> list[str]:
    found = (titles.get(hit.chunk_id or "") for hit in hits)
    return list(dict.fromkeys(title for title in found if title))


def scores(ranked: list[str], gold: frozenset[str]) -> dict[str, float]:
    figures = {f"recall@{k}": len(gold & set(ranked[:k])) / len(gold) for k in CUTOFFS}
    figures["all@5"] = float(gold <= set(ranked[:5]))
    return figures


def evaluate(
    memory: Kenning,
    questions: list[Question],
    titles: dict[str, str],
    kind: SearchType,
    options: dict[str, Any],
) -> dict[str, Any]:
    per_question: list[dict[str, float]] = []
    latencies: list[float] = []
    for question in questions:
        started = time.perf_counter()
        request = SearchRequest(
            query=question.text,
            type=kind,
            scopes=[memory.scope()],
            top_k=10,
            only_context=True,
            options=options,
        )
        result = search(memory.wiring, request)
        latencies.append(time.perf_counter() - started)
        per_question.append(scores(ranked_titles(result.results, titles), question.gold))
    return summary(per_question, latencies)


def summary(per_question: list[dict[str, float]], latencies: list[float]) -> dict[str, Any]:
    figures: dict[str, Any] = {
        name: round(statistics.mean(q[name] for q in per_question), 4) for name in per_question[0]
    }
    latencies = sorted(latencies)
    figures["latency_ms_p50"] = round(1000 * latencies[len(latencies) // 2], 1)
    figures["latency_ms_p95"] = round(1000 * latencies[int(len(latencies) * 0.95)], 1)
    figures["questions"] = len(per_question)
    return figures


@contextmanager
def opened(home: Path | None) -> Iterator[Kenning]:
    with tempfile.TemporaryDirectory() as scratch:
        settings = load_settings(home=home or Path(scratch), embedding_provider="local", llm_url="")
        with Kenning(settings) as memory:
            yield memory


def ingest(memory: Kenning, benchmark: Benchmark) -> dict[str, Any]:
    started = time.perf_counter()
    added = memory.add(sources(benchmark))
    run = memory.cognify()
    if run.status.value != "completed":
        raise SystemExit(f"cognify failed: {run.error}")
    return {
        "documents": len(benchmark.paragraphs),
        "added": len(added.added),
        "seconds": round(time.perf_counter() - started, 1),
        "stats": run.stats,
    }


def run(
    benchmark: Benchmark,
    home: Path | None,
    options: dict[str, Any],
    lanes: bool,
    splits: tuple[str, ...],
    tune: bool,
    tune_walk_too: bool = False,
    tune_facts: bool = False,
) -> dict[str, Any]:
    halves = split(benchmark.questions)
    with opened(home) as memory:
        ingestion = ingest(memory, benchmark)
        print(f"ingested: {json.dumps(ingestion)}", file=sys.stderr)
        titles = chunk_titles(memory, memory.scope())
        walking = tune_walk(memory, halves["dev"], titles) if tune_walk_too else None
        walk_options = walking["options"] if walking else {}
        facts = tune_walk(memory, halves["dev"], titles, FACT_GRID, base=walk_options) if tune_facts else None
        walk_options = {**walk_options, **(facts["options"] if facts else {})}
        tuning = tune_weights(memory, halves["dev"], titles, {**options, **walk_options}) if tune else None
        hybrid = {**options, **walk_options, "weights": tuning["weights"]} if tuning else options
        results: dict[str, Any] = {}
        for name in splits:
            results[name] = measure(memory, halves[name], titles, hybrid, lanes, walk_options)
    return {
        "dataset": benchmark.name,
        "corpus": benchmark.selection,
        "questions": {name: len(halves[name]) for name in SPLITS},
        "split_seed": SPLIT_SEED,
        "embedder": "local all-MiniLM-L6-v2",
        "extractor": "offline",
        "top_k": 10,
        "hybrid_options": hybrid,
        "tuning": tuning,
        "walk_tuning": walking,
        "fact_tuning": facts,
        "ingestion": ingestion,
        "results": results,
    }


def measure(
    memory: Kenning,
    questions: list[Question],
    titles: dict[str, str],
    options: dict[str, Any],
    lanes: bool,
    walk_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for kind in TYPES:
        chosen = options if kind == SearchType.HYBRID_COMPLETION else {}
        if kind in WALKING:
            chosen = {**(walk_options or {}), **chosen}
        results[kind.value] = evaluate(memory, questions, titles, kind, chosen)
        print(f"{kind.value:>18}: {json.dumps(results[kind.value])}", file=sys.stderr)
    for lane in LANES if lanes else ():
        alone = {**options, "weights": {lane: 1.0}}
        name = f"HYBRID lane {lane} alone"
        results[name] = evaluate(memory, questions, titles, SearchType.HYBRID_COMPLETION, alone)
        print(f"{name}: {json.dumps(results[name])}", file=sys.stderr)
    return results


def tune_weights(
    memory: Kenning, dev: list[Question], titles: dict[str, str], options: dict[str, Any]
) -> dict[str, Any]:
    """HYBRID_COMPLETION's lane weights with the best recall@5 (then all@5) on the development half."""
    base = FusionConfig.model_validate(options).weights
    tried: list[dict[str, Any]] = []
    for values in itertools.product(*GRID.values()):
        weights = {**base, **dict(zip(GRID, values, strict=True))}
        figures = evaluate(memory, dev, titles, SearchType.HYBRID_COMPLETION, {**options, "weights": weights})
        tried.append({"weights": weights, "recall@5": figures["recall@5"], "all@5": figures["all@5"]})
        print(f"tune {json.dumps(tried[-1])}", file=sys.stderr)
    best = max(tried, key=lambda entry: (entry["recall@5"], entry["all@5"]))
    return {"on": "dev", "grid": GRID, "weights": best["weights"], "tried": tried}


def tune_walk(
    memory: Kenning,
    dev: list[Question],
    titles: dict[str, str],
    grid: Mapping[str, Sequence[float]] = WALK_GRID,
    base: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """GRAPH_PPR's walk options of `grid` (beside `base`) with the best recall@5 (then all@5, then
    recall@2) on the development half; the first tried of those that tie."""
    tried: list[dict[str, Any]] = []
    for values in itertools.product(*grid.values()):
        chosen = {**(base or {}), **dict(zip(grid, values, strict=True))}
        figures = evaluate(memory, dev, titles, SearchType.GRAPH_PPR, chosen)
        tried.append(
            {"options": chosen, **{name: figures[name] for name in ("recall@2", "recall@5", "all@5")}}
        )
        print(f"tune walk {json.dumps(tried[-1])}", file=sys.stderr)
    best = max(tried, key=lambda entry: (entry["recall@5"], entry["all@5"], entry["recall@2"]))
    return {"on": "dev", "grid": grid, "options": best["options"], "tried": tried}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--dataset", choices=("hotpotqa", "twowiki"), required=True)
    parser.add_argument("--limit", type=int, default=None, help="twowiki: distractors kept beside the gold")
    parser.add_argument("--home", type=Path, default=None, help="keep the stores here and reuse them")
    parser.add_argument("--options", default="{}", help="HYBRID_COMPLETION options as JSON")
    parser.add_argument("--lanes", action="store_true", help="also measure each hybrid lane alone")
    parser.add_argument("--split", choices=("dev", "test", "both"), default="both", help="halves reported")
    parser.add_argument("--tune", action="store_true", help="choose the hybrid lane weights on the dev half")
    parser.add_argument(
        "--tune-walk", action="store_true", help="choose the walk's chunk and title weights on the dev half"
    )
    parser.add_argument(
        "--tune-facts",
        action="store_true",
        help="choose the walk's name links and fact seeds on the dev half",
    )
    args = parser.parse_args(argv)
    benchmark = hotpotqa() if args.dataset == "hotpotqa" else twowiki(args.limit)
    splits = SPLITS if args.split == "both" else (args.split,)
    options = json.loads(args.options)
    report = run(
        benchmark, args.home, options, args.lanes, splits, args.tune, args.tune_walk, args.tune_facts
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"retrieval-{args.dataset}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
