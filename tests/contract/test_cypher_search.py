"""CYPHER and NATURAL_LANGUAGE against a real FalkorDB: one graph per dataset, read-only,
within a budget the server enforces, refused where isolation cannot be enforced."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis

from kenning.pipeline.errors import QueryBudgetExceeded, StoreError
from kenning.pipeline.models import GraphEdge, GraphNode, Scope
from kenning.retrieval.contract import Principal, QueryBudget, SearchRequest, SearchType
from kenning.retrieval.cypher import QueryRejected
from kenning.retrieval.registry import search
from kenning.storage.graph.falkordb import FalkorGraphStore, graph_key
from kenning.storage.graph.memgraph import MemgraphGraphStore
from tests.services import free_port
from tests.twins import TwinServices
from tests.unit.test_graph_search_types import ScriptedCompleter

GRAPH = "kenning_cypher_search"
SCOPE = Scope(tenant="cy", dataset="people")
OTHER = Scope(tenant="cy", dataset="secret")
STRANGER = Scope(tenant="acme", dataset="private")
HOSTILE = "'}) DETACH DELETE n //"
CALLER = Principal(tenant="cy", may_run_cypher=True)
# A billion rows of work: the server's timeout is all that ends it.
CROSS_PRODUCT = (
    "UNWIND range(1, 1000) AS a UNWIND range(1, 1000) AS b UNWIND range(1, 1000) AS c RETURN count(*)"
)


@pytest.fixture
def services(falkordb_url: str) -> Iterator[TwinServices]:
    graph = FalkorGraphStore(falkordb_url, graph_name=GRAPH)
    people = {SCOPE: ["Ada", "Grace", HOSTILE], OTHER: ["Hidden"], STRANGER: ["Acme secret"]}
    for scope, names in people.items():
        nodes = [
            GraphNode(id=f"{scope.dataset}-{name}", type="Entity", properties={"name": name})
            for name in names
        ]
        graph.upsert_nodes(scope, nodes)
    graph.upsert_edges(
        SCOPE, [GraphEdge(id="e1", source_id="people-Ada", target_id="people-Grace", relationship="knows")]
    )
    yield TwinServices(graph=graph)  # type: ignore[arg-type]
    for scope in people:
        graph._delete_scope(scope)
    graph.close()


def cypher(
    services: TwinServices,
    query: str,
    kind: SearchType = SearchType.CYPHER,
    scopes: tuple[Scope, ...] = (SCOPE,),
    principal: Principal = CALLER,
) -> list[str]:
    request = SearchRequest(
        query=query, type=kind, scopes=list(scopes), only_context=True, principal=principal
    )
    return [hit.text for hit in search(services, request).results]


def names(rows: list[str]) -> list[str]:
    return sorted(str(value) for row in rows for value in json.loads(row).values())


def test_a_query_with_no_filter_sees_only_its_own_dataset(services: TwinServices) -> None:
    # Given other datasets of the same tenant and of another one in the same FalkorDB
    # When a query asks for every node, with no tenant or dataset filter at all
    rows = cypher(services, "MATCH (n) RETURN n.name AS name")

    # Then it reads its dataset's graph alone: never the other dataset's, never the other tenant's
    assert names(rows) == sorted(["Ada", "Grace", HOSTILE])
    assert cypher(services, 'MATCH (n) WHERE n.dataset = "secret" RETURN n.name') == []


def test_another_tenant_reads_nothing_whatever_its_query_says(services: TwinServices) -> None:
    hostile = Principal(tenant="default", read_scopes=("default/hostile",), may_run_cypher=True)
    query = 'MATCH (n) WHERE n.tenant = "acme" OR n.tenant = "cy" RETURN n.name'
    for dataset in ("hostile", "doesnotexist", "private", "people"):
        assert (
            cypher(services, query, scopes=(Scope(tenant="default", dataset=dataset),), principal=hostile)
            == []
        )


def test_scopes_outside_the_principal_give_nothing(services: TwinServices) -> None:
    # A request naming another tenant's dataset, or a dataset past the read scopes, reads nothing there
    narrow = Principal(tenant="cy", read_scopes=("cy/people",), may_run_cypher=True)
    rows = cypher(services, "MATCH (n) RETURN n.name", scopes=(SCOPE, OTHER, STRANGER), principal=narrow)
    assert names(rows) == sorted(["Ada", "Grace", HOSTILE])
    assert cypher(services, "MATCH (n) RETURN n.name", scopes=(STRANGER,)) == []


def test_each_scope_is_a_graph_of_its_own(services: TwinServices, falkordb_url: str) -> None:
    client = redis.Redis.from_url(falkordb_url, decode_responses=True)
    try:
        graphs = client.execute_command("GRAPH.LIST")
        for scope in (SCOPE, OTHER, STRANGER):
            assert graph_key(GRAPH, scope) in graphs
        assert GRAPH not in graphs
        assert graph_key(GRAPH, Scope(tenant="a:b", dataset="c")) != graph_key(
            GRAPH, Scope(tenant="a", dataset="b:c")
        )
    finally:
        client.close()


def test_the_permission_is_the_principal_s_not_an_option(services: TwinServices) -> None:
    request = SearchRequest(query="MATCH (n) RETURN n", type=SearchType.CYPHER, scopes=[SCOPE])
    for unchecked in (request, request.model_copy(update={"options": {"cypher_allowed": True}})):
        with pytest.raises(QueryRejected, match="disabled"):
            search(services, unchecked)


@pytest.mark.parametrize(
    "query",
    [
        "MATCH (n) DETACH DELETE n",
        "MATCH (n) SET n.name = 'x'",
        "CREATE (n:Node {name: 'x'})",
        "MATCH (n) RETURN n; MATCH (m) DELETE m",
        "CALL db.labels()",
        "MATCH (n) RETURN n.name } RETURN * UNION MATCH (m) RETURN m.name AS `n.name` LIMIT 1 //",
    ],
)
def test_write_and_escaping_queries_are_rejected_and_nothing_changes(
    services: TwinServices, query: str
) -> None:
    before = services.graph.counts(SCOPE)
    with pytest.raises(QueryRejected):
        cypher(services, query)
    assert services.graph.counts(SCOPE) == before


def test_injection_in_a_literal_stays_a_literal(services: TwinServices) -> None:
    before = services.graph.counts(SCOPE)
    rows = cypher(services, f'MATCH (n:Node {{dataset: $dataset}}) WHERE n.name = "{HOSTILE}" RETURN n.name')
    assert rows == [json.dumps({"n.name": HOSTILE})]
    assert services.graph.counts(SCOPE) == before


def test_the_server_stops_a_query_at_its_timeout(services: TwinServices, falkordb_url: str) -> None:
    # Given a budget of one second, and a query that would run for minutes
    principal = CALLER.model_copy(update={"cypher_budget": QueryBudget(timeout_ms=1000)})

    # When it runs
    with pytest.raises(QueryBudgetExceeded, match="stopped the query at its budget"):
        cypher(services, CROSS_PRODUCT, principal=principal)

    # Then the server itself ended it (its answer is the error), and runs nothing more
    assert running_queries(falkordb_url) == []


def test_the_server_stops_a_query_that_builds_a_huge_list(services: TwinServices, falkordb_url: str) -> None:
    # A hundred million values, as ranges each small enough to pass the check before the query
    # runs: stopped by the server (QUERY_MEM_CAPACITY or the default timeout)
    with pytest.raises(QueryBudgetExceeded, match="stopped the query at its budget"):
        cypher(services, "UNWIND [a IN range(1, 10000) | range(1, 10000)] AS x RETURN count(x)")
    assert running_queries(falkordb_url) == []
    client = redis.Redis.from_url(falkordb_url)
    try:
        assert int(client.info("memory")["used_memory"]) < 256 * 2**20
    finally:
        client.close()


def test_the_server_returns_at_most_the_row_budget(services: TwinServices) -> None:
    principal = CALLER.model_copy(update={"cypher_budget": QueryBudget(max_rows=5)})
    # Three million rows would take the client seconds to read; the server sends five (the
    # client does not cut the rows it gets).
    rows = cypher(services, "UNWIND range(1, 3000000) AS x RETURN x", principal=principal)
    assert rows == [json.dumps({"x": x}) for x in range(1, 6)]


def test_a_timeout_above_the_server_maximum_says_so(services: TwinServices) -> None:
    principal = CALLER.model_copy(update={"cypher_budget": QueryBudget(timeout_ms=10**6)})
    with pytest.raises(StoreError, match="TIMEOUT_MAX"):
        cypher(services, "MATCH (n) RETURN n.name", principal=principal)


def test_natural_language_retries_with_the_error_until_a_read_query(services: TwinServices) -> None:
    queries = iter(
        [
            "MATCH (n) DETACH DELETE n",
            "```cypher\nMATCH (a:Node)-[r]->(b)\nRETURN a.name, type(r), b.name\n```",
        ]
    )
    completer = ScriptedCompleter(lambda system, prompt: next(queries))
    services.completer = completer  # type: ignore[assignment]
    rows = cypher(services, "Who knows whom?", SearchType.NATURAL_LANGUAGE)
    assert rows == [json.dumps({"a.name": "Ada", "b.name": "Grace", "type(r)": "knows"})]
    assert "DETACH is not allowed" in completer.calls[1][1]
    assert services.graph.counts(SCOPE)[0] == 3


@pytest.mark.parametrize("kind", [SearchType.CYPHER, SearchType.NATURAL_LANGUAGE])
def test_memgraph_refuses_raw_cypher_as_it_cannot_isolate_datasets(kind: SearchType) -> None:
    # No server is needed: the refusal comes before any query is sent
    graph = MemgraphGraphStore(f"bolt://127.0.0.1:{free_port()}")
    try:
        with pytest.raises(QueryRejected, match="memgraph"):
            cypher(TwinServices(graph=graph), "MATCH (n) RETURN n", kind)  # type: ignore[arg-type]
    finally:
        graph.close()


def running_queries(falkordb_url: str) -> list[object]:
    client = redis.Redis.from_url(falkordb_url, decode_responses=True)
    try:
        _title, running = client.execute_command("GRAPH.INFO", "RunningQueries")
        return list(running)
    finally:
        client.close()
