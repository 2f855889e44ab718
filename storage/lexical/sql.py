"""A BM25 inverted index in SQL tables on SQLite or PostgreSQL.

`lexical_terms` holds the posting lists (one row per term and text, with the term's
frequency), `lexical_docs` each text's length and payload, `lexical_stats` the text
count and total length of each scope, so N and the average length cost one row read,
and `lexical_revisions` a counter per scope that every write bumps.

A search is answered from the scope's postings held in memory (`lexical_snapshot`) when they
were read at the scope's current revision, else by one SQL query over the posting lists of
the query's terms; then, from the scope's second search in a process on, the postings are read
again, in the background by default, for the searches that follow.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from kenning.pipeline.errors import StoreError
from kenning.pipeline.lexical import K1, B, LexicalEntry, bm25_distance, query_terms, term_frequencies
from kenning.pipeline.models import Scope, ScoredPoint
from kenning.pipeline.ports import chunked
from kenning.storage.lexical.snapshot import MAX_POSTINGS, Snapshot
from kenning.storage.sql.engine import create_tables
from kenning.storage.sql.errors import translated_sql
from kenning.storage.sql.snapshots import Snapshots, bump, read_at_revision, revision_of, revisions_table

BATCH_SIZE = 500

metadata = sa.MetaData()

terms_table = sa.Table(
    "lexical_terms",
    metadata,
    sa.Column("tenant", sa.String, primary_key=True),
    sa.Column("dataset", sa.String, primary_key=True),
    sa.Column("term", sa.String, primary_key=True),
    sa.Column("doc_id", sa.String, primary_key=True),
    sa.Column("tf", sa.Integer, nullable=False),
    sa.Index("ix_lexical_terms_doc", "tenant", "dataset", "doc_id"),
)

docs_table = sa.Table(
    "lexical_docs",
    metadata,
    sa.Column("tenant", sa.String, primary_key=True),
    sa.Column("dataset", sa.String, primary_key=True),
    sa.Column("doc_id", sa.String, primary_key=True),
    sa.Column("length", sa.Integer, nullable=False),
    sa.Column("payload", sa.Text, nullable=False),
)

stats_table = sa.Table(
    "lexical_stats",
    metadata,
    sa.Column("tenant", sa.String, primary_key=True),
    sa.Column("dataset", sa.String, primary_key=True),
    sa.Column("doc_count", sa.BigInteger, nullable=False),
    sa.Column("total_length", sa.BigInteger, nullable=False),
)

revisions = revisions_table("lexical_revisions", metadata)


class _Staged:
    def __init__(self, doc_id: str, text: str, payload: dict[str, Any]) -> None:
        self.doc_id = doc_id
        self.terms, self.length = term_frequencies(text)
        self.payload = _json(payload)


class SqlLexicalIndex:
    """A `LexicalIndex` in `lexical_*` tables, created on construction when missing.

    Writes to one scope are serialised on its stats row, so concurrent indexing keeps
    the text count and total length exact, and bump its revision. `snapshots` is one of
    `kenning.storage.sql.snapshots.MODES`; `max_postings` bounds the postings held in memory.
    """

    def __init__(
        self, engine: sa.Engine, snapshots: str = "background", max_postings: int = MAX_POSTINGS
    ) -> None:
        if engine.dialect.name not in ("sqlite", "postgresql"):
            raise StoreError(f"the lexical index supports SQLite and PostgreSQL, not {engine.dialect.name}")
        self._engine = engine
        self._snapshots: Snapshots[Snapshot] = Snapshots(max_postings, snapshots)
        with _translated():
            create_tables(engine, metadata)
            self._needs_ln = engine.dialect.name == "sqlite" and not _has_ln(engine)

    def index(self, scope: Scope, entries: Sequence[LexicalEntry]) -> None:
        staged = {doc_id: _Staged(doc_id, text, payload) for doc_id, text, payload in entries}
        if not staged:
            return
        with _translated(), self._engine.begin() as conn:
            self._lock_scope(conn, scope)
            old_count, old_length = _drop(conn, scope, list(staged))
            _insert_rows(conn, docs_table, [_doc_row(scope, text) for text in staged.values()])
            postings = [row for text in staged.values() for row in _term_rows(scope, text)]
            _insert_rows(conn, terms_table, postings)
            new_length = sum(text.length for text in staged.values())
            _add_stats(conn, scope, len(staged) - old_count, new_length - old_length)
            bump(conn, revisions, scope)

    def search(self, scope: Scope, query: str, limit: int, *, payloads: bool = True) -> list[ScoredPoint]:
        terms = query_terms(query)
        if not terms or limit <= 0:
            return []
        with _translated(), self._engine.connect() as conn:
            found = self._from_snapshot(conn, scope, terms, limit, payloads)
            if found is None:
                if self._needs_ln:
                    conn.connection.driver_connection.create_function(  # type: ignore[union-attr]
                        "ln", 1, math.log, deterministic=True
                    )
                rows = conn.execute(_bm25_query(scope, terms, limit)).all()
                found = [(row.doc_id, float(row.bm25), row.payload) for row in rows]
        return [
            ScoredPoint(
                id=doc_id,
                score=bm25_distance(bm25),
                payload={**(json.loads(payload) if payloads else {}), "bm25": bm25},
            )
            for doc_id, bm25, payload in found
        ]

    def held(self, scope: Scope) -> int | None:
        """The revision at which the scope's postings are held in memory; None when they are not."""
        return self._snapshots.revision(scope)

    def reading(self, scope: Scope) -> bool:
        """Whether the scope's postings are being read into memory now."""
        return self._snapshots.reading(scope)

    def _from_snapshot(
        self, conn: sa.Connection, scope: Scope, terms: list[str], limit: int, read_payloads: bool
    ) -> list[tuple[str, float, str]] | None:
        """(id, BM25, payload) of the best texts from the scope's postings in memory at its current
        revision; None when they are not (they are read, as the mode says) or a text they name
        is gone since. Payloads not to be read come as empty strings: the postings are of this
        revision, which the read above checked."""
        snapshot = self._snapshots.usable(
            scope, revision_of(conn, revisions, scope), lambda: self._read(scope)
        )
        if snapshot is None:
            return None
        hits = snapshot.search(terms, limit)
        if not read_payloads:
            return [(doc_id, bm25, "") for doc_id, bm25 in hits]
        payloads = _payloads(conn, scope, [doc_id for doc_id, _ in hits])
        if len(payloads) < len(hits):
            return None
        return [(doc_id, bm25, payloads[doc_id]) for doc_id, bm25 in hits]

    def _read(self, scope: Scope) -> Snapshot | None:
        with _translated(), self._engine.connect() as conn:
            return _read_snapshot(conn, scope)

    def remove(self, scope: Scope, ids: Sequence[str]) -> None:
        unique = list(dict.fromkeys(ids))
        if not unique:
            return
        with _translated(), self._engine.begin() as conn:
            self._lock_scope(conn, scope)
            count, length = _drop(conn, scope, unique)
            _add_stats(conn, scope, -count, -length)
            # A scope left with no text keeps no row (a forgotten dataset leaves nothing here).
            conn.execute(
                sa.delete(stats_table).where(_in_scope(stats_table, scope), stats_table.c.doc_count <= 0)
            )
            bump(conn, revisions, scope)

    def _lock_scope(self, conn: sa.Connection, scope: Scope) -> None:
        """Create the scope's stats row if missing, then hold its row lock until commit."""
        insert = postgresql.insert if self._engine.dialect.name == "postgresql" else sqlite.insert
        row = {"tenant": scope.tenant, "dataset": scope.dataset, "doc_count": 0, "total_length": 0}
        conn.execute(insert(stats_table).values(row).on_conflict_do_nothing())
        # A write to the row takes its lock on PostgreSQL (and the write lock on SQLite).
        conn.execute(
            sa.update(stats_table)
            .where(_in_scope(stats_table, scope))
            .values(doc_count=stats_table.c.doc_count)
        )


def _bm25_query(scope: Scope, terms: list[str], limit: int) -> sa.Select[Any]:
    """The top `limit` texts by BM25 over the query terms' posting lists, with their payloads."""
    postings, docs, stats = terms_table, docs_table, stats_table
    df = (
        sa.select(postings.c.term, sa.cast(sa.func.count(), sa.Float).label("df"))
        .where(_in_scope(postings, scope), postings.c.term.in_(terms))
        .group_by(postings.c.term)
        .subquery("df")
    )
    n = sa.cast(stats.c.doc_count, sa.Float)
    corpus = (
        sa.select(
            n.label("n"),
            (sa.cast(stats.c.total_length, sa.Float) / sa.func.nullif(n, 0.0)).label("avgdl"),
        )
        .where(_in_scope(stats, scope))
        .subquery("corpus")
    )
    tf = sa.cast(postings.c.tf, sa.Float)
    length = sa.cast(docs.c.length, sa.Float)
    idf = sa.func.ln(1.0 + (corpus.c.n - df.c.df + 0.5) / (df.c.df + 0.5))
    norm = 1.0 - B + B * length / corpus.c.avgdl
    weight = idf * tf * (K1 + 1.0) / (tf + K1 * norm)
    ranked = (
        sa.select(postings.c.doc_id, sa.func.sum(weight).label("bm25"))
        .select_from(
            postings.join(df, df.c.term == postings.c.term)
            .join(docs, _same_doc(docs, postings))
            .join(corpus, sa.true())
        )
        .where(_in_scope(postings, scope), postings.c.term.in_(terms))
        .group_by(postings.c.doc_id)
        .order_by(sa.desc("bm25"), postings.c.doc_id)
        .limit(limit)
        .subquery("ranked")
    )
    return (
        sa.select(ranked.c.doc_id, ranked.c.bm25, docs.c.payload)
        .join(docs, sa.and_(_in_scope(docs, scope), docs.c.doc_id == ranked.c.doc_id))
        .order_by(ranked.c.bm25.desc(), ranked.c.doc_id)
    )


def _read_snapshot(conn: sa.Connection, scope: Scope) -> Snapshot | None:
    """The scope's postings as one snapshot; None if a write came in while they were read."""

    def read() -> tuple[list[tuple[str, int]], list[tuple[str, str, int]]]:
        docs, terms = docs_table, terms_table
        lengths = conn.execute(sa.select(docs.c.doc_id, docs.c.length).where(_in_scope(docs, scope)))
        documents = [(doc_id, int(length)) for doc_id, length in lengths]
        postings = conn.execute(
            sa.select(terms.c.term, terms.c.doc_id, terms.c.tf).where(_in_scope(terms, scope))
        )
        return documents, [(term, doc_id, int(tf)) for term, doc_id, tf in postings]

    found = read_at_revision(conn, revisions, scope, read)
    return None if found is None else Snapshot.read(found[0], *found[1])


def _payloads(conn: sa.Connection, scope: Scope, doc_ids: list[str]) -> dict[str, str]:
    if not doc_ids:
        return {}
    query = sa.select(docs_table.c.doc_id, docs_table.c.payload).where(
        _in_scope(docs_table, scope), docs_table.c.doc_id.in_(doc_ids)
    )
    return {row.doc_id: row.payload for row in conn.execute(query)}


def _drop(conn: sa.Connection, scope: Scope, doc_ids: list[str]) -> tuple[int, int]:
    """Delete these texts and their postings: (how many existed, their total length)."""
    count = length = 0
    for batch in chunked(doc_ids, BATCH_SIZE):
        found = conn.execute(
            sa.select(docs_table.c.length).where(_in_scope(docs_table, scope), docs_table.c.doc_id.in_(batch))
        ).all()
        count += len(found)
        length += sum(int(row.length) for row in found)
        for table in (terms_table, docs_table):
            conn.execute(sa.delete(table).where(_in_scope(table, scope), table.c.doc_id.in_(batch)))
    return count, length


def _add_stats(conn: sa.Connection, scope: Scope, count: int, length: int) -> None:
    conn.execute(
        sa.update(stats_table)
        .where(_in_scope(stats_table, scope))
        .values(
            doc_count=stats_table.c.doc_count + count,
            total_length=stats_table.c.total_length + length,
        )
    )


def _insert_rows(conn: sa.Connection, table: sa.Table, rows: list[dict[str, Any]]) -> None:
    for start in range(0, len(rows), BATCH_SIZE):
        conn.execute(sa.insert(table), rows[start : start + BATCH_SIZE])


def _doc_row(scope: Scope, text: _Staged) -> dict[str, Any]:
    return {
        "tenant": scope.tenant,
        "dataset": scope.dataset,
        "doc_id": text.doc_id,
        "length": text.length,
        "payload": text.payload,
    }


def _term_rows(scope: Scope, text: _Staged) -> list[dict[str, Any]]:
    return [
        {"tenant": scope.tenant, "dataset": scope.dataset, "term": term, "doc_id": text.doc_id, "tf": tf}
        for term, tf in text.terms.items()
    ]


def _in_scope(table: Any, scope: Scope) -> sa.ColumnElement[bool]:
    return sa.and_(table.c.tenant == scope.tenant, table.c.dataset == scope.dataset)


def _same_doc(docs: sa.Table, postings: sa.Table) -> sa.ColumnElement[bool]:
    return sa.and_(
        docs.c.tenant == postings.c.tenant,
        docs.c.dataset == postings.c.dataset,
        docs.c.doc_id == postings.c.doc_id,
    )


def _json(payload: dict[str, Any]) -> str:
    try:
        return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise StoreError(f"lexical payload is not JSON: {exc}") from exc


def _has_ln(engine: sa.Engine) -> bool:
    # SQLite has ln() only when built with its math functions; Python's sqlite3 may lack them.
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT ln(2.0)"))
    except sa.exc.OperationalError:
        return False
    return True


def _translated() -> AbstractContextManager[None]:
    return translated_sql("lexical index")
