"""What an LLM judged of a fact, on every graph store: kept in its statements across writes that do
not carry it, and used to work out the periods (`kenning.pipeline.validity`, `ENDS`, `JUDGED_AT`)."""

from __future__ import annotations

from kenning.pipeline.ports import GraphStore
from kenning.pipeline.validity import ENDS, JUDGED, JUDGED_AT, FactRules, settle
from tests.contract import test_graph_store as contract
from tests.contract.test_fact_periods import edges_of, entity, fact
from tests.contract.test_graph_store import NewScope

store, new_scope, made_scopes = contract.store, contract.new_scope, contract.made_scopes

RULES = FactRules()


def test_a_judged_ending_survives_a_write_without_it_and_ends_the_earlier_fact(
    store: GraphStore, new_scope: NewScope
) -> None:
    scope = new_scope()
    # Given Ana played for Rovers, then for United, and United was judged to end Rovers
    store.upsert_nodes(
        scope, [entity("ana", ["d1", "d2"]), entity("rovers", ["d1"]), entity("united", ["d2"])]
    )
    rovers, united = (
        fact("rovers", "plays_for", "d1", "2021-03-04"),
        fact("united", "plays_for", "d2", "2023-05-01"),
    )
    judged = united.model_copy(deep=True)
    judged.properties["said"][0] |= {ENDS: [rovers.id], JUDGED_AT: ["ana"]}
    store.upsert_edges(scope, [rovers, judged])

    # When United is written again as a load writes it, with no judgment in its statement
    store.upsert_edges(scope, [united])
    settle(store, scope, ["ana"], RULES)

    # Then the judgment is still in its statement, and Rovers held until United began
    edges = edges_of(store, scope)
    [said] = edges[united.id].properties["said"]
    assert (said[ENDS], said[JUDGED_AT]) == ([rovers.id], ["ana"])
    [held] = edges[rovers.id].properties["periods"]
    assert (held["to"], held["to_by"], held["retired_by"], held[JUDGED]) == (
        "2023-05-01",
        "d2",
        united.id,
        True,
    )
    assert "valid_to" not in edges[united.id].properties
    assert settle(store, scope, ["ana"], RULES).changed == []  # settled again: nothing to write
