"""Conversational memory on LoCoMo, no LLM: evidence recall, latency and the cost of forgetting.

    python -m bench.locomo --conversations 5 --embedding local

Each conversation is remembered, one `remember` call per session, into its own dataset of
a fresh embedded home: every message is one data item whose id is its dia_id, with its
speaker and the session's date (an image a speaker shares is kept as its caption, as in
the LoCoMo baselines). Then every question is recalled with `recall`'s default (AUTO, as a
user gets it) and with every search type that retrieves without an LLM (context only), and
each result's cited data item is mapped back to its dia_id. Evidence recall@k is the share
of a question's gold dia_ids cited by its first k results; recall@20 and @50 (from one
more, untimed, recall of 50) say how deep the rest sits. Categories 1-4 make the overall
figure; category 5 (adversarial: the answer is not in the conversation) is reported apart.

The questions are drawn, by a fixed seed, into a dev half and a test half. Every figure is
given for both halves, overall and per category, in one table with the types side by side
(`table`). CONVERSATION's options (its time and graph lanes' weights) are chosen on the dev
half (`tuned`), and the test half is where the choice is reported.

Also measured: remember latency (per message, and per call), recall latency per type, and
`forget` of one data item from a dataset of 1,000 messages. `recall_latency` gives the default's
per question (p50, p95, p99, max, and per conversation) beside its 50 ms target and the load
average: each conversation is remembered before it is asked, so the embedder is loaded and no
recall pays for it. `--latency` asks with the default only (no tuning grid, no forget): that
figure alone, in a few minutes. Data is read from ../shared/data/locomo, never copied.
Results go to bench/results/locomo.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from kenning.workers.application.lifecycle import Message
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "locomo" / "locomo5.json"
RESULTS = ROOT / "bench" / "results"
# `recall` with no type: what a user gets.
DEFAULT = "default"
TYPES = (
    DEFAULT,
    "CHUNKS",
    "CHUNKS_LEXICAL",
    "SUMMARIES",
    "TRIPLET_COMPLETION",
    "GRAPH_PPR",
    "GRAPH_COMPLETION",
    "HYBRID_COMPLETION",
    "CONVERSATION",
)
TUNED = "CONVERSATION"
# CONVERSATION's lanes at their default weights, and the weights tried for the time lanes and
# the graph lane on the dev questions; the best there is reported on test.
BASE_WEIGHTS = {
    "turns": 1.0,
    "chunks": 1.0,
    "lexical": 1.0,
    "lexical_context": 1.0,
    "dated": 2.0,
    "speaker": 2.0,
}
GRID = {"timed": (1.0, 2.0, 3.0), "ordered": (1.0,), "graph": (0.0, 1.0)}
SPLIT_SEED = 8
DEV_SHARE = 0.5
CUTOFFS = (5, 10)
TOP_K = 10
# How deep the gold sits, from one more (untimed) recall of the first 50: what a better
# ordering of the same candidates could reach at 10.
REACH = (20, 50)
# The default recall's p95 per question that this size of memory should stay under (issue target).
LATENCY_TARGET_MS = 50.0
ADVERSARIAL = 5
# Temporal recall@10 on the test half before time was read generally: CONVERSATION, the best type
# then, at commit 165ebc3 (five conversations, local MiniLM, seed 8).
TEMPORAL_TEST_BEFORE = 0.8312
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
SESSION = re.compile(r"session_(\d+)")
DIA_ID = re.compile(r"D:?(\d+):(\d+)")
ID_PREFIX = "id:"


@dataclass(frozen=True)
class Question:
    text: str
    gold: frozenset[str]
    category: int
    split: str = "dev"


@dataclass
class Conversation:
    name: str
    sessions: list[list[Message]]
    questions: list[Question]
    dropped_evidence: list[str] = field(default_factory=list)

    @property
    def messages(self) -> int:
        return sum(len(session) for session in self.sessions)


def session_time(text: str) -> datetime:
    """`1:56 pm on 8 May, 2023` -> 2023-05-08 13:56."""
    return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y")


def message_text(turn: dict[str, Any]) -> str:
    caption = turn.get("blip_caption")
    return f"{turn['text']} [shares an image: {caption}]" if caption else str(turn["text"])


def conversation_of(record: dict[str, Any]) -> Conversation:
    """A LoCoMo record as sessions of messages and questions whose gold ids exist.

    The annotations hold a few malformed ids (`D:11:26`, `D8:6; D9:17`): they are repaired;
    one naming no message of the conversation is dropped and listed.
    """
    dialogue = record["conversation"]
    numbers = sorted(int(m.group(1)) for key in dialogue if (m := SESSION.fullmatch(key)))
    sessions = [
        [
            Message(
                speaker=turn["speaker"],
                text=message_text(turn),
                time=session_time(dialogue[f"session_{n}_date_time"]),
                id=turn["dia_id"],
            )
            for turn in dialogue[f"session_{n}"]
        ]
        for n in numbers
    ]
    known = {message.id for session in sessions for message in session}
    dropped: list[str] = []
    questions = []
    for qa in record["qa"]:
        gold: set[str] = set()
        for raw in qa.get("evidence", []):
            found = [f"D{s}:{t}" for s, t in DIA_ID.findall(raw)]
            gold.update(dia for dia in found if dia in known)
            if not found or any(dia not in known for dia in found):
                dropped.append(raw)
        if gold:
            questions.append(Question(qa["question"], frozenset(gold), int(qa["category"])))
    name = str(record.get("sample_id") or "conversation")
    return Conversation(name, sessions, questions, dropped)


def load(path: Path, count: int | None) -> list[Conversation]:
    records = json.loads(path.read_text())
    return split([conversation_of(record) for record in records[:count]])


def split(conversations: list[Conversation], seed: int = SPLIT_SEED) -> list[Conversation]:
    """Each question drawn into `dev` (tuning) or `test` (reporting), by a fixed seed, in file order."""
    draw = random.Random(seed)
    for conversation in conversations:
        conversation.questions = [
            Question(q.text, q.gold, q.category, "dev" if draw.random() < DEV_SHARE else "test")
            for q in conversation.questions
        ]
    return conversations


def grid() -> list[dict[str, Any]]:
    """CONVERSATION's options for every combination of the GRID's lane weights."""
    combinations = [dict(zip(GRID, values, strict=True)) for values in itertools.product(*GRID.values())]
    return [{"weights": {**BASE_WEIGHTS, **weights}} for weights in combinations]


def option_label(options: dict[str, Any]) -> str:
    weights = options.get("weights", {})
    return ",".join(f"{lane}={weights[lane]:g}" for lane in GRID if lane in weights)


@contextmanager
def opened(embedding: str) -> Iterator[Kenning]:
    """A fresh embedded home, offline extractor, dropped on exit."""
    with tempfile.TemporaryDirectory(prefix="kenning-locomo-") as home:
        with Kenning(load_settings(home=home, embedding_provider=embedding, llm_url="")) as memory:
            yield memory


def remember(memory: Kenning, sessions: Sequence[Sequence[Message]], dataset: str) -> list[float]:
    """Remember each session with one call; the seconds of each call."""
    seconds = []
    for session in sessions:
        started = time.perf_counter()
        done = memory.remember(list(session), dataset)
        seconds.append(time.perf_counter() - started)
        if done.status != "completed":
            raise SystemExit(f"remember in {dataset} ended {done.status}")
    return seconds


def dia_ids(memory: Kenning, dataset: str) -> dict[str, str]:
    """Data item id -> the message id it was remembered under (its source is `id:<message id>`)."""
    metadata = memory.wiring.metadata
    found = metadata.get_dataset(memory.scope(dataset))
    if found is None:
        return {}
    items = metadata.list_items(found.id)
    return {
        item.id: item.source.removeprefix(ID_PREFIX) for item in items if item.source.startswith(ID_PREFIX)
    }


def cited(data_ids: Sequence[str | None], names: dict[str, str]) -> list[str]:
    """The dia_id each result cites, in result order (None where it cites no known item)."""
    return [names.get(data_id or "", "") for data_id in data_ids]


def recall_at(citations: Sequence[str], gold: frozenset[str], k: int) -> float:
    return len(gold & set(citations[:k])) / len(gold)


def ask(
    memory: Kenning,
    dataset: str,
    questions: Sequence[Question],
    kind: str,
    names: dict[str, str],
    options: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """One row per question: its category, split, recall at each cutoff and the recall's latency."""
    rows = []
    chosen = {} if kind == DEFAULT else {"type": kind}
    for question in questions:
        started = time.perf_counter()
        recalled = memory.recall(question.text, [dataset], top_k=TOP_K, options=options, **chosen)
        seconds = time.perf_counter() - started
        citations = cited([result.data_id for result in recalled.results], names)
        row: dict[str, Any] = {"category": question.category, "split": question.split, "seconds": seconds}
        row["searched"] = "+".join(recalled.searched)
        row.update({f"recall@{k}": recall_at(citations, question.gold, k) for k in CUTOFFS})
        deeper = memory.recall(question.text, [dataset], top_k=max(REACH), options=options, **chosen)
        reached = cited([result.data_id for result in deeper.results], names)
        row.update({f"recall@{k}": recall_at(reached, question.gold, k) for k in REACH})
        row["uncited"] = sum(1 for dia in citations if not dia)
        rows.append(row)
    return rows


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    figures: dict[str, Any] = {"questions": len(rows)}
    for k in (*CUTOFFS, *REACH):
        figures[f"recall@{k}"] = round(statistics.mean(r[f"recall@{k}"] for r in rows), 4) if rows else None
    return figures


def percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def milliseconds(values: Sequence[float]) -> dict[str, float]:
    return {
        "p50_ms": round(1000 * percentile(values, 0.5), 1),
        "p95_ms": round(1000 * percentile(values, 0.95), 1),
    }


def recall_latency(
    rows: Sequence[dict[str, Any]], by_conversation: Mapping[str, Sequence[dict[str, Any]]]
) -> dict[str, Any]:
    """The default recall's seconds per question (every category), in milliseconds, against
    LATENCY_TARGET_MS; and each conversation's p50 and p95."""
    seconds = [r["seconds"] for r in rows]
    if not seconds:
        return {"questions": 0}
    p95 = 1000 * percentile(seconds, 0.95)
    return {
        "type": DEFAULT,
        "questions": len(seconds),
        **milliseconds(seconds),
        "p99_ms": round(1000 * percentile(seconds, 0.99), 1),
        "max_ms": round(1000 * max(seconds), 1),
        "mean_ms": round(1000 * statistics.mean(seconds), 1),
        "target_p95_ms": LATENCY_TARGET_MS,
        "p95_under_target": p95 < LATENCY_TARGET_MS,
        "per_conversation": {
            name: milliseconds([r["seconds"] for r in found])
            for name, found in by_conversation.items()
            if found
        },
    }


def by_category(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {
        f"{n} {CATEGORIES.get(n, '')}".strip(): summary([r for r in rows if r["category"] == n])
        for n in sorted({r["category"] for r in rows})
    }


def report(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Overall (categories 1-4), per category, each for both halves too, the adversarial category
    apart, the searches run (for the default), and latency."""
    answerable = [r for r in rows if r["category"] != ADVERSARIAL]
    halves = {split: [r for r in answerable if r["split"] == split] for split in ("dev", "test")}
    return {
        "overall": summary(answerable),
        "dev": summary(halves["dev"]),
        "test": summary(halves["test"]),
        "per_category": by_category(answerable),
        "per_category_dev": by_category(halves["dev"]),
        "per_category_test": by_category(halves["test"]),
        "adversarial": summary([r for r in rows if r["category"] == ADVERSARIAL]),
        "uncited_results": sum(r["uncited"] for r in rows),
        "searched": dict(sorted(Counter(str(r.get("searched", "")) for r in rows).items())),
        "latency": milliseconds([r["seconds"] for r in rows]),
    }


def table(results: dict[str, dict[str, Any]], k: int = TOP_K) -> str:
    """recall@k of every type side by side: overall and per category, on the dev and test halves."""
    categories = sorted({name for figures in results.values() for name in figures["per_category"]})
    header = ["type", "dev", "test", *(f"{name} dev/test" for name in categories), "p95 ms"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for kind, figures in results.items():
        cells = [kind, _cell(figures["dev"], k), _cell(figures["test"], k)]
        for name in categories:
            dev, test = figures["per_category_dev"].get(name), figures["per_category_test"].get(name)
            cells.append(f"{_cell(dev, k)} / {_cell(test, k)}")
        cells.append(str(figures["latency"]["p95_ms"]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(figures: dict[str, Any] | None, k: int) -> str:
    value = figures.get(f"recall@{k}") if figures else None
    return "-" if value is None else f"{value:.3f}"


def targets(results: dict[str, dict[str, Any]], temporal_before: float | None) -> dict[str, Any]:
    """The default against the best single type (test half), its temporal test figure, its p95."""
    singles = {kind: f["test"]["recall@10"] or 0.0 for kind, f in results.items() if kind != DEFAULT}
    found: dict[str, Any] = {}
    if DEFAULT in results and singles:
        best = max(singles, key=lambda kind: singles[kind])
        default = results[DEFAULT]
        found["best_single_type_test"] = {best: singles[best]}
        found["default_test"] = default["test"]["recall@10"]
        found["default_within_0.01_of_best"] = (default["test"]["recall@10"] or 0.0) >= singles[best] - 0.01
        temporal = default["per_category_test"].get("2 temporal", {}).get("recall@10")
        found["default_temporal_test"] = temporal
        if temporal_before is not None and temporal is not None:
            found["temporal_test_before"] = temporal_before
            found["temporal_at_least_before"] = temporal >= temporal_before
        found["default_p95_ms"] = default["latency"]["p95_ms"]
    return found


def run_conversation(
    memory: Kenning,
    conversation: Conversation,
    types: Sequence[str],
    tuning: Sequence[dict[str, Any]] = (),
) -> tuple[list[float], dict[str, list[dict[str, Any]]]]:
    """Remember the conversation in its own dataset, then ask its questions with each type, and
    with TUNED under each of the `tuning` options (rows under `TUNED[options]`)."""
    dataset = conversation.name
    seconds = remember(memory, conversation.sessions, dataset)
    names = dia_ids(memory, dataset)
    missing = {m.id for s in conversation.sessions for m in s} - set(names.values())
    if missing:
        raise SystemExit(f"{dataset}: {len(missing)} messages have no data item, e.g. {sorted(missing)[:3]}")
    rows = {kind: ask(memory, dataset, conversation.questions, kind, names) for kind in types}
    for options in tuning:
        rows[f"{TUNED}[{option_label(options)}]"] = ask(
            memory, dataset, conversation.questions, TUNED, names, options
        )
    return seconds, rows


def tuned(rows: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """The TUNED options best on the dev questions (recall@10), with their figures on dev and test."""
    tried = {kind: report(found) for kind, found in rows.items() if kind.startswith(f"{TUNED}[")}
    if not tried:
        return None
    best = max(tried, key=lambda kind: tried[kind]["dev"]["recall@10"] or 0.0)
    return {
        "chosen_on_dev": best,
        "figures": tried[best],
        "dev_recall@10_by_options": {kind: tried[kind]["dev"]["recall@10"] for kind in tried},
    }


def forget_cost(
    conversations: Sequence[Conversation], embedding: str, items: int, sample: int
) -> dict[str, Any]:
    """Remember the first `items` messages of the conversations in one dataset, then forget
    `sample` of them, one item per call, evenly spread; the milliseconds of each call.

    dia_ids repeat across conversations, and a message id seen again replaces the earlier
    message, so here each id is prefixed with its conversation's name.
    """
    sessions: list[list[Message]] = []
    left = items
    for conversation in conversations:
        for session in conversation.sessions:
            if left > 0:
                kept = session[:left]
                sessions.append([m.model_copy(update={"id": f"{conversation.name}/{m.id}"}) for m in kept])
                left -= len(kept)
    dataset = "forget"
    with opened(embedding) as memory:
        started = time.perf_counter()
        remember(memory, sessions, dataset)
        remembered_s = time.perf_counter() - started
        ids = sorted(dia_ids(memory, dataset))
        chosen = ids[:: max(1, len(ids) // sample)][:sample]
        seconds, reloaded = [], []
        for data_id in chosen:
            started = time.perf_counter()
            forgotten = memory.forget(dataset, [data_id])
            seconds.append(time.perf_counter() - started)
            reloaded.append(sum(f.reload_chunks for f in forgotten))
        left_items = len(dia_ids(memory, dataset))
    return {
        "items": len(ids),
        "remember_s": round(remembered_s, 1),
        "forgotten": len(chosen),
        "items_left": left_items,
        "ms_per_item": milliseconds(seconds),
        "chunks_reloaded_per_item_p50": statistics.median(reloaded),
    }


def run(
    conversations: Sequence[Conversation],
    embedding: str,
    forget_items: int,
    forget_from: Sequence[Conversation] = (),
    types: Sequence[str] = TYPES,
    tuning: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """The figures of the conversations, and of forgetting in a dataset of `forget_items`
    messages drawn from `forget_from` (by default the same conversations)."""
    started = time.perf_counter()
    load_before = os.getloadavg()
    calls: list[float] = []
    rows: dict[str, list[dict[str, Any]]] = {}
    per_conversation = {}
    default_rows: dict[str, list[dict[str, Any]]] = {}
    for conversation in conversations:
        with opened(embedding) as memory:
            seconds, found = run_conversation(memory, conversation, types, tuning)
        calls += seconds
        default_rows[conversation.name] = found.get(DEFAULT, [])
        for kind, kind_rows in found.items():
            rows.setdefault(kind, []).extend(kind_rows)
        per_conversation[conversation.name] = {
            "sessions": len(conversation.sessions),
            "messages": conversation.messages,
            "questions": len(conversation.questions),
            "remember_s": round(sum(seconds), 1),
            **{kind: summary([r for r in found[kind] if r["category"] != ADVERSARIAL]) for kind in types},
        }
        print(f"{conversation.name}: {json.dumps(per_conversation[conversation.name])}", file=sys.stderr)
    messages = sum(c.messages for c in conversations)
    results = {kind: report(kind_rows) for kind, kind_rows in rows.items() if kind in types}
    print(table(results), file=sys.stderr)
    source = forget_from or conversations
    forgetting = forget_cost(source, embedding, forget_items, 20) if forget_items else None
    print(f"forget: {json.dumps(forgetting)}", file=sys.stderr)
    return {
        "benchmark": "LoCoMo evidence recall (context only, no LLM)",
        "conversations": len(conversations),
        "messages": messages,
        "questions": sum(len(c.questions) for c in conversations),
        "split": {
            "seed": SPLIT_SEED,
            "dev": sum(q.split == "dev" for c in conversations for q in c.questions),
        },
        "dropped_evidence_ids": [d for c in conversations for d in c.dropped_evidence],
        "embedder": "local all-MiniLM-L6-v2" if embedding == "local" else embedding,
        "extractor": "offline",
        "top_k": TOP_K,
        "results": results,
        "table": table(results),
        "targets": targets(results, TEMPORAL_TEST_BEFORE),
        "recall_latency": recall_latency([r for found in default_rows.values() for r in found], default_rows),
        "tuned": tuned(rows),
        "remember": {
            "calls": len(calls),
            "ms_per_message": round(1000 * sum(calls) / messages, 1),
            "per_call": milliseconds(calls),
        },
        "forget": forgetting,
        "per_conversation": per_conversation,
        "machine": {
            "cpus": os.cpu_count(),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
        "seconds": round(time.perf_counter() - started, 1),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--conversations", type=int, default=5, help="the first N conversations")
    parser.add_argument("--embedding", choices=("local", "hash"), default="local")
    parser.add_argument("--forget-items", type=int, default=1000, help="dataset size for forget; 0 skips it")
    parser.add_argument(
        "--types", default=",".join(TYPES), help="search types to recall with, comma-separated"
    )
    parser.add_argument("--no-tuning", action="store_true", help=f"skip the {TUNED} options grid")
    parser.add_argument(
        "--latency",
        action="store_true",
        help="recall's default only, no tuning grid and no forget: its evidence recall and latency",
    )
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--out", type=Path, default=RESULTS / "locomo.json")
    args = parser.parse_args(argv)
    everything = load(args.data, None)
    types = [DEFAULT] if args.latency else [kind for kind in args.types.split(",") if kind]
    tuning = [] if args.no_tuning or args.latency else grid()
    forget_items = 0 if args.latency else args.forget_items
    figures = run(everything[: args.conversations], args.embedding, forget_items, everything, types, tuning)
    print(f"recall latency: {json.dumps(figures['recall_latency'])}", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
