"""When facts held, worked out from their statements alone (`kenning.pipeline.validity`), and the
times texts give (`kenning.pipeline.temporal`)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from kenning.pipeline.errors import ConfigError
from kenning.pipeline.models import GraphEdge, GraphNode, Scope
from kenning.pipeline.temporal import document_time, parse_moment, stated_time
from kenning.pipeline.validity import (
    FactRules,
    held_phrase,
    holds,
    keyed_ends,
    negates,
    periods,
    settle,
    statement,
)
from kenning.storage.graph.memory import MemoryGraphStore
from kenning.workers.runtime.settings import load_settings

RULES = FactRules()


def fact(source: str, relationship: str, target: str, *said: tuple[str, str]) -> GraphEdge:
    """A fact and its statements, each (data id, moment)."""
    return GraphEdge(
        id=f"{source}-{relationship}-{target}",
        source_id=source,
        target_id=target,
        relationship=relationship,
        properties={"said": [statement(d, f"c-{d}", at, f"2026-01-01T00:00:0{d[-1]}Z") for d, at in said]},
        data_ids=[d for d, _ in said],
    )


def spans(
    edges: list[GraphEdge], names: dict[str, str] | None = None
) -> dict[str, list[tuple[str, str | None]]]:
    found = periods(edges, RULES, names)
    return {edge_id: [(p["from"], p["to"]) for p in held] for edge_id, held in found.items()}


def test_a_city_again_after_another_holds_twice() -> None:
    edges = [
        fact("ana", "live_in", "oslo", ("d1", "2020"), ("d3", "2024-02")),
        fact("ana", "moved_to", "berlin", ("d2", "2022-06")),
    ]
    assert spans(edges) == {
        "ana-live_in-oslo": [("2020", "2022-06"), ("2024-02", None)],
        "ana-moved_to-berlin": [("2022-06", "2024-02")],
    }


def test_periods_do_not_depend_on_the_order_facts_come_in() -> None:
    edges = [
        fact("ana", "works_for", "acme", ("d1", "2019-01-01")),
        fact("ana", "joined", "zalando", ("d2", "2021-01-01")),
        fact("ana", "employed_by", "sap", ("d3", "2023-01-01"), ("d4", "2023-05-01")),
        fact("ana", "likes", "jazz", ("d5", "2020-01-01")),
    ]
    expected = spans(edges)
    assert expected["ana-likes-jazz"] == [("2020-01-01", None)]  # no functional relation: never ended
    assert expected["ana-joined-zalando"] == [("2021-01-01", "2023-01-01")]
    shuffled = list(edges)
    random.Random(7).shuffle(shuffled)
    assert spans(shuffled) == expected


def test_an_office_has_one_holder_and_a_person_many_facts() -> None:
    office = {"acme-ceo": "CEO of Acme Corp"}
    edges = [
        fact("alice", "is", "acme-ceo", ("d1", "2019")),
        fact("bob", "became", "acme-ceo", ("d2", "2021-06")),
        fact("alice", "is", "tall", ("d3", "2022")),
    ]
    found = spans(edges, {**office, "tall": "Tall"})
    assert found["alice-is-acme-ceo"] == [("2019", "2021-06")]
    assert found["bob-became-acme-ceo"] == [("2021-06", None)]
    assert found["alice-is-tall"] == [("2022", None)]


def test_statements_at_the_same_time_end_nothing_and_forgotten_ones_count_for_nothing() -> None:
    same = [
        fact("ana", "lives_in", "oslo", ("d1", "2020")),
        fact("ana", "lives_in", "bergen", ("d2", "2020")),
    ]
    assert {held[0][1] for held in spans(same).values()} == {None}
    ended = fact("ana", "lives_in", "oslo", ("d1", "2020"))
    gone = fact("ana", "lives_in", "bergen", ("d2", "2021")).model_copy(update={"data_ids": []})
    assert spans([ended, gone]) == {"ana-lives_in-oslo": [("2020", None)], "ana-lives_in-bergen": []}


def test_a_negation_ends_its_pair_and_a_fact_again_ends_the_negation() -> None:
    edges = [
        fact("ana", "eats", "meat", ("d1", "2020"), ("d3", "2024")),
        fact("ana", "stopped_eating", "meat", ("d2", "2022")),
        fact("ana", "eats", "fish", ("d1", "2020")),
    ]
    assert spans(edges) == {
        "ana-eats-meat": [("2020", "2022"), ("2024", None)],
        "ana-stopped_eating-meat": [("2022", "2024")],
        "ana-eats-fish": [("2020", None)],
    }
    assert all(negates(name) for name in ("no_longer_works_for", "left", "stopped", "quit", "moved_out_of"))
    assert not any(negates(name) for name in ("lives_in", "leftover", "visits"))


def test_holds_now_and_as_of_a_moment() -> None:
    held = {"periods": [{"from": "2020", "to": "2022-06"}, {"from": "2024-02-01", "to": None}]}
    assert holds(held) and holds({}) and holds({"periods": []})
    assert holds(held, "2021") and holds(held, "2022-05") and not holds(held, "2022-06")
    assert not holds(held, "2024-01") and holds(held, "2024-02-01T00:00:00Z")
    assert held_phrase(held) == "(since 2024-02-01)" and held_phrase(held, "2021") == "(2020 to 2022-06)"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[2024-06-02T10:00:00+02:00] Ana: hi", "2024-06-02T08:00:00Z"),
        ("[2024-06-02] Ana: hi", "2024-06-02"),
        ("2021-03-01\nAlice is the CEO.", "2021-03-01"),
        ("---\ntitle: Notes\ndate: 2022-01-05\n---\nBody", "2022-01-05"),
        ("Nothing dated here, 2021 or not.", None),
    ],
)
def test_the_time_a_text_gives_for_itself(text: str, expected: str | None) -> None:
    assert document_time(text) == expected


@pytest.mark.parametrize(
    ("sentence", "reference", "expected"),
    [
        ("We moved to Berlin last month.", "2024-06-02", "2024-05"),
        ("She joined three weeks ago.", "2024-06-02T10:00:00Z", "2024-05-12"),
        ("Bob became CEO in March 2022.", "2023-01-01", "2022-03"),
        ("He moved there on 2021-07-04.", "2023-01-01", "2021-07-04"),
        ("Ana, born in 1990, lives in Oslo.", "2023-01-01", "2023-01-01"),
        ("She will move in 2030.", "2023-01-01", "2023-01-01"),
        ("I live in Oslo.", "2023-01-10T09:00:00Z", "2023-01-10T09:00:00Z"),
    ],
)
def test_when_a_sentence_says_its_fact_began(sentence: str, reference: str, expected: str) -> None:
    assert stated_time(sentence, reference) == expected


def test_a_moment_is_read_or_refused_plainly() -> None:
    assert [parse_moment(v) for v in ("2023", "2023-05", "2023-05-02")] == ["2023", "2023-05", "2023-05-02"]
    assert parse_moment("2023-05-02T10:00:00+02:00") == "2023-05-02T08:00:00Z"
    with pytest.raises(ValueError, match="expected a year"):
        parse_moment("last tuesday")


def test_which_relations_hold_one_value_is_set_in_settings(tmp_path: Path) -> None:
    settings = load_settings(
        home=tmp_path, functional_relations={"Owns": "target"}, relation_synonyms={"Dwells In": "lives_in"}
    )
    rules = settings.pipeline.facts
    assert rules.functional == {"owns": "target"} and rules.family("dwells_in") == "lives_in"
    assert rules.family("moved_to") == "lives_in"  # the default names stay
    with pytest.raises(ConfigError, match="KENNING_FUNCTIONAL_RELATIONS"):
        load_settings(home=tmp_path, functional_relations={"lives_in": "sideways"})


class CountingGraph(MemoryGraphStore):
    """The in-memory graph, counting the facts its reads return."""

    def __init__(self) -> None:
        super().__init__()
        self.read = 0

    def get_edges(
        self, scope: Scope, node_ids: Sequence[str], among: bool = False, **kwargs: Any
    ) -> list[GraphEdge]:
        found = super().get_edges(scope, node_ids, among, **kwargs)
        self.read += len(found)
        return found


def test_settling_a_fact_no_rule_keys_reads_the_facts_of_its_two_ends_not_every_fact_of_a_place() -> None:
    # Given a city 50 people were born in, and a woman who lived in one city, then another
    scope, graph = Scope(tenant="t", dataset="d"), CountingGraph()
    people = [f"p{n}" for n in range(50)]
    places = ["ana", "paris", "oslo", "rome", *people]
    graph.upsert_nodes(
        scope, [GraphNode(id=name, type="Entity", properties={"name": name}) for name in places]
    )
    born = [fact(person, "born_in", "paris", (f"d{n}", "2001-01-01")) for n, person in enumerate(people)]
    graph.upsert_edges(scope, [*born, fact("ana", "lives_in", "oslo", ("d60", "2020-01-01"))])
    # When a load batch writes her birth in Paris and her move to Rome, and settles them as it keys them
    new = [
        fact("ana", "born_in", "paris", ("d61", "1990-01-01")),
        fact("ana", "lives_in", "rome", ("d62", "2024-01-01")),
    ]
    graph.upsert_edges(scope, new)
    ends = sorted({end for edge in new for end in (edge.source_id, edge.target_id)})
    whole = keyed_ends(RULES, [(e.source_id, e.relationship, e.target_id) for e in new], lambda _: "")
    settled = settle(graph, scope, ends, RULES, whole)
    # Then her facts were read whole (one lives in at a time), Paris's only as far as they are hers
    assert whole == {"ana"}
    assert graph.read <= 6
    # And her facts were settled: born in Paris since 1990, Oslo until she moved to Rome in 2024
    assert spans_of(settled.periods, "ana-born_in-paris") == [("1990-01-01", None)]
    assert spans_of(settled.periods, "ana-lives_in-oslo") == [("2020-01-01", "2024-01-01")]
    assert spans_of(settled.periods, "ana-lives_in-rome") == [("2024-01-01", None)]
    # And settling with every end read whole, as a judge needs, reads the 50 births in Paris too
    graph.read = 0
    settle(graph, scope, ends, RULES)
    assert graph.read > 50


def spans_of(found: dict[str, list[dict[str, Any]]], edge_id: str) -> list[tuple[str, str | None]]:
    return [(p["from"][:10], p["to"][:10] if p["to"] else None) for p in found[edge_id]]
