"""`kenning history ENTITY`: every fact about an entity, retired ones too, with when each held and
the data items that said so."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from kenning.pipeline.validity import Fact
from kenning.workers.cli.home import settings_for
from kenning.workers.cli.show import DATASET_NAME, safe
from kenning.workers.memory import Kenning

AS_OF_HELP = "Facts as they held at this moment: a year, YYYY-MM, a date or an ISO 8601 date and time."


@click.command("history")
@click.argument("entity")
@click.option("--dataset", type=DATASET_NAME, default=None, help="The dataset (default: KENNING_DATASET).")
@click.option("--as-of", "as_of", default=None, help=AS_OF_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def history_command(entity: str, dataset: str | None, as_of: str | None, as_json: bool) -> None:
    """An entity's facts, oldest first: since when each held, until when, what ended it, and the
    data items that state it. A retired fact stays in the history."""
    with Kenning(settings_for()) as memory:
        facts = memory.history(entity, dataset, as_of)
    if as_json:
        found = [fact.model_dump(mode="json") for fact in facts]
        click.echo(json.dumps({"entity": entity, "as_of": as_of, "facts": found}, ensure_ascii=False))
        return
    if not facts:
        click.echo(f"no facts about {entity}" + (f" as of {as_of}" if as_of else ""))
        return
    Console().print(fact_table(facts))


def fact_table(facts: list[Fact]) -> Table:
    table = Table("fact", "from", "to", "now", "stated by")
    for fact in facts:
        held = fact.periods or []
        start = ", ".join(p.valid_from for p in held) or "-"
        end = ", ".join(p.valid_to or "" for p in held if p.valid_to) or "-"
        now = "holds" if fact.current else "retired"
        stated = ", ".join(data_id[:8] for data_id in fact.data_ids)
        text = f"{fact.source} {fact.relationship.replace('_', ' ')} {fact.target}"
        table.add_row(safe(text), start, end, now, stated)
    return table


COMMANDS = [history_command]
