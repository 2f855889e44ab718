"""The API's documentation pages in headless Chromium: `/docs` (Swagger UI) and `/redoc` load
everything they need from the app itself, so they list the operations with no internet."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kenning.workers.api import create_app
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from tests.browser import Page, chromium, chromium_path
from tests.integration.test_mcp import served

pytestmark = pytest.mark.skipif(
    chromium_path() is None, reason="needs Debian's chromium package (scripts/install.sh installs it)"
)


@pytest.fixture
def base_url(tmp_path: Path) -> Iterator[str]:
    """The API app answering on a free port of 127.0.0.1."""
    with Kenning(load_settings(home=tmp_path / "home", embedding_provider="hash")) as memory:
        with served(create_app(memory)) as mcp_url:
            yield mcp_url.removesuffix("/mcp")


def open_page(page: Page, url: str) -> None:
    """Navigate, noting every request the page makes, and wait for the load event."""
    page.send("Network.enable")
    page.send("Page.enable")
    page.send("Page.navigate", url=url)
    page.wait_event("Page.loadEventFired")


def fetched(page: Page) -> list[str]:
    """The URLs the page fetched: not inline ones (`data:`, `blob:`), nor those the page's
    content security policy stopped before they left."""
    page.send("Runtime.evaluate", expression="0")  # take in the events sent before now
    blocked = {
        event["params"]["requestId"]
        for event in page.events
        if event["method"] == "Network.loadingFailed" and event["params"].get("blockedReason") == "csp"
    }
    return [
        event["params"]["request"]["url"]
        for event in page.events
        if event["method"] == "Network.requestWillBeSent"
        and event["params"]["requestId"] not in blocked
        and not event["params"]["request"]["url"].startswith(("data:", "blob:"))
    ]


def test_swagger_ui_lists_the_operations_from_the_app_alone(base_url: str, tmp_path: Path) -> None:
    with chromium(tmp_path / "profile") as page:
        # When /docs is opened
        open_page(page, f"{base_url}/docs")
        # Then Swagger UI lists the operations of the document, /v1/search among them
        count = page.wait_for("document.querySelectorAll('.opblock').length")
        paths = page.evaluate(
            "[...document.querySelectorAll('.opblock-summary-path')].map(e => e.textContent.trim())"
        )
        assert count >= 20 and "/v1/search" in paths
        # And every script, style and the document came from the app itself
        requested = fetched(page)
        assert any(url.endswith("/swagger-ui-bundle.js") for url in requested)
        assert all(url.startswith(base_url) for url in requested), requested


def test_redoc_lists_the_operations_from_the_app_alone(base_url: str, tmp_path: Path) -> None:
    with chromium(tmp_path / "profile") as page:
        open_page(page, f"{base_url}/redoc")
        # ReDoc draws each operation with its method and path, and its sidebar (whose logo is
        # its maker's, on a CDN: the image is refused, and ReDoc takes it away)
        page.wait_for("document.body.innerText.includes('/v1/search')")
        page.wait_for("!document.querySelector('img[alt=\"redocly logo\"]')")
        requested = fetched(page)
        assert any(url.endswith("/redoc.standalone.js") for url in requested)
        assert all(url.startswith(base_url) for url in requested), requested
