"""Facts that change, embedded: a newer fact retires the one it contradicts (functional relations,
offices, negations), nothing is deleted, forget brings back what only the forgotten item ended,
and every read answers from the facts of now or of a moment (`kenning.pipeline.validity`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from kenning.pipeline.errors import InputError, NotFound
from kenning.pipeline.models import Extraction, KnowledgeEdge, KnowledgeGraph, KnowledgeNode
from kenning.pipeline.permission import Permission, User, issue_key
from kenning.pipeline.validity import Fact
from kenning.workers.api import create_app
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from kenning.workers.runtime.wiring import Wiring

OSLO = "[2023-01-10T09:00:00] Ana: I live in Oslo and work for Norsk Data."
BERLIN = "[2024-06-02T10:00:00] Ana: We moved to Berlin last month; I joined Zalando."


@pytest.fixture
def kenning(tmp_path: Path) -> Iterator[Kenning]:
    settings = load_settings(home=tmp_path / "home", embedding_provider="hash")
    with Kenning(settings) as memory:
        yield memory


def facts(kenning: Kenning, entity: str, dataset: str, **options: Any) -> dict[str, Fact]:
    return {f"{f.relationship} {f.target}": f for f in kenning.history(entity, dataset, **options)}


def context(kenning: Kenning, question: str, dataset: str, kind: str, as_of: str | None = None) -> str:
    found = kenning.search(question, kind, datasets=[dataset], only_context=True, as_of=as_of)
    return found.context


def test_ana_moves_and_the_old_city_is_retired_not_deleted(kenning: Kenning) -> None:
    # Given Ana said where she lives, then that she moved
    first = kenning.remember(OSLO, "ana").item_ids[0]
    second = kenning.remember(BERLIN, "ana").item_ids[0]

    # Then Oslo is retired when the move began ("last month": May 2024), by the second message
    history = facts(kenning, "Ana", "ana")
    oslo, berlin = history["live_in Oslo"], history["moved_to Berlin"]
    assert not oslo.current and berlin.current
    [held] = oslo.periods
    assert (held.valid_from, held.valid_from_by) == ("2023-01-10T09:00:00Z", first)
    assert (held.valid_to, held.valid_to_by, held.retired_by) == ("2024-05", second, berlin.id)
    assert held.recorded_at and held.retired_at and held.retired_at >= held.recorded_at
    assert berlin.periods[0].valid_from == "2024-05" and berlin.line == "Ana moved to Berlin (since 2024-05)"

    # And reads answer from what holds now, saying since when, or from what held then
    now = context(kenning, "Where does Ana live?", "ana", "GRAPH_COMPLETION")
    assert "--> Berlin (since 2024-05)" in now and "--> Oslo" not in now
    # (the text of the message whose fact no longer holds is not given either; the other's is)
    assert "Ana: I live in Oslo" not in now and "Ana: We moved to Berlin" in now
    then = context(kenning, "Where does Ana live?", "ana", "GRAPH_COMPLETION", as_of="2023")
    assert "--> Oslo (2023-01-10 to 2024-05)" in then and "--> Berlin" not in then
    assert "-> Oslo" not in context(kenning, "Ana live Oslo", "ana", "TRIPLET_COMPLETION")
    assert "-> Oslo" in context(kenning, "Ana live Oslo", "ana", "TRIPLET_COMPLETION", as_of="2023-06")


def test_as_of_at_each_boundary(kenning: Kenning) -> None:
    # Given two statements at exact instants, the second ending the first
    kenning.remember("[2023-01-10T09:00:00] Ana: I live in Oslo.", "ana")
    kenning.remember("[2024-06-02T10:00:00] Ana: I live in Berlin now.", "ana")

    def cities(as_of: str) -> set[str]:
        return {f.target for f in kenning.history("Ana", "ana", as_of=as_of) if f.relationship == "live_in"}

    # Then each holds from its instant, up to (not at) the next
    assert cities("2023-01-10T08:59:59") == set()
    assert cities("2023-01-10T09:00:00") == {"Oslo"}
    assert cities("2024-06-02T09:59:59") == {"Oslo"}
    assert cities("2024-06-02T10:00:00") == {"Berlin"}
    # A day, month or year is read at its end
    assert cities("2024-06-01") == {"Oslo"} and cities("2024-06-02") == {"Berlin"}
    assert cities("2024-05") == {"Oslo"} and cities("2024") == {"Berlin"} and cities("2023") == {"Oslo"}
    with pytest.raises(InputError, match="no time"):
        kenning.history("Ana", "ana", as_of="yesterday-ish")
    with pytest.raises(NotFound):
        kenning.history("Nobody", "ana")


def test_a_ceo_succession_across_three_documents(kenning: Kenning) -> None:
    # Given three dated documents naming one office's holders (added in another order)
    kenning.add_text("2023-03-01\nCarol White became the CEO of Acme Corp.", "acme", name="three")
    kenning.add_text("2019-01-01\nAlice Smith is the CEO of Acme Corp.", "acme", name="one")
    kenning.add_text("2021-06-01\nBob Jones became the CEO of Acme Corp.", "acme", name="two")
    kenning.cognify("acme")

    # Then each held the office until the next took it
    holders = [
        (f.source, f.periods[0].valid_from, f.periods[0].valid_to, f.current)
        for f in kenning.history("CEO of Acme Corp", "acme")
    ]
    assert holders == [
        ("Alice Smith", "2019-01-01", "2021-06-01", False),
        ("Bob Jones", "2021-06-01", "2023-03-01", False),
        ("Carol White", "2023-03-01", None, True),
    ]
    ask = "Who is the CEO of Acme Corp?"
    now = context(kenning, ask, "acme", "GRAPH_COMPLETION")
    assert "Carol White" in now and "Bob Jones" not in now and "Alice Smith" not in now
    assert "Bob Jones" in context(kenning, ask, "acme", "GRAPH_COMPLETION", as_of="2022")
    assert "Alice Smith" in context(kenning, ask, "acme", "GRAPH_COMPLETION", as_of="2021-05-31")


class DietExtractor:
    """A model's reading of the diet messages: Ana eats meat, then Ana stopped eating meat."""

    model = "diet"
    prompt_version = "1"

    def extract(self, text: str) -> Extraction:
        nodes = [
            KnowledgeNode(id="ana", name="Ana", type="Person"),
            KnowledgeNode(id="meat", name="meat", type="Food"),
        ]
        relation = "stopped_eating" if "stopped" in text else "eats"
        edges = [KnowledgeEdge(source="ana", target="meat", relationship=relation, description=text)]
        return Extraction(graph=KnowledgeGraph(nodes=nodes, edges=edges), summary=text[:40])


def test_a_negation_ends_the_fact_it_denies(tmp_path: Path) -> None:
    settings = load_settings(home=tmp_path / "home", embedding_provider="hash")
    with Kenning(settings, Wiring(settings, {"extractor": DietExtractor()})) as kenning:
        # Given Ana ate meat, then stopped
        kenning.remember("[2022-03-01] Ana: I love a good steak, I eat meat every day.", "diet")
        stop = kenning.remember("[2024-01-15] Ana: I stopped eating meat.", "diet").item_ids[0]

        # Then eating meat held until she stopped, and the negation holds since
        history = facts(kenning, "Ana", "diet")
        eats, stopped = history["eats meat"], history["stopped_eating meat"]
        assert (eats.current, eats.periods[0].valid_to, eats.periods[0].valid_to_by) == (
            False,
            "2024-01-15",
            stop,
        )
        assert stopped.current and stopped.negates
        assert "eats" not in context(kenning, "Does Ana eat meat?", "diet", "GRAPH_COMPLETION")


def test_no_longer_working_somewhere_offline(kenning: Kenning) -> None:
    kenning.remember(OSLO, "ana")
    kenning.remember("[2024-07-02] Ana: I no longer work for Norsk Data.", "ana")
    history = facts(kenning, "Ana", "ana")
    assert not history["work_for Norsk Data"].current
    assert history["work_for Norsk Data"].periods[0].valid_to == "2024-07-02"
    assert history["live_in Oslo"].current  # a negation ends only the facts of its own two ends


def test_remembering_the_same_conversation_again_changes_nothing(kenning: Kenning) -> None:
    conversation = [
        {"speaker": "Ana", "text": "I live in Oslo.", "time": "2023-01-10T09:00:00"},
        {"speaker": "Ana", "text": "I live in Berlin now.", "time": "2024-06-02T10:00:00"},
    ]
    kenning.remember(conversation, "ana")
    before = kenning.wiring.graph.export(kenning.scope("ana"))[1]
    kenning.remember(conversation, "ana")
    after = kenning.wiring.graph.export(kenning.scope("ana"))[1]
    assert sorted(before, key=lambda e: e.id) == sorted(after, key=lambda e: e.id)


def test_forgetting_the_message_that_retired_a_fact_brings_it_back(kenning: Kenning) -> None:
    # Given Oslo retired by the move
    first = kenning.remember(OSLO, "ana").item_ids[0]
    second = kenning.remember(BERLIN, "ana").item_ids[0]
    assert not facts(kenning, "Ana", "ana")["live_in Oslo"].current

    # When the message of the move is forgotten
    kenning.forget("ana", [second])

    # Then Oslo holds again, and nothing in the graph names the forgotten message
    history = facts(kenning, "Ana", "ana")
    assert "moved_to Berlin" not in history
    oslo = history["live_in Oslo"]
    assert oslo.current and oslo.periods[0].valid_to is None and oslo.data_ids == [first]
    nodes, edges = kenning.wiring.graph.export(kenning.scope("ana"))
    assert second not in str([e.properties for e in edges]) + str([n.properties for n in nodes])
    assert "--> Oslo (since 2023-01-10)" in context(
        kenning, "Where does Ana live?", "ana", "GRAPH_COMPLETION"
    )


def test_undated_documents_are_ordered_by_when_they_were_added(kenning: Kenning) -> None:
    # Given two texts that give no time, added one after the other
    kenning.add_text("Mara Quill moved to Bergen.", "people", name="one")
    kenning.cognify("people")
    kenning.add_text("Mara Quill moved to Tromso.", "people", name="two")
    kenning.cognify("people")

    # Then the later one retired the earlier, from when it was added
    history = facts(kenning, "Mara Quill", "people")
    bergen, tromso = history["moved_to Bergen"], history["moved_to Tromso"]
    assert tromso.current and not bergen.current
    assert bergen.periods[0].valid_to == tromso.periods[0].valid_from == tromso.periods[0].recorded_at


def test_history_and_as_of_over_http(kenning: Kenning) -> None:
    # Given Ana's move, and a reader of her dataset and a user who may read nothing
    kenning.remember(OSLO, "ana")
    kenning.remember(BERLIN, "ana")
    store = kenning.wiring.permissions
    tokens = {}
    for name, grants in (("reader", [Permission.READ]), ("stranger", [])):
        user = User(tenant=kenning.settings.tenant, name=name)
        store.add_user(user)
        if grants:
            store.grant(user, "ana", grants)
        token, key = issue_key(user)
        store.add_key(key)
        tokens[name] = {"Authorization": f"Bearer {token}"}

    with TestClient(create_app(kenning)) as client:
        # When the reader asks for Ana's history, now and as of 2023, and searches as of 2023
        found = client.get("/v1/datasets/ana/history", params={"entity": "Ana"}, headers=tokens["reader"])
        then = client.get(
            "/v1/datasets/ana/history", params={"entity": "Ana", "as_of": "2023"}, headers=tokens["reader"]
        )
        body = {
            "query": "Where does Ana live?",
            "type": "GRAPH_COMPLETION",
            "only_context": True,
            "as_of": "2023",
        }
        searched = client.post("/v1/search", json=body, headers=tokens["reader"])

        # Then both lists carry the periods, and the search answers from 2023's facts
        assert found.status_code == 200, found.text
        facts = {f"{f['relationship']} {f['target']}": f for f in found.json()}
        assert facts["live_in Oslo"]["current"] is False and facts["moved_to Berlin"]["current"] is True
        assert facts["live_in Oslo"]["periods"][0]["valid_to"] == "2024-05"
        assert {f["target"] for f in then.json()} == {"Oslo", "Norsk Data"}
        assert "--> Oslo (2023-01-10 to 2024-05)" in searched.json()["context"]

        # And a stranger, an unknown entity and a bad moment get plain errors
        stranger = client.get(
            "/v1/datasets/ana/history", params={"entity": "Ana"}, headers=tokens["stranger"]
        )
        nobody = client.get("/v1/datasets/ana/history", params={"entity": "Nobody"}, headers=tokens["reader"])
        bad = client.get(
            "/v1/datasets/ana/history", params={"entity": "Ana", "as_of": "soon"}, headers=tokens["reader"]
        )
        assert (stranger.status_code, nobody.status_code, bad.status_code) == (404, 404, 422)
