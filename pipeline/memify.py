"""Improve (memify): enrichment steps that run over a dataset's memory after cognify.

- Feedback: each session answer rated 1-5 moves the weight of the nodes it used,
  w <- w + alpha * (r - w) with r = (score - 1) / 4, clipped to [0, 1], starting at 0.5.
  Weights are recomputed from every rating in time order, so a second run changes nothing.
- Consolidation: entities of one type whose names mean the same (the same after
  normalising case, punctuation, possessives and plurals; an acronym of the other's
  words; or, when enabled, embeddings closer than a threshold) become one node. Edges
  are re-pointed to it, provenance is merged, and the merged names are kept as aliases.
  Entities of different types are never merged.
- Session Q&A worth keeping become data items (see `session_sources`), added and cognified
  by the caller like any other text.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime

from pydantic import BaseModel, Field

from kenning.pipeline.assembly import triplet_of
from kenning.pipeline.collection import EDGES, ENTITIES, TRIPLETS
from kenning.pipeline.context import Services
from kenning.pipeline.ingest import Source, text_source
from kenning.pipeline.models import (
    NEUTRAL_WEIGHT,
    Edge,
    Entity,
    GraphEdge,
    GraphNode,
    Scope,
    VectorPoint,
    normalize_name,
)
from kenning.pipeline.session import SessionEntry
from kenning.pipeline.text import inflector

ENTITY_TYPE = Entity.type_name()
_PUNCTUATION = re.compile(r"[^\w\s]")
_POSSESSIVE = re.compile(r"['’]s\b")
_FILLER = frozenset({"the", "of", "and", "for", "a", "an", "&"})


class MemifyConfig(BaseModel):
    alpha: float = Field(default=0.3, gt=0, le=1, description="How far one rating moves a weight")
    merge_similarity: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Also merge same-type entities whose name embeddings are at least "
        "this similar (cosine); 0 = names only",
    )


class Improvement(BaseModel):
    """What one improve run changed."""

    weighted: int = 0
    merged_entities: int = 0
    repointed_edges: int = 0
    session_items: int = 0


class Rating(BaseModel):
    """One rated answer: the elements it used, its score and when it was given."""

    element_ids: list[str]
    score: int = Field(ge=1, le=5)
    time: datetime


# Feedback


def ratings(entries: Iterable[SessionEntry]) -> list[Rating]:
    return [
        Rating(element_ids=entry.element_ids, score=entry.feedback_score, time=entry.time)
        for entry in entries
        if entry.feedback_score is not None and entry.element_ids
    ]


def feedback_weights(rated: Sequence[Rating], alpha: float) -> dict[str, float]:
    """Each element's weight after every rating, applied oldest first from the neutral weight."""
    weights: dict[str, float] = {}
    for rating in sorted(rated, key=lambda r: r.time):
        target = (rating.score - 1) / 4
        for element_id in dict.fromkeys(rating.element_ids):
            weight = weights.get(element_id, NEUTRAL_WEIGHT)
            weights[element_id] = round(min(1.0, max(0.0, weight + alpha * (target - weight))), 6)
    return weights


def apply_weights(services: Services, scope: Scope, weights: dict[str, float]) -> int:
    """Write each node's weight where it changed, into the graph and every vector payload of it."""
    nodes = services.graph.get_nodes(scope, sorted(weights))
    changed = [node for node in nodes if node.properties.get("weight") != weights[node.id]]
    if not changed:
        return 0
    services.graph.upsert_nodes(
        scope,
        [n.model_copy(update={"properties": {**n.properties, "weight": weights[n.id]}}) for n in changed],
    )
    patch = {node.id: {"weight": weights[node.id]} for node in changed}
    for name in services.vectors.list_collections():
        services.vectors.set_payload(scope, name, patch)
    return len(changed)


# Consolidation


def name_key(name: str) -> str:
    """The form two names of one entity share: no case, punctuation, possessive, article or plural."""
    words = _PUNCTUATION.sub(" ", _POSSESSIVE.sub("", normalize_name(name))).split()
    if words and words[0] == "the":
        words = words[1:]
    if words:
        singular = inflector().singular_noun(words[-1])
        words[-1] = singular if isinstance(singular, str) and len(singular) > 2 else words[-1]
    return " ".join(words)


def acronym(name: str) -> str:
    """The initials of a name of two or more words, fillers left out ("New York City" -> "nyc")."""
    words = [w for w in _PUNCTUATION.sub(" ", normalize_name(name)).split() if w not in _FILLER]
    return "".join(word[0] for word in words) if len(words) >= 2 else ""


def _as_acronym(name: str) -> str:
    """A name written as an acronym ("NYC", "N.Y.C."), lower-cased; "" otherwise."""
    letters = name.replace(".", "").strip()
    return letters.lower() if 2 <= len(letters) <= 6 and letters.isalpha() and letters.isupper() else ""


def duplicate_groups(
    entities: Sequence[GraphNode], similar: Iterable[tuple[str, str]] = ()
) -> list[list[str]]:
    """Groups of entity ids that name one thing, never across entity types; singletons left out."""
    parent = {node.id: node.id for node in entities}

    def root(node_id: str) -> str:
        while parent[node_id] != node_id:
            parent[node_id] = parent[parent[node_id]]
            node_id = parent[node_id]
        return node_id

    typed = {node.id: str(node.properties.get("entity_type", "")) for node in entities}
    pairs = [*_name_pairs(entities), *similar]
    for first, second in pairs:
        if first in parent and second in parent and typed[first] == typed[second]:
            parent[root(first)] = root(second)
    groups: dict[str, list[str]] = defaultdict(list)
    for node in entities:
        groups[root(node.id)].append(node.id)
    return sorted(sorted(group) for group in groups.values() if len(group) > 1)


def _name_pairs(entities: Sequence[GraphNode]) -> list[tuple[str, str]]:
    by_key: dict[tuple[str, str], list[str]] = defaultdict(list)
    by_acronym: dict[tuple[str, str], list[str]] = defaultdict(list)
    for node in entities:
        name, kind = str(node.properties.get("name", "")), str(node.properties.get("entity_type", ""))
        by_key[(kind, name_key(name))].append(node.id)
        if acronym(name):
            by_acronym[(kind, acronym(name))].append(node.id)
    pairs = [(ids[0], other) for ids in by_key.values() for other in ids[1:]]
    for node in entities:
        kind = str(node.properties.get("entity_type", ""))
        short = _as_acronym(str(node.properties.get("name", "")))
        pairs += [(node.id, other) for other in by_acronym.get((kind, short), [])]
    return pairs


def canonical(group: Sequence[GraphNode]) -> GraphNode:
    """The node a group merges into: the longest name, then the smallest id."""
    return min(group, key=lambda node: (-len(str(node.properties.get("name", ""))), node.id))


def consolidate(services: Services, scope: Scope, config: MemifyConfig) -> tuple[int, int]:
    """Merge duplicate entities of the scope; (entities merged away, edges re-pointed)."""
    nodes, edges = services.graph.export(scope)
    entities = [node for node in nodes if node.type == ENTITY_TYPE]
    groups = duplicate_groups(entities, _similar_pairs(services, scope, entities, config.merge_similarity))
    by_id = {node.id: node for node in entities}
    merged = repointed = 0
    for group in groups:
        keep = canonical([by_id[node_id] for node_id in group])
        gone = [node_id for node_id in group if node_id != keep.id]
        repointed += _merge(services, scope, keep, [by_id[node_id] for node_id in gone], edges)
        merged += len(gone)
    return merged, repointed


def _similar_pairs(
    services: Services, scope: Scope, entities: Sequence[GraphNode], threshold: float
) -> list[tuple[str, str]]:
    if threshold <= 0 or not entities:
        return []
    names = [str(node.properties.get("name", "")) for node in entities]
    pairs = []
    for node, vector in zip(entities, services.embedder.embed(names), strict=True):
        for hit in services.vectors.search(scope, ENTITIES, vector, 5, fields=["type"]):
            if hit.id != node.id and 1.0 - hit.score >= threshold:
                pairs.append((node.id, hit.id))
    return pairs


def _merge(
    services: Services, scope: Scope, keep: GraphNode, gone: list[GraphNode], edges: list[GraphEdge]
) -> int:
    gone_ids = {node.id for node in gone}
    aliases = sorted(
        {str(n.properties.get("name", "")) for n in gone} | set(keep.properties.get("aliases", []))
    )
    data_ids = sorted({*keep.data_ids, *(d for node in gone for d in node.data_ids)})
    services.graph.upsert_nodes(
        scope,
        [
            keep.model_copy(
                update={"properties": {**keep.properties, "aliases": aliases}, "data_ids": data_ids}
            )
        ],
    )
    touching = [edge for edge in edges if edge.source_id in gone_ids or edge.target_id in gone_ids]
    moved = [_repointed(scope, edge, gone_ids, keep.id) for edge in touching]
    kept = [edge for edge in moved if edge.source_id != edge.target_id]
    services.graph.upsert_edges(scope, kept)
    old_ids = [edge.id for edge in touching]
    services.graph.delete_elements(scope, sorted(gone_ids), old_ids)
    for name in services.vectors.list_collections():
        services.vectors.delete(scope, name, [*gone_ids, *old_ids])
    _index_edges(services, scope, kept, {keep.id: keep, **_endpoints(services, scope, kept)})
    return len(touching)


def _repointed(scope: Scope, edge: GraphEdge, gone: set[str], keep: str) -> GraphEdge:
    source = keep if edge.source_id in gone else edge.source_id
    target = keep if edge.target_id in gone else edge.target_id
    edge_id = Edge(
        tenant=scope.tenant,
        dataset=scope.dataset,
        source_id=source,
        target_id=target,
        relationship=edge.relationship,
    ).id
    return edge.model_copy(update={"id": edge_id, "source_id": source, "target_id": target})


def _endpoints(services: Services, scope: Scope, edges: list[GraphEdge]) -> dict[str, GraphNode]:
    ids = sorted({node_id for edge in edges for node_id in (edge.source_id, edge.target_id)})
    return {node.id: node for node in services.graph.get_nodes(scope, ids)}


def _index_edges(
    services: Services, scope: Scope, edges: list[GraphEdge], nodes: dict[str, GraphNode]
) -> None:
    """The vector points of re-pointed edges: their description and, between entities, their triplet."""
    entries: list[tuple[str, str, str, dict[str, object]]] = []
    for edge in edges:
        payload = {
            "source_id": edge.source_id,
            "target_id": edge.target_id,
            "relationship": edge.relationship,
            "chunk_id": edge.properties.get("chunk_id", ""),
            "data_ids": edge.data_ids,
        }
        description = str(edge.properties.get("description", ""))
        if description:
            entries.append((EDGES, edge.id, description, {**payload, "text": description, "type": "Edge"}))
        source, target = nodes.get(edge.source_id), nodes.get(edge.target_id)
        if source and target and source.type == target.type == ENTITY_TYPE:
            names = str(source.properties.get("name")), str(target.properties.get("name"))
            triplet = triplet_of(names[0], edge.relationship, names[1], description)
            entries.append((TRIPLETS, edge.id, triplet, {**payload, "text": triplet, "type": "Triplet"}))
    if not entries:
        return
    vectors = services.embedder.embed([text for _, _, text, _ in entries])
    by_collection: dict[str, list[VectorPoint]] = defaultdict(list)
    for (name, point_id, _, payload), vector in zip(entries, vectors, strict=True):
        by_collection[name].append(VectorPoint(id=point_id, vector=vector, payload=payload))
    for name, points in by_collection.items():
        services.vectors.ensure_collection(name, services.embedder.dimension)
        services.vectors.upsert(scope, name, points)


# Session Q&A


def session_sources(session_id: str, entries: Iterable[SessionEntry], min_score: int = 4) -> list[Source]:
    """Answered questions worth remembering (rated at least `min_score`, or unrated) as texts whose
    external id is the entry's, so a second run adds nothing new."""
    return [
        text_source(
            f"Q: {entry.question}\nA: {entry.answer}",
            name=f"session {session_id} {entry.id}",
            external_id=f"session:{session_id}:{entry.id}",
        )
        for entry in entries
        if entry.kind == "qa" and entry.answer and (entry.feedback_score or min_score) >= min_score
    ]
