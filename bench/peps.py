"""Long documents: 50 PEPs cognified with the simulated LLM, and one question per PEP.

The first 50 `pep-*.rst` of ../shared/data/peps/peps (sorted by name) are added and
cognified embedded, the LLM (and, by default, the embeddings) served by the simulator.
Each PEP is then asked "What does PEP <number> (<title>) specify?" with GRAPH_COMPLETION,
context only. Printed (JSON): the cognify's chat calls, tokens (prompt + completion) and
embedding requests, and the share of questions whose context holds the PEP's title (anywhere,
and in the sources its lines name).

    python -m bench.peps [--unit-tokens 1500]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kenning.pipeline.ingest import Source
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from tests.simulator import Simulator

ROOT = Path(__file__).resolve().parent.parent
PEPS = ROOT.parent / "shared" / "data" / "peps" / "peps"
_HEADER = re.compile(r"^(PEP|Title):\s*(.+)$", re.MULTILINE)
# The source a GRAPH_COMPLETION context line ends with: `[document: title, chunk n]`.
_SOURCE = re.compile(r" \[([^\[\]]*), chunk \d+\]$", re.MULTILINE)


def peps(count: int) -> list[tuple[Source, int, str]]:
    """The first `count` PEPs with their number and title (from their headers)."""
    found = []
    for path in sorted(PEPS.glob("pep-*.rst"))[:count]:
        data = path.read_bytes()
        header = dict(_HEADER.findall(data.decode(errors="replace")[:4000]))
        source = Source(name=path.name, uri=f"peps:{path.name}", data=data)
        found.append((source, int(header["PEP"].strip()), " ".join(header["Title"].split())))
    return found


def holds(context: str, title: str) -> bool:
    """Whether the context holds the title, inline markup (``literal``, *emphasis*) aside: the
    text loader drops it."""
    return _plain(title) in _plain(context)


def _plain(text: str) -> str:
    return " ".join(text.replace("`", "").replace("*", "").split()).casefold()


def run(args: argparse.Namespace) -> dict[str, Any]:
    corpus = peps(args.documents)
    overrides: dict[str, object] = {"llm_model": "sim"}
    if args.unit_tokens is not None:
        overrides["extraction_unit_tokens"] = args.unit_tokens
    with Simulator() as simulator, tempfile.TemporaryDirectory() as home:
        overrides["llm_url"] = simulator.base_url
        if args.embeddings == "simulator":
            overrides |= {"embedding_provider": "openai", "embedding_url": simulator.base_url}
        else:
            overrides["embedding_provider"] = "hash"
        settings = load_settings(home=Path(home), **overrides)
        with Kenning(settings) as memory:
            memory.add([source for source, _, _ in corpus])
            simulator.reset()
            started = time.perf_counter()
            pipeline_run = memory.cognify()
            cognify_s = time.perf_counter() - started
            cognify = simulator.stats()
            found, in_sources, sizes, missed = 0, 0, [], []
            for _, number, title in corpus:
                question = f"What does PEP {number} ({title}) specify?"
                answer = memory.search(question, "GRAPH_COMPLETION", only_context=True, options=args.options)
                context = answer.context or ""
                found += holds(context, title)
                in_sources += holds(" | ".join(_SOURCE.findall(context)), title)
                sizes.append(len(context))
                if not holds(context, title):
                    missed.append(number)
    stats = pipeline_run.stats
    return {
        "documents": len(corpus),
        "status": pipeline_run.status.value,
        "error": pipeline_run.error,
        "extraction_unit_tokens": settings.extraction_unit_tokens,
        "chunks": stats.get("chunks_to_extract", 0),
        "extractions": stats.get("extractions", 0),
        "chat_calls": cognify["calls"]["chat"],
        # The chat calls' tokens, as the extractor was billed; the simulator's own count adds
        # the embedding requests' input to its prompt tokens.
        "prompt_tokens": stats.get("prompt_tokens", 0),
        "completion_tokens": stats.get("completion_tokens", 0),
        "total_tokens": stats.get("prompt_tokens", 0) + stats.get("completion_tokens", 0),
        "embedding_calls": cognify["calls"]["embeddings"],
        "embedding_tokens": cognify["prompt_tokens"] - stats.get("prompt_tokens", 0),
        "embeddings": args.embeddings,
        "cognify_s": round(cognify_s, 2),
        "questions": len(corpus),
        "title_in_graph_context": round(found / max(1, len(corpus)), 4),
        # The same, counting only the sources the lines name, not the triplets' own text.
        "title_in_context_sources": round(in_sources / max(1, len(corpus)), 4),
        "context_chars_mean": round(sum(sizes) / max(1, len(sizes))),
        "titles_missed": missed,
        "cognee": {"chat_calls": 179, "total_tokens": 567_000, "title_in_graph_context": 0.98},
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--documents", type=int, default=50)
    parser.add_argument("--unit-tokens", type=int, default=None, help="the extraction unit budget")
    parser.add_argument("--embeddings", choices=("hash", "simulator"), default="simulator")
    parser.add_argument("--options", type=json.loads, default={}, help="GRAPH_COMPLETION options (JSON)")
    args = parser.parse_args(argv)
    if not PEPS.is_dir():
        sys.exit(f"the PEPs are missing: {PEPS}")
    print(json.dumps(run(args), indent=2))


if __name__ == "__main__":
    main()
