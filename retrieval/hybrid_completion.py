"""HYBRID_COMPLETION: reciprocal-rank fusion of lanes at chunk level, then one answer.

Lanes, each a ranking of chunks (by default chunks, lexical and graph weigh in: `FusionConfig`):
- chunks: vector search over chunk text;
- lexical: BM25 over chunk text;
- summaries: vector search over chunk summaries, mapped to the chunk summarised;
- entities: entity-name hits, their graph neighbours, and the chunks that contain them
  (`contains` edges), each entity's weight shared among the chunks that contain it;
- facts: vector search over edge descriptions, mapped to the chunk each fact came from;
- graph: chunks by GRAPH_PPR's walk from the question's entities and closest chunks.
The result is chunks; the context is their text, then the best edge facts they hold.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from kenning.pipeline import collection
from kenning.pipeline.assembly import STRUCTURAL_RELATIONSHIPS
from kenning.pipeline.models import GraphEdge, GraphNode, Scope, ScoredPoint
from kenning.pipeline.validity import fact_line
from kenning.retrieval.contract import (
    Hit,
    SearchPorts,
    SearchRequest,
    answer_from_context,
    options_of,
    passages_and_facts,
)
from kenning.retrieval.fusion import Fused, FusionConfig, reciprocal_rank_fusion
from kenning.retrieval.graph_ppr import WalkConfig, walk
from kenning.retrieval.reference import best_first, by_feedback, chunk_hit, feedback, point_hit, relevance

# A chunk holds several facts: the facts lane reads this many edge hits per chunk it ranks.
FACTS_PER_CHUNK = 8
# The payload fields each lane reads: fewer fields, less to copy out of the vector engine.
CHUNK_OF = ("chunk_id",)
WEIGHT_OF = ("weight",)
FACT_FIELDS = ("chunk_id", "source_id", "target_id", "relationship", "text")


class HybridCompletionRetriever:
    """Chunks by fused rank. `score` is the fused score over the best possible one, in (0, 1].
    `extra` holds the fused score (`rrf`), the chunk's rank in each lane
    (`lanes`) and the best edge facts drawn from it (`facts`: rank and text)."""

    def __init__(self, ports: SearchPorts) -> None:
        self._ports = ports

    def get_retrieved_objects(self, request: SearchRequest) -> list[Hit]:
        config = options_of(FusionConfig, request)
        vector = self._ports.embedder.embed([request.query])[0]
        hits: list[Hit] = []
        for scope in request.scopes:
            hits += self._scope_hits(scope, request, vector, config)
        return best_first(hits, request.top_k)

    def get_context_from_objects(self, request: SearchRequest, objects: list[Hit]) -> str:
        facts = sorted((fact for hit in objects for fact in hit.extra.get("facts", [])), key=_fact_rank)
        return passages_and_facts([hit.text for hit in objects], [fact["text"] for fact in facts])

    def get_completion_from_context(self, request: SearchRequest, context: str) -> str:
        return answer_from_context(self._ports.completer, request.query, context)

    def _scope_hits(
        self, scope: Scope, request: SearchRequest, vector: Sequence[float], config: FusionConfig
    ) -> list[Hit]:
        lanes, facts, moved = self._lanes(scope, request, vector, config)
        best = config.best_score() or 1.0
        fused = reciprocal_rank_fusion(lanes, config.weights, config.rrf_k)
        rrf = {entry.id: entry.score for entry in fused}
        for entry in fused:  # the score as a share of the best possible, moved by feedback
            entry.score = entry.score / best + moved.get(entry.id, 0.0)
        fused = sorted(fused, key=lambda entry: -entry.score)[: request.top_k]
        top_facts = facts[: config.facts]
        chunk_ids = [entry.id for entry in fused]
        endpoints = {str(p.payload.get(key, "")) for p in top_facts for key in ("source_id", "target_id")}
        # The facts' ends are only named: their provenance (every item mentioning them) goes unread.
        ends = self._nodes(scope, list(endpoints - set(chunk_ids)), provenance=False)
        nodes = ends | self._nodes(scope, chunk_ids)
        # Chunks the lanes that search the chunks' own text found, but the graph lacks.
        searched = {*lanes["chunks"], *lanes["lexical"]}
        points = self._indexed(scope, [e.id for e in fused if e.id in searched and e.id not in nodes])
        hits = [self._hit(scope, entry, nodes, points, rrf[entry.id]) for entry in fused]
        found = [hit for hit in hits if hit is not None]
        _attach_facts(found, top_facts, nodes, request.as_of)
        return found

    def _lanes(
        self, scope: Scope, request: SearchRequest, vector: Sequence[float], config: FusionConfig
    ) -> tuple[dict[str, list[str]], list[ScoredPoint], dict[str, float]]:
        """(chunk ids ranked by each lane, the edge-fact hits, feedback by chunk). The chunks'
        payloads are not read (their text comes from the graph), but for their feedback weight."""
        search, on, depth, query = self._ports.vectors.search, config.weight, config.depth, request.query
        chunks = (
            by_feedback(search(scope, collection.CHUNKS, vector, depth("chunks"), WEIGHT_OF))
            if on("chunks") > 0
            else []
        )
        lexical = (
            self._ports.lexical.search(scope, query, depth("lexical"), payloads=False)
            if on("lexical") > 0
            else []
        )
        summaries = (
            search(scope, collection.SUMMARIES, vector, depth("summaries"), CHUNK_OF)
            if on("summaries") > 0
            else []
        )
        wide = max(config.facts, depth("facts") * FACTS_PER_CHUNK) if on("facts") > 0 else config.facts
        facts = search(scope, collection.EDGES, vector, wide, FACT_FIELDS) if wide else []
        lanes = {
            "chunks": [point.id for point in chunks],
            "lexical": [point.id for point in lexical],
            "summaries": _chunk_ids(summaries),
            "entities": self._entity_lane(scope, vector, config) if on("entities") > 0 else [],
            "facts": _chunk_ids(facts)[: depth("facts")],
            "graph": self._graph_lane(scope, request, vector, chunks, config) if on("graph") > 0 else [],
        }
        return lanes, facts, feedback(chunks)

    def _graph_lane(
        self,
        scope: Scope,
        request: SearchRequest,
        vector: Sequence[float],
        chunks: list[ScoredPoint],
        fusion: FusionConfig,
    ) -> list[str]:
        """The walk's chunks. It starts from the chunks lane's closest when that lane searched as
        deep as the walk's chunk seeds, or deeper: the same chunks, up to an ANN index's
        approximation (a deeper search of one misses fewer)."""
        config = options_of(WalkConfig, request)
        deep_enough = fusion.weight("chunks") > 0 and fusion.depth("chunks") >= config.chunk_seeds
        ended = walk(self._ports, scope, request.query, config, vector, chunks if deep_enough else None)
        return [entry.chunk_id for entry in ended.ranked[: fusion.depth("graph")]]

    def _entity_lane(self, scope: Scope, vector: Sequence[float], config: FusionConfig) -> list[str]:
        seeds = self._ports.vectors.search(scope, collection.ENTITIES, vector, config.entity_seeds, ())
        if not seeds:
            return []
        weights = {point.id: 1.0 / rank for rank, point in enumerate(seeds, 1)}
        edges = self._edges_of(scope, list(weights))
        neighbours = _neighbours(edges.values(), weights, config)
        if neighbours:
            weights.update(neighbours)
            edges.update(self._edges_of(scope, list(neighbours)))
        return _containing_chunks(edges.values(), weights)[: config.depth("entities")]

    def _edges_of(self, scope: Scope, node_ids: list[str]) -> dict[str, GraphEdge]:
        """The edges touching these nodes, by id; the lane ranks by their ends alone."""
        return {edge.id: edge for edge in self._ports.graph.get_edges(scope, node_ids, provenance=False)}

    def _nodes(self, scope: Scope, ids: list[str], provenance: bool = True) -> dict[str, GraphNode]:
        wanted = sorted(set(ids) - {""})
        if not wanted:
            return {}
        return {node.id: node for node in self._ports.graph.get_nodes(scope, wanted, provenance=provenance)}

    def _indexed(self, scope: Scope, chunk_ids: list[str]) -> dict[str, ScoredPoint]:
        """The chunks' points with their payloads, read from the vector index: chunks of the vector
        or lexical lane that are not in the graph (the stores disagree)."""
        if not chunk_ids:
            return {}
        found = self._ports.vectors.retrieve(scope, collection.CHUNKS, chunk_ids)
        return {point.id: ScoredPoint(id=point.id, score=0.0, payload=point.payload) for point in found}

    def _hit(
        self,
        scope: Scope,
        entry: Fused,
        nodes: dict[str, GraphNode],
        points: dict[str, ScoredPoint],
        rrf: float,
    ) -> Hit | None:
        score = relevance(entry.score)
        node = nodes.get(entry.id)
        if node is not None:
            hit = chunk_hit(scope, node, score)
        elif entry.id in points:
            # Indexed but not in the graph (the stores disagree): the indexed payload will do.
            hit = point_hit(scope, points[entry.id], "chunk", {})
            hit.score, hit.chunk_id = score, entry.id
        else:
            return None
        hit.extra.update(rrf=rrf, lanes=entry.ranks)
        return hit


def _chunk_ids(points: list[ScoredPoint]) -> list[str]:
    """The chunks the points came from, each once, in the points' order."""
    found = (str(point.payload.get("chunk_id") or "") for point in points)
    return list(dict.fromkeys(chunk_id for chunk_id in found if chunk_id))


def _neighbours(
    edges: Iterable[GraphEdge], weights: dict[str, float], config: FusionConfig
) -> dict[str, float]:
    """Entities one fact away from a seed, weighted by their best seed's weight times the decay."""
    found: dict[str, float] = {}
    for edge in edges:
        if edge.relationship in STRUCTURAL_RELATIONSHIPS:
            continue
        for near, far in ((edge.source_id, edge.target_id), (edge.target_id, edge.source_id)):
            if near in weights and far not in weights:
                found[far] = max(found.get(far, 0.0), weights[near] * config.neighbour_decay)
    best = sorted(found.items(), key=lambda item: (-item[1], item[0]))[: config.neighbours]
    return dict(best)


def _containing_chunks(edges: Iterable[GraphEdge], weights: dict[str, float]) -> list[str]:
    """Chunks by the summed weight of the entities they contain; an entity found in many chunks
    spreads its weight thin, as a common term does in BM25."""
    holders: dict[str, set[str]] = {}
    for edge in edges:
        if edge.relationship == "contains" and edge.target_id in weights:
            holders.setdefault(edge.target_id, set()).add(edge.source_id)
    scores: dict[str, float] = {}
    for entity, chunks in holders.items():
        share = weights[entity] / math.log2(1 + len(chunks))
        for chunk_id in chunks:
            scores[chunk_id] = scores.get(chunk_id, 0.0) + share
    return [chunk_id for chunk_id, _ in sorted(scores.items(), key=lambda item: (-item[1], item[0]))]


def _attach_facts(
    hits: list[Hit], facts: list[ScoredPoint], nodes: dict[str, GraphNode], as_of: str | None
) -> None:
    by_chunk = {hit.chunk_id: hit for hit in hits}
    for rank, point in enumerate(facts, 1):
        hit = by_chunk.get(str(point.payload.get("chunk_id") or ""))
        if hit is not None:
            hit.extra.setdefault("facts", []).append({"rank": rank, "text": render_fact(point, nodes, as_of)})


def render_fact(point: ScoredPoint, nodes: dict[str, GraphNode], as_of: str | None = None) -> str:
    """`source -> relationship -> target (when it held): description` (`fact_line`), with node
    names where the graph has them."""
    source = _name(nodes.get(str(point.payload.get("source_id", ""))))
    target = _name(nodes.get(str(point.payload.get("target_id", ""))))
    relationship = str(point.payload.get("relationship", "related_to")).replace("_", " ")
    head = f"{source} -> {relationship} -> {target}"
    return fact_line(head, point.payload, as_of, str(point.payload.get("text", "")))


def _name(node: GraphNode | None) -> str:
    return str(node.properties.get("name") or "?") if node else "?"


def _fact_rank(fact: dict[str, Any]) -> int:
    return int(fact["rank"])
