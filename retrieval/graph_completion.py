"""GRAPH_COMPLETION: the best chunks of a graph walk, as their facts (triplets) and their text.

The walk is GRAPH_PPR's (personalized PageRank from the question's entities, the facts
closest to it and its closest chunks, see retrieval.graph_ppr). From each of the best chunks
come the facts extracted from it, closest to the question first (by their triplets' vectors);
they are taken in rounds, one per chunk at a time, so the context covers many chunks. Only
facts between entities are given: the pipeline's own edges (a chunk `contains` an entity,
`is_part_of` a document, an entity `is_a` type...) are structure, not knowledge.

The first few of the best chunks (`passages`, by default 5 and at most half the results) also
give their text, before their facts: what a model extracted from a paragraph is less than the
paragraph (measured on HotpotQA, docs/real-llm.md), and the text is what a reader answers best
from. The chunk closest to the question is always one of them (`with_closest`), and the second
closest gives its text too wherever the walk ranks it (`closest_passages`, `shown`). A chunk some
fact of which does not hold at the moment searched never gives its text (it would say what no
longer holds); one no fact was ever extracted from gives its text in its turn. `passages` 0
gives facts alone.

Beside passages, the reader's context holds the facts of the passages' chunks and of the chunks
that cannot give their text (some fact of theirs no longer holds); what the chunks below the
passages give (a fact, or the text of one no fact was extracted from) stays among the results
(their sources count in the walk's recall) but is kept out of the context (`below_facts` gives
it too): with HotpotQA's paragraphs and a 1.5B reader it led the reader astray more often than
it helped (docs/real-llm.md).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from kenning.pipeline import collection
from kenning.pipeline.assembly import STRUCTURAL_RELATIONSHIPS
from kenning.pipeline.linking import document_title
from kenning.pipeline.models import Chunk, GraphEdge, GraphNode, Scope
from kenning.pipeline.ports import GraphStore
from kenning.pipeline.validity import fact_line, holds
from kenning.retrieval.contract import (
    Hit,
    SearchPorts,
    SearchRequest,
    answer_from_context,
    options_of,
    passages_and_facts,
)
from kenning.retrieval.graph_ppr import CONTAINS, Walk, WalkConfig, walk
from kenning.retrieval.reference import best_first, chunk_hit, chunk_nodes, first
from kenning.retrieval.timeline import every_fact

TOP_EDGES = 15
PASSAGES = 5
CLOSEST_PASSAGES = 2
NODE_TEXT_CHARS = 300
TITLE_CHARS = 120


class CompletionOptions(BaseModel):
    """GRAPH_COMPLETION's own options (`SearchRequest.options`), beside the walk's (`WalkConfig`)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    top_edges: int = Field(default=TOP_EDGES, ge=1, le=1000, description="Facts (and texts) given at most")
    passages: int | None = Field(
        default=None, ge=0, le=1000, description="Best chunks giving their text; None: 5, at most top_k / 2"
    )
    below_facts: bool = Field(
        default=False, description="Give the reader what the chunks below the passages give too"
    )
    closest_passages: int = Field(
        default=CLOSEST_PASSAGES,
        ge=0,
        le=1000,
        description="The question's closest chunks that give their text wherever the walk ranks them",
    )


@dataclass
class Fragment:
    """A projected piece of the graph: the nodes and facts the triplets are drawn from."""

    nodes: dict[str, GraphNode] = field(default_factory=dict)
    edges: dict[str, GraphEdge] = field(default_factory=dict)
    # Chunks some fact was extracted from, whether it holds at the moment searched or not.
    told: set[str] = field(default_factory=set)
    # Chunks some fact was extracted from that does not hold at the moment searched.
    stale: set[str] = field(default_factory=set)


def is_fact(edge: GraphEdge) -> bool:
    """Whether an edge is knowledge to give a reader, not the pipeline's structure."""
    return edge.relationship not in STRUCTURAL_RELATIONSHIPS


BELOW = "below_passages"


def in_rounds(
    fragment: Fragment,
    chunks: Sequence[str],
    ended: Walk,
    closeness: Mapping[str, float],
    whole: Collection[str] = (),
) -> list[tuple[GraphEdge | str, float]]:
    """Each chunk's facts in order (`chunk_facts`), taken in rounds: the first of every chunk in
    walk order, then the second... The chunks that show their text (`whole`, see `shown`) give it
    (their id) before their facts; any other chunk no fact was ever extracted from gives its text
    alone, and one whose facts no longer hold gives nothing. The score is the round plus the
    chunk's place over the number of chunks: lower is closer."""
    owned: dict[str, list[GraphEdge]] = {chunk: [] for chunk in chunks}
    for edge in fragment.edges.values():
        owner = _chunk_of(edge)
        if owner in owned and is_fact(edge):
            owned[owner].append(edge)
    found: list[tuple[GraphEdge | str, float]] = []
    for place, chunk in enumerate(chunks):
        facts: list[GraphEdge | str] = [*chunk_facts(owned[chunk], ended, closeness)]
        if chunk in whole or not (facts or chunk in fragment.told):
            facts = [chunk, *facts]
        found += [(item, turn + place / len(chunks)) for turn, item in enumerate(facts)]
    return sorted(found, key=lambda item: item[1])


def with_closest(chunks: list[str], closest: str, passages: int) -> list[str]:
    """The walk's chunks with the one closest to the question among the first `passages`: the
    walk ranks the chunks its names lead to above it, and a small model's graph may join the
    names to other paragraphs than the one the question is about. It takes the last passage's
    place (the walk's order above it kept) when the walk put it lower or left it out."""
    if not chunks or not closest or passages < 1 or closest in chunks[:passages]:
        return chunks
    rest = [chunk for chunk in chunks if chunk != closest][: len(chunks) - 1]
    place = min(passages - 1, len(rest))
    return [*rest[:place], closest, *rest[place:]]


def chunk_facts(edges: Sequence[GraphEdge], ended: Walk, closeness: Mapping[str, float]) -> list[GraphEdge]:
    """A chunk's facts, closest to the question first (then by the walk scores of their ends); a
    fact that tells what one before it told (the same description) waits until every fact with
    something new has been given."""

    def order(edge: GraphEdge) -> tuple[float, float, str]:
        reach = ended.scores.get(edge.source_id, 0.0) + ended.scores.get(edge.target_id, 0.0)
        return -closeness.get(edge.id, 0.0), -reach, edge.id

    told: set[str] = set()
    fresh: list[GraphEdge] = []
    repeated: list[GraphEdge] = []
    for edge in sorted(edges, key=order):
        description = str(edge.properties.get("description") or "")
        (repeated if description and description in told else fresh).append(edge)
        told.add(description)
    return fresh + repeated


def _chunk_of(edge: GraphEdge) -> str:
    return str(edge.properties.get("chunk_id") or "")


class GraphCompletionRetriever:
    def __init__(self, ports: SearchPorts) -> None:
        self._ports = ports

    def get_retrieved_objects(self, request: SearchRequest) -> list[Hit]:
        own = options_of(CompletionOptions, request)
        top = own.top_edges
        passages = min(PASSAGES, request.top_k // 2) if own.passages is None else own.passages
        config = options_of(WalkConfig, request)
        vector = self._ports.embedder.embed([request.query])[0]
        hits: list[Hit] = []
        for scope in request.scopes:
            ended = walk(self._ports, scope, request.query, config, vector)
            best = [entry.chunk_id for entry in ended.then_closest[: min(request.top_k, top)]]
            chunks = with_closest(best, ended.nearest, passages)
            fragment = self._project(scope, chunks, request.as_of)
            closeness = self._closeness(scope, vector, list(fragment.edges))
            whole = shown(fragment, chunks, passages, ended.near[: own.closest_passages])
            ranked = in_rounds(fragment, chunks, ended, closeness, whole)[:top]
            edges = [item for item, _ in ranked if isinstance(item, GraphEdge)]
            self._add_nodes(scope, fragment, chunks, edges, passages=len(edges) < len(ranked))
            below = below_passages(fragment, chunks, whole)
            hits += [
                hit
                for item, score in ranked
                if (hit := self._hit(scope, fragment, item, score, request.as_of, below))
            ]
        return best_first(hits, min(top, request.top_k))

    def _project(self, scope: Scope, chunks: list[str], as_of: str | None) -> Fragment:
        """The facts extracted from the chunks (between the entities they contain) that hold at
        `as_of` (now when None), and which chunks any fact came from; no nodes."""
        if not chunks:
            return Fragment()
        graph, wanted = every_fact(self._ports.graph), set(chunks)
        touching = graph.edge_shapes(scope, chunks)
        entities = sorted(
            {
                edge.target_id
                for edge in touching
                if edge.relationship == CONTAINS and edge.source_id in wanted
            }
        )
        facts = [
            edge
            for edge in (graph.get_edges(scope, entities, among=True, provenance=False) if entities else [])
            if is_fact(edge) and _chunk_of(edge) in wanted
        ]
        held = {edge.id: edge for edge in facts if holds(edge.properties, as_of)}
        stale = {_chunk_of(edge) for edge in facts if edge.id not in held}
        return Fragment(edges=held, told={_chunk_of(edge) for edge in facts}, stale=stale)

    def _closeness(self, scope: Scope, vector: Sequence[float], edge_ids: list[str]) -> dict[str, float]:
        """Each fact's cosine similarity to the question, by its triplet's stored vector; a fact
        with none is left out (it comes after those that have one)."""
        if not edge_ids:
            return {}
        points = self._ports.vectors.retrieve(scope, collection.TRIPLETS, edge_ids, ())
        if not points:
            return {}
        query = np.asarray(vector, dtype=np.float64)
        query /= max(float(np.linalg.norm(query)), 1e-12)
        stored = np.asarray([point.vector for point in points], dtype=np.float64)
        return dict(zip((point.id for point in points), (stored @ query).tolist(), strict=True))

    def _add_nodes(
        self, scope: Scope, fragment: Fragment, chunks: list[str], edges: list[GraphEdge], passages: bool
    ) -> None:
        """The chunks and the ends of `edges`, read once the edges are ranked: the triplets name
        only the ends of the edges they keep. Only the chunks come with their data ids: a hit's
        data item is its chunk's."""
        if not edges and not passages:
            return
        graph, wanted = self._ports.graph, set(chunks)
        ends = sorted({end for edge in edges for end in (edge.source_id, edge.target_id)} - wanted)
        nodes = [
            *graph.get_nodes(scope, chunks),
            *(graph.get_nodes(scope, ends, provenance=False) if ends else []),
        ]
        fragment.nodes.update((node.id, node) for node in nodes)

    def _hit(
        self,
        scope: Scope,
        fragment: Fragment,
        item: GraphEdge | str,
        score: float,
        as_of: str | None,
        below: set[str],
    ) -> Hit | None:
        """A triplet's hit, saying when it held (as of `as_of`); a chunk's (its text) for a chunk
        id, unless the chunk is gone."""
        if not isinstance(item, GraphEdge):
            node = fragment.nodes.get(item)
            if node is None:
                return None
            hit = chunk_hit(scope, node, 1.0 / (1.0 + score))
            return hit.model_copy(update={"extra": {**hit.extra, BELOW: True}}) if item in below else hit
        edge = item
        chunk_id = _chunk_of(edge)
        chunk = fragment.nodes.get(chunk_id) if chunk_id else None
        document_id = chunk.properties.get("document_id") if chunk else None
        return Hit(
            text=render_triplet(fragment, edge, as_of),
            score=1.0 / (1.0 + score),  # its place in the rounds, as a score in (0, 1]
            kind="edge",
            dataset=scope.dataset,
            data_id=first(chunk.data_ids) if chunk else None,
            document_id=str(document_id) if document_id else None,
            chunk_id=chunk_id or None,
            extra={
                "source_id": edge.source_id,
                "target_id": edge.target_id,
                "relationship": edge.relationship,
                **({BELOW: True} if chunk_id in below else {}),
            },
        )

    def get_context_from_objects(self, request: SearchRequest, objects: list[Hit]) -> str:
        """The chunks' texts, a blank line between them, then the triplets under `Facts:`, one a
        line; each followed by its source: `[document: title, chunk n]`. Facts alone are one a
        line, with no heading. Beside passages, what the chunks below them give is left out
        (`below_facts`)."""
        shown = objects if options_of(CompletionOptions, request).below_facts else for_reader(objects)
        labels = source_labels(self._ports.graph, request.scopes, shown)
        labelled = [(hit.kind, with_source(hit.text, labels.get(hit.chunk_id or "", ""))) for hit in shown]
        passages = [text for kind, text in labelled if kind == "chunk"]
        facts = [text for kind, text in labelled if kind != "chunk"]
        return passages_and_facts(passages, facts) if passages else "\n".join(facts)

    def get_completion_from_context(self, request: SearchRequest, context: str) -> str:
        return answer_from_context(self._ports.completer, request.query, context)


def shown(fragment: Fragment, chunks: Sequence[str], passages: int, near: Collection[str] = ()) -> set[str]:
    """The chunks that give their text before their facts: the first `passages` of those that may
    (`fresh`), and any other of them among the question's closest (`near`), wherever the walk
    ranked it: a small model's graph may lead the walk past the paragraph that answers. None
    without passages (facts alone)."""
    if passages < 1:
        return set()
    may = fresh(fragment, chunks)
    return set(may[:passages]) | (set(may) & set(near))


def below_passages(fragment: Fragment, chunks: Sequence[str], whole: Collection[str]) -> set[str]:
    """The chunks below the passages that could have given their text but do not (not in
    `whole`, the chunks `shown`), with no fact that no longer holds. None without passages."""
    return set(fresh(fragment, chunks)) - set(whole) if whole else set()


def fresh(fragment: Fragment, chunks: Sequence[str]) -> list[str]:
    """The chunks, in order, that may give their text: no fact of theirs no longer holds."""
    return [chunk for chunk in chunks if chunk not in fragment.stale]


def for_reader(hits: Sequence[Hit]) -> list[Hit]:
    """The hits a reader is given: beside a passage, nothing of a chunk below the passages."""
    if not any(hit.kind == "chunk" and not hit.extra.get(BELOW) for hit in hits):
        return list(hits)
    return [hit for hit in hits if not hit.extra.get(BELOW)]


def with_source(text: str, label: str) -> str:
    return f"{text} [{label}]" if label else text


def source_labels(graph: GraphStore, scopes: Sequence[Scope], hits: Sequence[Hit]) -> dict[str, str]:
    """`document: title, chunk n` for each hit's chunk, by chunk id; two graph reads a scope.

    The title is the one its document opens with (`document_title` of its first chunk).
    """
    labels: dict[str, str] = {}
    for scope in scopes:
        mine = (hit.chunk_id for hit in hits if hit.dataset == scope.dataset)
        chunks = chunk_nodes(graph, scope, mine, provenance=False)
        documents = {str(node.properties.get("document_id") or "") for node in chunks.values()} - {""}
        openings = {document_id: _first_chunk_id(scope, document_id) for document_id in documents}
        wanted = sorted(documents | {*openings.values()})
        found = {node.id: node for node in graph.get_nodes(scope, wanted, provenance=False)}
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
    title = _clip(document_title(str(opening.properties.get("text") or ""))) if opening is not None else ""
    source = f"{name}: {title}" if name and title and title != name else name or title
    where = f"chunk {chunk.properties.get('index', '?')}"
    return f"{source}, {where}" if source else where


def _clip(text: str) -> str:
    return text if len(text) <= TITLE_CHARS else text[: TITLE_CHARS - 1] + "…"


def node_text(node: GraphNode | None) -> str:
    if node is None:
        return "?"
    for key in ("name", "text"):
        value = node.properties.get(key)
        if value:
            text = " ".join(str(value).split())
            return text if len(text) <= NODE_TEXT_CHARS else text[: NODE_TEXT_CHARS - 1] + "…"
    return node.type


def render_triplet(fragment: Fragment, edge: GraphEdge, as_of: str | None = None) -> str:
    """`source --[relationship]--> target (when it held): description` (`fact_line`)."""
    source = node_text(fragment.nodes.get(edge.source_id))
    target = node_text(fragment.nodes.get(edge.target_id))
    description = str(edge.properties.get("description") or "")
    return fact_line(f"{source} --[{edge.relationship}]--> {target}", edge.properties, as_of, description)
