"""`kenning runs list | cancel | retry`: the operator's view of pipeline runs, and its two levers."""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.table import Table

from kenning.pipeline.models import Dataset
from kenning.workers.cli.home import settings_for
from kenning.workers.cli.show import DATASET_NAME, safe
from kenning.workers.control.runs import cancel_run, list_runs, retry_run
from kenning.workers.memory import Kenning
from kenning.workers.runtime.extras import needs_extra
from kenning.workers.runtime.settings import in_mode

console = Console(stderr=True)


@click.group("runs")
def runs_group() -> None:
    """Pipeline runs: list them (a stalled one says why), cancel one, retry one."""


@runs_group.command("list")
@click.option(
    "--dataset", default=None, type=DATASET_NAME, help="Only this dataset's runs (default: every dataset)."
)
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 1000))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def list_command(dataset: str | None, limit: int, as_json: bool) -> None:
    """The most recent runs, newest first."""
    with Kenning(settings_for()) as memory:
        runs = list_runs(memory, dataset, limit)
    if as_json:
        click.echo(json.dumps({"runs": [run.model_dump(mode="json") for run in runs]}))
        return
    table = Table("run", "dataset", "status", "step", "started", "why")
    for run in runs:
        status = f"{run.status} (stalled)" if run.stalled else run.status
        started = run.started_at.strftime("%Y-%m-%d %H:%M:%S") if run.started_at else "-"
        why = safe(run.stalled or run.error)
        table.add_row(safe(run.id[:12]), safe(run.dataset), status, safe(run.step or "-"), started, why)
    Console().print(table)


@runs_group.command("cancel")
@click.argument("run_id")
@click.option("--reason", default="", help="Why; kept in the run's error.")
def cancel_command(run_id: str, reason: str) -> None:
    """End a run that has not ended: it is marked cancelled, its dataset lock released, and its
    tasks in flight stop at their next write. RUN_ID may be a unique prefix."""
    with needs_extra("kenning runs cancel"), Kenning(settings_for()) as memory:
        run = cancel_run(memory, run_id, reason)
    console.print(f"run {safe(run.id)} of dataset {safe(repr(run.dataset))} {run.status}: {safe(run.error)}")


@runs_group.command("retry")
@click.argument("run_id")
@click.option("--distributed", is_flag=True, help="Send the new run to the Celery workers and follow it.")
def retry_command(run_id: str, distributed: bool) -> None:
    """Start a new run of an ended run's dataset, which redoes only what is not done."""
    settings = settings_for()
    with Kenning(in_mode(settings, "distributed") if distributed else settings) as memory:

        def start(dataset: Dataset) -> str:
            console.print(f"retrying run {safe(run_id)} of dataset {safe(repr(dataset.name))}")
            return memory.cognify(dataset.name, console=console).id

        new_id = retry_run(memory, run_id, start)
        run = memory.wiring.metadata.get_run(new_id)
    if run is None:
        raise click.ClickException(f"run {new_id} was not recorded")
    figures = ", ".join(f"{name} {value}" for name, value in sorted(run.stats.items()))
    console.print(f"run {run.id[:8]} {run.status.value}: {figures}")
    if run.error:
        console.print(f"[red]{safe(run.error)}[/red]", soft_wrap=True)
    if run.status.value != "completed":
        sys.exit(1)


COMMANDS = (runs_group,)
