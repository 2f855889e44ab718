"""`kenning remember`: files, stdin or a conversation made memory, with the same progress as
`cognify`, each item made printed by id and each one that failed with its reason."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from kenning.pipeline.errors import InputError
from kenning.pipeline.ingest import read_capped
from kenning.pipeline.loaders import decode_text
from kenning.pipeline.models import DataItem, ItemStatus
from kenning.workers.application.conversation import messages_from_json
from kenning.workers.application.lifecycle import Message, Remembered
from kenning.workers.cli import background
from kenning.workers.cli.home import settings_for
from kenning.workers.cli.progress import cognify_drawn, print_run, progress_bars
from kenning.workers.cli.show import DATASET_NAME, printable, safe
from kenning.workers.memory import Kenning

console = Console(stderr=True)


@click.command("remember")
@click.argument("paths", nargs=-1)
@click.option(
    "--messages",
    "conversation",
    default=None,
    metavar="FILE",
    help="A conversation: a JSON list of {speaker or role, text or content, time} from FILE, or - for stdin.",
)
@click.option("--dataset", default=None, type=DATASET_NAME)
@click.option(
    "--session",
    "session_id",
    default=None,
    help="Write into this session and return: the graph is built by a process left running "
    "(`kenning status` shows it).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def remember_command(
    paths: tuple[str, ...],
    conversation: str | None,
    dataset: str | None,
    session_id: str | None,
    as_json: bool,
) -> None:
    """Make files, - (stdin) or a conversation (--messages) memory: added and cognified now, or
    with --session written to the session at once. Prints the id of each item made; exits
    non-zero when any path or item failed."""
    if bool(paths) == bool(conversation):
        raise click.UsageError("give the PATHS to remember, or --messages FILE, not both")
    with Kenning(settings_for(makes_home=True)) as memory:
        limit = memory.settings.max_document_bytes
        if conversation is not None:
            messages: list[Message] | None = read_messages(conversation, limit)
        else:
            messages = [Message(text=read_text(p, limit)) for p in paths] if session_id else None
        if session_id is not None and messages is not None:
            done = memory.remember(messages, dataset, session_id, detached=True)
            background.start(messages, dataset, session_id)
            errors: dict[str, str] = {}
        elif messages is not None:
            with progress_bars(memory.wiring.spend) as advance:
                done = memory.remember(messages, dataset, progress=advance)
            errors = {}
        else:
            done, errors = remember_paths(memory, list(paths), dataset)
        items = memory.wiring.metadata.get_items(done.item_ids)
    report(done, items, errors, session_id, as_json)


def remember_paths(
    memory: Kenning, paths: list[str], dataset: str | None
) -> tuple[Remembered, dict[str, str]]:
    """Add the paths and cognify what was added; nothing read is an InputError naming each path."""
    added = memory.add_paths(paths, dataset)
    made = added.added + added.unchanged
    if not made:
        raise InputError(
            "; ".join(f"{path}: {why}" for path, why in added.errors.items()) or "nothing to remember"
        )
    run = cognify_drawn(memory, dataset)
    print_run(run)
    done = Remembered(item_ids=[item.id for item in made], run_id=run.id, status=run.status.value)
    return done, added.errors


def report(
    done: Remembered, items: list[DataItem], errors: dict[str, str], session_id: str | None, as_json: bool
) -> None:
    """The items made on stdout (id and name, one a line), what failed on stderr; exit 1 if any did."""
    failed = {item.id: item.error or "failed" for item in items if item.status == ItemStatus.FAILED}
    names = {item.id: item.name for item in items}
    if as_json:
        click.echo(json.dumps({**done.model_dump(mode="json"), "failed": failed, "errors": errors}))
    else:
        for path, why in errors.items():
            console.print(f"[red]error[/red] {safe(path)}: {safe(why)}")
        for item_id in done.item_ids:
            click.echo(printable(f"{item_id}\t{names.get(item_id, '')}"))
        for item_id, why in failed.items():
            console.print(f"[red]failed[/red] {safe(names[item_id])} ({item_id}): {safe(why)}")
        console.print(summary(done, failed, session_id))
    if errors or failed or done.status not in ("completed", "queued"):
        sys.exit(1)


def summary(done: Remembered, failed: dict[str, str], session_id: str | None) -> str:
    made = len(done.item_ids) - len(failed)
    if session_id is None:
        return f"remembered {made} of {len(done.item_ids)} items: run {done.run_id or '-'} {done.status}"
    return safe(
        f"remembered {len(done.item_ids)} items in session {session_id!r}; their graph is being built "
        "in the background (`kenning status` shows it)"
    )


def read_messages(path: str, limit: int) -> list[Message]:
    """The conversation in the JSON file (or stdin, `-`); InputError saying what is wrong where."""
    name = "stdin" if path == "-" else path
    return messages_from_json(decode_text(read_bytes(path, limit), limit), name)


def read_text(path: str, limit: int) -> str:
    """A file's (or stdin's) text, decoded as the pipeline decodes text (UTF-8, UTF-16/32 with a BOM,
    legacy cp1252); binary content, or bytes that are no text, an InputError naming the path."""
    try:
        return decode_text(read_bytes(path, limit), limit)
    except InputError as error:
        raise InputError(f"{'stdin' if path == '-' else path}: {error}") from None


def read_bytes(path: str, limit: int) -> bytes:
    """At most `limit` bytes of a regular file, or of stdin (`-`): never a device or a pipe, which
    may not end."""
    if path == "-":
        return read_capped(sys.stdin.buffer, "stdin", limit)
    file = Path(path)
    if not file.is_file():
        why = "no such file" if not file.exists() else "not a regular file"
        raise InputError(f"{path}: {why}")
    with file.open("rb") as stream:
        return read_capped(stream, path, limit)


COMMANDS: tuple[Any, ...] = (remember_command,)
