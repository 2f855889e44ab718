"""The graph view in headless Chromium: the page loads with the network off, draws the dataset's
entities, search highlights one, a selected entity shows its sources; a screenshot is kept
in tests/artifacts/."""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path

import pytest

from kenning.pipeline.models import GraphEdge, GraphNode, Scope
from kenning.workers.control.graph_view import MAX_NODES, graph_html, graph_view, render_html
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from tests.browser import Page, chromium, chromium_path

ARTIFACTS = Path(__file__).parents[1] / "artifacts"
STATE = "window.kenningGraph"

pytestmark = pytest.mark.skipif(
    chromium_path() is None, reason="needs Debian's chromium package (scripts/install.sh installs it)"
)


def keep(shot: Path) -> None:
    """Copy a screenshot to tests/artifacts/, where it outlives the test's temporary directory."""
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(shot, ARTIFACTS / shot.name)


def open_page(page: Page, html: str, path: Path) -> None:
    path.write_text(html, encoding="utf-8")
    page.open_offline(path.as_uri())
    page.wait_for(f"{STATE} && {STATE}.ready")


def test_page_draws_a_dataset_offline_and_search_highlights_one(tmp_path: Path) -> None:
    # Given a dataset remembered from two texts
    with Kenning(load_settings(home=tmp_path / "home", embedding_provider="hash")) as memory:
        memory.remember(
            "Ada Lovelace worked with Charles Babbage in London on the Analytical Engine in 1843. "
            "Charles Babbage designed the Difference Engine.",
            "notes",
        )
        memory.remember("Grace Hopper built the first compiler in Philadelphia in 1952.", "notes")
        html = graph_html(memory, "notes")
        nodes, _ = memory.wiring.graph.export(memory.scope("notes"))
    entities = [n for n in nodes if n.type == "Entity"]
    babbage = next(n for n in entities if n.properties["name"] == "Charles Babbage")

    with chromium(tmp_path / "profile") as page:
        # When its page is opened from a file, with the network off
        open_page(page, html, tmp_path / "graph.html")
        # Then it loaded nothing but itself, and drew every entity
        assert all(url.startswith("file:") for url in page.requested())
        assert page.evaluate(f"{STATE}.nodes") == len(entities) >= 5
        page.wait_for(f"{STATE}.drawn === {len(entities)}")
        assert page.evaluate("document.getElementById('graph').dataset.drawn") == str(len(entities))
        assert page.evaluate("document.getElementById('notice').hidden") is True

        # When a name is typed into the search box
        page.type_text("#search", "babb")
        # Then that one entity is highlighted
        assert page.evaluate(f"{STATE}.highlighted") == [babbage.id]
        assert page.evaluate("document.getElementById('matches').textContent") == "1 match"

        # When Enter selects it, then the details name it, its relations and its sources
        page.press("Enter")
        page.wait_for("!document.getElementById('details').hidden")
        assert page.evaluate("document.getElementById('d-name').textContent") == "Charles Babbage"
        relations = page.evaluate("document.getElementById('d-relations').textContent")
        assert "Difference Engine" in relations
        sources = page.evaluate("document.getElementById('d-sources').textContent")
        assert babbage.data_ids[0] in sources and "Charles Babbage designed" in sources
        page.wait_for(f"{STATE}.settled", timeout_s=30)
        keep(page.screenshot(tmp_path / "graph_view.png"))


def large_graph(entities: int, seed: int = 7) -> tuple[list[GraphNode], list[GraphEdge]]:
    """A connected random graph of `entities` entities, each cited by a chunk of one of 50 items."""
    rng = random.Random(seed)
    types = ["Person", "Place", "Organization", "Event", "Concept"]
    nodes = [
        GraphNode(
            id=f"e{i}",
            type="Entity",
            properties={"name": f"Entity {i:05d}", "entity_type": rng.choice(types), "description": f"#{i}"},
            data_ids=[f"item{i % 50}"],
        )
        for i in range(entities)
    ]
    chunks = [
        GraphNode(id=f"c{i}", type="DocumentChunk", properties={"text": f"chunk {i}"}, data_ids=[f"item{i}"])
        for i in range(50)
    ]
    pairs = {(i, rng.randrange(i)) for i in range(1, entities)}
    pairs |= {(rng.randrange(entities), rng.randrange(entities)) for _ in range(entities)}
    edges = [
        GraphEdge(id=f"r{a}-{b}", source_id=f"e{a}", target_id=f"e{b}", relationship="related_to")
        for a, b in pairs
        if a != b
    ]
    edges += [
        GraphEdge(id=f"k{i}", source_id=f"c{i % 50}", target_id=f"e{i}", relationship="contains")
        for i in range(entities)
    ]
    return nodes + chunks, edges


def test_page_samples_above_5000_entities_and_stays_usable(tmp_path: Path) -> None:
    # Given a graph of 6,000 entities and their relations
    nodes, edges = large_graph(6000)
    items = {f"item{i}": f"document {i}.md" for i in range(50)}
    view = graph_view(Scope(tenant="t", dataset="big"), nodes, edges, items)
    assert len(view.nodes) == MAX_NODES and view.sampled
    target = view.nodes[123]

    with chromium(tmp_path / "profile") as page:
        # When its page is opened
        started = time.monotonic()
        open_page(page, render_html(view), tmp_path / "big.html")
        ready_s = time.monotonic() - started
        # Then it draws the best connected 5,000 and says that it does
        page.wait_for(f"{STATE}.drawn === {MAX_NODES}")
        notice = page.evaluate("document.getElementById('notice').textContent")
        assert "5,000 best connected of 6,000 entities" in notice
        assert page.evaluate("document.getElementById('notice').hidden") is False
        # And it is usable: drawn within seconds, and the layout comes to rest
        assert ready_s < 20, f"the page took {ready_s:.1f} s to draw"
        page.wait_for(f"{STATE}.settled", timeout_s=60)
        settled_s = time.monotonic() - started

        # When one name is searched, then exactly that entity is highlighted
        page.type_text("#search", target.name)
        assert page.evaluate(f"{STATE}.highlighted") == [target.id]
        keep(page.screenshot(tmp_path / "graph_view_5000.png"))
    print(json.dumps({"ready_s": round(ready_s, 2), "settled_s": round(settled_s, 2)}))
