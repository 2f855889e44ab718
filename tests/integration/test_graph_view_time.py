"""The graph view's time slider, in headless Chromium: facts that do not hold at the day chosen
(retired ones, or not yet true) are dimmed, and an entity's relations say when each held."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from kenning.workers.control.graph_view import GraphView, dataset_view, payload, render_html
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from tests.browser import chromium, chromium_path
from tests.integration.test_graph_view import STATE, keep, open_page

OSLO = "[2023-01-10] Ana: I live in Oslo and work for Norsk Data."
BERLIN = "[2024-06-02] Ana: We moved to Berlin last month; I joined Zalando."

needs_chromium = pytest.mark.skipif(
    chromium_path() is None, reason="needs Debian's chromium package (scripts/install.sh installs it)"
)


@pytest.fixture
def memory(tmp_path: Path) -> Kenning:
    memory = Kenning(load_settings(home=tmp_path / "home", embedding_provider="hash"))
    memory.remember(OSLO, "ana")
    memory.remember(BERLIN, "ana")
    return memory


def test_the_view_carries_when_each_fact_held(memory: Kenning) -> None:
    # When the view of Ana's moves is made
    with memory:
        view = dataset_view(memory, "ana")
    links = {(link.relationship, link.target): link for link in view.links}

    # Then each fact keeps its periods ([from, to) in ms), retired ones too, and the slider spans them
    oslo, berlin = links["live_in", node_id(view, "Oslo")], links["moved_to", node_id(view, "Berlin")]
    may_2024 = int(datetime(2024, 5, 1, tzinfo=UTC).timestamp() * 1000)
    assert oslo.periods == [(int(datetime(2023, 1, 10, tzinfo=UTC).timestamp() * 1000), may_2024)]
    assert oslo.held == "2023-01-10 to 2024-05" and berlin.held == "since 2024-05"
    assert berlin.periods == [(may_2024, None)]
    timeline = payload(view)["timeline"]
    assert timeline["start"] == oslo.periods[0][0] and timeline["end"] == timeline["now"] >= may_2024


def node_id(view: GraphView, name: str) -> str:
    return next(node.id for node in view.nodes if node.name == name)


@needs_chromium
def test_the_time_slider_dims_the_facts_that_did_not_hold(memory: Kenning, tmp_path: Path) -> None:
    with memory:
        view = dataset_view(memory, "ana")
    html = render_html(view)

    with chromium(tmp_path / "profile") as page:
        # When the page opens, it shows now: Oslo is retired, so dimmed
        open_page(page, html, tmp_path / "graph.html")
        assert page.evaluate("document.getElementById('timeline').hidden") is False
        assert page.evaluate(f"{STATE}.asOf") == "now"
        assert page.evaluate(f"{STATE}.retired") == ["Ana live_in Oslo"]
        assert "1 not holding now (dimmed)" in page.evaluate("document.getElementById('counts').textContent")

        # And Ana's relations say when each held, the retired one dimmed
        page.evaluate(f"{STATE}.select('{node_id(view, 'Ana')}')")
        page.wait_for("!document.getElementById('details').hidden")
        retired = page.evaluate(
            "[...document.querySelectorAll('#d-relations li.retired')].map(li => li.textContent)"
        )
        assert retired == ["live_in \u2192 Oslo (2023-01-10 to 2024-05)"]
        relations = page.evaluate("document.getElementById('d-relations').textContent")
        assert "moved_to \u2192 Berlin (since 2024-05)" in relations

        # When the slider is moved to its first day, as a user drags it (the day Ana spoke of Oslo)
        page.evaluate(
            "(() => { const s = document.getElementById('as-of'); s.value = '0';"
            " s.dispatchEvent(new Event('input')); })()"
        )
        # Then Berlin, not yet true then, is dimmed and Oslo is not
        assert page.evaluate("document.getElementById('as-of-label').textContent") == "2023-01-10"
        assert page.evaluate(f"{STATE}.retired") == ["Ana moved_to Berlin"]
        retired = page.evaluate(
            "[...document.querySelectorAll('#d-relations li.retired')].map(li => li.textContent)"
        )
        assert retired == ["moved_to \u2192 Berlin (since 2024-05)"]

        # And a day is read at its end, as as_of is: the day before the move began, then the first
        assert page.evaluate(f"{STATE}.asOfDay('2024-04-30')") == 1
        assert page.evaluate(f"{STATE}.retired") == ["Ana moved_to Berlin"]
        assert page.evaluate(f"{STATE}.asOfDay('2024-05-01')") == 1
        assert page.evaluate(f"{STATE}.retired") == ["Ana live_in Oslo"]

        # When the slider goes back to its end, it shows now again
        page.evaluate(
            "(() => { const s = document.getElementById('as-of'); s.value = s.max;"
            " s.dispatchEvent(new Event('input')); })()"
        )
        assert page.evaluate(f"{STATE}.asOf") == "now"
        page.wait_for(f"{STATE}.settled", timeout_s=30)
        keep(page.screenshot(tmp_path / "graph_view_time.png"))
