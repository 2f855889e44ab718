"""`kenning memory list | get | update | delete`: memory records, shown as what they say (text,
entities, relations), or as JSON with --json."""

from __future__ import annotations

import click
from rich.console import Console

from kenning.pipeline.loaders import decode_text
from kenning.workers.application.records import MemoryRecord
from kenning.workers.cli.home import settings_for
from kenning.workers.cli.remember import read_bytes
from kenning.workers.cli.show import DATASET_NAME, printable, safe
from kenning.workers.memory import Kenning

console = Console(stderr=True)
JSON = click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
SHOWN_ELEMENTS = 50


@click.group("memory")
def memory_group() -> None:
    """Memory records: each added item, with the nodes and edges it produced; a record keeps its
    id across updates."""


@memory_group.command("list")
@click.option("--dataset", default=None, type=DATASET_NAME)
@click.option("--offset", default=0, show_default=True, type=click.IntRange(0))
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 1000))
@JSON
def memory_list(dataset: str | None, offset: int, limit: int, as_json: bool) -> None:
    """The dataset's records, one a line: id, status, size and name."""
    with Kenning(settings_for()) as memory:
        page = memory.records.list(dataset, offset, limit)
    if as_json:
        click.echo(page.model_dump_json())
        return
    for record in page.records:
        click.echo(printable(f"{record.id}\t{record.status}\t{record.size}\t{record.name}"))
    shown = f"{offset + 1}-{offset + len(page.records)}" if page.records else "none"
    console.print(f"records {shown} of {page.total}")


@memory_group.command("get")
@click.argument("record_id")
@click.option("--dataset", default=None, type=DATASET_NAME)
@JSON
def memory_get(record_id: str, dataset: str | None, as_json: bool) -> None:
    """A record: its text, then the entities and relations it made. RECORD_ID may be its data id."""
    with Kenning(settings_for()) as memory:
        record = memory.records.get(record_id, dataset)
    if as_json:
        click.echo(record.model_dump_json())
    else:
        show(record)


def show(record: MemoryRecord) -> None:
    state = f"{record.status}: {record.error}" if record.error else record.status
    click.echo(printable(f"record {record.id} ({record.name}, {state})"))
    sizes = f"sha256 {record.content_hash}, {record.size} bytes, {record.created_at}"
    click.echo(printable(f"data {record.data_id}, {sizes}"))
    click.echo("")
    click.echo(printable(record.text) if record.text is not None else "(no text: binary content)")
    entities = [node for node in record.nodes if node.type == "Entity"]
    # Facts between entities; the structure around them (chunks, types) is in --json
    ids = {node.id for node in entities}
    relations = [edge for edge in record.edges if edge.source_id in ids and edge.target_id in ids]
    click.echo(f"\nentities ({len(entities)}):")
    for node in entities[:SHOWN_ELEMENTS]:
        click.echo(printable(f"  {node.name}" + (f" ({node.entity_type})" if node.entity_type else "")))
    click.echo(f"\nrelations ({len(relations)}):")
    for edge in relations[:SHOWN_ELEMENTS]:
        click.echo(printable(f"  {edge.source} -{edge.relationship}-> {edge.target}"))
    if max(len(entities), len(relations)) > SHOWN_ELEMENTS:
        console.print(f"the first {SHOWN_ELEMENTS} of each shown; --json gives them all")


@memory_group.command("update")
@click.argument("record_id")
@click.argument("path")
@click.option("--dataset", default=None, type=DATASET_NAME)
@JSON
def memory_update(record_id: str, path: str, dataset: str | None, as_json: bool) -> None:
    """Replace a record's text with PATH's (or - for stdin), cognify, and forget what is stale.
    The record keeps its id."""
    with Kenning(settings_for()) as memory:
        limit = memory.settings.max_document_bytes
        text = decode_text(read_bytes(path, limit), limit)
        record = memory.records.update(record_id, text, dataset)
    if as_json:
        click.echo(record.model_dump_json())
    else:
        show(record)


@memory_group.command("delete")
@click.argument("record_id")
@click.option("--dataset", default=None, type=DATASET_NAME)
def memory_delete(record_id: str, dataset: str | None) -> None:
    """Forget a record, every version of it, from every store."""
    with Kenning(settings_for()) as memory:
        memory.records.delete(record_id, dataset)
    console.print(f"deleted record {safe(record_id)}")


COMMANDS = (memory_group,)
