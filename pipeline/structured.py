"""Structured sources: rows of CSV/JSON tables as Records, and the foreign-key edges between them.

No LLM is involved: a column named `<x>_id` (or `<x>id`) whose value is a key of the
table `<x>`, or of a table named by its plural or singular (`company_id` -> `companies`,
`person_id` -> `people`), is a reference from one row to another. Columns whose names do not
say their table are declared: `{"employer_id": "companies", "people.manager": "people"}`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache

from pydantic import BaseModel, Field

from kenning.pipeline.loaders import format_row
from kenning.pipeline.models import DataPoint, Edge, Provenance, normalize_name
from kenning.pipeline.text import inflector


class Record(DataPoint):
    """One row of a table; its text is the row as "col: value; ..." (graph properties stay flat)."""

    identity = ("table", "key")
    index_fields = ("text",)

    table: str
    key: str
    text: str

    @classmethod
    def type_name(cls) -> str:
        return "Record"


class Table(BaseModel):
    """The rows of one structured data item; `name` is the file stem, e.g. `customers`."""

    name: str
    data_id: str
    rows: list[dict[str, str]] = Field(default_factory=list)


REFERENCE_COLUMN = re.compile(r"^(?P<target>.+?)_?id$", re.IGNORECASE)


@dataclass(frozen=True)
class KeyedTable:
    """A table with its Records, indexed by normalized key for reference lookup."""

    table: Table
    key_column: str | None
    records: list[Record]
    by_key: dict[str, Record]


def foreign_key_graph(
    tables: list[Table], tenant: str, dataset: str, references: Mapping[str, str] | None = None
) -> tuple[list[Record], list[Edge]]:
    """Records for every row of every table, and an edge for every resolvable foreign key.

    `references` declares the table a column refers to, by `column` or `table.column` (the
    latter wins); a declaration wins over what the column's name says. Ids are deterministic
    and the output order does not depend on the order of `tables`. A reference to a key that
    no table holds gives no edge.
    """
    keyed = [key_table(table, tenant, dataset) for table in sorted(tables, key=table_order)]
    by_name: dict[str, KeyedTable] = {}
    for item in keyed:
        by_name.setdefault(table_token(item.table.name), item)
    for item in keyed:
        # A table answers to its other number too, unless a table of that name exists.
        for form in noun_forms(table_token(item.table.name)):
            by_name.setdefault(form, item)
    declared = {table_token(column): table_token(table) for column, table in (references or {}).items()}
    records = [record for item in keyed for record in item.records]
    edges = [edge for item in keyed for edge in reference_edges(item, by_name, declared)]
    return records, edges


def table_order(table: Table) -> tuple[str, str, str]:
    return table_token(table.name), table.name, table.data_id


def table_token(name: str) -> str:
    return re.sub(r"[\s\-]+", "_", name.strip().casefold())


# Keys.


def key_table(table: Table, tenant: str, dataset: str) -> KeyedTable:
    key_column = pick_key_column(table)
    keys = row_keys(table.rows, key_column)
    source = Provenance(data_id=table.data_id)
    records = [
        Record(tenant=tenant, dataset=dataset, table=table.name, key=key, text=format_row(row), source=source)
        for key, row in zip(keys, table.rows, strict=True)
    ]
    by_key = {
        normalize_name(record.key): record
        for record, row in zip(records, table.rows, strict=True)
        if key_column and record.key == row.get(key_column, "").strip()
    }
    return KeyedTable(table=table, key_column=key_column, records=records, by_key=by_key)


def pick_key_column(table: Table) -> str | None:
    columns = table_columns(table)
    stems = singulars(table.name)
    wanted = {"id", *(f"{stem}_id" for stem in stems), *(f"{stem}id" for stem in stems)}
    named = next((column for column in columns if column.casefold() in wanted), None)
    return named or next((column for column in columns if is_unique_key(table.rows, column)), None)


def table_columns(table: Table) -> list[str]:
    return list(dict.fromkeys(column for row in table.rows for column in row))


def singulars(name: str) -> list[str]:
    token = table_token(name)
    return [token, *noun_forms(token)]


@cache
def noun_forms(token: str) -> tuple[str, ...]:
    """The singular and plural of a table or column token, inflecting its last word:
    `companies` -> (`company`,), `sales_person` -> (`sales_people`,)."""
    head, _, word = token.rpartition("_")
    if not word.isalpha():
        return ()
    engine = inflector()
    singular = engine.singular_noun(word)
    plural = engine.plural_noun(singular or word)
    forms = [
        f"{head}_{form}" if head else form for form in (singular, plural) if isinstance(form, str) and form
    ]
    return tuple(dict.fromkeys(form for form in forms if form != token))


def is_unique_key(rows: list[dict[str, str]], column: str) -> bool:
    values = [normalize_name(row.get(column, "")) for row in rows]
    return all(values) and len(set(values)) == len(values)


def row_keys(rows: list[dict[str, str]], key_column: str | None) -> list[str]:
    """Each row's key; a row with no key, or a key an earlier row took, is keyed by its row number."""
    taken: set[str] = set()
    keys: list[str] = []
    for number, row in enumerate(rows, start=1):
        key = row.get(key_column, "").strip() if key_column else ""
        if not key or normalize_name(key) in taken:
            key = row_number(number)
        taken.add(normalize_name(key))
        keys.append(key)
    return keys


def row_number(number: int) -> str:
    return f"#{number}"


# References.


def reference_edges(
    item: KeyedTable, by_name: dict[str, KeyedTable], declared: Mapping[str, str]
) -> Iterator[Edge]:
    for column in table_columns(item.table):
        target = declared_target(item, column, by_name, declared) or reference_target(column, by_name)
        if target is None or (target is item and column == item.key_column):
            continue
        for record, row in zip(item.records, item.table.rows, strict=True):
            referenced = target.by_key.get(normalize_name(row.get(column, "")))
            if referenced is not None:
                yield reference_edge(item, record, column, target, referenced)


def declared_target(
    item: KeyedTable, column: str, by_name: dict[str, KeyedTable], declared: Mapping[str, str]
) -> KeyedTable | None:
    token = table_token(column)
    table = declared.get(f"{table_token(item.table.name)}.{token}") or declared.get(token)
    return by_name.get(table) if table else None


def reference_target(column: str, by_name: dict[str, KeyedTable]) -> KeyedTable | None:
    match = REFERENCE_COLUMN.match(column.strip())
    if match is None:
        return None
    stem = table_token(match.group("target")).rstrip("_")
    candidates = (stem, *noun_forms(stem)) if stem else ()
    return next((by_name[name] for name in candidates if name in by_name), None)


def reference_edge(
    item: KeyedTable, record: Record, column: str, target: KeyedTable, referenced: Record
) -> Edge:
    return Edge(
        tenant=record.tenant,
        dataset=record.dataset,
        source_id=record.id,
        target_id=referenced.id,
        relationship=column,
        description=(
            f"{item.table.name} row {record.key} {column} refers to {target.table.name} row {referenced.key}"
        ),
        data_ids=sorted({item.table.data_id, target.table.data_id}),
    )
