"""GRAPH_PPR: chunks ranked by personalized PageRank over the entity-chunk graph (HippoRAG 2 style).

The walk restarts at the question's entities (its names matched against Entity names, and
each name's nearest Entity_name vectors) and at the closest chunks by vector search; with
`fact_seeds`, at the ends of the facts closest to the question too (what it asks, beside the
names it gives). It runs
on a projected subgraph, never the whole graph: the `contains` edges between chunks and
entities, and the facts between entities, a bounded number of hops around those seeds.
Two entities of the projection that are one thing under two names (one runs word for word within
the other and they embed alike: "Moscow State University" and "Lomonosov Moscow State
University", written in two paragraphs) are joined for the walk, as the graph keeps them apart.
Every step divides a node's score among all its edges in the whole graph, and an entity's
restart weight is shared among the chunks that contain it, so a hub entity spreads thin
rather than pulling every chunk that mentions it to the top. The closest chunks the walk did not
reach follow every chunk it reached, closest first (not in HYBRID_COMPLETION's graph lane: the
closest chunks are a lane of their own there).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from kenning.pipeline import collection
from kenning.pipeline.assembly import ABOUT_RELATIONSHIP, STRUCTURAL_RELATIONSHIPS
from kenning.pipeline.models import EdgeShape, Entity, GraphEdge, Scope, ScoredPoint
from kenning.pipeline.offline import OfflineExtractor
from kenning.pipeline.ports import Neighbourhood
from kenning.retrieval.contract import Hit, SearchPorts, SearchRequest, answer_from_context, options_of
from kenning.retrieval.reference import best_first, chunk_hit, relevance

CONTAINS = "contains"
_WORD = re.compile(r"\w[\w'’-]*")
MAX_SPAN_WORDS = 8
# A name does not run across these.
_BREAKS = frozenset('()[]{},;?!"')
# Structure the walk does not follow: documents, summaries, entity types and dated events.
SKIPPED = sorted(
    (STRUCTURAL_RELATIONSHIPS - {CONTAINS, ABOUT_RELATIONSHIP}) | {"mentions_event", "happened_at"}
)
# Edges from a chunk to its entities: every entity it contains, and the one it is about.
CHUNK_EDGES = frozenset({CONTAINS, ABOUT_RELATIONSHIP})
# The payload field of an Entity_name point that holds the name.
NAME_FIELD = "text"
_NUMBER = re.compile(r"[0-9]")
# The payload fields of a triplet point that name its ends.
FACT_ENDS = ("source_id", "target_id")


class WalkConfig(BaseModel):
    """How GRAPH_PPR seeds and bounds its walk; any field can be set through `SearchRequest.options`."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    damping: float = Field(default=0.5, ge=0.0, lt=1.0, description="The share of a step that follows edges")
    iterations: int = Field(default=30, ge=1, le=200, description="Power iterations")
    chunk_seeds: int = Field(default=10, ge=0, le=200, description="Closest chunks the walk restarts at")
    chunk_weight: float = Field(
        default=0.0,
        ge=0.0,
        description="Restart weight of the chunk seeds in all, beside the entities' 1 (alone: all of it)",
    )
    fact_seeds: int = Field(
        default=0,
        ge=0,
        le=200,
        description="Facts closest to the question whose ends the walk restarts at where no name links",
    )
    fact_share: float = Field(
        default=0.0,
        ge=0.0,
        description="Restart weight of the facts' ends in all, beside the named entities' 1 (alone: all)",
    )
    entity_links: int = Field(default=3, ge=0, le=50, description="Entity_name hits per question name")
    link_distance: float = Field(default=0.2, ge=0.0, le=2.0, description="Farthest Entity_name hit linked")
    hops: int = Field(default=2, ge=0, le=5, description="Hops around the seeds projected")
    max_edges: int = Field(default=4000, ge=1, le=100_000, description="Edges projected at most")
    max_degree: int = Field(default=100, ge=1, description="A node with more edges is not expanded")
    fact_weight: float = Field(default=0.5, ge=0.0, description="A fact edge's weight; `contains` weighs 1")
    about_weight: float = Field(
        default=8.0,
        ge=0.0,
        description="Weight of the edge from a titled chunk to its title's entity, beside `contains`",
    )
    alike_names: float = Field(
        default=0.85,
        ge=0.0,
        le=1.01,
        description="Entities of the walk whose names embed at least this close are joined (above 1: never)",
    )
    alike_weight: float = Field(default=1.0, ge=0.0, description="Weight of an edge joining two alike names")
    alike_entities: int = Field(
        default=2000, ge=0, le=4000, description="Entities of the walk compared by name, at most"
    )


@dataclass(frozen=True)
class Ranked:
    """A chunk the walk reached, with its score (higher is better)."""

    chunk_id: str
    score: float


@dataclass(frozen=True)
class Walk:
    """Where a walk ended: the chunks it reached, best first, and the score of every node; and
    the closest chunks it did not reach, closest first, scored below every chunk it reached."""

    ranked: list[Ranked]
    scores: dict[str, float]
    closest: list[Ranked] = field(default_factory=list)
    # The chunks closest to the query, reached or not, closest first (none without chunk seeds).
    near: list[str] = field(default_factory=list)

    @property
    def nearest(self) -> str:
        """The chunk closest to the query, reached or not ("" when the walk had no chunk seeds)."""
        return self.near[0] if self.near else ""

    @property
    def then_closest(self) -> list[Ranked]:
        """The chunks it reached, then the closest it did not: what a search of the walk alone
        gives (a fusion lane takes `ranked`: the closest chunks have a lane of their own)."""
        return [*self.ranked, *self.closest]


class GraphPprRetriever:
    """Chunks by walk score. `score` is the walk score over the best chunk's, in (0, 1].
    `extra["ppr"]` holds the walk score."""

    def __init__(self, ports: SearchPorts) -> None:
        self._ports = ports

    def get_retrieved_objects(self, request: SearchRequest) -> list[Hit]:
        config = options_of(WalkConfig, request)
        hits: list[Hit] = []
        for scope in request.scopes:
            ranked = walk(self._ports, scope, request.query, config).then_closest[: request.top_k]
            found = self._ports.graph.get_nodes(scope, [entry.chunk_id for entry in ranked])
            nodes = {node.id: node for node in found}
            best = ranked[0].score if ranked else 1.0
            for entry in ranked:
                node = nodes.get(entry.chunk_id)
                if node is not None:
                    hit = chunk_hit(scope, node, relevance(entry.score / best))
                    hit.extra["ppr"] = entry.score
                    hits.append(hit)
        return best_first(hits, request.top_k)

    def get_context_from_objects(self, request: SearchRequest, objects: list[Hit]) -> str:
        return "\n\n".join(hit.text for hit in objects)

    def get_completion_from_context(self, request: SearchRequest, context: str) -> str:
        return answer_from_context(self._ports.completer, request.query, context)


def walk(
    ports: SearchPorts,
    scope: Scope,
    query: str,
    config: WalkConfig,
    vector: Sequence[float] | None = None,
    closest: Sequence[ScoredPoint] | None = None,
) -> Walk:
    """Personalized PageRank from the query's entities and closest chunks over the scope's graph
    around them. A caller that has them already passes `vector`, the query's embedding, and
    `closest`, the scope's chunks nearest to it best first (at least `chunk_seeds` of them, or
    all the scope holds)."""
    names = question_names(query)
    exact = exact_entities(ports, scope, [*names, *question_spans(query)])
    unmatched = [name for name in names if not _within(name, exact)] if config.entity_links else []
    texts = [*([] if vector is not None else [query]), *unmatched]
    embedded = ports.embedder.embed(texts) if texts else []
    query_vector = vector if vector is not None else embedded.pop(0)
    if closest is None:
        closest = (
            ports.vectors.search(scope, collection.CHUNKS, query_vector, config.chunk_seeds, ())
            if config.chunk_seeds
            else []
        )
    chunk_points = closest[: config.chunk_seeds]
    chunk_seeds = {point.id: max(1.0 - point.score, 0.0) for point in chunk_points}
    linked = link_entities(ports, scope, embedded, config)
    entity_seeds = linked | {entity_id: 1.0 for entity_id in exact.values()}
    # With no share beside the names, the facts' ends seed only a question whose names link nothing.
    beside = config.fact_share > 0 or not entity_seeds
    fact_seeds = fact_ends(ports, scope, query_vector, config) if beside else {}
    # Beside named entities, the facts' ends only restart the walk within the names' subgraph:
    # projecting around them too left the names' own neighbourhood out of the edge budget.
    seeds = list(dict.fromkeys([*(entity_seeds or fact_seeds), *chunk_seeds]))
    if not seeds:
        return Walk(ranked=[], scores={})
    projected = ports.graph.neighbourhood(
        scope,
        seeds,
        hops=config.hops,
        limit=config.max_edges,
        max_degree=config.max_degree,
        skip=SKIPPED,
        shape_only=True,
    )
    restart = restart_weights(
        entity_seeds, chunk_seeds, projected, config.chunk_weight, fact_seeds, config.fact_share
    )
    followed = walk_edges(projected.edges, config) + alike_edges(ports, scope, projected.edges, config)
    scores = personalized_pagerank(followed, projected.degrees, restart, config)
    chunks = _chunk_ids(projected.edges) | set(chunk_seeds)
    ranked = sorted(((scores.get(c, 0.0), c) for c in chunks), key=lambda item: (-item[0], item[1]))
    reached = [Ranked(chunk_id, score) for score, chunk_id in ranked if score > 0]
    near = [point.id for point in chunk_points]
    return Walk(ranked=reached, scores=scores, closest=closest_after(reached, chunk_points), near=near)


def closest_after(reached: Sequence[Ranked], closest: Sequence[ScoredPoint]) -> list[Ranked]:
    """The closest chunks the walk did not reach (it reaches little where a small model's graph
    joins the question's names to few chunks), after every chunk it reached, closest first: each
    scored below the last reached (half its score, by similarity)."""
    seen = {entry.chunk_id for entry in reached}
    below = reached[-1].score / 2 if reached else 1.0
    return [
        Ranked(point.id, below * max(1.0 - point.score, 1e-6)) for point in closest if point.id not in seen
    ]


def question_names(query: str) -> list[str]:
    """The names the offline extractor finds in the question, in order, each once."""
    found = OfflineExtractor().extract(query).graph.nodes
    return list(dict.fromkeys(node.name for node in found if node.name.strip()))


def question_spans(query: str) -> list[str]:
    """Every run of 2 to `MAX_SPAN_WORDS` words of the question that starts and ends with a capital
    or a digit, within one clause (no bracket, comma or question mark in it), as written
    ("Guidelines for Language Evolution", "Gaby: A True Story"): the names, titles above all,
    that the extractor cuts at their small words."""
    words = list(_WORD.finditer(query))
    capitals = [n for n, word in enumerate(words) if word.group()[0].isupper() or word.group()[0].isdigit()]
    spans = []
    for first in capitals:
        for last in capitals:
            span = query[words[first].start() : words[last].end()]
            if 2 <= last - first + 1 <= MAX_SPAN_WORDS and not _BREAKS.intersection(span):
                spans.append(span)
    return spans


def exact_entities(ports: SearchPorts, scope: Scope, names: Sequence[str]) -> dict[str, str]:
    """The names that are entities of the scope (by normalised name), name -> entity id; a name
    within a longer one that is an entity too is left out (the longer says which is meant)."""
    ids = {name: Entity(name=name, tenant=scope.tenant, dataset=scope.dataset).id for name in names}
    found = {node.id for node in ports.graph.get_nodes(scope, list(set(ids.values())), provenance=False)}
    matched = {name: entity_id for name, entity_id in ids.items() if entity_id in found}
    return {
        name: entity_id for name, entity_id in matched.items() if not _within(name, matched, strictly=True)
    }


def _within(name: str, names: Mapping[str, str], strictly: bool = False) -> bool:
    """Whether `name` is one of `names`, or (`strictly`: only) part of a longer one, word for word."""
    padded = f" {name.casefold()} "
    return any(
        padded in f" {other.casefold()} " and (len(other) > len(name) or (not strictly and other == name))
        for other in names
    )


def link_entities(
    ports: SearchPorts,
    scope: Scope,
    vectors: Sequence[Sequence[float]],
    config: WalkConfig,
) -> dict[str, float]:
    """Entity ids for the question's names that are no entity's name, by their embeddings
    (`vectors`): each name's nearest Entity_name vectors within `link_distance`, with a link
    strength of 1 - cosine distance. A name that is an entity means that entity (strength 1),
    not the ones whose names embed near it: those are not looked up."""
    links: dict[str, float] = {}
    for vector in vectors if config.entity_links else ():
        for point in ports.vectors.search(scope, collection.ENTITIES, vector, config.entity_links, ()):
            if point.score <= config.link_distance:
                links[point.id] = max(links.get(point.id, 0.0), 1.0 - point.score)
    return links


def fact_ends(
    ports: SearchPorts, scope: Scope, vector: Sequence[float], config: WalkConfig
) -> dict[str, float]:
    """The ends of the `fact_seeds` facts (triplets) closest to the question, each entity with the
    similarity (1 - cosine distance) of its closest fact: what the question asks about, which
    its names alone do not say ("who founded the guild?")."""
    if not config.fact_seeds:
        return {}
    ends: dict[str, float] = {}
    for point in ports.vectors.search(scope, collection.TRIPLETS, vector, config.fact_seeds, FACT_ENDS):
        similarity = max(1.0 - point.score, 0.0)
        for key in FACT_ENDS:
            entity_id = str(point.payload.get(key) or "")
            if entity_id and similarity > ends.get(entity_id, 0.0):
                ends[entity_id] = similarity
    return ends


def restart_weights(
    entities: Mapping[str, float],
    chunks: Mapping[str, float],
    projected: Neighbourhood,
    chunk_weight: float,
    facts: Mapping[str, float] | None = None,
    fact_share: float = 1.0,
) -> dict[str, float]:
    """Where the walk restarts: each named entity by its link strength over the number of its
    edges (a name found everywhere says little), 1 in all; the ends of the closest facts alike,
    `fact_share` in all; the chunks by similarity, `chunk_weight` in all. Each group takes its
    share only beside another (alone, it takes all); with no entity, the chunks alone (whatever
    `chunk_weight`)."""
    named = _normalised(_specific(entities, projected))
    asked = _normalised(_specific(facts or {}, projected))
    found = _normalised(dict(chunks))
    if not named and not asked:
        return found
    groups = [(named, 1.0), (asked, fact_share)] if named and asked else [(named or asked, 1.0)]
    restart: dict[str, float] = {}
    for weights, share in [*groups, (found, chunk_weight)]:
        for node, weight in weights.items():
            restart[node] = restart.get(node, 0.0) + share * weight
    return _normalised(restart)


def _specific(entities: Mapping[str, float], projected: Neighbourhood) -> dict[str, float]:
    """Each entity's strength over the number of its edges."""
    return {
        entity: strength / max(projected.degrees.get(entity, 1), 1) for entity, strength in entities.items()
    }


def walk_edges(edges: Iterable[GraphEdge | EdgeShape], config: WalkConfig) -> list[tuple[str, str, float]]:
    """(source, target, weight) of the edges the walk follows: `contains` weighs 1, `is_about`
    `about_weight`, a fact `fact_weight`."""
    found: list[tuple[str, str, float]] = []
    weights = {CONTAINS: 1.0, ABOUT_RELATIONSHIP: config.about_weight}
    for edge in edges:
        weight = weights.get(edge.relationship, config.fact_weight)
        if weight > 0 and edge.source_id != edge.target_id:
            found.append((edge.source_id, edge.target_id, weight))
    return found


def alike_edges(
    ports: SearchPorts, scope: Scope, edges: Sequence[GraphEdge | EdgeShape], config: WalkConfig
) -> list[tuple[str, str, float]]:
    """Edges joining two entities of the walk that are one thing under two names: the shorter
    name, of two words or more, word for word within the longer, the two embedding at least
    `alike_names` close (by their Entity_name vectors), and no number in either (two dates or two
    models are two things). "Moscow State University" in one paragraph and "Lomonosov Moscow
    State University" in another let the walk cross from one to the other; "Sergei Kosarev" and
    "Sergei Kudryavtsev" do not. Only the entities the walk projected are compared, the first
    `alike_entities` of them in edge order."""
    if config.alike_names > 1.0 or not config.alike_weight or not config.alike_entities:
        return []
    entities = list(dict.fromkeys(_entity_ids(edges)))[: config.alike_entities]
    found = ports.vectors.retrieve(scope, collection.ENTITIES, entities, (NAME_FIELD,)) if entities else []
    named = [(point, str(point.payload.get(NAME_FIELD) or "")) for point in found]
    points = [(point, name) for point, name in named if name and not _NUMBER.search(name)]
    if len(points) < 2:
        return []
    stored = np.asarray([point.vector for point, _ in points], dtype=np.float32)
    stored /= np.maximum(np.linalg.norm(stored, axis=1, keepdims=True), 1e-12)
    similar = np.triu(stored @ stored.T, k=1) >= config.alike_names
    names = [_padded_words(name) for _, name in points]
    return [
        (points[first][0].id, points[second][0].id, config.alike_weight)
        for first, second in zip(*np.nonzero(similar), strict=True)
        if _nested(names[first], names[second])
    ]


def _padded_words(name: str) -> str:
    """The name's words, case-folded, one space between and one at each end."""
    return f" {' '.join(_WORD.findall(name.casefold()))} "


def _nested(one: str, other: str) -> bool:
    """Whether the shorter name, of two words or more, runs word for word within the longer (a
    one-word name, "Beatrice", is within too many others to say which it is)."""
    shorter, longer = sorted((one, other), key=len)
    return shorter.count(" ") > 2 and shorter in longer


def _entity_ids(edges: Iterable[GraphEdge | EdgeShape]) -> Iterator[str]:
    """The entities the edges touch: what a chunk contains or is about, and a fact's ends."""
    for edge in edges:
        if edge.relationship not in CHUNK_EDGES:
            yield edge.source_id
        yield edge.target_id


def personalized_pagerank(
    edges: Sequence[tuple[str, str, float]],
    degrees: Mapping[str, int],
    restart: Mapping[str, float],
    config: WalkConfig,
) -> dict[str, float]:
    """Scores of a walk that, at each step, restarts at `restart` with probability 1 - damping and
    otherwise follows an edge, either way. A node's share along an edge is the edge's weight over
    the node's degree in the whole graph (`degrees`, at least its edges here): what it would send
    beyond the projected subgraph is lost, so a hub passes little to each neighbour."""
    # Nodes numbered as first met: the sums below run in edge order whatever the numbering.
    index: dict[str, int] = {}
    ahead, behind = _positions(index, edges, 0), _positions(index, edges, 1)
    for node in restart:
        index.setdefault(node, len(index))
    nodes = list(index)
    sources, targets = np.concatenate([ahead, behind]), np.concatenate([behind, ahead])
    weights = np.tile(np.fromiter(map(itemgetter(2), edges), dtype=np.float64, count=len(edges)), 2)
    local = np.bincount(sources, weights=weights, minlength=len(nodes))
    whole = np.fromiter(map(degrees.get, nodes, repeat(0)), dtype=np.float64, count=len(nodes))
    spread = np.maximum(local, whole * (local / np.maximum(_edge_counts(sources, len(nodes)), 1)))
    share = weights / np.maximum(spread[sources], 1e-12)
    start = np.fromiter(map(restart.get, nodes, repeat(0.0)), dtype=np.float64, count=len(nodes))
    scores, restarted = start.copy(), (1.0 - config.damping) * start
    for _ in range(config.iterations):
        moved = np.bincount(targets, weights=scores[sources] * share, minlength=len(nodes))
        scores = restarted + config.damping * moved
    return dict(zip(nodes, scores.tolist(), strict=True))


def _positions(index: dict[str, int], edges: Sequence[tuple[str, str, float]], end: int) -> np.ndarray:
    """The number of each edge's `end` (0: source, 1: target), in edge order; a node met for the
    first time is numbered next."""
    ends: Iterator[str] = map(itemgetter(end), edges)
    return np.fromiter(
        (index.setdefault(node, len(index)) for node in ends), dtype=np.int64, count=len(edges)
    )


def _edge_counts(sources: np.ndarray, size: int) -> np.ndarray:
    return np.bincount(sources, minlength=size).astype(np.float64)


def _chunk_ids(edges: Iterable[GraphEdge | EdgeShape]) -> set[str]:
    return {edge.source_id for edge in edges if edge.relationship in CHUNK_EDGES}


def _normalised(weights: dict[str, float]) -> dict[str, float]:
    total = sum(weights.values())
    return {key: value / total for key, value in weights.items() if value > 0} if total > 0 else {}
