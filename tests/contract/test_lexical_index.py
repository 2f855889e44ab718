"""One contract for every LexicalIndex: the in-memory twin and the SQL inverted index (SQLite, PostgreSQL),
searched in SQL and from its postings held in memory (read inline, so every search uses them)."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
import sqlalchemy as sa

from kenning.pipeline.errors import StoreError
from kenning.pipeline.lexical import LexicalIndex, bm25_distance, bm25_term, query_terms, tokenize
from kenning.pipeline.models import Scope
from kenning.storage.lexical.memory import MemoryLexicalIndex
from kenning.storage.lexical.sql import SqlLexicalIndex
from kenning.storage.sql.engine import open_engine
from tests.threads import at_once

BACKENDS = [
    "memory",
    "sqlite",
    "sqlite-inline",
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("postgres-inline", marks=pytest.mark.postgres),
]

CORPUS = [
    ("ada", "Ada Lovelace wrote the first algorithm for the Analytical Engine."),
    ("babbage", "Charles Babbage designed the Analytical Engine and the Difference Engine."),
    ("car", "The engine of a car burns fuel."),
    ("hopper", "Grace Hopper built the first compiler."),
]

HOSTILE = [
    "'; DROP TABLE lexical_terms; --",
    "Robert'); DELETE FROM lexical_docs;--",
    "100% _wild_ \\ backslash",
    "nul\x00byte",
    '"quoted" `ticks` $1 :name %(x)s ?',
]

NewScope = Callable[[], Scope]


@pytest.fixture(params=BACKENDS)
def index(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LexicalIndex]:
    if request.param == "memory":
        yield MemoryLexicalIndex()
        return
    url = f"sqlite:///{tmp_path / 'lexical.db'}"
    database, _, snapshots = request.param.partition("-")
    engine = open_engine(request.getfixturevalue("postgres_url") if database == "postgres" else url)
    try:
        yield SqlLexicalIndex(engine, snapshots=snapshots or "off")
    finally:
        engine.dispose()


@pytest.fixture
def new_scope() -> NewScope:
    """A scope no other test uses: the PostgreSQL database is shared by the whole session."""

    def make() -> Scope:
        token = uuid.uuid4().hex[:10]
        return Scope(tenant=f"tenant-{token}", dataset=f"dataset-{token}")

    return make


def entries(corpus: list[tuple[str, str]]) -> list[tuple[str, str, dict[str, object]]]:
    return [(key, text, {"text": text, "chunk_id": key, "data_ids": [f"data-{key}"]}) for key, text in corpus]


def ids(index: LexicalIndex, scope: Scope, query: str, limit: int = 10) -> list[str]:
    return [hit.id for hit in index.search(scope, query, limit)]


def test_best_match_first_and_only_texts_sharing_a_term(index: LexicalIndex, new_scope: NewScope) -> None:
    # Given four texts, two about the Analytical Engine
    scope = new_scope()
    index.index(scope, entries(CORPUS))
    # When searching for it
    hits = index.search(scope, "the analytical engine", 10)
    # Then the text naming it twice comes first, the car engine last, the compiler not at all
    assert [hit.id for hit in hits] == ["babbage", "ada", "car"]
    assert [hit.score for hit in hits] == sorted(hit.score for hit in hits)
    assert all(hit.score == pytest.approx(bm25_distance(hit.payload["bm25"])) for hit in hits)
    assert hits[0].payload["chunk_id"] == "babbage" and hits[0].payload["data_ids"] == ["data-babbage"]


def test_a_search_without_payloads_ranks_the_same_and_copies_only_the_score(
    index: LexicalIndex, new_scope: NewScope
) -> None:
    # Given four texts with their payloads
    scope = new_scope()
    index.index(scope, entries(CORPUS))
    for query in ("the analytical engine", "engine Lovelace", "compiler"):
        # When searching with and without payloads
        whole = index.search(scope, query, 10)
        bare = index.search(scope, query, 10, payloads=False)
        # Then the same texts come with the same scores, and the payload holds the BM25 score alone
        assert [(hit.id, hit.score) for hit in bare] == [(hit.id, hit.score) for hit in whole]
        assert [hit.payload for hit in bare] == [{"bm25": hit.payload["bm25"]} for hit in whole]


def test_scores_are_bm25(index: LexicalIndex, new_scope: NewScope) -> None:
    # Given a corpus whose statistics are known: N = 4, lengths from the tokenizer
    scope = new_scope()
    index.index(scope, entries(CORPUS))
    lengths = {key: len(tokenize(text)) for key, text in CORPUS}
    average = sum(lengths.values()) / len(lengths)
    # When searching two terms, one in three texts and one in one
    hits = {hit.id: hit.payload["bm25"] for hit in index.search(scope, "engine Lovelace", 10)}
    # Then each score is the sum of the BM25 terms
    expected_ada = bm25_term(1, 3, 4, lengths["ada"], average) + bm25_term(1, 1, 4, lengths["ada"], average)
    assert hits["ada"] == pytest.approx(expected_ada, rel=1e-9)
    assert hits["babbage"] == pytest.approx(bm25_term(2, 3, 4, lengths["babbage"], average), rel=1e-9)
    assert hits["car"] == pytest.approx(bm25_term(1, 3, 4, lengths["car"], average), rel=1e-9)


def test_rare_terms_and_short_texts_weigh_more(index: LexicalIndex, new_scope: NewScope) -> None:
    scope = new_scope()
    index.index(
        scope,
        entries(
            [
                ("short", "river bridge"),
                ("long", "river bridge with many other words about towns roads fields and hills"),
                ("common1", "river town"),
                ("common2", "river field"),
            ]
        ),
    )
    assert ids(index, scope, "bridge")[:2] == ["short", "long"]
    # "bridge" is in two texts, "river" in all four: the bridge texts lead for "river bridge"
    assert set(ids(index, scope, "river bridge")[:2]) == {"short", "long"}


def test_limit_caps_the_hits(index: LexicalIndex, new_scope: NewScope) -> None:
    scope = new_scope()
    index.index(scope, entries(CORPUS))
    assert len(index.search(scope, "engine", 2)) == 2
    assert index.search(scope, "engine", 0) == []


def test_queries_without_terms_find_nothing(index: LexicalIndex, new_scope: NewScope) -> None:
    scope = new_scope()
    index.index(scope, entries(CORPUS))
    for query in ("", "   ", "the of and", "?!", "zeppelin"):
        assert index.search(scope, query, 5) == [], query


def test_reindexing_is_idempotent_and_replaces_text(index: LexicalIndex, new_scope: NewScope) -> None:
    # Given an indexed corpus
    scope = new_scope()
    index.index(scope, entries(CORPUS))
    before = index.search(scope, "first engine", 10)
    # When the same entries are indexed again
    index.index(scope, entries(CORPUS))
    # Then nothing changes, scores included (the corpus statistics did not grow)
    assert index.search(scope, "first engine", 10) == before
    # When one id is indexed with a new text and payload
    index.index(scope, [("car", "A steam locomotive pulled the train.", {"text": "new"})])
    # Then its old terms no longer find it, its new ones do, and the payload is the new one
    assert "car" not in ids(index, scope, "fuel car")
    [hit] = index.search(scope, "locomotive", 5)
    assert hit.id == "car" and hit.payload["text"] == "new"


def test_a_batch_with_a_repeated_id_keeps_the_last(index: LexicalIndex, new_scope: NewScope) -> None:
    scope = new_scope()
    index.index(scope, [("x", "first version", {"v": 1}), ("x", "second edition", {"v": 2})])
    assert index.search(scope, "version", 5) == []
    [hit] = index.search(scope, "edition", 5)
    assert hit.payload["v"] == 2


def test_statistics_follow_replacements_and_removals(index: LexicalIndex, new_scope: NewScope) -> None:
    # Given one index that saw extra texts, replaced them and removed some
    scope, fresh = new_scope(), new_scope()
    index.index(scope, entries([*CORPUS, ("extra", "engine engine engine"), ("gone", "Lovelace")]))
    index.index(scope, [("extra", "Analytical notes", {"text": "x"})])
    index.remove(scope, ["extra", "gone", "never-indexed"])
    # And another that only ever saw the final texts
    index.index(fresh, entries(CORPUS))
    # Then both score alike: N and the average length are exact
    assert index.search(scope, "analytical engine Lovelace", 10) == index.search(
        fresh, "analytical engine Lovelace", 10
    )
    assert "gone" not in ids(index, scope, "Lovelace")


def test_scopes_never_meet(index: LexicalIndex, new_scope: NewScope) -> None:
    # Given the same id with different texts in two datasets
    mine, theirs, empty = new_scope(), new_scope(), new_scope()
    index.index(mine, [("same-id", "Ada Lovelace", {"owner": "mine"})])
    index.index(theirs, [("same-id", "Alan Turing", {"owner": "theirs"})])
    # Then each scope finds only its own text, and an empty scope nothing
    assert [hit.payload["owner"] for hit in index.search(mine, "Ada Turing", 5)] == ["mine"]
    assert [hit.payload["owner"] for hit in index.search(theirs, "Ada Turing", 5)] == ["theirs"]
    assert index.search(empty, "Ada Turing", 5) == []
    # And removing in one scope leaves the other alone
    index.remove(theirs, ["same-id"])
    assert ids(index, mine, "Ada") == ["same-id"]


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_strings_are_data(index: LexicalIndex, new_scope: NewScope, hostile: str) -> None:
    # Given a text, an id and a payload made of a hostile string (ids are UUIDs in use: no NUL in them)
    scope = new_scope()
    key = hostile.replace("\x00", "")
    index.index(scope, [*entries(CORPUS), (key, f"{hostile} marker", {"text": hostile})])
    # When searching with the same string
    hits = index.search(scope, f"{hostile} marker", 10)
    # Then it is found like any text, and the rest of the index is intact
    assert hits[0].id == key and hits[0].payload["text"] == hostile
    assert ids(index, scope, "compiler") == ["hopper"]


def test_unicode_is_folded(index: LexicalIndex, new_scope: NewScope) -> None:
    scope = new_scope()
    index.index(
        scope,
        entries(
            [
                ("zurich", "Die Universität Zürich liegt an der Limmat."),
                ("tokyo", "東京タワー は 東京 にある"),
                ("greek", "ΣΊΣΥΦΟΣ pushed the stone"),
                ("wide", "ＡＢＣ Corporation 🚀 launches"),
            ]
        ),
    )
    assert ids(index, scope, "zurich") == ["zurich"]
    assert ids(index, scope, "UNIVERSITÄT") == ["zurich"]
    assert ids(index, scope, "東京") == ["tokyo"]
    assert ids(index, scope, "σίσυφος") == ["greek"]
    assert ids(index, scope, "abc corporations") == ["wide"]


def test_non_json_payload_is_refused(index: LexicalIndex, new_scope: NewScope) -> None:
    with pytest.raises(StoreError, match="JSON"):
        index.index(new_scope(), [("x", "text", {"bad": object()})])


def test_large_batches_are_indexed_whole(index: LexicalIndex, new_scope: NewScope) -> None:
    scope = new_scope()
    index.index(scope, [(f"id-{i}", f"common word{i}", {"i": i}) for i in range(1_200)])
    assert len(index.search(scope, "common", 2_000)) == 1_200
    assert ids(index, scope, "word777") == ["id-777"]


def test_concurrent_writers_keep_statistics_exact(index: LexicalIndex, new_scope: NewScope) -> None:
    # Given three threads indexing overlapping ids into one scope at once
    scope, fresh = new_scope(), new_scope()
    batches = [[(f"id-{j}", f"shared term{j % 7}", {"j": j}) for j in range(i, i + 40)] for i in (0, 20, 40)]
    errors = at_once([partial(index.index, scope, batch) for batch in batches])
    # Then no write failed, and scores equal those of a single clean write of the same texts
    assert not errors
    index.index(fresh, [(f"id-{j}", f"shared term{j % 7}", {"j": j}) for j in range(80)])
    assert index.search(scope, "shared term3", 200) == index.search(fresh, "shared term3", 200)


def test_a_missing_ln_function_is_supplied_on_sqlite(tmp_path: Path, new_scope: NewScope) -> None:
    # Given an SQLite index told that its SQLite lacks the math functions
    engine = open_engine(f"sqlite:///{tmp_path / 'plain.db'}")
    index = SqlLexicalIndex(engine)
    index._needs_ln = True
    scope = new_scope()
    index.index(scope, entries(CORPUS))
    # Then searching still works, through the Python function
    assert ids(index, scope, "compiler") == ["hopper"]
    engine.dispose()


def test_other_databases_are_refused() -> None:
    engine = sa.create_mock_engine("mysql://", executor=lambda *_: None)
    with pytest.raises(StoreError, match="SQLite and PostgreSQL"):
        SqlLexicalIndex(engine)  # type: ignore[arg-type]


def test_tokenizer_folds_strips_and_drops_stop_words() -> None:
    assert tokenize("The Analytical Engines of Babbage's classes, 1843!") == [
        "analytical",
        "engine",
        "babbage",
        "class",
        "1843",
    ]
    assert tokenize("Glass virus analysis bus") == ["glass", "virus", "analysis", "bus"]
    assert tokenize("Café crème") == ["cafe", "creme"]
    assert query_terms("engine Engine engines") == ["engine"]
    assert max(len(term) for term in tokenize("x" * 500)) == 64


# The SQL index's postings held in memory


def sqlite_index(tmp_path: Path, snapshots: str) -> SqlLexicalIndex:
    return SqlLexicalIndex(open_engine(f"sqlite:///{tmp_path / 'lexical.db'}"), snapshots=snapshots)


def test_postings_held_in_memory_rank_as_the_sql_query_does(tmp_path: Path, new_scope: NewScope) -> None:
    # Given texts over a small vocabulary, so that many share terms and many tie
    rng = random.Random(7)
    words = [f"word{n}" for n in range(40)]
    corpus = [(f"t{n:04}", " ".join(rng.choices(words, k=rng.randint(1, 12)))) for n in range(300)]
    scope = new_scope()
    in_sql, in_memory = sqlite_index(tmp_path, "off"), sqlite_index(tmp_path, "inline")
    in_sql.index(scope, entries(corpus))
    for _ in range(40):
        query = " ".join(rng.choices(words, k=rng.randint(1, 4)))
        # When each searches
        expected = in_sql.search(scope, query, 10)
        found = in_memory.search(scope, query, 10)
        # Then the same texts come in the same order, with the same scores and payloads
        assert [hit.id for hit in found] == [hit.id for hit in expected], query
        assert [hit.payload.pop("bm25") for hit in found] == pytest.approx(
            [hit.payload.pop("bm25") for hit in expected], rel=1e-9
        )
        assert [hit.payload for hit in found] == [hit.payload for hit in expected]
    assert in_memory.held(scope) is not None


def test_a_search_after_a_write_never_answers_from_postings_read_before_it(
    tmp_path: Path, new_scope: NewScope
) -> None:
    scope = new_scope()
    index = sqlite_index(tmp_path, "background")
    index.index(scope, entries(CORPUS))
    # Given the scope's postings read in the background once it is searched again (a process
    # that searches once never reads them: a search begins its read before it returns)
    assert ids(index, scope, "compiler") == ["hopper"]
    assert not index.reading(scope) and index.held(scope) is None
    assert held_at(index, scope, 1)
    assert ids(index, scope, "compiler") == ["hopper"]
    # When a text is replaced and another removed
    index.index(scope, entries([("hopper", "Grace Hopper sailed with the navy.")]))
    index.remove(scope, ["car"])
    # Then the next searches see the writes at once
    assert ids(index, scope, "compiler") == []
    assert ids(index, scope, "navy") == ["hopper"]
    assert "car" not in ids(index, scope, "engine fuel")
    # And once the postings are read again (two writes: revision 3), they answer the same
    assert held_at(index, scope, 3)
    assert ids(index, scope, "compiler") == []
    assert ids(index, scope, "navy") == ["hopper"]


def held_at(index: SqlLexicalIndex, scope: Scope, revision: int) -> bool:
    """Whether the scope's postings come to be held at `revision` (searching starts the read)."""
    deadline = time.monotonic() + 30
    while index.held(scope) != revision and time.monotonic() < deadline:
        index.search(scope, "engine", 1)
        time.sleep(0.05)
    return index.held(scope) == revision


def test_a_scope_past_the_bound_is_searched_in_sql(tmp_path: Path, new_scope: NewScope) -> None:
    scope = new_scope()
    engine = open_engine(f"sqlite:///{tmp_path / 'lexical.db'}")
    index = SqlLexicalIndex(engine, snapshots="inline", max_postings=5)
    index.index(scope, entries(CORPUS))
    assert ids(index, scope, "engine") == ids(SqlLexicalIndex(engine, snapshots="off"), scope, "engine")
    assert index.held(scope) is None
