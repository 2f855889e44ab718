"""GRAPH_COMPLETION: brute-force triplet search over every indexed collection.

The query is embedded once; each collection is searched with a wide top-k; the graph
fragment around the hits is projected; every edge is scored by the sum of its two
endpoints' distances and its own, where anything not hit costs a fixed penalty; the
best edges, rendered as triplets, are the context.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from kenning.pipeline.collection import EDGES, NODES
from kenning.pipeline.models import Chunk, GraphEdge, GraphNode, Scope
from kenning.pipeline.ports import GraphStore
from kenning.retrieval.contract import Hit, SearchPorts, SearchRequest, answer_from_context
from kenning.retrieval.reference import chunk_nodes

HUB_TYPES = frozenset({"EntityType"})
ENDPOINTS = ("source_id", "target_id")
WIDE_TOP_K = 100
MISS_PENALTY = 6.5
TOP_EDGES = 15
NODE_TEXT_CHARS = 300
TITLE_CHARS = 120
_TITLE_WORDS = 16
_TITLE_SEARCH_CHARS = 2000
# A header field: `Title: ...` up to the next `Field:` (header lines are joined by the chunker).
_TITLE_FIELD = re.compile(r"(?:^|\s)Title:[ \t]+(.+?)(?=\s+[A-Z][\w-]*:\s|\n|$)")


@dataclass
class Fragment:
    """A projected piece of the graph with the distances the vector search gave it."""

    nodes: dict[str, GraphNode] = field(default_factory=dict)
    edges: dict[str, GraphEdge] = field(default_factory=dict)
    node_distance: dict[str, float] = field(default_factory=dict)
    edge_distance: dict[str, float] = field(default_factory=dict)

    def score(self, edge: GraphEdge, penalty: float) -> float:
        return (
            self.node_distance.get(edge.source_id, penalty)
            + self.node_distance.get(edge.target_id, penalty)
            + self.edge_distance.get(edge.id, penalty)
        )


class GraphCompletionRetriever:
    def __init__(self, ports: SearchPorts) -> None:
        self._ports = ports

    def get_retrieved_objects(self, request: SearchRequest) -> list[Hit]:
        vector = self._ports.embedder.embed([request.query])[0]
        top = int(request.options.get("top_edges", TOP_EDGES))
        penalty = float(request.options.get("penalty", MISS_PENALTY))
        wide = int(request.options.get("wide_top_k", WIDE_TOP_K))
        hits: list[Hit] = []
        for scope in request.scopes:
            fragment = self._project(scope, vector, wide, top)
            ranked = sorted(fragment.edges.values(), key=lambda e: (fragment.score(e, penalty), e.id))
            hits += [self._hit(scope, fragment, edge, fragment.score(edge, penalty)) for edge in ranked[:top]]
        return sorted(hits, key=lambda hit: hit.score)[:top]

    def _project(self, scope: Scope, vector: Sequence[float], wide: int, top: int) -> Fragment:
        fragment = Fragment()
        hubs: set[str] = set()
        for collection in NODES:
            for point in self._ports.vectors.search(scope, collection, vector, wide, fields=("type",)):
                previous = fragment.node_distance.get(point.id, point.score)
                fragment.node_distance[point.id] = min(previous, point.score)
                if point.payload.get("type") in HUB_TYPES:
                    hubs.add(point.id)
        endpoints: set[str] = set()
        for point in self._ports.vectors.search(scope, EDGES, vector, wide, fields=ENDPOINTS):
            fragment.edge_distance[point.id] = point.score
            endpoints.update(str(point.payload.get(key, "")) for key in ENDPOINTS)
        # A type node links to every entity of its type: expanding it would fetch a large share of
        # the graph, all of it scored with a miss penalty. Its distance still counts where it is
        # an endpoint of an edge reached from another hit.
        seeds = sorted((set(fragment.node_distance) - hubs | endpoints) - {""})
        # An edge with an endpoint that was not hit scores at least one penalty more than any edge
        # between hits, so the edges among the hits are enough unless they are too few.
        edges = self._ports.graph.get_edges(scope, seeds, among=True)
        if len(edges) < top:
            edges = self._ports.graph.get_edges(scope, seeds)
        for edge in edges:
            fragment.edges[edge.id] = edge
        node_ids = {e.source_id for e in fragment.edges.values()} | {
            e.target_id for e in fragment.edges.values()
        }
        fragment.nodes = {node.id: node for node in self._ports.graph.get_nodes(scope, sorted(node_ids))}
        return fragment

    def _hit(self, scope: Scope, fragment: Fragment, edge: GraphEdge, score: float) -> Hit:
        chunk_id = str(edge.properties.get("chunk_id") or "") or _chunk_endpoint(fragment, edge)
        chunk = fragment.nodes.get(chunk_id) if chunk_id else None
        document_id = chunk.properties.get("document_id") if chunk else None
        return Hit(
            text=render_triplet(fragment, edge),
            score=score,
            kind="edge",
            dataset=scope.dataset,
            data_id=edge.data_ids[0] if edge.data_ids else None,
            document_id=str(document_id) if document_id else None,
            chunk_id=chunk_id or None,
            extra={
                "source_id": edge.source_id,
                "target_id": edge.target_id,
                "relationship": edge.relationship,
            },
        )

    def get_context_from_objects(self, request: SearchRequest, objects: list[Hit]) -> str:
        """One triplet a line, each followed by its source: `[document: title, chunk n]`."""
        labels = source_labels(self._ports.graph, request.scopes, objects)
        return "\n".join(with_source(hit.text, labels.get(hit.chunk_id or "", "")) for hit in objects)

    def get_completion_from_context(self, request: SearchRequest, context: str) -> str:
        return answer_from_context(self._ports.completer, request.query, context)


def with_source(text: str, label: str) -> str:
    return f"{text} [{label}]" if label else text


def source_labels(graph: GraphStore, scopes: Sequence[Scope], hits: Sequence[Hit]) -> dict[str, str]:
    """`document: title, chunk n` for each hit's chunk, by chunk id; two graph reads a scope.

    The title is the one its document opens with (`document_title` of its first chunk).
    """
    labels: dict[str, str] = {}
    for scope in scopes:
        chunks = chunk_nodes(graph, scope, (hit.chunk_id for hit in hits if hit.dataset == scope.dataset))
        documents = {str(node.properties.get("document_id") or "") for node in chunks.values()} - {""}
        openings = {document_id: _first_chunk_id(scope, document_id) for document_id in documents}
        found = {node.id: node for node in graph.get_nodes(scope, sorted(documents | {*openings.values()}))}
        for chunk_id, chunk in chunks.items():
            document_id = str(chunk.properties.get("document_id") or "")
            opening = found.get(openings.get(document_id, ""))
            labels[chunk_id] = _label(found.get(document_id), opening, chunk)
    return labels


def _first_chunk_id(scope: Scope, document_id: str) -> str:
    first = Chunk(
        text="", index=0, document_id=document_id, token_count=0, tenant=scope.tenant, dataset=scope.dataset
    )
    return first.id


def _label(document: GraphNode | None, opening: GraphNode | None, chunk: GraphNode) -> str:
    name = str(document.properties.get("name") or "") if document is not None else ""
    title = document_title(str(opening.properties.get("text") or "")) if opening is not None else ""
    source = f"{name}: {title}" if name and title and title != name else name or title
    where = f"chunk {chunk.properties.get('index', '?')}"
    return f"{source}, {where}" if source else where


def document_title(text: str) -> str:
    """The title a document's text opens with: a `Title:` header field (PEPs, RFCs, mail), or a
    first paragraph of one short line that ends no sentence (`Lloyd (film)`, a heading); else ""."""
    head = text[:_TITLE_SEARCH_CHARS]
    field_match = _TITLE_FIELD.search(head)
    if field_match:
        return _clip(" ".join(field_match.group(1).split()))
    first, _, rest = head.strip().partition("\n\n")
    line = " ".join(first.split())
    if not rest.strip() or len(line) > TITLE_CHARS or len(line.split()) > _TITLE_WORDS:
        return ""
    return "" if line.endswith((".", "!", "?", ":", ";", ",")) else line


def _clip(text: str) -> str:
    return text if len(text) <= TITLE_CHARS else text[: TITLE_CHARS - 1] + "…"


def _chunk_endpoint(fragment: Fragment, edge: GraphEdge) -> str:
    for node_id in (edge.source_id, edge.target_id):
        node = fragment.nodes.get(node_id)
        if node is not None and node.type == "DocumentChunk":
            return node_id
    return ""


def node_text(node: GraphNode | None) -> str:
    if node is None:
        return "?"
    for key in ("name", "text"):
        value = node.properties.get(key)
        if value:
            text = " ".join(str(value).split())
            return text if len(text) <= NODE_TEXT_CHARS else text[: NODE_TEXT_CHARS - 1] + "…"
    return node.type


def render_triplet(fragment: Fragment, edge: GraphEdge) -> str:
    source = node_text(fragment.nodes.get(edge.source_id))
    target = node_text(fragment.nodes.get(edge.target_id))
    line = f"{source} --[{edge.relationship}]--> {target}"
    description = str(edge.properties.get("description") or "")
    return f"{line}: {description}" if description else line
