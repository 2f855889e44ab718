"""CONVERSATION: recall of remembered messages, each read in the context of the turn before it.

A conversation remembered message by message is a list of turns. Each turn is one point of
the TURNS collection, under its message's chunk id (so forgetting the message removes it):
its vector is the message read after the turn before it (that turn's speaker and words),
and its payload keeps the message's own text and item, and the chunk ids of the turns
before and after it in the same remembered conversation.

A query is ranked in four lanes fused by reciprocal rank with a small k (a few strong
lanes agreeing should win): the turns' context vectors, the messages' own vectors
(CHUNKS), BM25 over the messages, and BM25 read in context (a message's score plus a
share of the score of the turn before it). More lanes join when the query calls for them
(time words are read by `kenning.retrieval.when`, relative ones against the last day the
conversation was spoken on):
- dated: it names days ("on 1 February, 2023", "last week", "two months ago", "since
  June", "the day before the concert": beside the day the turn closest to it speaks of): the
  turns said then, or whose own words speak of then ("yesterday", said the day after);
- timed: it asks for a time ("when did...", "how long..."): the turns that say a time;
- ordered: it asks for an order ("the first time", "most recently"): the turns closest to it,
  earliest or latest said first;
- speaker: it names exactly one of the speakers: that speaker's turns.
Each ranks its turns by how close they are to the query. A share of each fused score then
goes to the turns beside it in its conversation: an answer often sits next to the words the
question shares. Every hit is one message and cites that message's own item, never a
neighbour's, with its speaker, the time it was said and the days its words speak of.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kenning.pipeline.collection import CHUNKS
from kenning.pipeline.models import Scope, ScoredPoint, VectorPoint
from kenning.pipeline.ports import Embedder, VectorStore
from kenning.retrieval.contract import Hit, SearchPorts, SearchRequest, answer_from_context, options_of
from kenning.retrieval.currency import current_first
from kenning.retrieval.fusion import Weight, known_lanes, reciprocal_rank_fusion
from kenning.retrieval.graph_ppr import WalkConfig, walk
from kenning.retrieval.reference import best_first, by_feedback, feedback, first, relevance
from kenning.retrieval.timeline import every_fact
from kenning.retrieval.turn_cache import (
    STAMP,
    TIME,
    TURN_FIELDS,
    TURNS,
    Known,
    new_stamp,
    said_on,
    turn_cache,
)
from kenning.retrieval.when import Asked, Span, anchored, asked, overlaps, within

__all__ = ["TURNS", "TURN_FIELDS", "said_on"]  # kept here for those reading turns
LANES = ("turns", "chunks", "lexical", "lexical_context", "dated", "timed", "ordered", "speaker", "graph")
# The lanes a query opens by naming a day or a speaker count double: few turns qualify.
NAMED_LANE_WEIGHT = 2.0
ASKED_LANES = ("dated", "timed", "ordered", "speaker")
LINKS = ("previous", "next")


class ConversationConfig(BaseModel):
    """How CONVERSATION ranks; any field can be set through `SearchRequest.options`.

    Tuned on a dev split of LoCoMo's questions with the local embedder (bench/locomo.py).
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    rrf_k: int = Field(default=10, ge=0, description="The k of 1 / (k + rank)")
    weights: dict[str, Weight] = Field(
        description="Each lane's weight; a lane left out of a given dict is off",
        default_factory=lambda: {
            **dict.fromkeys(LANES, 1.0),
            # GRAPH_PPR's walk over the graph of the chat: off, it added nothing on the dev half
            # of LoCoMo (bench/locomo.py); a graph of chat built by an LLM may do better.
            "graph": 0.0,
            "dated": NAMED_LANE_WEIGHT,
            "speaker": NAMED_LANE_WEIGHT,
            # Chosen on LoCoMo's dev half (bench/locomo.py): 2 over 1 and 0 (off).
            "timed": NAMED_LANE_WEIGHT,
        },
    )
    order_pool: int = Field(
        default=10, ge=1, le=1000, description="The closest turns the ordered lane puts in time order"
    )
    depth: int = Field(default=50, ge=1, le=1000, description="Hits taken from each lane")
    context_share: float = Field(
        default=1.0, ge=0.0, le=1.0, description="The share of the previous turn's BM25 in a turn's"
    )
    neighbour_share: float = Field(
        default=0.2, ge=0.0, le=1.0, description="The share of a turn's fused score each neighbour gets"
    )
    max_turns: int = Field(
        default=5000, ge=1, le=100_000, description="Turns read per query: their links and context scores"
    )
    current_first: bool = Field(
        default=True,
        description="Mark the messages whose facts on the question do not hold at the moment asked, rank "
        "them last, and give the facts that hold instead first (kenning.retrieval.currency)",
    )

    @field_validator("weights")
    @classmethod
    def _known_lanes(cls, value: dict[str, float]) -> dict[str, float]:
        return known_lanes(value, LANES)

    def weight(self, lane: str) -> float:
        return float(self.weights.get(lane, 0.0))


@dataclass(frozen=True)
class Turn:
    """One message of a remembered conversation, in order: its item, chunk and text to embed."""

    data_id: str
    chunk_id: str
    document_id: str
    text: str
    context: str = ""
    spoken: str = ""
    speaker: str = ""
    said_at: str = ""  # ISO time the message was said, if known


@dataclass
class Candidate:
    """What the lanes know of one chunk: its point (payload) and its links to the turns beside it."""

    point: ScoredPoint
    previous: str | None = None
    next: str | None = None


def context_text(previous: str, text: str) -> str:
    """A message read after the turn before it (its speaker and words), as the turn's vector sees it."""
    return f"{previous}\n{text}" if previous else text


def turn_points(turns: Sequence[Turn], vectors: Sequence[Sequence[float]]) -> list[VectorPoint]:
    """The TURNS points of turns given in conversation order, each linked to the turns beside it.

    `vectors[i]` embeds `context_text(turns[i].context, turns[i].text)`.
    """
    if len(turns) != len(vectors):
        raise ValueError(f"{len(turns)} turns but {len(vectors)} vectors")
    stamp = new_stamp()  # what reads turns keeps a payload by its stamp (kenning.retrieval.turn_cache)
    points = []
    for index, turn in enumerate(turns):
        previous = turns[index - 1].chunk_id if index > 0 else None
        following = turns[index + 1].chunk_id if index + 1 < len(turns) else None
        payload = {
            "text": turn.text,
            "spoken": turn.spoken,
            "speaker": turn.speaker,
            "said_at": turn.said_at,
            "data_ids": [turn.data_id],
            "document_id": turn.document_id,
            "chunk_id": turn.chunk_id,
            "previous": previous,
            "next": following,
            STAMP: stamp,
        }
        points.append(VectorPoint(id=turn.chunk_id, vector=list(vectors[index]), payload=payload))
    return points


def turns_of(vectors: VectorStore, scope: Scope, chunk_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The payloads of the TURNS points of these chunks (read before they are forgotten), by id."""
    return {point.id: point.payload for point in vectors.retrieve(scope, TURNS, chunk_ids, LINKS)}


def mend_turns(
    vectors: VectorStore, embedder: Embedder, scope: Scope, gone: Mapping[str, Mapping[str, Any]]
) -> int:
    """Close the gaps that forgotten turns (`gone`, from `turns_of`) left in their conversations.

    The turn after a gap is embedded again, read after the nearest surviving turn before it (or
    alone), and the two are linked to each other: no vector or link keeps a forgotten message.
    Returns the turns embedded again.
    """
    gaps = {(_survivor(gone, turn, "previous"), _survivor(gone, turn, "next")) for turn in gone}
    wanted = sorted({turn for gap in gaps for turn in gap if turn})
    found = {point.id: point for point in vectors.retrieve(scope, TURNS, wanted)} if wanted else {}
    pairs = [(_kept(found, before), _kept(found, after)) for before, after in sorted(gaps, key=str)]
    stamp = new_stamp()
    links = {before: {"next": after, STAMP: stamp} for before, after in pairs if before}
    if links:
        vectors.set_payload(scope, TURNS, links)
    mended = [(before, found[after]) for before, after in pairs if after]
    if not mended:
        return 0
    texts = [
        context_text(_spoken(found[before].payload) if before else "", str(point.payload.get("text", "")))
        for before, point in mended
    ]
    points = [
        VectorPoint(
            id=point.id, vector=list(vector), payload={**point.payload, "previous": before, STAMP: stamp}
        )
        for (before, point), vector in zip(mended, embedder.embed(texts), strict=True)
    ]
    vectors.upsert(scope, TURNS, points)
    return len(points)


def _kept(found: Mapping[str, VectorPoint], turn: str | None) -> str | None:
    return turn if turn in found else None


def _survivor(gone: Mapping[str, Mapping[str, Any]], turn_id: str, side: str) -> str | None:
    """The nearest turn on `side` of a forgotten one that is not forgotten itself, or None."""
    step = _link(gone[turn_id].get(side))
    for _ in range(len(gone)):
        if step is None or step not in gone:
            return step
        step = _link(gone[step].get(side))
    return None


def _spoken(payload: Mapping[str, Any]) -> str:
    """`speaker: text` of a turn: stored since turns kept it, else its text without its time."""
    spoken = payload.get("spoken")
    return str(spoken) if spoken else TIME.sub("", str(payload.get("text", "")), count=1)


def in_context(
    scores: Mapping[str, float], previous: Mapping[str, str | None], share: float
) -> dict[str, float]:
    """Each score plus `share` of the score of the turn before it (0 where that one did not score).

    Turns that did not score themselves but follow one that did score too: their context matched.
    """
    found = dict(scores)
    if share <= 0:
        return found
    for item, before in previous.items():
        if before and before in scores:
            found[item] = found.get(item, 0.0) + share * scores[before]
    return found


def spread(
    scores: Mapping[str, float], neighbours: Mapping[str, Sequence[str]], share: float
) -> dict[str, float]:
    """Each turn's score plus `share` of each of its neighbours' scores, from the scores given only
    (one step, so the expansion is bounded: a turn reaches its direct neighbours, no farther)."""
    spread_to = dict(scores)
    if share <= 0:
        return spread_to
    for item, score in scores.items():
        for other in neighbours.get(item, ()):
            spread_to[other] = spread_to.get(other, 0.0) + share * score
    return spread_to


def ranked(scores: Mapping[str, float]) -> list[str]:
    """Ids by score, best first; ties in first-seen order."""
    return [item for item, _ in sorted(scores.items(), key=lambda pair: -pair[1])]


class ConversationRetriever:
    def __init__(self, ports: SearchPorts) -> None:
        self._ports = ports

    def get_retrieved_objects(self, request: SearchRequest) -> list[Hit]:
        config = options_of(ConversationConfig, request)
        vector = self._ports.embedder.embed([request.query])[0]
        hits: list[Hit] = []
        for scope in request.scopes:
            hits += self._scope_hits(scope, request, config, vector)
        return best_first(hits, request.top_k)

    def _scope_hits(
        self, scope: Scope, request: SearchRequest, config: ConversationConfig, vector: list[float]
    ) -> list[Hit]:
        ports = self._ports
        turns, known = turn_cache(ports.vectors).read(ports.vectors, scope, vector, config.max_turns)
        chunks = by_feedback(ports.vectors.search(scope, CHUNKS, vector, config.depth))
        lexical = ports.lexical.search(scope, request.query, config.depth)
        candidates = _candidates(turns, chunks, lexical)
        previous = {item: c.previous for item, c in candidates.items()}
        bm25 = {point.id: float(point.payload.get("bm25") or 0.0) for point in lexical}
        lanes = {
            "turns": [point.id for point in turns[: config.depth]],
            "chunks": [point.id for point in chunks],
            "lexical": [point.id for point in lexical],
            "lexical_context": ranked(in_context(bm25, previous, config.context_share))[: config.depth],
        }
        if config.weight("graph") > 0:
            walking = options_of(WalkConfig, request)
            walked = walk(ports, scope, request.query, walking, vector, chunks)
            lanes["graph"] = [entry.chunk_id for entry in walked.ranked[: config.depth]]
        ask, speaker = asked(request.query, last_day(turns)), named_speaker(turns, request.query)
        if ask.spans or ask.anchor or ask.when or ask.order or speaker:
            close = closeness(turns, chunks, bm25)
            lanes.update(asked_lanes(turns, ask, speaker, close, config, known))
        fused = reciprocal_rank_fusion(lanes, config.weights, config.rrf_k)
        # Every lane's items are read (a walk's chunk not read by a lane has no text to show).
        found = {entry.id: entry.score for entry in fused if entry.id in candidates}
        # The neighbours of the turns that scored: only they spread a share.
        neighbours = {
            item: [other for other in (c.previous, c.next) if other and other in candidates]
            for item in found
            if (c := candidates[item])
        }
        scores = spread(found, neighbours, config.neighbour_share)
        best = best_possible(config, [lane for lane, found in lanes.items() if found])
        moved = feedback(chunks)
        shares = {item: score / best + moved.get(item, 0.0) for item, score in scores.items()}
        hits = []
        for item in ranked(shares)[: request.top_k]:
            hit = _hit(scope, candidates[item].point, ask, known.get(item))
            hit.score = relevance(shares[item])
            hit.extra["fused"] = scores[item]
            hits.append(hit)
        if not config.current_first:
            return hits
        return current_first(every_fact(ports.graph), scope, request.query, hits, request.as_of)

    def get_context_from_objects(self, request: SearchRequest, objects: list[Hit]) -> str:
        return "\n\n".join(hit.text for hit in objects)

    def get_completion_from_context(self, request: SearchRequest, context: str) -> str:
        return answer_from_context(self._ports.completer, request.query, context)


def closeness(
    turns: Sequence[ScoredPoint], chunks: Sequence[ScoredPoint], bm25: Mapping[str, float]
) -> dict[str, float]:
    """How close each turn is to the query, all lanes' evidence summed: its context vector's
    cosine similarity, its message vector's where CHUNKS found it, and its BM25 over the best."""
    top = max(bm25.values(), default=0.0) or 1.0
    message = {point.id: 1.0 - point.score for point in chunks}
    return {
        point.id: 1.0 - point.score + message.get(point.id, 0.0) + bm25.get(point.id, 0.0) / top
        for point in turns
    }


def asked_lanes(
    turns: Sequence[ScoredPoint],
    ask: Asked,
    speaker: str | None,
    close: Mapping[str, float],
    config: ConversationConfig,
    known: Mapping[str, Known] | None = None,
) -> dict[str, list[str]]:
    """The lanes the query's words open (see the module's docstring), each at most `depth` deep;
    `known`: what is known of the turns (else worked out here)."""
    lanes = {
        "dated": dated(turns, list(ask.spans) or event_spans(turns, ask.anchor, close, known), close, known),
        "timed": timed_turns(turns, close, known) if ask.when else [],
        "ordered": in_order(turns, close, ask.order, config.order_pool, known),
        "speaker": spoken_by(turns, speaker, close),
    }
    return {lane: found[: config.depth] for lane, found in lanes.items()}


def event_spans(
    turns: Sequence[ScoredPoint],
    anchor: str,
    close: Mapping[str, float],
    known: Mapping[str, Known] | None = None,
) -> list[Span]:
    """The days "the day before the concert" names: beside the day the turn closest to the query
    speaks of (the day it says, "yesterday" said the day after, else the day it was said)."""
    if not anchor or not turns:
        return []
    top = _known(max(turns, key=lambda point: close[point.id]), known)
    day = top.day
    if day is None:
        return []
    spoken = [start for start, end in top.told() if end - start == timedelta(days=1)]
    return [anchored(anchor, spoken[0] if spoken else day)]


def dated(
    turns: Sequence[ScoredPoint],
    spans: list[Span],
    close: Mapping[str, float],
    known: Mapping[str, Known] | None = None,
) -> list[str]:
    """The turns said in the spans, or whose words speak of a day in them, closest first."""
    if not spans:
        return []
    return _closest([p.id for p in turns if _dated(_known(p, known), spans)], close)


def _dated(turn: Known, spans: list[Span]) -> bool:
    day = turn.day
    if day is None:
        return False
    return within(day, spans) or overlaps(turn.told(), spans)


def timed_turns(
    turns: Sequence[ScoredPoint], close: Mapping[str, float], known: Mapping[str, Known] | None = None
) -> list[str]:
    """The turns whose words say a time or a length of time, closest first."""
    return _closest([point.id for point in turns if _known(point, known).timed()], close)


def in_order(
    turns: Sequence[ScoredPoint],
    close: Mapping[str, float],
    order: int,
    pool: int,
    known: Mapping[str, Known] | None = None,
) -> list[str]:
    """The `pool` turns closest to the query, earliest said first (order 1) or latest first (-1)."""
    if not order:
        return []
    dated_turns = [(point.id, day) for point in turns if (day := _known(point, known).day)]
    closest = sorted(dated_turns, key=lambda pair: -close[pair[0]])[:pool]
    return [item for item, _ in sorted(closest, key=lambda pair: pair[1], reverse=order < 0)]


def last_day(turns: Sequence[ScoredPoint]) -> date | None:
    """The last day any of the turns was said: "last week" in a question is read against it. The
    latest ISO time is the greatest string: one is read as a date, not every turn's."""
    latest = max((point for point in turns if point.payload.get("said_at")), default=None, key=_said_at)
    return said_on(latest.payload) if latest else None


def _said_at(point: ScoredPoint) -> str:
    return str(point.payload.get("said_at"))


def _known(point: ScoredPoint, known: Mapping[str, Known] | None) -> Known:
    """What is known of a turn: from `known` when it holds it, else worked out now."""
    found = known.get(point.id) if known else None
    return found if found is not None else Known(point.payload, None)


def named_speaker(turns: Sequence[ScoredPoint], query: str) -> str | None:
    """The one speaker of these turns the query names by whole words, exactly as spoken; None for
    none or several. A name within a longer one named too ("Mary" in "Mary Ann") does not count."""
    speakers = {str(point.payload.get("speaker") or "") for point in turns} - {""}
    found = [name for name in speakers if re.search(rf"(?<!\w){re.escape(name)}(?!\w)", query)]
    named = [name for name in found if not any(name != longer and name in longer for longer in found)]
    return named[0] if len(named) == 1 else None


def spoken_by(turns: Sequence[ScoredPoint], speaker: str | None, close: Mapping[str, float]) -> list[str]:
    """The turns of that speaker, closest first; none without a speaker."""
    if speaker is None:
        return []
    return _closest([point.id for point in turns if point.payload.get("speaker") == speaker], close)


def _closest(found: list[str], close: Mapping[str, float]) -> list[str]:
    return sorted(found, key=lambda item: -close[item])


def best_possible(config: ConversationConfig, opened: Sequence[str] = LANES) -> float:
    """The score of a turn first in every lane `opened` (those with hits for this query) with both
    neighbours first too: scores over it are 0."""
    top = sum(config.weight(lane) for lane in opened) / (config.rrf_k + 1)
    return top * (1.0 + 2.0 * config.neighbour_share) or 1.0


def _candidates(
    turns: Sequence[ScoredPoint], chunks: Sequence[ScoredPoint], lexical: Sequence[ScoredPoint]
) -> dict[str, Candidate]:
    """Every chunk a lane found, live in this query's reads: turns with their links, then the others."""
    found: dict[str, Candidate] = {}
    for point in turns:
        found[point.id] = Candidate(
            point=point,
            previous=_link(point.payload.get("previous")),
            next=_link(point.payload.get("next")),
        )
    for point in [*chunks, *lexical]:
        if point.id not in found:
            found[point.id] = Candidate(point=point)
    return found


def _hit(scope: Scope, point: ScoredPoint, ask: Asked, known: Known | None = None) -> Hit:
    """The message of a turn, with its speaker, when it was said, and (asked when) the days its
    words speak of, as ISO dates or ranges; `known`: what is known of the turn, if it is one."""
    payload = point.payload
    turn = known if known is not None and known.payload is payload else Known(payload, None)
    document_id = payload.get("document_id")
    extra: dict[str, Any] = {
        "speaker": str(payload.get("speaker") or ""),
        "said_at": str(payload.get("said_at") or ""),
    }
    if turn.day is not None and (ask.when or ask.spans or ask.anchor or ask.order):
        extra["speaks_of"] = [_iso(span) for span in turn.told()]
    return Hit(
        text=str(payload.get("text", "")),
        score=1.0,
        kind="chunk",
        dataset=scope.dataset,
        data_id=first(payload.get("data_ids")),
        document_id=str(document_id) if document_id else None,
        chunk_id=point.id,
        extra=extra,
    )


def _iso(span: Span) -> str:
    start, end = span
    if end - start == timedelta(days=1):
        return start.isoformat()
    last = "" if end == date.max else (end - timedelta(days=1)).isoformat()
    return f"{'' if start == date.min else start.isoformat()}..{last}"


def _link(value: object) -> str | None:
    return str(value) if value else None
