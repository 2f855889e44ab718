"""CYPHER and NATURAL_LANGUAGE against a real FalkorDB: read-only, scoped parameters, injection-proof."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kenning.pipeline.models import GraphEdge, GraphNode, Scope
from kenning.retrieval.contract import SearchRequest, SearchType
from kenning.retrieval.cypher import QueryRejected
from kenning.retrieval.registry import search
from kenning.storage.graph_falkordb import FalkorGraphStore
from tests.twins import TwinServices
from tests.unit.test_graph_search_types import ScriptedCompleter

SCOPE = Scope(tenant="cy", dataset="people")
OTHER = Scope(tenant="cy", dataset="secret")
HOSTILE = "'}) DETACH DELETE n //"


@pytest.fixture
def services(falkordb_url: str) -> Iterator[TwinServices]:
    graph = FalkorGraphStore(falkordb_url, graph_name="kenning_cypher_search")
    for scope, names in ((SCOPE, ["Ada", "Grace", HOSTILE]), (OTHER, ["Hidden"])):
        nodes = [
            GraphNode(id=f"{scope.dataset}-{name}", type="Entity", properties={"name": name})
            for name in names
        ]
        graph.upsert_nodes(scope, nodes)
    graph.upsert_edges(
        SCOPE, [GraphEdge(id="e1", source_id="people-Ada", target_id="people-Grace", relationship="knows")]
    )
    yield TwinServices(graph=graph)  # type: ignore[arg-type]
    graph._delete_scope(SCOPE)
    graph._delete_scope(OTHER)
    graph.close()


def cypher(services: TwinServices, query: str, kind: SearchType = SearchType.CYPHER) -> list[str]:
    request = SearchRequest(
        query=query, type=kind, scopes=[SCOPE], only_context=True, options={"cypher_allowed": True}
    )
    return [hit.text for hit in search(services, request).results]


def test_a_read_query_runs_with_the_scope_bound(services: TwinServices) -> None:
    rows = cypher(
        services, "MATCH (n:Node {tenant: $tenant, dataset: $dataset}) RETURN n.name ORDER BY n.name"
    )
    assert sorted(rows) == sorted(['["Ada"]', '["Grace"]', f'["{HOSTILE}"]'])  # never the other dataset's


@pytest.mark.parametrize(
    "query",
    [
        "MATCH (n) DETACH DELETE n",
        "MATCH (n) SET n.name = 'x'",
        "CREATE (n:Node {name: 'x'})",
        "MATCH (n) RETURN n; MATCH (m) DELETE m",
        "CALL db.labels()",
    ],
)
def test_write_queries_are_rejected_and_nothing_changes(services: TwinServices, query: str) -> None:
    before = services.graph.counts(SCOPE)
    with pytest.raises(QueryRejected):
        cypher(services, query)
    assert services.graph.counts(SCOPE) == before


def test_injection_in_a_literal_stays_a_literal(services: TwinServices) -> None:
    before = services.graph.counts(SCOPE)
    rows = cypher(services, f'MATCH (n:Node {{dataset: $dataset}}) WHERE n.name = "{HOSTILE}" RETURN n.name')
    assert rows == [f'["{HOSTILE}"]']
    assert services.graph.counts(SCOPE) == before


def test_natural_language_retries_with_the_error_until_a_read_query(services: TwinServices) -> None:
    queries = iter(
        [
            "MATCH (n) DETACH DELETE n",
            "```cypher\nMATCH (a:Node {tenant: $tenant, dataset: $dataset})-[r]->(b)\n"
            "RETURN a.name, type(r), b.name\n```",
        ]
    )
    completer = ScriptedCompleter(lambda system, prompt: next(queries))
    services.completer = completer  # type: ignore[assignment]
    rows = cypher(services, "Who knows whom?", SearchType.NATURAL_LANGUAGE)
    assert rows == ['["Ada", "knows", "Grace"]']
    assert "DETACH is not allowed" in completer.calls[1][1]
    assert services.graph.counts(SCOPE)[0] == 3
