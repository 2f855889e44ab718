"""`kenning session list | show | end | feedback`: the caller's agent sessions, each with its state
(running, idle, abandoned, ended), the LLM requests, tokens and cost of its operations, and its
errors; a session's entries; its end; the rating of one of its entries."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from kenning.pipeline.errors import InputError, KenningError
from kenning.pipeline.session import SessionEntry
from kenning.workers.application import sessions
from kenning.workers.application.sessions import SessionSummary
from kenning.workers.cli.show import printable, safe
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings

TIME = "%Y-%m-%d %H:%M:%S"


def open_memory() -> Kenning:
    return Kenning(load_settings())


@click.group("session")
def session_group() -> None:
    """Your agent sessions: list them, show one (its usage and entries), end one, rate an entry."""


@session_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def list_command(as_json: bool) -> None:
    """Your sessions, the most recently used first, with their state and spend."""
    with open_memory() as memory:
        found = sessions.summaries(memory.context)
    if as_json:
        click.echo(json.dumps({"sessions": [s.model_dump(mode="json") for s in found]}, ensure_ascii=False))
        return
    if not found:
        click.echo("no sessions")
        return
    table = Table("session", "state", "last used", "LLM calls", "tokens in", "tokens out", "cost", "errors")
    for s in found:
        used = s.last_activity_at.strftime(TIME)
        row = (s.llm_calls, s.tokens_in, s.tokens_out)
        table.add_row(safe(s.session_id), s.state, used, *map(str, row), f"{s.cost:g}", str(s.errors))
    Console().print(table)


@session_group.command("show")
@click.argument("session_id")
@click.option("--last", "last_n", default=None, type=click.IntRange(1), help="Only the newest N entries.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def show_command(session_id: str, last_n: int | None, as_json: bool) -> None:
    """A session: its state, usage per model and errors, then its entries, oldest first."""
    with open_memory() as memory:
        found = sessions.summary(memory.context, session_id)
        entries = _entries(memory, session_id, last_n)
    if as_json:
        shown = {
            "session": found.model_dump(mode="json"),
            "entries": [e.model_dump(mode="json") for e in entries],
        }
        click.echo(json.dumps(shown, ensure_ascii=False))
        return
    _print_summary(found)
    for entry in entries:
        click.echo(_entry_line(entry))


def _entries(memory: Kenning, session_id: str, last_n: int | None) -> list[SessionEntry]:
    try:
        return memory.get_session(session_id, last_n)
    except KenningError as error:  # the record is there; its entries are not (session memory off)
        click.echo(f"entries unavailable: {printable(error)}", err=True)
        return []


def _print_summary(s: SessionSummary) -> None:
    click.echo(f"session {printable(s.session_id)}: {s.state}")
    ended = f", ended {s.ended_at.strftime(TIME)}" if s.ended_at else ""
    click.echo(
        f"  started {s.started_at.strftime(TIME)}, last used {s.last_activity_at.strftime(TIME)}{ended}"
    )
    click.echo(f"  LLM calls {s.llm_calls}, tokens in {s.tokens_in}, out {s.tokens_out}, cost {s.cost:g}")
    for model, usage in s.models.items():
        spent = (
            f"{usage.calls} calls, tokens in {usage.tokens_in}, out {usage.tokens_out}, cost {usage.cost:g}"
        )
        click.echo(f"    {printable(model)}: {spent}")
    click.echo(f"  errors {s.errors}" + (f", last: {printable(s.last_error)}" if s.last_error else ""))


def _entry_line(entry: SessionEntry) -> str:
    when = entry.time.strftime(TIME)
    if entry.kind == "message":
        return printable(f"{when} {entry.id} {entry.speaker or 'user'}: {entry.question}")
    answer = f" -> {entry.answer}" if entry.answer else ""
    return printable(f"{when} {entry.id} Q: {entry.question}{answer}")


@session_group.command("end")
@click.argument("session_id")
def end_command(session_id: str) -> None:
    """Mark a session ended (a later operation with it starts it again)."""
    with open_memory() as memory:
        sessions.end(memory.context, session_id)
    click.echo(f"ended session {printable(session_id)}")


@session_group.command("feedback")
@click.argument("session_id")
@click.argument("entry_id")
@click.option("--score", type=click.IntRange(1, 5), default=None, help="1 (useless) to 5 (exactly right).")
@click.option("--text", default="")
@click.option("--delete", is_flag=True, help="Remove the entry's feedback instead.")
def feedback_command(session_id: str, entry_id: str, score: int | None, text: str, delete: bool) -> None:
    """Rate an entry of a session 1-5 (`improve` turns ratings into weights), or remove its rating."""
    if delete:
        with open_memory() as memory:
            found = memory.delete_feedback(session_id, entry_id)
    elif score is None:
        raise click.UsageError("give --score 1-5, or --delete")
    else:
        with open_memory() as memory:
            found = memory.add_feedback(session_id, entry_id, score, text)
    if not found:
        raise InputError(f"session {session_id!r} has no entry {entry_id!r}")
    click.echo("ok")


COMMANDS = (session_group,)
