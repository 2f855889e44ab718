"""What the load step asks an LLM of the facts a batch gives an entity, and what it keeps of the
replies (`kenning.pipeline.contradiction`), on the in-memory graph with a scripted judge."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from pydantic import BaseModel

from kenning.pipeline.checks import REPLIES_REPAIRED
from kenning.pipeline.contradiction import (
    ENDED_BY_JUDGMENT,
    FACTS_RETIMED,
    JUDGMENTS,
    JUDGMENTS_FAILED,
    MAX_NEW,
    NEW_LEFT_OUT,
    PAIRS_LEFT_OUT,
    UNKNOWN_IDS,
    Endings,
    FactJudge,
    judge_batch,
    judge_of,
    unwrap_listing,
)
from kenning.pipeline.errors import LLMError
from kenning.pipeline.models import GraphEdge, GraphNode, Scope
from kenning.pipeline.offline import OfflineExtractor
from kenning.pipeline.validity import JUDGED, FactRules, holds, settle_facts, statement
from kenning.storage.graph.memory import MemoryGraphStore
from kenning.storage.vectors.memory import MemoryVectorStore

SCOPE = Scope(tenant="t", dataset="d")
RULES = FactRules(llm_endings=True)
Shape = TypeVar("Shape", bound=BaseModel)
Reply = Callable[[dict[str, Any]], dict[str, Any]]


class ScriptedJudge:
    """Answers each listing with `reply(listing)`; keeps the listings it was asked."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.asked: list[dict[str, Any]] = []

    def ask_structured(
        self, system: str, user: str, shape: type[Shape], max_tokens: int
    ) -> tuple[Shape, dict[str, int]]:
        listing = unwrap_listing(user)
        assert listing is not None and max_tokens > 0
        self.asked.append(listing)
        return shape.model_validate(self.reply(listing)), {REPLIES_REPAIRED: 1}


def key_of(listing: dict[str, Any], target: str) -> str:
    """The key of the listed fact whose target is named `target` (any case)."""
    return next(str(fact["id"]) for fact in listing["facts"] if fact["target"].casefold() == target)


def ending(ender: str, *ended: str) -> Reply:
    """The reply: the fact whose target is `ender` ends those whose targets are `ended`."""

    def reply(listing: dict[str, Any]) -> dict[str, Any]:
        if ender not in {fact["target"].casefold() for fact in listing["facts"]}:
            return {"endings": []}
        return {"endings": [{"fact": key_of(listing, ender), "ends": [key_of(listing, e) for e in ended]}]}

    return reply


class Graph:
    """An in-memory graph of Ana and her teams, written as load batches write it."""

    def __init__(self) -> None:
        self.graph = MemoryGraphStore()
        self.vectors = MemoryVectorStore()
        names = ["Ana", "Rovers", "United", "Oslo", "Berlin"]
        self.graph.upsert_nodes(
            SCOPE,
            [
                GraphNode(id=n.lower(), type="Entity", properties={"name": n}, data_ids=["seed"])
                for n in names
            ],
        )

    def load(self, judge: FactJudge | None, *facts: tuple[str, ...]) -> dict[str, int]:
        """One load batch of facts (source, relationship, target, moment[, data id]), each from
        a data item of its own (by default named after its target), then settled."""
        edges: list[GraphEdge] = []
        for source, relationship, target, at, *named in facts:
            data_id = named[0] if named else f"d-{target}"
            recorded = f"2026-01-0{len(edges) + 1}T00:00:00Z"
            edges.append(
                GraphEdge(
                    id=f"{source}-{relationship}-{target}",
                    source_id=source,
                    target_id=target,
                    relationship=relationship,
                    properties={"said": [statement(data_id, f"c-{data_id}", at, recorded)]},
                    data_ids=[data_id],
                )
            )
        self.graph.upsert_edges(SCOPE, edges)
        ends = sorted({end for edge in edges for end in (edge.source_id, edge.target_id)})
        written = {edge.id for edge in edges}
        # As a load batch settles its facts: by the rules, then by what the judge says.
        counts = {FACTS_RETIMED: settle_facts(self.graph, self.vectors, SCOPE, RULES, ends, written)}
        if judge is None:
            return counts
        judged = judge_batch(self.graph, self.vectors, SCOPE, RULES, ends, written, judge)
        return {**counts, **judged, FACTS_RETIMED: counts[FACTS_RETIMED] + judged[FACTS_RETIMED]}

    def fact(self, edge_id: str) -> GraphEdge:
        return next(edge for edge in self.graph.get_edges(SCOPE, ["ana"]) if edge.id == edge_id)

    def current(self) -> set[str]:
        return {edge.target_id for edge in self.graph.get_edges(SCOPE, ["ana"]) if holds(edge.properties)}


def test_one_call_per_entity_with_the_facts_of_now_and_the_new_ones() -> None:
    graph = Graph()
    judge = ScriptedJudge(ending("united", "rovers"))
    graph.load(judge, ("ana", "plays_for", "rovers", "2021-03-04"))
    assert judge.asked == []  # nothing to put a lone fact against

    # When one batch gives Ana a new team and a new city
    counts = graph.load(
        judge, ("ana", "plays_for", "united", "2023-05-01"), ("ana", "visited", "berlin", "2023-06-01")
    )

    # Then Ana's facts were asked about once (the teams and the city have no other fact)
    assert counts[JUDGMENTS] == 1 and counts[ENDED_BY_JUDGMENT] == 1, counts
    assert counts[REPLIES_REPAIRED] == 1  # what the reply took is counted as an extraction's is
    [listing] = judge.asked
    assert listing["entity"] == "Ana"
    assert {(f["target"], f["since"], f["new"]) for f in listing["facts"]} == {
        ("Rovers", "2021-03-04", False),
        ("United", "2023-05-01", True),
        ("Berlin", "2023-06-01", True),
    }
    assert graph.current() == {"united", "berlin"}
    [held] = graph.fact("ana-plays_for-rovers").properties["periods"]
    assert (held["to"], held["to_by"], held["retired_by"], held[JUDGED]) == (
        "2023-05-01",
        "d-united",
        "ana-plays_for-united",
        True,
    )


def test_ids_not_listed_are_dropped_and_counted_and_impossible_pairs_left_out() -> None:
    graph = Graph()
    graph.load(None, ("ana", "plays_for", "rovers", "2021-03-04"))

    def reply(listing: dict[str, Any]) -> dict[str, Any]:
        rovers, united = key_of(listing, "rovers"), key_of(listing, "united")
        return {
            "endings": [
                {"fact": "f99", "ends": [rovers]},  # an id never listed: 2 unknown
                {"fact": united, "ends": ["x", united]},  # unknown, and a fact ending itself
                {"fact": rovers, "ends": [united]},  # back in time: the earlier ends the later
            ]
        }

    counts = graph.load(ScriptedJudge(reply), ("ana", "plays_for", "united", "2023-05-01"))
    assert (counts[UNKNOWN_IDS], counts[PAIRS_LEFT_OUT], counts.get(ENDED_BY_JUDGMENT, 0)) == (3, 2, 0)
    assert graph.current() == {"rovers", "united"}


def test_a_pair_the_rules_settle_is_not_the_llms_to_end() -> None:
    graph = Graph()
    graph.load(None, ("ana", "lives_in", "oslo", "2020-01-01"), ("ana", "lives_in", "berlin", "2022-01-01"))
    assert graph.current() == {"berlin"}
    judge = ScriptedJudge(ending("oslo", "berlin"))
    # Oslo again, later: the rules end Berlin; no pair is left to ask about
    graph.load(judge, ("ana", "lives_in", "oslo", "2024-01-01", "d-oslo-again"))
    assert judge.asked == [] and graph.current() == {"oslo"}


def test_facts_of_other_subjects_at_an_entity_are_put_together_only_for_one_relation() -> None:
    # Given a city two people speak of in two ways, and a team two people play for
    graph = Graph()
    judge = ScriptedJudge(ending("nobody"))
    graph.load(
        judge, ("ana", "visited", "oslo", "2021-01-01"), ("rovers", "sponsored_by", "oslo", "2021-02-01")
    )
    graph.load(judge, ("united", "plays_against", "rovers", "2021-03-01"))
    # When a new fact of a third subject comes to each
    graph.load(judge, ("berlin", "twinned_with", "oslo", "2022-01-01"))
    assert judge.asked == []  # another subject, another relation: nothing to ask at Oslo
    graph.load(judge, ("ana", "plays_against", "rovers", "2022-01-01", "d-ana"))
    # Then Ana's facts were put together, and at Rovers only those of the same relation to it
    listed = {listing["entity"]: {fact["target"] for fact in listing["facts"]} for listing in judge.asked}
    assert listed == {"Ana": {"Oslo", "Rovers"}, "Rovers": {"Rovers"}}
    [rovers] = [listing for listing in judge.asked if listing["entity"] == "Rovers"]
    assert {fact["source"] for fact in rovers["facts"]} == {"Ana", "United"}


def test_loading_again_asks_nothing_and_retires_at_the_same_time() -> None:
    graph = Graph()
    judge = ScriptedJudge(ending("united", "rovers"))
    graph.load(judge, ("ana", "plays_for", "rovers", "2021-03-04"))
    graph.load(judge, ("ana", "plays_for", "united", "2023-05-01"))
    before = graph.fact("ana-plays_for-rovers").properties

    # When both batches are loaded again (redelivered), in the other order
    again = graph.load(judge, ("ana", "plays_for", "united", "2023-05-01"))
    again.update(graph.load(judge, ("ana", "plays_for", "rovers", "2021-03-04")))

    assert len(judge.asked) == 1 and JUDGMENTS not in again
    assert graph.fact("ana-plays_for-rovers").properties == before


def test_a_later_fact_loaded_first_ends_the_earlier_one_loaded_after() -> None:
    graph = Graph()
    judge = ScriptedJudge(ending("united", "rovers"))
    graph.load(judge, ("ana", "plays_for", "united", "2023-05-01"))
    graph.load(judge, ("ana", "plays_for", "rovers", "2021-03-04"))
    assert graph.current() == {"united"}
    assert graph.fact("ana-plays_for-rovers").properties["periods"][0]["to"] == "2023-05-01"


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
@pytest.mark.parametrize("together", [False, True])
def test_a_team_again_after_another_holds_twice_in_any_order(order: tuple[int, ...], together: bool) -> None:
    # Given Ana played for Rovers, then United, then Rovers again, loaded in any order (the last
    # two in one batch, or each in a batch of its own)
    said = [
        ("ana", "plays_for", "rovers", "2020-01-01", "d1"),
        ("ana", "plays_for", "united", "2021-01-01", "d2"),
        ("ana", "plays_for", "rovers", "2022-01-01", "d3"),
    ]
    graph = Graph()
    judge = ScriptedJudge(same_relation_ends)
    batches = (
        [[said[i] for i in order[:1]], [said[i] for i in order[1:]]]
        if together
        else [[said[i]] for i in order]
    )
    for batch in batches:
        graph.load(judge, *batch)

    # Then each held until the next began
    def spans(edge_id: str) -> list[tuple[str, str | None]]:
        return [(p["from"], p["to"]) for p in graph.fact(edge_id).properties["periods"]]

    assert spans("ana-plays_for-rovers") == [("2020-01-01", "2021-01-01"), ("2022-01-01", None)]
    assert spans("ana-plays_for-united") == [("2021-01-01", "2022-01-01")]


def same_relation_ends(listing: dict[str, Any]) -> dict[str, Any]:
    """A later fact ends an earlier one of the same relationship with another target."""
    facts = listing["facts"]
    return {
        "endings": [
            {
                "fact": later["id"],
                "ends": [
                    e["id"]
                    for e in facts
                    if e["relationship"] == later["relationship"]
                    and e["target"] != later["target"]
                    and e["since"] < later["since"]
                ],
            }
            for later in facts
        ]
    }


def test_new_facts_beyond_a_call_are_counted_and_asked_about_when_loaded_again() -> None:
    # Given one batch giving Ana more new teams than a call lists
    graph = Graph()
    teams = [f"team{number:02}" for number in range(MAX_NEW + 2)]
    graph.graph.upsert_nodes(
        SCOPE, [GraphNode(id=t, type="Entity", properties={"name": t}, data_ids=["seed"]) for t in teams]
    )
    batch = [("ana", "plays_for", team, f"2021-01-{number + 1:02}") for number, team in enumerate(teams)]
    judge = ScriptedJudge(same_relation_ends)
    counts = graph.load(judge, *batch)

    # Then the latest were listed, the two earliest counted as left out and not marked judged
    assert counts[NEW_LEFT_OUT] == 2 and len(judge.asked) == 1
    assert {fact["target"] for fact in judge.asked[0]["facts"]} == set(teams[2:])
    # And loading the batch again asks about them, and a third time asks nothing
    graph.load(judge, *batch)
    assert len(judge.asked) == 2 and {"team00", "team01"} <= {f["target"] for f in judge.asked[1]["facts"]}
    graph.load(judge, *batch)
    assert len(judge.asked) == 2 and graph.current() == {teams[-1]}


def test_no_usable_reply_leaves_the_rules_settlement_and_asks_again_next_time() -> None:
    graph = Graph()
    graph.load(None, ("ana", "plays_for", "rovers", "2021-03-04"))

    class Failing(ScriptedJudge):
        def ask_structured(
            self, system: str, user: str, shape: type[Shape], max_tokens: int
        ) -> tuple[Shape, dict[str, int]]:
            raise LLMError("the answer was not usable, even repaired once")

    counts = graph.load(Failing(ending("united", "rovers")), ("ana", "plays_for", "united", "2023-05-01"))
    assert (counts[JUDGMENTS], counts[JUDGMENTS_FAILED]) == (1, 1) and graph.current() == {"rovers", "united"}
    judge = ScriptedJudge(ending("united", "rovers"))
    graph.load(judge, ("ana", "plays_for", "united", "2023-05-01"))
    assert len(judge.asked) == 1 and graph.current() == {"united"}


def test_forgetting_the_ender_brings_the_ended_fact_back_whichever_end_is_settled() -> None:
    graph = Graph()
    judge = ScriptedJudge(ending("united", "rovers"))
    graph.load(judge, ("ana", "plays_for", "rovers", "2021-03-04"))
    graph.load(judge, ("ana", "plays_for", "united", "2023-05-01"))
    assert graph.current() == {"united"}
    # (settling the facts of the team alone does not lose what ended it: the fact is at Ana)
    settle_facts(graph.graph, graph.vectors, SCOPE, RULES, ["rovers"])
    assert graph.current() == {"united"}

    # When the data item of the ending fact is forgotten, and only the team's end is settled
    graph.graph.remove_data(SCOPE, ["d-united"])
    settle_facts(graph.graph, graph.vectors, SCOPE, RULES, ["rovers"])

    # Then the fact it ended holds again (its other end was read too)
    assert graph.current() == {"rovers"}


def test_only_an_llm_extractor_with_the_setting_on_judges() -> None:
    assert judge_of(OfflineExtractor(), RULES) is None
    judge = ScriptedJudge(ending("united"))
    assert judge_of(judge, RULES) is judge
    assert judge_of(judge, FactRules()) is None
    assert FACTS_RETIMED in Graph().load(None, ("ana", "plays_for", "rovers", "2021-03-04"))
    assert Endings.model_validate({"endings": [{"fact": "f1", "ends": ["f2"], "why": "moved"}]})
