"""Messages that tell what no longer holds: recall answers from what is true now, or at `as_of`.

Remembered messages are history: "I live in Oslo" stays said after "we moved to Berlin", and a
search over messages finds both. So the facts each found message states (the graph's fact edges
whose statements cite its chunk) are read, with their periods (`kenning.pipeline.validity`):
those about an entity the question names, and about what it asks (a word of the question is a
word of the fact's relation, of a name of its relation, or of its other end's name). A message
all of whose such facts do not hold at the moment asked is kept, but marked (`held`: when they
held; `instead`: the facts of the same relations that hold then) and ranked below the others;
and the facts that hold instead come first, as hits of kind `fact` ("Ana moved to Berlin (since
2024-05)"). With no such fact a message is left as it is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kenning.pipeline.lexical import tokenize
from kenning.pipeline.models import GraphEdge, GraphNode, Scope
from kenning.pipeline.ports import GraphStore
from kenning.pipeline.validity import (
    DEFAULT_SYNONYMS,
    NEGATES,
    PERIODS,
    SAID,
    STRUCTURAL,
    FactRules,
    fact_line,
    held_phrase,
    holds,
)
from kenning.retrieval.contract import Hit

ENTITY = "Entity"
FACT = "fact"
# A marked message's score is at most this share of the lowest score of the unmarked ones.
BELOW = 0.9
# Words match on their first letters: live, lives, lived, living; work, works, working.
STEM = 4
_RULES = FactRules()
_NAMES_OF: dict[str, set[str]] = {
    family: {name for name, named in DEFAULT_SYNONYMS.items() if named == family}
    for family in set(DEFAULT_SYNONYMS.values())
}


@dataclass(frozen=True)
class Stated:
    """A fact a message states about an entity the question names, with the names of its ends."""

    edge: GraphEdge
    subject: str  # the entity named by the question
    family: str
    line: str

    @property
    def properties(self) -> dict[str, Any]:
        return self.edge.properties


def current_first(
    graph: GraphStore, scope: Scope, query: str, hits: Sequence[Hit], as_of: str | None
) -> list[Hit]:
    """The hits (messages, by chunk) with those that state only facts not holding at `as_of` (None:
    now) marked and put last, after the facts holding instead (see the module's docstring).
    `graph` reads every fact, retired ones too."""
    chunk_ids = sorted({hit.chunk_id for hit in hits if hit.chunk_id})
    if not chunk_ids:
        return list(hits)
    stated = facts_stated(graph, scope, query, chunk_ids)
    if not stated:
        return list(hits)
    every = [fact for facts in stated.values() for fact in facts]
    marked: dict[str, tuple[str, list[Stated]]] = {}
    for chunk_id, facts in stated.items():
        if chunk_id and not any(holds(fact.properties, as_of) for fact in facts):
            marked[chunk_id] = (_held(facts, as_of), _instead(facts, every, as_of))
    if not marked:
        return list(hits)
    return _reranked(scope, hits, marked, as_of)


def facts_stated(
    graph: GraphStore, scope: Scope, query: str, chunk_ids: Sequence[str]
) -> dict[str, list[Stated]]:
    """Chunk id -> the facts it states about an entity the query names, on what the query asks;
    beside them (under ""), every other fact of those entities on what it asks."""
    contained = [
        e for e in graph.get_edges(scope, chunk_ids, provenance=False) if e.relationship == "contains"
    ]
    entity_ids = sorted({edge.target_id for edge in contained})
    if not entity_ids:
        return {}
    words = _stems(tokenize(query))
    named = {
        node.id: _name(node)
        for node in graph.get_nodes(scope, entity_ids, provenance=False)
        if node.type == ENTITY and _named(_name(node), query)
    }
    if not named or not words:
        return {}
    edges = [e for e in graph.get_edges(scope, sorted(named)) if _is_fact(e)]
    ends = sorted({end for edge in edges for end in (edge.source_id, edge.target_id)} - set(named))
    names = dict(named)
    names.update(
        {node.id: _name(node) for node in graph.get_nodes(scope, ends, provenance=False)} if ends else {}
    )
    wanted = set(chunk_ids)
    found: dict[str, list[Stated]] = {}
    for edge in edges:
        fact = _stated(edge, named, names)
        if fact is None or not words & _fact_words(fact, names):
            continue
        cited = {str(said.get("chunk_id") or "") for said in edge.properties.get(SAID) or []}
        for chunk_id in (cited & wanted) or {""}:
            found.setdefault(chunk_id, []).append(fact)
    return found


def _is_fact(edge: GraphEdge) -> bool:
    return edge.relationship not in STRUCTURAL and bool(edge.properties.get(PERIODS))


def _stated(edge: GraphEdge, named: Mapping[str, str], names: Mapping[str, str]) -> Stated | None:
    if edge.source_id not in names or edge.target_id not in names:
        return None
    subject = edge.source_id if edge.source_id in named else edge.target_id
    family = _RULES.family(edge.relationship, names[edge.target_id])
    line = f"{names[edge.source_id]} {edge.relationship.replace('_', ' ')} {names[edge.target_id]}"
    return Stated(edge=edge, subject=subject, family=family, line=line)


def _fact_words(fact: Stated, names: Mapping[str, str]) -> set[str]:
    """The words a question about the fact may use: its relation's, its relation's other names',
    and the name of its end that the question did not name."""
    edge = fact.edge
    other = edge.target_id if fact.subject == edge.source_id else edge.source_id
    relations = {edge.relationship, fact.family, *_NAMES_OF.get(fact.family, ())}
    words = [word for relation in relations for word in tokenize(relation.replace("_", " "))]
    return _stems([*words, *tokenize(names[other])])


def _stems(words: Iterable[str]) -> set[str]:
    return {word[:STEM] for word in words if len(word) > 2}


def _named(name: str, query: str) -> bool:
    return bool(name) and re.search(rf"(?<!\w){re.escape(name)}(?!\w)", query, re.IGNORECASE) is not None


def _name(node: GraphNode) -> str:
    return str(node.properties.get("name") or "")


def _held(facts: Sequence[Stated], as_of: str | None) -> str:
    """When the facts held, as a context says it ("2023-01-10 to 2024-05"), the first one's."""
    phrases = [held_phrase(fact.properties, as_of).strip("()") for fact in facts]
    return next((phrase for phrase in phrases if phrase), "")


def _instead(facts: Sequence[Stated], every: Sequence[Stated], as_of: str | None) -> list[Stated]:
    """The facts holding at `as_of` of the same entity and relation as one of `facts`."""
    kinds = {(fact.subject, fact.family) for fact in facts}
    found = {
        fact.edge.id: fact
        for fact in every
        if (fact.subject, fact.family) in kinds
        and not fact.properties.get(NEGATES)
        and holds(fact.properties, as_of)
    }
    return sorted(found.values(), key=lambda fact: fact.line)


def _reranked(
    scope: Scope, hits: Sequence[Hit], marked: Mapping[str, tuple[str, list[Stated]]], as_of: str | None
) -> list[Hit]:
    """The facts holding instead first, then the unmarked hits, then the marked ones, marked."""
    kept = [hit for hit in hits if hit.chunk_id not in marked]
    old = [hit for hit in hits if hit.chunk_id in marked]
    top = max(hit.score for hit in hits)
    instead = {fact.edge.id: fact for _, facts in marked.values() for fact in facts}
    facts = [_fact_hit(scope, fact, top, as_of) for fact in sorted(instead.values(), key=lambda f: f.line)]
    floor = min((hit.score for hit in kept), default=top)
    for hit in old:
        held, holding = marked[str(hit.chunk_id)]
        hit.score = min(hit.score, floor) * BELOW
        hit.extra["held"] = held
        hit.extra["instead"] = [_line(fact, as_of) for fact in holding]
    return [*facts, *kept, *old]


def _fact_hit(scope: Scope, fact: Stated, score: float, as_of: str | None) -> Hit:
    said = fact.properties.get(SAID) or [{}]
    latest = said[-1]
    return Hit(
        text=_line(fact, as_of),
        score=score,
        kind=FACT,
        dataset=scope.dataset,
        data_id=str(latest.get("data_id") or "") or None,
        extra={"fact_id": fact.edge.id, "held": held_phrase(fact.properties, as_of).strip("()")},
    )


def _line(fact: Stated, as_of: str | None) -> str:
    return fact_line(fact.line, fact.properties, as_of)
