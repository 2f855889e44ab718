"""kenning with a real local model: extraction and answers on the samples and a HotpotQA subset.

    bash scripts/real_llm.sh start && python -m bench.real_llm [--questions 10]

The endpoint is KENNING_REAL_LLM_URL (an OpenAI-compatible /v1 URL, model KENNING_REAL_LLM_MODEL)
or else the server scripts/real_llm.sh started. Every other setting is kenning's default: it
paces that one-request-at-a-time CPU server by itself (docs/real-llm.md). Two sets, each
cognified in a fresh embedded home:

- `samples`: the bundled sample corpus (`kenning samples`) and the three demo questions;
- `hotpot`: the first N questions of ../shared/data/cognee_hotpot (hotpot_50) with their own
  gold and distractor paragraphs (ten a question, in corpus order), nothing else.

For each set: chunks extracted and failed (with the first errors), the structured-output rung
the endpoint's model settled on (as `kenning status` shows it), what the checks of the model's
replies repaired or dropped (the run's counters), LLM calls and seconds per extraction call. Then
every question is asked with HYBRID_COMPLETION, GRAPH_COMPLETION, RAG_COMPLETION (plain RAG
over CHUNKS) and GRAPH_COMPLETION with facts alone (`passages` 0) with the same model (`--types`
chooses; GRAPH_COMPLETION_PASSAGES_ONLY gives its five passages and no fact,
GRAPH_COMPLETION_BELOW_FACTS the facts of the chunks below the passages too,
GRAPH_COMPLETION_ONE_CLOSEST no text of the second closest chunk below them): exact match and
token F1 against the gold answer, whether the gold answer (every key phrase of it) is in the
context and in the answer, and seconds per answer. Results go to
bench/results/real_llm.json. `--home DIR` keeps each set's store in DIR/<set>; a set already
cognified there is only asked again. `--extraction offline` has kenning's offline extractor build
the graph (no LLM, seconds), so that the model only answers: the reader compared on many
questions in the time one model-built graph of five takes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.qa import exact_match, normalize, token_f1
from kenning.pipeline.checks import CHECK_COUNTERS
from kenning.pipeline.errors import KenningError
from kenning.pipeline.ingest import Source
from kenning.retrieval.contract import SearchType
from kenning.workers.control.runs import structured_output
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from tests.real_llm.server import real_llm_model, real_llm_overrides, real_llm_url

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "workers" / "samples"
HOTPOT = ROOT.parent / "shared" / "data" / "cognee_hotpot"
RESULTS = ROOT / "bench" / "results"
PARAGRAPHS_PER_QUESTION = 10
# What each question is asked with: a name for the report, the search type and its options.
ASKED: dict[str, tuple[SearchType, dict[str, Any]]] = {
    "HYBRID_COMPLETION": (SearchType.HYBRID_COMPLETION, {}),
    "GRAPH_COMPLETION": (SearchType.GRAPH_COMPLETION, {}),
    "RAG_COMPLETION": (SearchType.RAG_COMPLETION, {}),
    # GRAPH_COMPLETION as it was before its contexts gave the best chunks' text: facts alone
    "GRAPH_COMPLETION_FACTS_ONLY": (SearchType.GRAPH_COMPLETION, {"passages": 0}),
    # GRAPH_COMPLETION with the text of its five best chunks and no fact (`top_edges` 5)
    "GRAPH_COMPLETION_PASSAGES_ONLY": (SearchType.GRAPH_COMPLETION, {"top_edges": 5}),
    # GRAPH_COMPLETION as it was before its reader's context left out the facts of the chunks
    # below the passages (they are among its results either way)
    "GRAPH_COMPLETION_BELOW_FACTS": (SearchType.GRAPH_COMPLETION, {"below_facts": True}),
    # GRAPH_COMPLETION as it was before the question's second closest chunk gave its text
    # wherever the walk ranked it (the closest is always a passage)
    "GRAPH_COMPLETION_ONE_CLOSEST": (SearchType.GRAPH_COMPLETION, {"closest_passages": 1}),
}
# What a run asks by default: each type, and the graph's facts alone.
DEFAULT_TYPES = ("HYBRID_COMPLETION", "GRAPH_COMPLETION", "RAG_COMPLETION", "GRAPH_COMPLETION_FACTS_ONLY")


@dataclass(frozen=True)
class Question:
    text: str
    gold: str
    keys: tuple[str, ...] = ()

    @property
    def phrases(self) -> tuple[str, ...]:
        """What a context or an answer must hold to hold the gold answer."""
        return self.keys or (self.gold,)


SAMPLE_QUESTIONS = (
    Question("Who founded the Harrow Point lighthouse keepers' guild?", "Elinor Vance"),
    Question(
        "Which ship ran aground near Harrow Point, and what happened to its cargo?",
        "The Osprey: most of its tea was lost to the sea, and divers recovered its porcelain in 1890",
        ("Osprey", "porcelain"),
    ),
    Question(
        "How did the lighthouse lamp change over the years?",
        "Whale oil, then a paraffin lamp with a Fresnel lens in 1868, electricity in 1931, "
        "automated in 1987, and a solar-powered LED lantern since 2011",
        ("whale oil", "paraffin", "electricity", "LED"),
    ),
)


def samples() -> tuple[list[Source], list[Question]]:
    sources = [
        Source(name=path.name, uri=f"samples:{path.name}", data=path.read_bytes())
        for path in sorted(SAMPLES.glob("*.md"))
    ]
    return sources, list(SAMPLE_QUESTIONS)


def hotpot(questions: int, first: int = 0) -> tuple[list[Source], list[Question]]:
    """Questions `first` to `first + questions` of hotpot_50, with their own paragraphs."""
    corpus = json.loads((HOTPOT / "hotpot_50_corpus.json").read_text())
    pairs = json.loads((HOTPOT / "hotpot_50_qa_pairs.json").read_text())[first : first + questions]
    start = first * PARAGRAPHS_PER_QUESTION
    paragraphs = corpus[start : start + len(pairs) * PARAGRAPHS_PER_QUESTION]
    sources = [
        Source(name=f"paragraph-{i}.txt", uri=f"hotpot:{i}", data=text.encode())
        for i, text in enumerate(paragraphs, start)
    ]
    return sources, [Question(p["question"], p["answer"]) for p in pairs]


def holds(text: str, question: Question) -> bool:
    found = normalize(text)
    return all(normalize(phrase) in found for phrase in question.phrases)


def extraction(memory: Kenning, dataset: str, seconds: float) -> dict[str, Any]:
    """What the cognify of `dataset` extracted, failed, repaired and dropped, and what it took."""
    (status,) = memory.status(dataset)
    run = status["runs"][0]
    stats: dict[str, int] = run["stats"]
    calls = status["llm_calls"]
    errors = sorted({chunk["error"][:300] for chunk in status["failed_chunks"]})
    return {
        "run_status": run["status"],
        "chunks": stats.get("chunks_to_extract", 0),
        "extracted": stats.get("extractions", 0),
        "failed": stats.get("failed_chunks", 0),
        "first_errors": errors[:3],
        "structured_output_rung": structured_output(memory),
        "validation": {name: stats.get(name, 0) for name in CHECK_COUNTERS},
        "graph": status["graph"],
        "llm_calls": calls,
        "tokens": status["tokens"],
        "cognify_s": round(seconds, 1),
        "seconds_per_extraction_call": round(stats.get("ms_extract", 0) / 1000 / calls, 1) if calls else None,
        "stats": stats,
    }


def ask(memory: Kenning, dataset: str, asked: str, question: Question) -> dict[str, Any]:
    search_type, options = ASKED[asked]
    started = time.perf_counter()
    try:
        result = memory.search(question.text, search_type, datasets=[dataset], options=options)
        answer, context, error = result.answer or "", result.context, ""
    except KenningError as failure:
        answer, context, error = "", "", str(failure)[:300]
    return {
        "question": question.text,
        "gold": question.gold,
        "answer": answer,
        "error": error,
        "em": exact_match(answer, question.gold),
        "f1": token_f1(answer, question.gold),
        "answer_holds_gold": holds(answer, question),
        "context_holds_gold": holds(context, question),
        "context": context,
        "seconds": round(time.perf_counter() - started, 1),
    }


def answers(rows: list[dict[str, Any]]) -> dict[str, Any]:
    count = max(len(rows), 1)
    return {
        "exact_match": round(sum(r["em"] for r in rows) / count, 3),
        "f1": round(sum(r["f1"] for r in rows) / count, 3),
        "gold_in_context": round(sum(r["context_holds_gold"] for r in rows) / count, 3),
        "gold_in_answer": round(sum(r["answer_holds_gold"] for r in rows) / count, 3),
        "errors": sum(bool(r["error"]) for r in rows),
        "seconds_per_answer": round(statistics.mean(r["seconds"] for r in rows), 1) if rows else None,
        "rows": rows,
    }


def evaluate(
    url: str,
    name: str,
    sources: list[Source],
    questions: list[Question],
    keep: Path | None = None,
    kinds: Sequence[str] = DEFAULT_TYPES,
    saved: Callable[[dict[str, Any]], None] = lambda figures: None,
    offline: bool = False,
) -> dict[str, Any]:
    """Cognify `sources` as dataset `name` and ask `questions`; the figures, to which each step
    adds its own and then calls `saved`. With `keep`, the home is that folder and stays; a
    dataset it already holds is not cognified again (only asked). With `offline`, kenning's
    offline extractor builds the graph (no LLM) and the model only answers."""
    figures: dict[str, Any] = {
        "set": name,
        "documents": len(sources),
        "questions": len(questions),
        "extractor": "offline" if offline else "model",
    }
    with tempfile.TemporaryDirectory() as scratch:
        home = keep / name if keep else Path(scratch)
        real = load_settings(home=home, **real_llm_overrides(url))
        started = time.perf_counter()
        reused = built_offline(home, sources, name) if offline else None
        with Kenning(real) as memory:
            if reused is None:
                reused = built(memory, sources, name)
            figures["extraction"] = extraction(memory, name, time.perf_counter() - started)
            figures["extraction"]["reused"] = reused
            print(f"{name}: {brief(figures['extraction'])}", flush=True)
            asked(memory, questions, kinds, figures, saved)
    return figures


def cognified(memory: Kenning, name: str) -> bool:
    """Whether the home already holds a finished cognify of dataset `name`."""
    try:
        runs = memory.status(name)[0]["runs"]
    except KenningError:
        return False
    return any(run["status"] not in ("started", "queued") for run in runs)


def built(memory: Kenning, sources: list[Source], name: str) -> bool:
    """Add and cognify `sources` as dataset `name`, unless the home holds it already (True)."""
    if cognified(memory, name):
        return True
    memory.add(sources, name)
    memory.cognify(name)
    return False


def built_offline(home: Path, sources: list[Source], name: str) -> bool:
    """`built` by kenning's offline extractor (no LLM), in a Kenning of its own on `home`."""
    with Kenning(load_settings(home=home)) as memory:
        return built(memory, sources, name)


def asked(
    memory: Kenning,
    questions: list[Question],
    kinds: Sequence[str],
    figures: dict[str, Any],
    saved: Callable[[dict[str, Any]], None],
) -> None:
    """Ask every question with each type, adding to `figures` and calling `saved` before the
    first type and after each, so that a run stopped early keeps what it measured."""
    name = figures["set"]
    figures["answers"] = {}
    saved(figures)
    for kind in kinds:
        rows = []
        for number, question in enumerate(questions, 1):
            rows.append(ask(memory, name, kind, question))
            print(
                f"{name} {kind} {number}/{len(questions)}: em {rows[-1]['em']:.0f} f1 {rows[-1]['f1']:.2f}",
                flush=True,
            )
        figures["answers"][kind] = answers(rows)
        print(f"{name} {kind}: {brief(figures['answers'][kind])}", flush=True)
        saved(figures)


def brief(figures: dict[str, Any]) -> str:
    """Figures as one JSON line, without their rows and counters."""
    return json.dumps({k: v for k, v in figures.items() if k not in ("rows", "stats")})


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=10, help="first N questions of hotpot_50")
    parser.add_argument("--first", type=int, default=0, help="hotpot_50 question to start at (0: the first)")
    parser.add_argument("--sets", default="samples,hotpot", help="comma-separated: samples, hotpot")
    parser.add_argument("--out", type=Path, default=RESULTS / "real_llm.json")
    parser.add_argument(
        "--types", default=",".join(DEFAULT_TYPES), help=f"comma-separated, of {', '.join(ASKED)}"
    )
    parser.add_argument(
        "--home", type=Path, help="keep each set's store in HOME/<set>; a set cognified there is only asked"
    )
    parser.add_argument(
        "--extraction",
        choices=("model", "offline"),
        default="model",
        help="who builds the graph: the model, or kenning's offline extractor (the model only answers)",
    )
    args = parser.parse_args(argv)
    url = real_llm_url()
    if not url:
        sys.exit("no real LLM: run `bash scripts/real_llm.sh start` or set KENNING_REAL_LLM_URL (a /v1 URL)")
    model = real_llm_model()
    sets: dict[str, Callable[[], tuple[list[Source], list[Question]]]] = {
        "samples": samples,
        "hotpot": lambda: hotpot(args.questions, args.first),
    }
    kinds = [kind.strip() for kind in args.types.split(",") if kind.strip()]
    if not kinds or set(kinds) - set(ASKED):
        sys.exit(f"unknown types {sorted(set(kinds) - set(ASKED))}; choose from {sorted(ASKED)}")
    wanted = [name.strip() for name in args.sets.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in sets]
    if unknown or not wanted:
        sys.exit(f"unknown sets {unknown}; choose from {sorted(sets)}")
    # Settings other than the defaults come from KENNING_* variables; the report names them.
    changed = {k: v for k, v in os.environ.items() if k.startswith("KENNING_") and "KEY" not in k}
    report: dict[str, Any] = {
        "url": url,
        "model": model,
        "settings": {k: v for k, v in real_llm_overrides(url).items() if k != "llm_url"},
        "environment": changed,
        "hotpot_questions": [args.first, args.first + args.questions],
        "extraction": args.extraction,
        "complete": False,
        "sets": {},
    }
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)

    def write() -> None:
        out.write_text(json.dumps(report, indent=2) + "\n")

    def save(figures: dict[str, Any]) -> None:
        report["sets"][figures["set"]] = figures
        write()

    for name in wanted:
        sources, questions = sets[name]()
        evaluate(url, name, sources, questions, args.home, kinds, save, args.extraction == "offline")
    report["complete"] = True
    write()
    print(f"written to {out}")


if __name__ == "__main__":
    main()
