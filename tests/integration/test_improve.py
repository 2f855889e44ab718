"""Improve, embedded: entity merges by alias rule (never across types), feedback that changes
retrieval order, rated session answers remembered, and a second run that changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from kenning.pipeline.models import Extraction, KnowledgeEdge, KnowledgeGraph, KnowledgeNode
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from kenning.workers.runtime.wiring import Wiring

NAMES = {
    "New York City": "Place",
    "NYC": "Place",
    "Boston": "Place",
    "NYC FC": "Team",
    "Maria Lopez": "Person",
}


class ScriptedExtractor:
    """Entities are the known names found in the text; each links to the next one found."""

    model = "scripted"
    prompt_version = "1"

    def extract(self, text: str) -> Extraction:
        found = sorted((text.find(name), name) for name in NAMES if name in text)
        names = [name for _, name in found if not any(name in other and name != other for _, other in found)]
        nodes = [KnowledgeNode(id=name, name=name, type=NAMES[name]) for name in names]
        edges = [
            KnowledgeEdge(source=a, target=b, relationship="mentioned_with", description=text)
            for a, b in zip(names, names[1:], strict=False)
        ]
        return Extraction(graph=KnowledgeGraph(nodes=nodes, edges=edges), summary=text[:40])


@pytest.fixture
def kenning(tmp_path: Path) -> Kenning:
    settings = load_settings(home=tmp_path / "home", embedding_provider="hash")
    return Kenning(settings, Wiring(settings, {"extractor": ScriptedExtractor()}))


def entity_names(kenning: Kenning) -> dict[str, dict[str, object]]:
    nodes, _ = kenning.wiring.graph.export(kenning.scope("city"))
    return {
        str(n.properties["name"]): {**n.properties, "data_ids": n.data_ids}
        for n in nodes
        if n.type == "Entity"
    }


def test_improve_merges_aliases_of_one_type_and_a_second_run_changes_nothing(kenning: Kenning) -> None:
    with kenning:
        # Given two texts naming one city two ways, and a team whose name shares the acronym
        first = kenning.add_text("Maria Lopez moved to New York City in 2019.", "city", name="one")
        second = kenning.add_text("Maria Lopez loves NYC and Boston.", "city", name="two")
        kenning.add_text("NYC FC plays in Boston.", "city", name="three")
        kenning.cognify("city")
        assert {"New York City", "NYC", "NYC FC"} <= set(entity_names(kenning))

        # When improve runs
        done = kenning.improve("city")

        # Then NYC became an alias of New York City, with both texts' provenance, and the team stayed
        names = entity_names(kenning)
        assert done.merged_entities == 1 and done.repointed_edges >= 1
        assert "NYC" not in names and names["New York City"]["aliases"] == ["NYC"]
        assert set(names["New York City"]["data_ids"]) == {first.added[0].id, second.added[0].id}  # type: ignore[arg-type]
        assert "NYC FC" in names
        _, edges = kenning.wiring.graph.export(kenning.scope("city"))
        nyc = next(
            n
            for n in kenning.wiring.graph.export(kenning.scope("city"))[0]
            if n.properties.get("name") == "New York City"
        )
        assert any(nyc.id in (e.source_id, e.target_id) and e.relationship == "mentioned_with" for e in edges)
        before = kenning.wiring.graph.export(kenning.scope("city"))

        # And a second run changes nothing
        again = kenning.improve("city")
        assert (again.merged_entities, again.weighted, again.session_items) == (0, 0, 0)
        assert kenning.wiring.graph.export(kenning.scope("city")) == before


def test_feedback_changes_the_order_of_recall_through_improve(tmp_path: Path) -> None:
    settings = load_settings(home=tmp_path / "home", embedding_provider="hash", improve_alpha=1.0)
    with Kenning(settings, Wiring(settings, {"extractor": ScriptedExtractor()})) as kenning:
        # Given two chunks that are nearly the same answer to a query
        kenning.add_text("Boston harbour ships: notes one.", "city", name="a")
        kenning.add_text("Boston harbour ships: notes two.", "city", name="b")
        kenning.cognify("city")
        order = [r.chunk_id for r in kenning.recall("Boston harbour ships", ["city"], top_k=2).results]
        assert len(order) == 2

        # When an agent's recall used only the top one, and the agent rated it 1 of 5, and improve ran
        used = kenning.recall("Boston harbour ships", ["city"], session_id="s1", top_k=1)
        assert used.entry_id and kenning.add_feedback("s1", used.entry_id, 1, "wrong harbour")
        done = kenning.improve("city")

        # Then that chunk sank below the other, and a second improve changes nothing
        assert done.weighted == 1
        after = [r.chunk_id for r in kenning.recall("Boston harbour ships", ["city"], top_k=2).results]
        assert after == list(reversed(order))
        assert kenning.improve("city").weighted == 0


def test_rated_session_answers_become_memory(kenning: Kenning) -> None:
    with kenning:
        kenning.add_text("Boston has a harbour.", "city", name="a")
        kenning.cognify("city")
        from kenning.pipeline.session import SessionEntry

        entry = SessionEntry(
            kind="qa", question="Where is Maria Lopez?", answer="Maria Lopez lives in Boston.", dataset="city"
        )
        kenning.wiring.sessions.append(kenning.session_key("s2"), entry)  # type: ignore[union-attr]
        kenning.add_feedback("s2", entry.id, 5)

        done = kenning.improve("city")

        assert done.session_items == 1
        assert "Maria Lopez" in entity_names(kenning)
        assert kenning.improve("city").session_items == 0
