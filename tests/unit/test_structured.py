"""Foreign-key edges between rows of structured tables, with no LLM involved."""

from __future__ import annotations

import json
import random

from kenning.pipeline.ingest import Source, add
from kenning.pipeline.loaders import extract_rows
from kenning.pipeline.models import Edge, Scope, stable_id
from kenning.pipeline.structured import Record, Table, foreign_key_graph
from kenning.workers.runtime.local_runner import LocalRunner
from kenning.workers.runtime.settings import load_settings
from tests.twins import TwinServices

CYPHER = "'}) DETACH DELETE n //"


def customers() -> Table:
    rows = [
        {"id": "1", "name": "Alice", "city": "Paris"},
        {"id": "2", "name": "Bob", "city": "Rome"},
        {"id": "3", "name": CYPHER, "city": ""},
    ]
    return Table(name="customers", data_id="data-customers", rows=rows)


def products() -> Table:
    rows = [{"product_id": "P1", "title": "Tea"}, {"product_id": "P2", "title": "Coffee"}]
    return Table(name="products", data_id="data-products", rows=rows)


def orders() -> Table:
    rows = [
        {"id": "10", "customer_id": "3", "product_id": "P1"},
        {"id": "11", "customer_id": "1", "product_id": "P2"},
        {"id": "12", "customer_id": "99", "product_id": "P9"},
        {"id": "13", "customer_id": "", "product_id": "p1"},
    ]
    return Table(name="orders", data_id="data-orders", rows=rows)


def record_id(table: str, key: str, tenant: str = "acme", dataset: str = "shop") -> str:
    return Record(tenant=tenant, dataset=dataset, table=table, key=key, text="").id


def edge_triples(edges: list[Edge]) -> set[tuple[str, str, str]]:
    return {(edge.source_id, edge.relationship, edge.target_id) for edge in edges}


def test_every_row_becomes_a_record_with_its_text_and_provenance() -> None:
    records, _ = foreign_key_graph([customers(), orders(), products()], "acme", "shop")
    assert len(records) == 9
    alice = next(record for record in records if record.table == "customers" and record.key == "1")
    assert alice.text == "id: 1; name: Alice; city: Paris"
    assert alice.source is not None and alice.source.data_id == "data-customers"
    assert alice.data_ids == ["data-customers"]
    assert (alice.tenant, alice.dataset) == ("acme", "shop")
    assert alice.type_name() == "Record"
    assert all(not isinstance(value, dict) for value in alice.properties().values())


def test_customers_orders_products_give_foreign_key_edges() -> None:
    # Given orders that reference customers by `id` and products by `product_id`.
    _, edges = foreign_key_graph([customers(), orders(), products()], "acme", "shop")
    # Then each resolvable reference is one edge, named after the column.
    assert edge_triples(edges) == {
        (record_id("orders", "10"), "customer_id", record_id("customers", "3")),
        (record_id("orders", "10"), "product_id", record_id("products", "P1")),
        (record_id("orders", "11"), "customer_id", record_id("customers", "1")),
        (record_id("orders", "11"), "product_id", record_id("products", "P2")),
        # Keys compare like ids do: case-folded, so "p1" is product P1.
        (record_id("orders", "13"), "product_id", record_id("products", "P1")),
    }
    descriptions = {edge.description for edge in edges}
    assert "orders row 10 customer_id refers to customers row 3" in descriptions
    assert "orders row 11 product_id refers to products row P2" in descriptions
    assert all(edge.tenant == "acme" and edge.dataset == "shop" for edge in edges)


def test_edges_carry_both_tables_as_provenance() -> None:
    _, edges = foreign_key_graph([customers(), orders()], "acme", "shop")
    assert {tuple(edge.data_ids) for edge in edges} == {("data-customers", "data-orders")}


def test_missing_references_give_no_edge() -> None:
    # Given order 12, whose customer 99 and product P9 exist nowhere, and no products table at all.
    _, edges = foreign_key_graph([customers(), orders()], "acme", "shop")
    assert all(edge.source_id != record_id("orders", "12") for edge in edges)
    assert {edge.relationship for edge in edges} == {"customer_id"}


def test_ids_are_deterministic_in_any_order_of_tables() -> None:
    first_records, first_edges = foreign_key_graph([customers(), orders(), products()], "acme", "shop")
    for seed in range(5):
        tables = [customers(), orders(), products()]
        random.Random(seed).shuffle(tables)
        records, edges = foreign_key_graph(tables, "acme", "shop")
        assert [record.id for record in records] == [record.id for record in first_records]
        assert [edge.id for edge in edges] == [edge.id for edge in first_edges]


def test_edge_ids_follow_the_edge_identity() -> None:
    _, edges = foreign_key_graph([customers(), orders()], "acme", "shop")
    edge = next(edge for edge in edges if edge.source_id == record_id("orders", "11"))
    expected = stable_id(
        "acme", "shop", "Edge", record_id("orders", "11"), "customer_id", record_id("customers", "1")
    )
    assert edge.id == expected


def test_scope_changes_every_id() -> None:
    records_a, edges_a = foreign_key_graph([customers(), orders()], "acme", "shop")
    records_b, edges_b = foreign_key_graph([customers(), orders()], "other", "shop")
    assert not {record.id for record in records_a} & {record.id for record in records_b}
    assert not {edge.id for edge in edges_a} & {edge.id for edge in edges_b}


def test_json_rows_link_like_csv_rows() -> None:
    # Given two JSON data items, one an object holding its list of rows.
    authors = json.dumps(
        {"authors": [{"author_id": "a1", "name": "Ann"}, {"author_id": "a2", "name": "Ben"}]}
    )
    books = json.dumps([{"isbn": "111", "title": "One", "AuthorID": "a2"}, {"isbn": "222", "title": "Two"}])
    author_rows = extract_rows("json", authors.encode())
    book_rows = extract_rows("json", books.encode())
    assert author_rows is not None and book_rows is not None
    tables = [
        Table(name="authors", data_id="d1", rows=author_rows),
        Table(name="books", data_id="d2", rows=book_rows),
    ]
    # When the graph is built.
    records, edges = foreign_key_graph(tables, "t", "d")
    # Then books are keyed by their first unique column, and the reference resolves case-insensitively.
    assert {(record.table, record.key) for record in records} == {
        ("authors", "a1"), ("authors", "a2"), ("books", "111"), ("books", "222"),
    }  # fmt: skip
    [edge] = edges
    assert edge.relationship == "AuthorID"
    assert (edge.source_id, edge.target_id) == (
        record_id("books", "111", "t", "d"),
        record_id("authors", "a2", "t", "d"),
    )
    assert edge.description == "books row 111 AuthorID refers to authors row a2"


def test_rows_without_a_key_are_keyed_by_row_number() -> None:
    # Given a table with no id column and no unique column, and one with a missing and a duplicate id.
    notes = Table(name="notes", data_id="n", rows=[{"text": "same"}, {"text": "same"}])
    boxes = Table(name="boxes", data_id="b", rows=[{"id": "1"}, {"id": ""}, {"id": "1"}, {"id": "2"}])
    records, _ = foreign_key_graph([notes, boxes], "t", "d")
    keys = {(record.table, record.key) for record in records}
    assert keys == {
        ("notes", "#1"),
        ("notes", "#2"),
        ("boxes", "1"),
        ("boxes", "#2"),
        ("boxes", "#3"),
        ("boxes", "2"),
    }
    assert len({record.id for record in records}) == 6


def test_row_number_keys_are_never_reference_targets() -> None:
    boxes = Table(name="boxes", data_id="b", rows=[{"label": "x"}, {"label": "x"}])
    items = Table(name="items", data_id="i", rows=[{"id": "1", "box_id": "#1"}])
    _, edges = foreign_key_graph([boxes, items], "t", "d")
    assert edges == []


def test_es_plural_and_compact_id_columns_resolve() -> None:
    boxes = Table(name="boxes", data_id="b", rows=[{"box_id": "B1"}, {"box_id": "B2"}])
    items = Table(name="items", data_id="i", rows=[{"id": "1", "boxid": "B2"}])
    _, edges = foreign_key_graph([boxes, items], "t", "d")
    assert edge_triples(edges) == {
        (record_id("items", "1", "t", "d"), "boxid", record_id("boxes", "B2", "t", "d"))
    }


def test_a_table_key_column_is_not_a_reference_to_itself() -> None:
    _, edges = foreign_key_graph([products()], "t", "d")
    assert edges == []


def test_self_references_within_one_table() -> None:
    employees = Table(
        name="employees",
        data_id="e",
        rows=[{"id": "1", "employee_id": "", "name": "Boss"}, {"id": "2", "employee_id": "1", "name": "Dev"}],
    )
    _, edges = foreign_key_graph([employees], "t", "d")
    assert edge_triples(edges) == {
        (record_id("employees", "2", "t", "d"), "employee_id", record_id("employees", "1", "t", "d"))
    }


def test_hostile_values_come_through_verbatim() -> None:
    records, edges = foreign_key_graph([customers(), orders()], "acme", "shop")
    hostile = next(record for record in records if record.key == "3" and record.table == "customers")
    assert hostile.text == f"id: 3; name: {CYPHER}"
    assert hostile.properties()["text"] == f"id: 3; name: {CYPHER}"


def test_no_tables_give_nothing() -> None:
    assert foreign_key_graph([], "t", "d") == ([], [])


def people() -> Table:
    rows = [
        {"id": "1", "name": "Ada", "company_id": "C1", "employer_id": "C2", "manager": ""},
        {"id": "2", "name": "Grace", "company_id": "C2", "employer_id": "C1", "manager": "1"},
    ]
    return Table(name="people", data_id="data-people", rows=rows)


def companies() -> Table:
    rows = [{"id": "C1", "name": "Analytical Engines"}, {"id": "C2", "name": "Remington Rand"}]
    return Table(name="companies", data_id="data-companies", rows=rows)


def test_irregular_plurals_resolve_both_ways() -> None:
    # Given people who reference companies, and assignments that reference people by person_id
    assignments = Table(
        name="assignments",
        data_id="data-assignments",
        rows=[{"id": "A1", "person_id": "2", "child_id": "K1"}],
    )
    children = Table(name="children", data_id="data-children", rows=[{"id": "K1", "name": "Byron"}])
    # When their foreign keys are resolved
    _, edges = foreign_key_graph([people(), companies(), assignments, children], "t", "d")
    # Then company_id finds `companies`, person_id finds `people`, child_id finds `children`
    assert edge_triples(edges) == {
        (record_id("people", "1", "t", "d"), "company_id", record_id("companies", "C1", "t", "d")),
        (record_id("people", "2", "t", "d"), "company_id", record_id("companies", "C2", "t", "d")),
        (record_id("assignments", "A1", "t", "d"), "person_id", record_id("people", "2", "t", "d")),
        (record_id("assignments", "A1", "t", "d"), "child_id", record_id("children", "K1", "t", "d")),
    }


def test_the_key_column_of_an_irregular_plural_is_its_singular_id() -> None:
    # Given `people` keyed by person_id, whose first unique column is the name
    staff = Table(
        name="people",
        data_id="p",
        rows=[{"name": "Ada", "person_id": "P1"}, {"name": "Grace", "person_id": "P2"}],
    )
    badges = Table(name="badges", data_id="b", rows=[{"id": "B1", "person_id": "P2"}])
    _, edges = foreign_key_graph([staff, badges], "t", "d")
    assert edge_triples(edges) == {
        (record_id("badges", "B1", "t", "d"), "person_id", record_id("people", "P2", "t", "d"))
    }


def test_declared_references_link_columns_whose_names_differ_from_the_table() -> None:
    # Given columns that do not name their table: employer_id -> companies, people.manager -> people
    references = {"employer_id": "companies", "people.manager": "people", "missing_id": "no_such_table"}
    # When the graph is built with those declarations
    _, edges = foreign_key_graph([people(), companies()], "t", "d", references)
    # Then those columns link too, beside the ones found by name
    triples = edge_triples(edges)
    assert (
        record_id("people", "1", "t", "d"),
        "employer_id",
        record_id("companies", "C2", "t", "d"),
    ) in triples
    assert (
        record_id("people", "2", "t", "d"),
        "employer_id",
        record_id("companies", "C1", "t", "d"),
    ) in triples
    assert (record_id("people", "2", "t", "d"), "manager", record_id("people", "1", "t", "d")) in triples
    assert len(triples) == 5
    # And without them, only the columns that name their table link
    _, undeclared = foreign_key_graph([people(), companies()], "t", "d")
    assert {relationship for _, relationship, _ in edge_triples(undeclared)} == {"company_id"}


def test_a_declared_reference_wins_over_the_name() -> None:
    # Given loans whose company_id in fact holds a person's id
    loans = Table(name="loans", data_id="l", rows=[{"id": "L1", "company_id": "2"}])
    # When that is declared, the column links to people; by its name alone it links nowhere
    _, declared = foreign_key_graph([people(), companies(), loans], "t", "d", {"loans.company_id": "people"})
    _, by_name = foreign_key_graph([people(), companies(), loans], "t", "d")
    loan = record_id("loans", "L1", "t", "d")
    assert {(s, r, t) for s, r, t in edge_triples(declared) if s == loan} == {
        (loan, "company_id", record_id("people", "2", "t", "d"))
    }
    assert not [s for s, _, _ in edge_triples(by_name) if s == loan]


def test_csv_files_link_through_the_pipeline_with_declared_references() -> None:
    # Given people.csv (id, name, company_id, employer_id) and companies.csv in one dataset
    services = TwinServices()
    services.config.references = {"employer_id": "companies"}
    scope = Scope(tenant="t", dataset="crm")
    csv = {
        "people.csv": "id,name,company_id,employer_id\n1,Ada,C1,C2\n2,Grace,C2,C1\n",
        "companies.csv": "id,name\nC1,Analytical Engines\nC2,Remington Rand\n",
    }
    add(
        services.metadata,
        services.blobs,
        scope,
        [Source(name=n, uri=f"test:{n}", data=t.encode()) for n, t in csv.items()],
    )
    # When the dataset is cognified
    run = LocalRunner(services, services.lock).run(scope)
    # Then each person row links to its company by name and to its employer as declared
    assert run.status.value == "completed", run.error
    nodes, edges = services.graph.export(scope)
    rows = {node.id for node in nodes if node.type == "Record"}
    relationships = sorted(edge.relationship for edge in edges if {edge.source_id, edge.target_id} <= rows)
    assert relationships == ["company_id", "company_id", "employer_id", "employer_id"]


def test_references_are_a_setting() -> None:
    settings = load_settings(fk_references={"people.employer_id": "companies"})
    assert settings.pipeline.references == {"people.employer_id": "companies"}
