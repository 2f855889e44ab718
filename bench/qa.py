"""End-to-end QA: exact match and token F1 of answers from an LLM endpoint.

    KENNING_LLM_URL=... python -m bench.qa --set hotpotqa --questions 20 --type GRAPH_COMPLETION

Sets: `hotpotqa` (../shared/data/hotpotqa_100: each question's own context paragraphs
are ingested) and `cognee_hotpot` (the 50-question corpus of cognee's comparison). With
no endpoint configured it stops and says so. Results go to bench/results/qa-<set>.json.
"""

from __future__ import annotations

import argparse
import json
import re
import string
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from kenning.pipeline.ingest import Source
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import Settings, load_settings

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
RESULTS = Path(__file__).resolve().parent / "results"


def normalize(text: str) -> str:
    """SQuAD-style answer normalisation: lower case, no punctuation, articles or extra spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize(prediction) == normalize(gold))


def token_f1(prediction: str, gold: str) -> float:
    predicted, expected = normalize(prediction).split(), normalize(gold).split()
    common = sum((Counter(predicted) & Counter(expected)).values())
    if not predicted or not expected or not common:
        return float(predicted == expected)
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def hotpotqa(limit: int) -> tuple[list[Source], list[tuple[str, str]]]:
    records = json.loads((DATA / "hotpotqa_100" / "hotpotqa_train.json").read_text())[:limit]
    paragraphs = {title: " ".join(lines) for record in records for title, lines in record["context"]}
    return _sources(paragraphs), [(r["question"], r["answer"]) for r in records]


def cognee_hotpot(limit: int) -> tuple[list[Source], list[tuple[str, str]]]:
    folder = DATA / "cognee_hotpot"
    corpus = json.loads((folder / "hotpot_50_corpus.json").read_text())
    pairs = json.loads((folder / "hotpot_50_qa_pairs.json").read_text())[:limit]
    return _sources({f"paragraph-{i}": text for i, text in enumerate(corpus)}), [
        (p["question"], p["answer"]) for p in pairs
    ]


def _sources(paragraphs: dict[str, str]) -> list[Source]:
    return [
        Source(name=f"{title}.txt", uri=f"qa:{title}", data=f"{title}\n\n{text}".encode())
        for title, text in paragraphs.items()
    ]


SETS = {"hotpotqa": hotpotqa, "cognee_hotpot": cognee_hotpot}


def evaluate(
    settings: Settings, name: str, questions: int, search_type: str, documents: int | None = None
) -> dict[str, object]:
    """Ingest the set's corpus (the first `documents` of it, if given) and score every answer."""
    sources, pairs = SETS[name](questions)
    sources = sources[:documents] if documents else sources
    rows = []
    with Kenning(settings) as memory:
        memory.add(sources, "qa")
        memory.cognify("qa")
        for question, gold in pairs:
            answer = memory.search(question, search_type, datasets=["qa"]).answer or ""
            rows.append(
                {
                    "question": question,
                    "gold": gold,
                    "answer": answer,
                    "em": exact_match(answer, gold),
                    "f1": token_f1(answer, gold),
                }
            )
    count = max(len(rows), 1)
    return {
        "set": name,
        "type": search_type,
        "questions": len(rows),
        "documents": len(sources),
        "model": settings.llm_model,
        "exact_match": round(sum(r["em"] for r in rows) / count, 4),  # type: ignore[misc]
        "f1": round(sum(r["f1"] for r in rows) / count, 4),  # type: ignore[misc]
        "rows": rows,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--set", choices=sorted(SETS), default="hotpotqa")
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--type", default="GRAPH_COMPLETION")
    parser.add_argument("--documents", type=int, default=None, help="ingest only this many paragraphs")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as home:
        settings = load_settings(home=Path(home))
        if not settings.llm_url:
            sys.exit("no LLM endpoint: set KENNING_LLM_URL (an OpenAI-compatible /v1 URL)")
        figures = evaluate(settings, args.set, args.questions, args.type, args.documents)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"qa-{args.set}.json").write_text(json.dumps(figures, indent=2))
    print(json.dumps({k: v for k, v in figures.items() if k != "rows"}, indent=2))


if __name__ == "__main__":
    main()
