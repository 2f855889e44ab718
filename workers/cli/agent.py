"""`kenning mcp` (memory as tools for agents) and `kenning visualize` (the graph view as a page)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from kenning.workers.cli.home import settings_for
from kenning.workers.cli.show import DATASET_NAME, safe
from kenning.workers.control.graph_view import MAX_NODES, graph_html
from kenning.workers.memory import Kenning
from kenning.workers.runtime.extras import needs_extra

console = Console(stderr=True)


@click.command("mcp")
@click.option(
    "--transport",
    type=click.Choice(["stdio", "http"]),
    default="stdio",
    show_default=True,
    help="stdio for a client that starts this process; http for streamable HTTP at /mcp.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="HTTP only.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(1, 65535), help="HTTP only.")
def mcp_command(transport: str, host: str, port: int) -> None:
    """Answer MCP: remember, recall, forget, search, list_datasets and status as tools.

    Over HTTP every request needs an API key (`kenning key create`), and each tool acts with
    that key's permissions; over stdio the tools act as this process's settings say.
    """
    with needs_extra("kenning mcp"):
        from kenning.workers.mcp.server import serve_http, serve_stdio

    with Kenning(settings_for(makes_home=True)) as memory:
        if transport == "stdio":
            serve_stdio(memory)
        else:
            console.print(f"MCP on http://{host}:{port}/mcp (Authorization: Bearer <key>)")
            serve_http(memory, host, port)


@click.command("visualize")
@click.option("--dataset", default=None, type=DATASET_NAME, help="Default: KENNING_DATASET or 'main'.")
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), default=Path("graph.html"), show_default=True
)
@click.option(
    "--max-nodes",
    type=click.IntRange(1),
    default=MAX_NODES,
    show_default=True,
    help="Above this many entities, draw the best connected ones.",
)
def visualize_command(dataset: str | None, out: Path, max_nodes: int) -> None:
    """Write the dataset's graph as one HTML page that opens offline: search, details, sources."""
    with Kenning(settings_for()) as memory:
        page = graph_html(memory, dataset, max_nodes)
    out.write_text(page, encoding="utf-8")
    console.print(f"wrote {safe(out)} ({len(page.encode()) // 1024} KiB)")


COMMANDS = (mcp_command, visualize_command)
