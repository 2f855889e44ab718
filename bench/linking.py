"""The shape of the offline knowledge graph on real multi-hop corpora: does it connect paragraphs?

Each paragraph becomes a document "title, blank line, paragraph" (as bench/retrieval.py
ingests it), chunked with the default chunking, extracted with the offline extractor and
assembled in load batches into one graph, with no stores. Printed as JSON, per corpus:

- entities, entity edges (between two entities, structural ones excluded) and both per chunk;
- the share of documents that share an entity with at least one other document, and the
  share reaching another document through one entity edge (entity -> entity);
- connected components of the chunk-entity graph (mentions plus entity edges; entity types
  and document nodes left out), and the largest one's share of the chunks;
- extraction speed in paragraphs per second (after a warm-up: `inflect` is imported on first use).

    python -m bench.linking
    python -m bench.linking --dataset twowiki --output bench/results/linking.json

Data is read from ../shared/data, never copied.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kenning.pipeline.assembly import STRUCTURAL_RELATIONSHIPS, Assembly, assemble
from kenning.pipeline.chunking import ChunkingConfig, chunk_text
from kenning.pipeline.context import PipelineConfig
from kenning.pipeline.linking import document_title
from kenning.pipeline.models import (
    Chunk,
    ChunkRecord,
    Document,
    DocumentRecord,
    Entity,
    Extraction,
    Scope,
    content_hash,
    stable_id,
)
from kenning.pipeline.offline import OfflineExtractor

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data"


def corpus(name: str) -> tuple[dict[str, str], list[frozenset[str]]]:
    """Title -> paragraph text, and each question's gold titles."""
    if name == "twowiki":
        folder = DATA / "twowiki_101"
        paragraphs = json.loads((folder / "2wikimultihopqa_corpus.json").read_text())
        questions = json.loads((folder / "results_vdb_2wikimultihopqa_101.json").read_text())
        gold = [frozenset(q["ground_truth"]) for q in questions]
        return {p["title"]: p["text"] for p in paragraphs}, gold
    folder = DATA / "hotpotqa_100"
    raw: dict[str, list[str]] = json.loads((folder / "hotpotqa_train_corpus.json").read_text())
    records = json.loads((folder / "hotpotqa_train.json").read_text())
    gold = [frozenset(title for title, _ in r["supporting_facts"]) for r in records]
    return {title: "".join(sentences).strip() for title, sentences in raw.items()}, gold


Batch = list[tuple[ChunkRecord, DocumentRecord, Extraction]]


def extracted(paragraphs: dict[str, str]) -> tuple[Batch, float]:
    """Every chunk of every paragraph with its extraction, and the extraction's seconds."""
    extractor, config = OfflineExtractor(), ChunkingConfig()
    extractor.extract("List of films\n\nA warm-up: the first plural common noun imports `inflect`.")
    batch: Batch = []
    seconds = 0.0
    for title, text in paragraphs.items():
        document_id = stable_id("bench", title)
        document = DocumentRecord(
            id=document_id, dataset_id="bench", data_id=document_id, name=title, kind="txt"
        )
        for index, piece in enumerate(chunk_text(f"{title}\n\n{text}", config)):
            record = ChunkRecord(
                id=stable_id(document_id, str(index)),
                dataset_id="bench",
                document_id=document_id,
                data_id=document_id,
                index=index,
                text=piece.text,
                token_count=piece.token_count,
                text_hash=content_hash(piece.text.encode()),
            )
            started = time.perf_counter()
            extraction = extractor.extract(record.text)
            seconds += time.perf_counter() - started
            batch.append((record, document, extraction))
    return batch, seconds


LOAD_BATCH = PipelineConfig().load_batch
SPECIFIC = 20  # an entity is specific when at most this many documents mention it (dates never are)


def shape(assembly: Assembly, gold: list[frozenset[str]]) -> dict[str, Any]:
    nodes = assembly.nodes
    entities = {i for i, node in nodes.items() if isinstance(node, Entity)}
    chunk_document = {i: node.document_id for i, node in nodes.items() if isinstance(node, Chunk)}
    mentions: dict[str, set[str]] = defaultdict(set)  # entity -> documents
    links: list[tuple[str, str]] = []
    relationships: dict[str, int] = defaultdict(int)
    for edge in assembly.edges.values():
        if edge.source_id in chunk_document and edge.target_id in entities:
            mentions[edge.target_id].add(chunk_document[edge.source_id])
        elif edge.source_id in entities and edge.target_id in entities:
            if edge.relationship not in STRUCTURAL_RELATIONSHIPS:
                links.append((edge.source_id, edge.target_id))
                relationships[edge.relationship] += 1
    held: dict[str, set[str]] = defaultdict(set)  # document -> entities
    for entity, documents in mentions.items():
        for document in documents:
            held[document].add(entity)
    specific = {
        e
        for e, docs in mentions.items()
        if len(docs) <= SPECIFIC and getattr(nodes[e], "entity_type", "") != "Date"
    }
    neighbours: dict[str, set[str]] = defaultdict(set)
    for source, target in links:
        neighbours[source].add(target)
        neighbours[target].add(source)
    documents = set(chunk_document.values())
    sharing = {d for d in documents if any(len(mentions[e]) > 1 for e in held[d])}
    sharing_specific = {d for d in documents if any(len(mentions[e]) > 1 for e in held[d] & specific)}
    components, largest = _components(chunk_document, mentions, links)
    pairs = _gold_pairs(nodes, gold)
    return {
        "documents": len(documents),
        "chunks": len(chunk_document),
        "entities": len(entities),
        "entity_edges": len(links),
        "entity_edges_per_chunk": round(len(links) / len(chunk_document), 3),
        "mentions_per_chunk": round(sum(map(len, held.values())) / len(chunk_document), 3),
        "documents_sharing_an_entity": round(len(sharing) / len(documents), 4),
        "documents_sharing_a_specific_entity": round(len(sharing_specific) / len(documents), 4),
        "components": components,
        "largest_component_chunk_share": round(largest / len(chunk_document), 4),
        "gold_pairs": len(pairs),
        "gold_pairs_sharing_an_entity": _share(pairs, lambda a, b: bool(held[a] & held[b])),
        "gold_pairs_sharing_a_specific_entity": _share(
            pairs, lambda a, b: bool(held[a] & held[b] & specific)
        ),
        "gold_pairs_within_one_entity_edge": _share(
            pairs,
            lambda a, b: bool(held[a] & held[b]) or any(neighbours[e] & held[b] for e in held[a]),
        ),
        "top_relationships": dict(sorted(relationships.items(), key=lambda kv: -kv[1])[:12]),
    }


def _gold_pairs(nodes: dict[str, Any], gold: list[frozenset[str]]) -> list[tuple[str, str]]:
    """Pairs of gold documents of one question, as document node ids."""
    by_title = {node.name: i for i, node in nodes.items() if isinstance(node, Document)}
    pairs = []
    for titles in gold:
        found = sorted(by_title[t] for t in titles if t in by_title)
        pairs += [(a, b) for n, a in enumerate(found) for b in found[n + 1 :]]
    return pairs


def _share(pairs: list[tuple[str, str]], linked: Callable[[str, str], bool]) -> float:
    return round(sum(1 for a, b in pairs if linked(a, b)) / max(len(pairs), 1), 4)


def _components(
    chunk_document: dict[str, str], mentions: dict[str, set[str]], links: list[tuple[str, str]]
) -> tuple[int, int]:
    """Connected components over documents' chunks and entities, and the largest one's chunk count."""
    parent: dict[str, str] = {}

    def find(node: str) -> str:
        parent.setdefault(node, node)
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    def union(a: str, b: str) -> None:
        parent[find(a)] = find(b)

    for chunk in chunk_document:
        find(chunk)
    for chunk, document in chunk_document.items():
        union(chunk, document)
    for entity, documents in mentions.items():
        for document in documents:
            union(entity, document)
    for source, target in links:
        union(source, target)
    roots = {find(node) for node in parent}
    sizes: dict[str, int] = defaultdict(int)
    for chunk in chunk_document:
        sizes[find(chunk)] += 1
    return len(roots), max(sizes.values())


def assembled(batch: Batch) -> Assembly:
    """The graph of all chunks, assembled in load batches as the pipeline does, then merged."""
    titles = {record.document_id: document_title(record.text) for record, _, _ in batch if record.index == 0}
    merged = Assembly()
    for start in range(0, len(batch), LOAD_BATCH):
        part = assemble(
            "bench", Scope(dataset="linking"), batch[start : start + LOAD_BATCH], {}, titles=titles
        )
        for node_id, node in part.nodes.items():
            merged.nodes.setdefault(node_id, node)
        for edge_id, edge in part.edges.items():
            merged.edges.setdefault(edge_id, edge)
    return merged


def measure(name: str) -> dict[str, Any]:
    paragraphs, gold = corpus(name)
    batch, seconds = extracted(paragraphs)
    figures = shape(assembled(batch), gold)
    figures["extract_seconds"] = round(seconds, 2)
    figures["paragraphs_per_second"] = round(len(paragraphs) / seconds, 1)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--dataset", choices=["twowiki", "hotpotqa", "both"], default="both")
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    names = ["twowiki", "hotpotqa"] if args.dataset == "both" else [args.dataset]
    results = {name: measure(name) for name in names}
    text = json.dumps(results, indent=2)
    print(text)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    main()
