"""Forget's cost, embedded: forgetting half of a dataset of N items, the erasure step apart.

    python -m bench.forget --items 1000

Hash embeddings and the offline extractor (no network). It adds N short texts, cognifies them,
forgets half of them in one call, and reports the milliseconds per forgotten item, the part of
that the erasure took (SQLite checkpoint, blob collection, the rebuild of every Qdrant Edge
collection), then the cost of rebuilding each collection alone (ms per collection of its point
count), and the home's size before and after (apparent, and on disk). Writes bench/results/forget.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kenning.pipeline.ingest import text_source
from kenning.pipeline.models import Dataset
from kenning.storage.vectors.edge import EdgeVectorStore
from kenning.workers.application import lifecycle
from kenning.workers.application.erasure import erase
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from kenning.workers.runtime.wiring import Wiring

ROOT = Path(__file__).resolve().parent.parent
DATASET = "bench"
NAMES = ["Nora Blake", "Oliver Reed", "Maria Lopez", "Anna Kim", "Tom Hardy", "Lea Roth"]
PLACES = ["Boston", "Denver", "Lisbon", "Oslo", "Kyoto", "Quito"]


def text(number: int) -> str:
    who, where = NAMES[number % len(NAMES)], PLACES[(number // len(NAMES)) % len(PLACES)]
    return f"{who} signed contract {number} with Firm{number} in {where}. Firm{number} builds turbines."


def size_of(home: Path) -> dict[str, int]:
    """The home's files' apparent size, and the disk they use (the engine's files are sparse)."""
    files = [path.stat() for path in home.rglob("*") if path.is_file()]
    return {"apparent": sum(f.st_size for f in files), "on_disk": sum(f.st_blocks * 512 for f in files)}


def timed_erase(spent: list[float]) -> Callable[[Wiring, Dataset, bool], dict[str, int]]:
    def timing(wiring: Wiring, dataset: Dataset, memory_only: bool) -> dict[str, int]:
        started = time.perf_counter()
        try:
            return erase(wiring, dataset, memory_only)
        finally:
            spent.append(time.perf_counter() - started)

    return timing


def rebuild_costs(kenning: Kenning) -> list[dict[str, Any]]:
    """Each collection rebuilt once more on its own: its points and the milliseconds it took."""
    store = kenning.wiring.vectors
    assert isinstance(store, EdgeVectorStore)
    costs = []
    for name in store.list_collections():
        started = time.perf_counter()
        points = store._shard(name).rebuild()
        costs.append({"collection": name, "points": points, "ms": round(_ms(started), 1)})
    return costs


def run(items: int, home: Path) -> dict[str, Any]:
    spent: list[float] = []
    lifecycle.erase = timed_erase(spent)  # type: ignore[attr-defined,assignment]
    settings = load_settings(home=home, embedding_provider="hash", blob_grace_s=0)
    with Kenning(settings) as kenning:
        ids = [kenning.add([text_source(text(n), name=f"t{n}")], DATASET).added[0].id for n in range(items)]
        started = time.perf_counter()
        assert kenning.cognify(DATASET).status.value == "completed"
        cognify_s = time.perf_counter() - started
        kenning.wiring.vectors.close()
        before = size_of(home)
        started = time.perf_counter()
        done = kenning.forget(DATASET, ids[: items // 2])[0]
        forget_s = time.perf_counter() - started
        costs = rebuild_costs(kenning)
        kenning.wiring.vectors.close()
    forgotten = len(done.items)
    return {
        "items": items,
        "forgotten": forgotten,
        "cognify_s": round(cognify_s, 2),
        "forget_ms_per_item": round(forget_s * 1000 / forgotten, 2),
        "forget_s": round(forget_s, 3),
        "erasure_s": round(sum(spent), 3),
        "erasure_share": round(sum(spent) / forget_s, 3),
        "erased": done.erased,
        "rebuild": costs,
        "home_bytes_before": before,
        "home_bytes_after": size_of(home),
    }


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "forget.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kenning-bench-forget-") as folder:
        result = run(args.items, Path(folder) / "home")
    print(json.dumps(result, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
