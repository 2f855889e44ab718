"""A Cypher query stays within its budget and its errors are the caller's: a range() too large
to build within the budget is refused before it runs (FalkorDB builds a range whole before it
checks the query's timeout or memory cap), and a query FalkorDB cannot compile is an input
error naming the problem (400), not an unavailable store (503)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from kenning.pipeline.errors import InputError, StoreError
from kenning.pipeline.models import GraphNode, Scope
from kenning.retrieval.contract import Principal, SearchRequest, SearchType
from kenning.retrieval.cypher import MAX_RANGE_VALUES, QueryRejected, check_read_only
from kenning.retrieval.registry import search
from kenning.storage.graph.falkordb import FalkorGraphStore
from kenning.workers.api.errors import MAPPED
from tests.twins import TwinServices

GRAPH = "kenning_cypher_bounds"
SCOPE = Scope(tenant="cb", dataset="people")
CALLER = Principal(tenant="cb", may_run_cypher=True)


@pytest.fixture
def services(falkordb_url: str) -> Iterator[TwinServices]:
    graph = FalkorGraphStore(falkordb_url, graph_name=GRAPH)
    graph.upsert_nodes(SCOPE, [GraphNode(id="ada", type="Entity", properties={"name": "Ada"})])
    yield TwinServices(graph=graph)  # type: ignore[arg-type]
    graph._delete_scope(SCOPE)
    graph.close()


def cypher(services: TwinServices, query: str) -> list[str]:
    request = SearchRequest(
        query=query, type=SearchType.CYPHER, scopes=[SCOPE], only_context=True, principal=CALLER
    )
    return [hit.text for hit in search(services, request).results]


@pytest.mark.parametrize(
    "query",
    [
        "UNWIND range(1, 300000000) AS x RETURN count(x)",
        "RETURN size(range(0, 3000000000, 2)) AS n",
        "UNWIND range(1, toInteger('300000000')) AS x RETURN count(x)",
        "UNWIND range(1, $limit) AS x RETURN count(x)",
        "UNWIND RANGE (1, 3 * 100000000) AS x RETURN count(x)",
    ],
)
def test_a_range_too_large_to_build_within_the_budget_is_refused_before_it_runs(
    services: TwinServices, query: str
) -> None:
    with pytest.raises(QueryRejected, match="range"):
        cypher(services, query)


def test_a_range_within_the_bound_runs(services: TwinServices) -> None:
    rows = cypher(services, f"UNWIND range(1, {MAX_RANGE_VALUES}) AS x RETURN count(x) AS n")
    assert rows == [json.dumps({"n": MAX_RANGE_VALUES})]
    # And a range named in a string is a string, not a range
    assert check_read_only("RETURN 'range(1, 300000000)' AS s") == "RETURN 'range(1, 300000000)' AS s"


@pytest.mark.parametrize(
    ("query", "problem"),
    [
        ("MATCH (n RETURN n", "Invalid input"),
        ("RETURN nosuchfn(1)", "nosuchfn"),
        ("MATCH (n) RETURN m", "'m' not defined"),
    ],
)
def test_a_query_the_server_cannot_compile_is_an_input_error_naming_it(
    services: TwinServices, query: str, problem: str
) -> None:
    # When a query FalkorDB cannot compile runs
    with pytest.raises(InputError) as refused:
        cypher(services, query)
    # Then it is the caller's error, naming the problem: answered 400 over HTTP
    assert problem in str(refused.value)
    assert not isinstance(refused.value, StoreError)
    status = next(status for kind, status, _ in MAPPED if isinstance(refused.value, kind))
    assert status == 400
