"""The `kenning` command line."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kenning import __version__
from kenning.pipeline.checks import CHECK_COUNTERS
from kenning.pipeline.context import Job
from kenning.pipeline.errors import InputError, KenningError
from kenning.pipeline.models import PipelineRun
from kenning.retrieval.contract import SearchResult, SearchType
from kenning.workers.application.lifecycle import deletable_dataset
from kenning.workers.cli.access import COMMANDS as ACCESS_COMMANDS
from kenning.workers.cli.agent import COMMANDS as AGENT_COMMANDS
from kenning.workers.cli.history import AS_OF_HELP
from kenning.workers.cli.history import COMMANDS as HISTORY_COMMANDS
from kenning.workers.cli.home import settings_for
from kenning.workers.cli.progress import cognify_drawn, print_run, progress_bars
from kenning.workers.cli.records import COMMANDS as RECORD_COMMANDS
from kenning.workers.cli.remember import COMMANDS as REMEMBER_COMMANDS
from kenning.workers.cli.runs import COMMANDS as RUNS_COMMANDS
from kenning.workers.cli.sessions import COMMANDS as SESSION_COMMANDS
from kenning.workers.cli.show import DATASET_NAME, printable, safe
from kenning.workers.control.runs import StallDetector, llm_breaker, load_placement, mark_stalled
from kenning.workers.memory import Kenning
from kenning.workers.runtime.extras import needs_extra
from kenning.workers.runtime.local_runner import Interrupted

console = Console(stderr=True)
SAMPLES = Path(__file__).parent.parent / "samples"
WATCH_POLL_S = 1.0
DEMO_QUESTIONS = (
    "Who founded the Harrow Point lighthouse keepers' guild?",
    "Which ship ran aground near Harrow Point, and what happened to its cargo?",
    "How did the lighthouse lamp change over the years?",
)


def open_memory(*, makes_home: bool = False, **overrides: Any) -> Kenning:
    """The memory of the home the settings name: one there already, unless `makes_home`."""
    return Kenning(settings_for(makes_home=makes_home, **overrides))


@click.group()
@click.version_option(__version__, prog_name="kenning")
def main() -> None:
    """kenning: long-term memory for AI agents (knowledge graph + vector index)."""


@main.command("add")
@click.argument("paths", nargs=-1, required=True)
@click.option(
    "--dataset",
    default=None,
    type=DATASET_NAME,
    help="Dataset to add to (default: KENNING_DATASET or 'main').",
)
@click.option("--node-set", "node_sets", multiple=True, help="A named subset the data joins (repeatable).")
def add_command(paths: tuple[str, ...], dataset: str | None, node_sets: tuple[str, ...]) -> None:
    """Add files, directories, - (stdin) or s3://bucket/prefix to a dataset."""
    with open_memory(makes_home=True) as memory:
        result = memory.add_paths(list(paths), dataset, node_sets=list(node_sets))
    for path, error in result.errors.items():
        console.print(f"[red]error[/red] {safe(path)}: {safe(error)}")
    console.print(
        f"added {len(result.added)}, unchanged {len(result.unchanged)}, errors {len(result.errors)}"
    )
    if result.errors and not (result.added or result.unchanged or result.skipped):
        sys.exit(1)


@main.command("cognify")
@click.option("--dataset", default=None, type=DATASET_NAME)
@click.option(
    "--distributed",
    is_flag=True,
    help="Distributed mode whatever KENNING_MODE says: enqueue on the Celery workers and follow progress.",
)
@click.option(
    "--dry-run", is_flag=True, help="Print the LLM calls, tokens and cost it would spend; do nothing."
)
@click.option("--temporal", is_flag=True, help="Also extract dated events (for TEMPORAL search); embedded.")
def cognify_command(dataset: str | None, distributed: bool, dry_run: bool, temporal: bool) -> None:
    """Build the knowledge graph and vector index of a dataset: in this process (embedded mode),
    or on the Celery workers (distributed mode, `KENNING_MODE` or `--distributed`)."""
    overrides: dict[str, Any] = {"temporal": True} if temporal else {}
    if distributed:
        overrides["mode"] = "distributed"
    with open_memory(**overrides) as memory:
        if dry_run:
            click.echo(json.dumps(memory.estimate(dataset).model_dump(mode="json")))
            return
        run = cognify_drawn(memory, dataset)
    print_run(run)
    if run.status.value != "completed":
        sys.exit(1)


@main.command("search")
@click.argument("query")
@click.option(
    "--type",
    "search_type",
    type=click.Choice([t.value for t in SearchType], case_sensitive=False),
    default=SearchType.AUTO.value,
    show_default=True,
    help="AUTO: the search each dataset's contents call for (messages, documents or both).",
)
@click.option(
    "--dataset", "datasets", multiple=True, type=DATASET_NAME, help="Dataset(s) to search (repeatable)."
)
@click.option("--top-k", default=10, show_default=True, type=click.IntRange(1, 1000))
@click.option("--only-context", is_flag=True, help="Stop after retrieval; no LLM call.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--remote", is_flag=True, help="Run on a query worker (kenning.search) instead of here.")
@click.option("--as-of", "as_of", default=None, help=AS_OF_HELP)
@click.option(
    "--session",
    "session_id",
    default=None,
    help="A session: its history goes to a completion, the answer is kept in it, the spend is its.",
)
def search_command(
    query: str,
    search_type: str,
    datasets: tuple[str, ...],
    top_k: int,
    only_context: bool,
    as_json: bool,
    remote: bool,
    as_of: str | None,
    session_id: str | None,
) -> None:
    """Search a dataset's memory (its facts: those that hold now, or --as-of a moment)."""
    for given, option in ((as_of, "--as-of"), (session_id, "--session")):
        if remote and given is not None:
            raise click.UsageError(f"{option} searches here: leave out --remote")
    with open_memory() as memory:
        if remote:
            with needs_extra("search --remote"):
                from kenning.workers.celery.canvas import search_remote

            result = search_remote(
                memory.settings, query, search_type.upper(), list(datasets), top_k, only_context
            )
        else:
            result = memory.search(
                query,
                search_type.upper(),
                datasets=list(datasets) or None,
                top_k=top_k,
                only_context=only_context,
                session_id=session_id,
                as_of=as_of,
            )
    if as_json:
        click.echo(json.dumps(result.model_dump(mode="json"), ensure_ascii=False))
    else:
        print_search(result)


def print_search(result: SearchResult) -> None:
    for number, hit in enumerate(result.results, 1):
        click.echo(f"{number:>2}. [{hit.score:.3f}] {printable(hit.text[:300])}")
    if result.type is SearchType.AUTO and result.searched:
        click.echo(f"searched with {', '.join(result.searched)}")
    if result.answer is not None:
        click.echo(f"\nanswer: {printable(result.answer)}")
    elif result.notice:
        console.print(f"[yellow]{safe(result.notice)}[/yellow]")


@main.command("recall")
@click.argument("query")
@click.option("--dataset", "datasets", multiple=True, type=DATASET_NAME)
@click.option("--session", "session_id", default=None)
@click.option(
    "--type",
    "search_type",
    type=click.Choice([t.value for t in SearchType], case_sensitive=False),
    default=SearchType.AUTO.value,
    show_default=True,
    help="AUTO: the search each dataset's contents call for (messages, documents or both).",
)
@click.option("--top-k", default=10, show_default=True, type=click.IntRange(1, 1000))
@click.option("--json", "as_json", is_flag=True)
@click.option("--as-of", "as_of", default=None, help=AS_OF_HELP)
def recall_command(
    query: str,
    datasets: tuple[str, ...],
    session_id: str | None,
    search_type: str,
    top_k: int,
    as_json: bool,
    as_of: str | None,
) -> None:
    """The best of the session's entries and of the memory, best first (scores in [0, 1], higher is
    better); each result says where it came from."""
    with open_memory() as memory:
        recalled = memory.recall(
            query, list(datasets) or None, session_id, search_type.upper(), top_k, as_of=as_of
        )
    if as_json:
        click.echo(recalled.model_dump_json())
        return
    for number, hit in enumerate(recalled.results, 1):
        cited = hit.entry_id or hit.chunk_id or hit.data_id or ""
        click.echo(printable(f"{number:>2}. [{hit.score:.3f}] ({hit.source} {cited[:8]}) {hit.text[:300]}"))
        if hit.held:
            holding = "; ".join(hit.instead) or "nothing known"
            click.echo(printable(f"    held {hit.held}; {'then' if as_of else 'now'}: {holding}"))
    if recalled.searched:
        click.echo(f"searched with {', '.join(recalled.searched)}")
    if recalled.notice:
        console.print(f"[yellow]{safe(recalled.notice)}[/yellow]")
    if not recalled.results:
        console.print("nothing recalled")


# What the erasure after a forget counts, by place (see kenning.workers.application.erasure).
ERASED = {
    "blobs": "unreferenced blobs removed",
    "vector_collections": "vector collections rewritten",
    "sqlite_wal": "SQLite write-ahead logs emptied",
    "graph_telemetry": "graph query logs dropped",
}


@main.command("forget")
@click.option(
    "--dataset", default=None, type=DATASET_NAME, help="The dataset (all of it, unless --data-id is given)."
)
@click.option("--data-id", "data_ids", multiple=True, help="Only these data items (repeatable).")
@click.option("--everything", is_flag=True, help="Every dataset of the tenant.")
@click.option("--memory-only", is_flag=True, help="Keep the stored bytes; forget only the memory.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def forget_command(
    dataset: str | None, data_ids: tuple[str, ...], everything: bool, memory_only: bool, yes: bool
) -> None:
    """Forget data items, a dataset or everything: from every store, keeping shared facts."""
    if not (dataset or data_ids or everything):
        raise click.UsageError("say what to forget: --dataset NAME, --data-id ID or --everything")
    target = dataset or "the default dataset"
    what = "everything" if everything else f"{len(data_ids) or 'all'} item(s) of {target}"
    if not yes:
        click.confirm(printable(f"forget {what}?"), abort=True)
    with open_memory() as memory:
        if data_ids:
            require_items(memory, dataset, data_ids)
        done = memory.forget(dataset, list(data_ids) or None, everything=everything, memory_only=memory_only)
    if not done:
        raise InputError("nothing to forget: the tenant has no dataset")
    items = sum(len(f.items) for f in done)
    nodes, edges = sum(f.nodes for f in done), sum(f.edges for f in done)
    console.print(f"forgot {items} items: {nodes} nodes, {edges} edges")
    erased: Counter[str] = Counter()
    for forgotten in done:
        erased.update(forgotten.erased)
    if erased:
        wiped = ", ".join(f"{ERASED.get(place, place)} {count}" for place, count in sorted(erased.items()))
        console.print(f"erased from disk and servers: {wiped}")


def require_items(memory: Kenning, dataset: str | None, data_ids: Sequence[str]) -> None:
    """InputError naming the first id that is no item of the dataset (or one the caller may not
    see: the same answer), before anything is forgotten."""
    target = deletable_dataset(memory.context, dataset)
    found = {item.id for item in memory.wiring.metadata.get_items(data_ids) if item.dataset_id == target.id}
    for data_id in data_ids:
        if data_id not in found:
            raise InputError(f"no item {data_id!r} in dataset {target.name!r}")


@main.command("prune")
@click.option("--dataset", default=None, type=DATASET_NAME)
@click.option("--older-than-days", type=click.FloatRange(0), default=None, help="Not used nor added since.")
@click.option("--below", type=click.FloatRange(0, 1), default=None, help="Decay factor under this.")
@click.option("--yes", is_flag=True)
def prune_command(dataset: str | None, older_than_days: float | None, below: float | None, yes: bool) -> None:
    """Forget what faded: items unused for a while, or whose decay factor fell below a floor."""
    if older_than_days is None and below is None:
        raise click.UsageError("say what to prune: --older-than-days DAYS, --below FACTOR or both")
    if not yes:
        click.confirm("forget every item that matches?", abort=True)
    with open_memory() as memory:
        done = memory.prune(dataset, older_than_days, below)
        name = memory.dataset(dataset).name if not done.items else ""
    if not done.items:
        raise InputError(f"nothing to prune: no item of dataset {name!r} matched")
    console.print(f"pruned {len(done.items)} items: {done.nodes} nodes, {done.edges} edges")


@main.command("improve")
@click.option("--dataset", default=None, type=DATASET_NAME)
def improve_command(dataset: str | None) -> None:
    """Remember rated session answers, apply feedback weights, merge duplicate entities."""
    with open_memory() as memory:
        done = memory.improve(dataset)
    click.echo(done.model_dump_json())


@main.command("status")
@click.option("--dataset", default=None, type=DATASET_NAME)
@click.option("--json", "as_json", is_flag=True)
@click.option("--watch", is_flag=True, help="Draw the started runs live until none is left, then print.")
@click.option("--timeout", "timeout_s", default=3600.0, show_default=True, type=click.FloatRange(0))
def status_command(dataset: str | None, as_json: bool, watch: bool, timeout_s: float) -> None:
    """Datasets, their items, recent runs, graph size, LLM calls, tokens and cost."""
    with open_memory() as memory:
        if watch:
            watch_started(memory, dataset, timeout_s)
        status = memory.status(dataset)
        total = memory.spend_total(dataset)
        mark_stalled(memory, status)
        llm = llm_breaker(memory)
        load = load_placement(memory)
        home = str(memory.settings.home.resolve())
    if as_json:
        click.echo(
            json.dumps(
                {"home": home, "llm": llm, "load": load, "datasets": status, "total": total},
                ensure_ascii=False,
            )
        )
        return
    print_deployment(home, llm, load)
    table = Table("dataset", "items", "graph", "last run", "llm calls", "tokens", "cost")
    for entry in status:
        items = ", ".join(f"{k} {v}" for k, v in sorted(entry["items"].items())) or "-"
        last = entry["runs"][0] if entry["runs"] else None
        run = f"{last['status']} ({last['step']})" if last else "-"
        if last and last["stalled"]:
            run = f"stalled: {run}"
        tokens = entry["tokens"]
        table.add_row(
            safe(entry["dataset"]),
            safe(items),
            f"{entry['graph']['nodes']} nodes, {entry['graph']['edges']} edges",
            safe(run),
            str(entry["llm_calls"]),
            f"{tokens['prompt']} in, {tokens['completion']} out",
            f"{entry['cost']:.4f}",
        )
    if len(status) > 1:  # a search of several datasets is in each one's row, and once here
        tokens = total["tokens"]
        spent = (str(total["llm_calls"]), f"{tokens['prompt']} in, {tokens['completion']} out")
        table.add_section()
        table.add_row("total", "", "", "", *spent, f"{total['cost']:.4f}")
    Console().print(table)
    for entry in status:
        for stalled in (run for run in entry["runs"] if run["stalled"]):
            line = printable(f" {entry['dataset']} run {stalled['id']}: {stalled['stalled']}")
            console.print(Text.assemble(("stalled", "yellow"), line), soft_wrap=True)
        for name, error in entry["errors"].items():
            console.print(f"[red]failed[/red] {safe(entry['dataset'])}/{safe(name)}: {safe(error)}")
        for chunk in entry["failed_chunks"]:
            where = f"{entry['dataset']}/{chunk['item']} chunk {chunk['index']}"
            console.print(f"[red]failed[/red] {safe(where)}: {safe(chunk['error'])}")
        print_checks(entry)


def print_deployment(home: str, llm: dict[str, Any] | None, load: dict[str, str] | None) -> None:
    """Status's first lines: the home, where load workers may run, the LLM's breaker."""
    click.echo(printable(f"home: {home}"))
    if load is not None:
        click.echo(printable(f"load workers: {load['load_workers']} (vectors: {load['vectors']})"))
    if llm is not None:
        click.echo(printable(breaker_line(llm)))


def breaker_line(llm: dict[str, Any]) -> str:
    line = f"llm: {llm['model']} at {llm['endpoint']}, structured output {llm['structured_output']}"
    line += f", circuit breaker {llm['breaker']}"
    if llm["breaker"] != "closed":
        line += f" since {llm['since']}: {llm['reason']}"
    return line


def print_checks(entry: dict[str, Any]) -> None:
    """A line saying what the dataset's last run repaired or dropped, if anything."""
    checked = checks_line(entry["runs"][0]) if entry["runs"] else ""
    if checked:
        console.print(f"[yellow]checked[/yellow] {safe(entry['dataset'])} last run: {checked}")


def checks_line(run: dict[str, Any]) -> str:
    """What the run repaired or dropped of the model's replies, in words; "" when nothing."""
    counted = [(name, run["stats"].get(name, 0)) for name in CHECK_COUNTERS]
    return ", ".join(f"{count} {name.replace('_', ' ')}" for name, count in counted if count)


def watch_started(memory: Kenning, dataset: str | None, timeout_s: float) -> None:
    """Draw the started runs until none is left; one that nothing works on is drawn as stalled."""
    with needs_extra("status --watch"):
        from kenning.workers.celery.canvas import watch

    detector = StallDetector(memory.settings)

    def stalled(runs: list[tuple[Job, PipelineRun]]) -> dict[str, str]:
        return detector.reasons([(memory.dataset(job.dataset), run) for job, run in runs])

    def started() -> list[Job]:
        return memory.started_jobs(dataset)

    watch(memory.wiring, started, console, timeout_s, WATCH_POLL_S, stalled=stalled)


@main.command("demo")
@click.option("--home", default=None, help="Where to keep the demo's data (default: KENNING_HOME).")
def demo_command(home: str | None) -> None:
    """Ingest the bundled sample corpus and answer a few questions, offline."""
    with open_memory(makes_home=True, **({"home": Path(home)} if home else {})) as memory:
        added = memory.add_paths([str(SAMPLES)], "demo")
        console.print(f"added {len(added.added)} sample documents ({len(added.unchanged)} already there)")
        with progress_bars() as advance:
            print_run(memory.cognify("demo", progress=advance))
        for question in DEMO_QUESTIONS:
            result = memory.search(question, SearchType.GRAPH_COMPLETION, datasets=["demo"], top_k=5)
            click.echo(f"\nQ: {question}")
            for hit in result.results[:5]:
                click.echo(f"   - {hit.text[:200]}")
            click.echo(
                f"A: {result.answer}" if result.answer else "A: (no LLM configured: context shown above)"
            )


@main.command("samples")
@click.argument("folder", default="samples", type=click.Path(file_okay=False, path_type=Path))
def samples_command(folder: Path) -> None:
    """Copy the bundled sample corpus (a lighthouse's history, in Markdown) into FOLDER, to add."""
    folder.mkdir(parents=True, exist_ok=True)
    samples = sorted(SAMPLES.glob("*.md"))
    for sample in samples:
        shutil.copyfile(sample, folder / sample.name)
    click.echo(f"copied {len(samples)} sample documents into {folder}")


@main.command("worker")
@click.option("--queues", default=None, help="Comma-separated queues (default: all kenning queues).")
@click.option(
    "--concurrency",
    default=None,
    type=click.IntRange(min=1),
    help="Tasks at once. Default: with the extract queue, enough batches to fill the LLM calls "
    "KENNING_CONCURRENCY allows in flight (threads); else 2.",
)
@click.option("--loglevel", default="INFO", show_default=True)
def worker_command(queues: str | None, concurrency: int | None, loglevel: str) -> None:
    """Start a Celery worker for the pipeline tasks."""
    with needs_extra("kenning worker"):
        from kenning.workers.celery.app import run_worker

    run_worker(queues, concurrency, loglevel)


for command in ACCESS_COMMANDS:
    main.add_command(command)
for command in AGENT_COMMANDS:
    main.add_command(command)
for command in RUNS_COMMANDS:
    main.add_command(command)
for command in SESSION_COMMANDS:
    main.add_command(command)
for command in (*REMEMBER_COMMANDS, *RECORD_COMMANDS, *HISTORY_COMMANDS):
    main.add_command(command)


def run() -> None:
    """The console script: exit status 0 only when the command did what it was asked, and every
    error one line on stderr (`error: ...`), never a traceback."""
    try:
        code = main(standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as error:  # `kenning` alone, or a group alone
        error.show()
        sys.exit(error.exit_code)
    except click.UsageError as error:
        where = f" (see '{error.ctx.command_path} --help')" if error.ctx else ""
        fail(f"{error.format_message()}{where}", error.exit_code)
    except click.ClickException as error:
        fail(error.format_message(), error.exit_code)
    except click.Abort as error:  # a confirmation answered no, or Ctrl-C
        if isinstance(error.__cause__, KeyboardInterrupt):
            interrupted(error.__cause__)
        fail("stopped", 1)
    except KenningError as error:
        fail(str(error), 2)
    except Exception as error:  # a fault of kenning's own: still one line, never a traceback
        fail(f"unexpected {type(error).__name__}: {error}", 1)
    sys.exit(code if isinstance(code, int) else 0)


def interrupted(error: KeyboardInterrupt) -> NoReturn:
    """Ctrl-C: one line (what it stopped, when that was a run: recorded as interrupted), then exit
    130 at once. The work it abandoned (LLM requests in flight) is not waited for: the threads that
    still wait for it would hold the process's exit until their calls end."""
    said = f"interrupted: {error}" if isinstance(error, Interrupted) else "interrupted (Ctrl-C)"
    line = printable(" ".join(said.split()))
    console.print(Text.assemble(("error:", "red"), " ", line), soft_wrap=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(130)


def fail(message: str, code: int) -> NoReturn:
    # One line, never wrapped, the message taken literally (it may hold brackets).
    line = printable(" ".join(message.split()))
    console.print(Text.assemble(("error:", "red"), " ", line), soft_wrap=True)
    sys.exit(code)
