"""When facts hold: each fact edge keeps the statements that made it (which data item and chunk,
when the text says it became true, when kenning learned it), and the periods it held, worked out
from every statement about its subject: a newer fact of a functional relation (one value at a
time: lives in, works for, CEO of...) or an explicit negation ("no longer", "stopped", "left")
ends it. Nothing is deleted: an ended fact keeps its history, and forgetting the statement that
ended it makes it current again.

Periods follow from the statements alone, never from the clock or the order they were loaded in:
loading the same statements again, in any order, on any worker, gives the same periods.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from kenning.pipeline.collection import FACTS
from kenning.pipeline.models import GraphEdge, GraphNode, Scope
from kenning.pipeline.ports import GraphStore, VectorStore
from kenning.pipeline.temporal import moment_last, moment_start

# Edge properties (JSON values, so every graph store keeps them as they are).
SAID = "said"  # [{data_id, chunk_id, at, recorded_at, ends?, judged_at?}]: each statement of the fact
PERIODS = "periods"  # [{from, from_by, to, to_by, retired_at, retired_by, judged?}]: when it held
NEGATES = "negates"  # true on a negation ("Ana stopped eating meat"): it ends its pair's facts
# In a statement, what an LLM judged (`kenning.pipeline.contradiction`): the facts (edge ids) the
# statement's fact ends, and the entities whose facts it was put against.
ENDS = "ends"
JUDGED_AT = "judged_at"
# In a period, true when a judgment (not a rule) ended it.
JUDGED = "judged"
TIME_FIELDS = (
    SAID,
    PERIODS,
    NEGATES,
    "valid_from",
    "valid_from_by",
    "valid_to",
    "valid_to_by",
    "recorded_at",
    "recorded_by",
    "retired_at",
    "retired_by",
)

Direction = Literal["source", "target", "both"]

# One value at a time: per subject ("source": Ana lives in one city), per object ("target": Acme
# has one CEO), or both ways (married to).
DEFAULT_FUNCTIONAL: dict[str, Direction] = {
    "lives_in": "source",
    "works_for": "source",
    "ceo_of": "target",
    "holds_office": "target",
    "married_to": "both",
    "age": "source",
    "role": "source",
}
_SYNONYMS_OF: dict[str, tuple[str, ...]] = {
    "lives_in": (
        "live_in", "living_in", "lived_in", "resides_in", "reside_in", "resided_in", "residing_in",
        "moved_to", "move_to", "moves_to", "moving_to", "relocated_to", "relocate_to", "relocates_to",
        "settled_in", "based_in", "moved_back_to", "lives_at", "live_at", "home_in", "resident_of",
    ),
    "works_for": (
        "work_for", "worked_for", "working_for", "work_at", "works_at", "worked_at", "working_at",
        "employed_by", "employed_at", "joined", "join", "joins", "hired_by", "started_at",
        "started_working_at", "started_working_for", "employee_of", "works_with_employer",
    ),
    "ceo_of": (
        "chief_executive_of", "chief_executive_officer_of", "became_ceo_of", "named_ceo_of",
        "appointed_ceo_of", "serves_as_ceo_of", "leads_as_ceo",
    ),
    "married_to": ("married", "marries", "wed", "weds", "spouse_of", "husband_of", "wife_of"),
    "age": ("aged", "has_age", "age_is", "is_aged"),
    "role": ("works_as", "worked_as", "working_as", "work_as", "promoted_to", "job_title", "has_role",
             "serves_as", "position", "holds_position", "title"),
}  # fmt: skip
DEFAULT_SYNONYMS: dict[str, str] = {
    name: family for family, names in _SYNONYMS_OF.items() for name in (family, *names)
}
# Relation words that say only "is" or "became": of an office ("CEO of Acme Corp"), one holder at a time.
_BEING = frozenset(
    {
        "is",
        "was",
        "became",
        "becomes",
        "become",
        "named",
        "appointed",
        "elected",
        "as",
        "is_now",
        "is_new",
        "became_new",
        "named_new",
    }
)
_OFFICE = re.compile(
    r"^(?:the\s+)?(?:new\s+)?(?:ceo|chief executive(?: officer)?|president|chair(?:man|woman|person)?|"
    r"prime minister|managing director|director|head|leader|mayor|governor|cfo|cto|coo|chancellor|"
    r"captain|manager|editor|principal|dean)\s+of\b",
    re.IGNORECASE,
)
_AUXILIARY_PREFIX = re.compile(r"^(?:is|was|are|has_been|have_been|had_been|became|now|currently|still)_")
_NEGATION = re.compile(
    r"^(?:no_longer|not_anymore|stopped|stops|stop|quit|quits|left|leaves|leave|gave_up|gives_up|"
    r"moved_out_of|moved_away_from|resigned_from|resigned_as|resigns_from|divorced|divorces|"
    r"ceased|ceases|ended|ends|retired_from|broke_up_with|sold)(?:_|$)"
)


class FactRules(BaseModel):
    """Which relations hold one value at a time, and the names that mean the same relation."""

    functional: dict[str, Direction] = Field(
        default_factory=lambda: dict(DEFAULT_FUNCTIONAL),
        description="relation -> which end holds one value at a time: source, target or both",
    )
    synonyms: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_SYNONYMS),
        description="relation name -> the relation it means (e.g. moved_to -> lives_in)",
    )
    llm_endings: bool = Field(
        default=False,
        description="With an LLM configured, also ask it, once per entity a load batch gives new "
        "facts, which of the entity's facts each new one ends (`kenning.pipeline.contradiction`)",
    )

    @field_validator("functional", "synonyms")
    @classmethod
    def _names(cls, value: dict[str, str]) -> dict[str, str]:
        # As relation names are kept: snake_case, lower case ("Lives In" is lives_in).
        return {
            _relation(key): _relation(item) if item not in _DIRECTIONS else item
            for key, item in value.items()
        }

    def family(self, relationship: str, target_name: str = "") -> str:
        """The relation a relationship name means: its synonym's, with "is"/"was" dropped from
        its front; "is" or "became" an office ("CEO of Acme") holds the office."""
        name = relationship.casefold()
        if name in _BEING and _OFFICE.match(target_name.strip()):
            return "holds_office"
        for candidate in (name, _AUXILIARY_PREFIX.sub("", name)):
            if candidate in self.synonyms:
                return self.synonyms[candidate]
        return _AUXILIARY_PREFIX.sub("", name)

    def ends_of(self, family: str) -> tuple[bool, bool]:
        """(one value per source, one value per target) for a relation."""
        direction = self.functional.get(family)
        return direction in ("source", "both"), direction in ("target", "both")


_DIRECTIONS = frozenset({"source", "target", "both"})


def _relation(name: str) -> str:
    return "_".join(re.findall(r"[a-z0-9]+", name.casefold()))


def negates(relationship: str) -> bool:
    """Whether a relationship name says its fact stopped ("no_longer_works_for", "left", "quit")."""
    return bool(_NEGATION.match(relationship.casefold()))


def _is_negation(edge: GraphEdge) -> bool:
    return bool(edge.properties.get(NEGATES)) or negates(edge.relationship)


def statement(data_id: str, chunk_id: str, at: str, recorded_at: str) -> dict[str, str]:
    """One statement of a fact: which data item and chunk said it, the moment it says the fact
    began (`kenning.pipeline.temporal`), and when kenning learned it."""
    return {"data_id": data_id, "chunk_id": chunk_id, "at": at, "recorded_at": recorded_at}


def merged_statements(*groups: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The statements of all groups, one per (data item, chunk), in a set order; what was judged
    of a statement (`ENDS`, `JUDGED_AT`) is the union of what every copy of it says."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    judged: dict[tuple[str, str], dict[str, set[str]]] = {}
    for group in groups:
        for said in group:
            key = (str(said.get("data_id", "")), str(said.get("chunk_id", "")))
            found[key] = min(found.get(key, said), said, key=_said_key)
            for name in (ENDS, JUDGED_AT):
                if isinstance(said.get(name), list):
                    judged.setdefault(key, {}).setdefault(name, set()).update(map(str, said[name]))
    for key, lists in judged.items():
        plain = {name: value for name, value in found[key].items() if name not in (ENDS, JUDGED_AT)}
        found[key] = plain | {name: sorted(ids) for name, ids in sorted(lists.items())}
    return sorted(found.values(), key=_said_key)


def _said_key(said: dict[str, Any]) -> tuple[str, ...]:
    return tuple(str(said.get(key, "")) for key in ("at", "recorded_at", "data_id", "chunk_id"))


# Working out the periods.


@dataclass(frozen=True)
class _Said:
    edge: GraphEdge
    data_id: str
    at: str
    recorded_at: str
    start: datetime
    negation: bool
    ends: frozenset[str] = frozenset()


# Edge id -> the periods it held.
Periods = dict[str, list[dict[str, Any]]]


@dataclass(frozen=True)
class Settled:
    """What `settle` worked out: the periods of every fact it read whole, and those it rewrote."""

    periods: Periods
    changed: list[GraphEdge]


Merge = Callable[[GraphEdge, GraphEdge], GraphEdge]


def settle(
    graph: GraphStore,
    scope: Scope,
    node_ids: Sequence[str],
    rules: FactRules,
    whole: Collection[str] | None = None,
    pending: Sequence[GraphEdge] = (),
    merge: Merge | None = None,
) -> Settled:
    """Work out again the periods of every fact touching `node_ids` (the ends of the facts just
    written, or of those a forget took support from) and write those that changed. A statement
    counts only while its data item still supports the fact; the others are dropped from it.

    With `whole`, only those of `node_ids` have every fact of theirs read (`keyed_ends`: where
    the facts written key a relation of one value at a time); of the others, the facts between
    two of `node_ids` are: enough to settle a fact no such relation keys (its negations and
    restatements are between its own ends), without reading every fact of a much-named place
    at each write.

    `pending` are edges not yet written (a load batch's, their ends among `node_ids`): each is
    settled as `merge` (the graph stores' rule) would write it over its stored self, and written
    once with its periods, in the one write of what changed."""
    wanted = set(node_ids)
    read = wanted if whole is None else set(whole) & wanted
    edges = _facts_of(graph, scope, sorted(read), sorted(wanted) if whole is not None else [])
    # A fact a judgment ended may be ended by a fact at its other end: read both its ends.
    beyond = {end for edge in edges if _judged(edge) for end in (edge.source_id, edge.target_id)} - read
    if beyond:
        known = {edge.id for edge in edges}
        edges += [edge for edge in _facts_of(graph, scope, sorted(beyond), []) if edge.id not in known]
        read |= beyond
    stored = {edge.id: edge for edge in edges}
    merged = _over_stored(pending, stored, merge)
    edges = [*(edge for edge in edges if edge.id not in merged), *merged.values()]
    facts = [edge for edge in edges if SAID in edge.properties]
    names = _names(graph, scope, facts) if facts else {}
    timed = periods(facts, rules, names)
    complete = [edge for edge in facts if _complete(edge, rules, names, read, wanted)]
    changed, stale = _changes(complete, timed, rules, stored)
    changed_ids = {edge.id for edge in changed}
    if stale:
        # A write unions statements with the stored ones: a forgotten one goes only with its edge.
        graph.delete_elements(scope, [], stale)
    writes = [*changed, *(edge for edge in merged.values() if edge.id not in changed_ids)]
    if writes:
        graph.upsert_edges(scope, writes)
    return Settled({edge.id: timed.get(edge.id, []) for edge in complete}, changed)


def _over_stored(
    pending: Sequence[GraphEdge], stored: dict[str, GraphEdge], merge: Merge | None
) -> dict[str, GraphEdge]:
    """Each pending edge as it will be written over its stored self (the last of an id wins)."""
    if pending and merge is None:
        raise ValueError("settling pending edges needs the graph stores' merge rule")
    merged: dict[str, GraphEdge] = {}
    for edge in pending:
        earlier = merged.get(edge.id) or stored.get(edge.id)
        merged[edge.id] = merge(edge, earlier) if merge is not None and earlier is not None else edge
    return merged


def _changes(
    complete: Sequence[GraphEdge],
    timed: dict[str, list[dict[str, Any]]],
    rules: FactRules,
    stored: dict[str, GraphEdge],
) -> tuple[list[GraphEdge], list[str]]:
    """The complete facts whose properties their periods change, and the stored ones among them
    that lost a statement (to delete before they are written again)."""
    changed, stale = [], []
    for edge in complete:
        properties = timed_properties(edge, timed.get(edge.id, []), rules)
        if properties != edge.properties:
            changed.append(edge.model_copy(update={"properties": properties}))
            before = stored.get(edge.id, edge)
            if len(properties[SAID]) < len(before.properties.get(SAID) or []):
                stale.append(edge.id)
    return changed, stale


def settle_facts(
    graph: GraphStore,
    vectors: VectorStore,
    scope: Scope,
    rules: FactRules,
    node_ids: Sequence[str],
    written: Iterable[str] = (),
    whole: Collection[str] | None = None,
) -> int:
    """`settle` the facts touching `node_ids` in the scope (every fact of `whole`, None: of all
    of them), and put the periods of those that changed (and of the facts `written` just now)
    into their vector points. How many changed."""
    if not node_ids:
        return 0
    settled = settle(graph, scope, node_ids, rules, whole)
    put_periods(vectors, scope, settled, {*written, *(edge.id for edge in settled.changed)})
    return len(settled.changed)


def put_periods(vectors: VectorStore, scope: Scope, settled: Settled, ids: Collection[str]) -> None:
    """Put the periods `settle` worked out for the facts `ids` into their vector points."""
    values = {edge_id: {PERIODS: held} for edge_id, held in settled.periods.items() if edge_id in ids}
    if values:
        collections = vectors.list_collections()
        for name in FACTS:
            if name in collections:
                vectors.set_payload(scope, name, values)


def _names(graph: GraphStore, scope: Scope, edges: Sequence[GraphEdge]) -> dict[str, str]:
    """The names of the ends a relation of being points at ("is" CEO of Acme Corp)."""
    wanted = sorted({edge.target_id for edge in edges if edge.relationship.casefold() in _BEING})
    nodes: list[GraphNode] = graph.get_nodes(scope, wanted, provenance=False) if wanted else []
    return {node.id: str(node.properties.get("name") or "") for node in nodes}


def _facts_of(graph: GraphStore, scope: Scope, whole: list[str], among: list[str]) -> list[GraphEdge]:
    """The facts (edges with statements) of the nodes `whole`, and those between two of `among`."""
    found = {edge.id: edge for edge in graph.get_edges(scope, whole)} if whole else {}
    if among:
        found.update((edge.id, edge) for edge in graph.get_edges(scope, among, among=True))
    return [edge for edge in found.values() if SAID in edge.properties]


def keyed_ends(
    rules: FactRules, facts: Iterable[tuple[str, str, str]], name_of: Callable[[str], str]
) -> set[str]:
    """Of facts (source, relationship, target), the ends a relation of one value at a time keys
    its value by (a person's one city, a company's one CEO), and both ends of a negation:
    `settle` reads every fact of these."""
    keyed = set()
    for source, relationship, target in facts:
        if negates(relationship):
            # It ends the facts of its two ends, which may be keyed by either: a rare fact.
            keyed |= {source, target}
            continue
        target_name = name_of(target) if relationship.casefold() in _BEING else ""
        per_source, per_target = rules.ends_of(rules.family(relationship, target_name))
        keyed |= {source} if per_source else set()
        keyed |= {target} if per_target else set()
    return keyed


def _complete(
    edge: GraphEdge, rules: FactRules, names: dict[str, str], read: set[str], between: set[str]
) -> bool:
    """Whether every statement that could end the edge was read: the nodes its groups are keyed by
    were among those whose edges were `read` (every one); for the facts of its own two ends (its
    negations), one of them was, or both were among the nodes whose facts `between` them were
    read. A fact a judgment ended needs both its ends: the fact that ended it may be at either."""
    ends = {edge.source_id, edge.target_id}
    pair = bool(ends & read) or ends <= between
    if _judged(edge):
        return ends <= read
    if _is_negation(edge):
        return pair
    per_source, per_target = rules.ends_of(rules.family(edge.relationship, names.get(edge.target_id, "")))
    needed = {edge.source_id} if per_source else set()
    needed |= {edge.target_id} if per_target else set()
    return needed <= read if needed else pair


def _judged(edge: GraphEdge) -> bool:
    """Whether a judgment ended some period of the edge, as it was last settled."""
    held = edge.properties.get(PERIODS)
    return isinstance(held, list) and any(isinstance(p, dict) and p.get(JUDGED) for p in held)


def periods(
    edges: Sequence[GraphEdge], rules: FactRules, names: dict[str, str] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Edge id -> the periods it held, from the statements of all `edges` (see the module doc)."""
    names = names or {}
    groups: dict[tuple[str, ...], list[_Said]] = {}
    pairs: dict[tuple[str, str], list[_Said]] = {}
    keys: dict[str, list[tuple[str, ...]]] = {}
    said = {edge.id: _statements(edge) for edge in edges}
    # Edge id -> the statements judged to end it (`ENDS`), in time order.
    enders: dict[str, list[_Said]] = {}
    for one in (one for statements in said.values() for one in statements):
        for ended in one.ends:
            enders.setdefault(ended, []).append(one)
    for edge in edges:
        family = rules.family(edge.relationship, names.get(edge.target_id, ""))
        per_source, per_target = rules.ends_of(family)
        own: list[tuple[str, ...]] = [("source", edge.source_id, family)] if per_source else []
        own += [("target", edge.target_id, family)] if per_target else []
        keys[edge.id] = [] if _is_negation(edge) else own
        for key in keys[edge.id]:
            groups.setdefault(key, []).extend(said[edge.id])
        pairs.setdefault((edge.source_id, edge.target_id), []).extend(said[edge.id])
    for group in (*groups.values(), *pairs.values(), *enders.values()):
        group.sort(key=_order)
    found: dict[str, list[dict[str, Any]]] = {}
    for edge in edges:
        judged = enders.get(edge.id, [])
        spans = [_first_ender(one, keys[edge.id], groups, pairs, judged) for one in said[edge.id]]
        found[edge.id] = _merged(spans)
    return found


def _statements(edge: GraphEdge) -> list[_Said]:
    live = set(edge.data_ids)
    negation = _is_negation(edge)
    found = []
    for said in merged_statements(edge.properties.get(SAID) or []):
        if said.get("data_id") not in live or not said.get("at"):
            continue
        try:
            start = moment_start(str(said["at"]))
        except ValueError:
            continue
        data_id, at, recorded = str(said["data_id"]), str(said["at"]), str(said.get("recorded_at") or "")
        ends = frozenset(map(str, said.get(ENDS) or ())) - {edge.id}
        found.append(_Said(edge, data_id, at, recorded, start, negation, ends))
    return found


@dataclass(frozen=True)
class _Span:
    """A statement, the earliest later statement that ends it (None: none does), and whether
    only a judgment says that one ends it."""

    one: _Said
    ender: _Said | None
    judged: bool = False


def _first_ender(
    one: _Said,
    keys: list[tuple[str, ...]],
    groups: dict[tuple[str, ...], list[_Said]],
    pairs: dict[tuple[str, str], list[_Said]],
    judged: list[_Said],
) -> _Span:
    """The earliest later statement that ends what `one` says: in one of its functional groups,
    another value; on its pair of ends, a negation (or, of a negation, a fact again); or one
    judged to end its fact (`judged`, in time order)."""
    candidates: list[_Said] = []
    for key in keys:
        value = one.edge.target_id if key[0] == "source" else one.edge.source_id
        for other in groups[key]:
            if other.start > one.start:
                other_value = other.edge.target_id if key[0] == "source" else other.edge.source_id
                if other_value != value:
                    candidates.append(other)
                    break
    for other in pairs[(one.edge.source_id, one.edge.target_id)]:
        if other.start > one.start and other.negation != one.negation:
            candidates.append(other)
            break
    by_rule = min(candidates, key=_order, default=None)
    by_judgment = next((other for other in judged if other.start > one.start), None)
    if by_judgment is not None and (by_rule is None or _order(by_judgment) < _order(by_rule)):
        return _Span(one, by_judgment, judged=True)
    return _Span(one, by_rule)


def _order(said: _Said) -> tuple[datetime, str, str]:
    return said.start, said.recorded_at, said.data_id


def _merged(spans: list[_Span]) -> list[dict[str, Any]]:
    """The statements' spans, overlapping ones joined, as periods."""
    result: list[dict[str, Any]] = []
    last_end: datetime | None = None
    for span in sorted(spans, key=lambda span: _order(span.one)):
        one, ender = span.one, span.ender
        end = ender.start if ender else None
        if result and (last_end is None or one.start < last_end):
            if last_end is not None and (end is None or end > last_end):
                _close(result[-1], span)
                last_end = end
            continue
        result.append({"from": one.at, "from_by": one.data_id, "recorded_at": one.recorded_at})
        _close(result[-1], span)
        last_end = end
    return result


def _close(period: dict[str, Any], span: _Span) -> None:
    one, ender = span.one, span.ender
    period.pop(JUDGED, None)
    if ender is None:
        period.update({"to": None, "to_by": None, "retired_at": None, "retired_by": None})
        return
    # Learned after what ended it, a fact was retired as soon as it was learned.
    period.update(
        {
            "to": ender.at,
            "to_by": ender.data_id,
            "retired_at": max(ender.recorded_at, one.recorded_at),
            "retired_by": ender.edge.id,
        }
    )
    if span.judged:
        period[JUDGED] = True


def timed_properties(edge: GraphEdge, held: list[dict[str, Any]], rules: FactRules) -> dict[str, Any]:
    """The edge's properties with its statements (only those of its data items), its periods, and
    the bounds of the last one."""
    properties = {key: value for key, value in edge.properties.items() if key not in TIME_FIELDS}
    live = set(edge.data_ids)
    said = [s for s in merged_statements(edge.properties.get(SAID) or []) if s.get("data_id") in live]
    properties[SAID] = said
    if _is_negation(edge):
        properties[NEGATES] = True
    if not held:
        return properties
    last, first_said = held[-1], said[0] if said else {}
    bounds = {
        PERIODS: held,
        "valid_from": last["from"],
        "valid_from_by": last["from_by"],
        "valid_to": last["to"],
        "valid_to_by": last["to_by"],
        "recorded_at": min(str(s.get("recorded_at") or "") for s in said) if said else "",
        "recorded_by": first_said.get("data_id", ""),
        "retired_at": last["retired_at"],
        "retired_by": last["retired_by"],
    }
    # No null at the top: a Cypher store keeps no property set to null.
    properties.update({key: value for key, value in bounds.items() if value is not None})
    return properties


# Reading: what held when.


def holds(properties: dict[str, Any], as_of: str | None = None) -> bool:
    """Whether a fact holds now (its last period is open), or `as_of` a moment (some period covers
    the moment's last instant). A fact with no periods (loaded before facts had times, or no fact
    of a text: a structural edge) always holds."""
    held = properties.get(PERIODS)
    if not isinstance(held, list) or not held:
        return True
    if as_of is None:
        return held[-1].get("to") is None
    instant = moment_last(as_of)
    for period in held:
        if moment_start(str(period["from"])) <= instant and (
            period.get("to") is None or instant < moment_start(str(period["to"]))
        ):
            return True
    return False


def held_phrase(properties: dict[str, Any], as_of: str | None = None) -> str:
    """When a fact held, for a context: "(since 2024-05)", "(2023-01-10 to 2024-05)"; "" for a
    fact with no periods, or one that holds since it was added (its text gave no time). Of several
    periods, the one covering `as_of` (default: the last)."""
    held = properties.get(PERIODS)
    if not isinstance(held, list) or not held:
        return ""
    period = held[-1]
    if as_of is not None:
        period = next((p for p in held if holds({PERIODS: [p]}, as_of)), period)
    start = _day(str(period["from"]))
    if period.get("to") is None:
        # A fact whose text gave no time holds since it was added: that says nothing of the world.
        return "" if period["from"] == period.get("recorded_at") else f"(since {start})"
    return f"({start} to {_day(str(period['to']))})"


def fact_line(head: str, properties: dict[str, Any], as_of: str | None = None, description: str = "") -> str:
    """A fact as every context gives it: its ends and relationship (`head`, in the search type's
    layout), when it held (`held_phrase`: of several periods, the one covering `as_of`), then
    what it says: `Ana --[moved_to]--> Berlin (since 2024-05): We moved to Berlin`."""
    held = held_phrase(properties, as_of)
    line = f"{head} {held}" if held else head
    return f"{line}: {description}" if description else line


def _day(moment: str) -> str:
    return moment[:10] if moment.endswith("Z") else moment


# An entity's history.

STRUCTURAL = frozenset({"is_part_of", "contains", "is_a", "made_from", "is_about"})


class Period(BaseModel):
    """One stretch of time a fact held, each bound with the data item that set it."""

    valid_from: str
    valid_from_by: str = ""
    valid_to: str | None = None
    valid_to_by: str | None = None
    recorded_at: str = ""
    retired_at: str | None = None
    retired_by: str | None = Field(default=None, description="The fact that ended it")


class Fact(BaseModel):
    """A fact about an entity, with the periods it held and the data items that state it."""

    id: str
    source: str
    relationship: str
    target: str
    description: str = ""
    negates: bool = False
    current: bool = Field(description="Whether it holds now")
    periods: list[Period] = Field(default_factory=list)
    data_ids: list[str] = Field(default_factory=list)

    def held_at(self, moment: str) -> bool:
        """Whether it held at the moment (`holds` with `as_of`)."""
        return holds({PERIODS: [_raw(p) for p in self.periods]}, moment)

    @property
    def line(self) -> str:
        """`source relationship target (since ...)`: the fact as a context shows it."""
        text = f"{self.source} {self.relationship.replace('_', ' ')} {self.target}"
        return fact_line(text, {PERIODS: [_raw(p) for p in self.periods]})


def _raw(period: Period) -> dict[str, Any]:
    return {"from": period.valid_from, "to": period.valid_to}


def history(graph: GraphStore, scope: Scope, entity_id: str) -> list[Fact]:
    """Every fact of the entity (retired ones too), oldest first, with its periods and sources."""
    edges = [e for e in graph.get_edges(scope, [entity_id]) if e.relationship not in STRUCTURAL]
    ends = sorted({end for edge in edges for end in (edge.source_id, edge.target_id)})
    nodes = {node.id: node for node in graph.get_nodes(scope, ends, provenance=False)} if ends else {}
    facts = []
    for edge in edges:
        source, target = nodes.get(edge.source_id), nodes.get(edge.target_id)
        if source is None or target is None or source.type != "Entity" or target.type != "Entity":
            continue
        held = edge.properties.get(PERIODS) or []
        facts.append(
            Fact(
                id=edge.id,
                source=str(source.properties.get("name") or ""),
                relationship=edge.relationship,
                target=str(target.properties.get("name") or ""),
                description=str(edge.properties.get("description") or ""),
                negates=bool(edge.properties.get(NEGATES)),
                current=holds(edge.properties),
                periods=[_period(p) for p in held],
                data_ids=edge.data_ids,
            )
        )
    return sorted(facts, key=_fact_order)


def _period(raw: dict[str, Any]) -> Period:
    return Period(
        valid_from=str(raw.get("from") or ""),
        valid_from_by=str(raw.get("from_by") or ""),
        valid_to=raw.get("to"),
        valid_to_by=raw.get("to_by"),
        recorded_at=str(raw.get("recorded_at") or ""),
        retired_at=raw.get("retired_at"),
        retired_by=raw.get("retired_by"),
    )


def _fact_order(fact: Fact) -> tuple[str, str, str, str]:
    first = moment_start(fact.periods[0].valid_from).isoformat() if fact.periods else ""
    return (first, fact.relationship, fact.target, fact.id)
