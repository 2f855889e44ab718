"""The `kenning` command line."""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from kenning import __version__
from kenning.pipeline.checks import CHECK_COUNTERS
from kenning.pipeline.context import Job
from kenning.pipeline.errors import InputError, KenningError, StoreError
from kenning.pipeline.models import PipelineRun
from kenning.pipeline.spend import SpendLedger, current_charge
from kenning.retrieval.contract import SearchResult, SearchType
from kenning.workers.application.lifecycle import Message, Remembered
from kenning.workers.cli.access import COMMANDS as ACCESS_COMMANDS
from kenning.workers.cli.agent import COMMANDS as AGENT_COMMANDS
from kenning.workers.cli.runs import COMMANDS as RUNS_COMMANDS
from kenning.workers.cli.sessions import COMMANDS as SESSION_COMMANDS
from kenning.workers.cli.show import DATASET_NAME, printable, safe
from kenning.workers.control.runs import StallDetector, llm_breaker, load_placement, mark_stalled
from kenning.workers.memory import Kenning
from kenning.workers.runtime.extras import needs_extra
from kenning.workers.runtime.settings import load_settings

console = Console(stderr=True)
SAMPLES = Path(__file__).parent.parent / "samples"
WATCH_POLL_S = 1.0
DEMO_QUESTIONS = (
    "Who founded the Harrow Point lighthouse keepers' guild?",
    "Which ship ran aground near Harrow Point, and what happened to its cargo?",
    "How did the lighthouse lamp change over the years?",
)


def open_memory(**overrides: Any) -> Kenning:
    return Kenning(load_settings(**overrides))


@contextmanager
def progress_bars(
    ledger: SpendLedger | None = None, output: Console | None = None
) -> Iterator[Callable[[str, int, int], None]]:
    """A progress callback drawing one bar per pipeline step; with a `ledger`, one more for the
    run's LLM requests (`LLMBar`), its failed ones (retried unless their call gave up) named."""
    columns = (TextColumn("{task.description:>9}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=output or console, transient=False) as bars:
        tasks: dict[str, Any] = {}
        llm = LLMBar(bars, ledger)

        def advance(step: str, done: int, total: int) -> None:
            if step not in tasks:
                tasks[step] = bars.add_task(step, total=max(total, 1))
            bars.update(tasks[step], completed=done if total else 1, total=max(total, 1))
            llm.update()

        yield advance
        llm.finish()


class LLMBar:
    """The LLM requests of the run a step reports for (its charge), from the spend ledger: those
    not failed of those sent, and how many failed. Read at most every `every_s`; a ledger that
    is away is skipped."""

    def __init__(self, bars: Progress, ledger: SpendLedger | None, every_s: float = 0.5) -> None:
        self._bars, self._ledger, self._every_s = bars, ledger, every_s
        self._task: TaskID | None = None
        self._run_id = ""
        self._next = 0.0
        self._lock = threading.Lock()

    def update(self) -> None:
        charge = current_charge()
        with self._lock:
            if charge is None or time.monotonic() < self._next:
                return
            self._next = time.monotonic() + self._every_s
            self._run_id = charge.run_id
            self._draw()

    def finish(self) -> None:
        """Draw the run's last figures, however recently it was read."""
        with self._lock:
            self._draw()

    def _draw(self) -> None:
        if self._ledger is None or not self._run_id:
            return
        try:
            spent = self._ledger.totals([self._run_id]).get(self._run_id)
        except StoreError:
            return
        if spent is None:
            return
        if self._task is None:
            self._task = self._bars.add_task("LLM", total=None)
        self._bars.update(
            self._task, description=safe(spent.label), completed=spent.answered, total=spent.calls
        )


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
    with open_memory() as memory:
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
    with open_memory(**overrides, **({"mode": "distributed"} if distributed else {})) as memory:
        if dry_run:
            click.echo(json.dumps(memory.estimate(dataset).model_dump(mode="json")))
            return
        if memory.wiring.distributed:  # the workers' progress is drawn as the run is followed
            run = memory.cognify(dataset, console=console)
        else:
            with progress_bars(memory.wiring.spend) as advance:
                run = memory.cognify(dataset, progress=advance)
    print_run(run)
    if run.status.value != "completed":
        sys.exit(1)


def print_run(run: PipelineRun) -> None:
    figures = ", ".join(f"{name} {value}" for name, value in sorted(run.stats.items()))
    console.print(f"run {run.id[:8]} {run.status.value}: {safe(figures)}")
    if run.error:
        console.print(f"[red]{safe(run.error)}[/red]")


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
def search_command(
    query: str,
    search_type: str,
    datasets: tuple[str, ...],
    top_k: int,
    only_context: bool,
    as_json: bool,
    remote: bool,
) -> None:
    """Search a dataset's memory."""
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


@main.command("remember")
@click.argument("paths", nargs=-1, required=True)
@click.option("--dataset", default=None, type=DATASET_NAME)
@click.option("--session", "session_id", default=None, help="Into this session now, the graph later.")
@click.option("--json", "as_json", is_flag=True)
def remember_command(
    paths: tuple[str, ...], dataset: str | None, session_id: str | None, as_json: bool
) -> None:
    """Make files (or - for stdin) memory: add and cognify, or write to a session first."""
    with open_memory() as memory:
        if session_id is None:
            added = memory.add_paths(list(paths), dataset)
            run = memory.cognify(dataset)
            ids = [item.id for item in added.added + added.unchanged]
            done = Remembered(item_ids=ids, run_id=run.id, status=run.status.value)
        else:
            limit = memory.settings.max_document_bytes
            texts = [sys.stdin.read(limit) if path == "-" else read_text(path, limit) for path in paths]
            done = memory.remember([Message(text=text) for text in texts], dataset, session_id)
    click.echo(done.model_dump_json() if as_json else f"remembered {len(done.item_ids)} items: {done.status}")
    if done.status not in ("completed", "queued"):
        sys.exit(1)


def read_text(path: str, limit: int) -> str:
    """A regular file's text, at most `limit` bytes: never a device or a pipe, which may not end."""
    file = Path(path)
    if not file.is_file():
        raise InputError(f"{path}: not a regular file")
    if file.stat().st_size > limit:
        raise InputError(f"{path}: {file.stat().st_size} bytes is over the limit of {limit} bytes")
    return file.read_text(errors="replace")


@main.command("recall")
@click.argument("query")
@click.option("--dataset", "datasets", multiple=True, type=DATASET_NAME)
@click.option("--session", "session_id", default=None)
@click.option(
    "--type",
    "search_type",
    default=SearchType.AUTO.value,
    show_default=True,
    help="AUTO: the search each dataset's contents call for (messages, documents or both).",
)
@click.option("--top-k", default=10, show_default=True, type=click.IntRange(1, 1000))
@click.option("--json", "as_json", is_flag=True)
def recall_command(
    query: str, datasets: tuple[str, ...], session_id: str | None, search_type: str, top_k: int, as_json: bool
) -> None:
    """The best of the session's entries and of the memory, best first (scores in [0, 1], higher is
    better); each result says where it came from."""
    with open_memory() as memory:
        recalled = memory.recall(query, list(datasets) or None, session_id, search_type.upper(), top_k)
    if as_json:
        click.echo(recalled.model_dump_json())
        return
    for number, hit in enumerate(recalled.results, 1):
        cited = hit.entry_id or hit.chunk_id or hit.data_id or ""
        click.echo(printable(f"{number:>2}. [{hit.score:.3f}] ({hit.source} {cited[:8]}) {hit.text[:300]}"))
    if recalled.searched:
        click.echo(f"searched with {', '.join(recalled.searched)}")


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
        done = memory.forget(dataset, list(data_ids) or None, everything=everything, memory_only=memory_only)
    items = sum(len(f.items) for f in done)
    nodes, edges = sum(f.nodes for f in done), sum(f.edges for f in done)
    console.print(f"forgot {items} items: {nodes} nodes, {edges} edges")
    erased: Counter[str] = Counter()
    for forgotten in done:
        erased.update(forgotten.erased)
    if erased:
        wiped = ", ".join(f"{ERASED.get(place, place)} {count}" for place, count in sorted(erased.items()))
        console.print(f"erased from disk and servers: {wiped}")


@main.command("prune")
@click.option("--dataset", default=None, type=DATASET_NAME)
@click.option("--older-than-days", type=click.FloatRange(0), default=None, help="Not used nor added since.")
@click.option("--below", type=click.FloatRange(0, 1), default=None, help="Decay factor under this.")
@click.option("--yes", is_flag=True)
def prune_command(dataset: str | None, older_than_days: float | None, below: float | None, yes: bool) -> None:
    """Forget what faded: items unused for a while, or whose decay factor fell below a floor."""
    if not yes:
        click.confirm("forget every item that matches?", abort=True)
    with open_memory() as memory:
        done = memory.prune(dataset, older_than_days, below)
    console.print(f"pruned {len(done.items)} items: {done.nodes} nodes, {done.edges} edges")


@main.command("improve")
@click.option("--dataset", default=None, type=DATASET_NAME)
def improve_command(dataset: str | None) -> None:
    """Remember rated session answers, apply feedback weights, merge duplicate entities."""
    with open_memory() as memory:
        done = memory.improve(dataset)
    click.echo(done.model_dump_json())


@main.group("memory")
def memory_group() -> None:
    """Memory records: each added item, with the nodes and edges it produced."""


@memory_group.command("list")
@click.option("--dataset", default=None, type=DATASET_NAME)
@click.option("--offset", default=0, show_default=True, type=click.IntRange(0))
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 1000))
def memory_list(dataset: str | None, offset: int, limit: int) -> None:
    with open_memory() as memory:
        click.echo(memory.records.list(dataset, offset, limit).model_dump_json())


@memory_group.command("get")
@click.argument("record_id")
@click.option("--dataset", default=None, type=DATASET_NAME)
def memory_get(record_id: str, dataset: str | None) -> None:
    with open_memory() as memory:
        click.echo(memory.records.get(record_id, dataset).model_dump_json())


@memory_group.command("update")
@click.argument("record_id")
@click.argument("path")
@click.option("--dataset", default=None, type=DATASET_NAME)
def memory_update(record_id: str, path: str, dataset: str | None) -> None:
    """Replace a record's text with PATH's (or - for stdin), cognify, and forget what is stale."""
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    with open_memory() as memory:
        click.echo(memory.records.update(record_id, text, dataset).model_dump_json())


@memory_group.command("delete")
@click.argument("record_id")
@click.option("--dataset", default=None, type=DATASET_NAME)
def memory_delete(record_id: str, dataset: str | None) -> None:
    with open_memory() as memory:
        memory.records.delete(record_id, dataset)
    click.echo("deleted")


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
        mark_stalled(memory, status)
        llm = llm_breaker(memory)
        load = load_placement(memory)
        home = str(memory.settings.home.resolve())
    if as_json:
        click.echo(
            json.dumps({"home": home, "llm": llm, "load": load, "datasets": status}, ensure_ascii=False)
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
    with open_memory(**({"home": Path(home)} if home else {})) as memory:
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


def run() -> None:
    try:
        main(standalone_mode=True)
    except KenningError as error:
        # One line, never wrapped, the message taken literally (it may hold brackets).
        line = printable(" ".join(str(error).split()))
        console.print(Text.assemble(("error:", "red"), " ", line), soft_wrap=True)
        sys.exit(2)
