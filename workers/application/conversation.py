"""Remembered messages as data items, and as the turns of one conversation for CONVERSATION recall."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, StrictStr, TypeAdapter, ValidationError

from kenning.pipeline.errors import InputError
from kenning.pipeline.ingest import Source, text_source
from kenning.pipeline.models import ChunkRecord, DataItem, Dataset
from kenning.retrieval.conversation import TURNS, Turn, context_text, turn_points
from kenning.workers.application.context import Context
from kenning.workers.application.ingest import add_sources
from kenning.workers.application.lifecycle import Message, find_dataset


def add_messages(context: Context, messages: Sequence[Message], dataset: str | None) -> list[DataItem]:
    """Each message as a data item of the dataset (added, or unchanged when already there)."""
    added = add_sources(context, [message_source(m, n) for n, m in enumerate(messages)], dataset)
    return added.added + added.unchanged


def message_item_ids(context: Context, messages: Sequence[Message], dataset: str | None) -> list[str]:
    """The id of the data item each message becomes once added (ids follow from the dataset and
    the bytes alone), so what cites a message can be found by its item before it exists."""
    target = Dataset.of(context.scope(dataset))
    sources = [message_source(m, n) for n, m in enumerate(messages)]
    return [DataItem.of(target, s.name, s.uri, s.data, s.mime).id for s in sources]


def index_turns(
    context: Context, messages: Sequence[Message], items: Sequence[DataItem], dataset: str | None
) -> int:
    """Index the messages, in order, as the turns of one conversation for CONVERSATION recall:
    each read after the turn before it and linked to its neighbours. Messages whose item has
    no chunk (failed, or empty) are left out. Returns the turns indexed."""
    by_source = {item.source: item for item in items}
    found = [(m, by_source.get(message_source(m, n).uri)) for n, m in enumerate(messages)]
    wanted = [(m, item) for m, item in found if item is not None]
    wiring = context.wiring
    target = find_dataset(wiring.metadata, context.caller.tenant, dataset or context.settings.dataset)
    first_chunks: dict[str, ChunkRecord] = {}
    for chunk in wiring.chunks.chunks_of(target.id, [item.id for _, item in wanted]):
        known = first_chunks.get(chunk.data_id)
        if known is None or chunk.index < known.index:
            first_chunks[chunk.data_id] = chunk
    turns: list[Turn] = []
    before: Message | None = None
    for m, item in wanted:
        first = first_chunks.get(item.id)
        if first is not None:
            turns.append(turn_of(m, before, item.id, first))
            before = m
    if not turns:
        return 0
    embedded = wiring.embedder.embed([context_text(turn.context, turn.text) for turn in turns])
    wiring.vectors.ensure_collection(TURNS, wiring.embedder.dimension)
    wiring.vectors.upsert(target.scope, TURNS, turn_points(turns, embedded))
    return len(turns)


def turn_of(message: Message, before: Message | None, data_id: str, chunk: ChunkRecord) -> Turn:
    """A remembered message as a turn of its conversation, read after the message before it."""
    return Turn(
        data_id=data_id,
        chunk_id=chunk.id,
        document_id=chunk.document_id,
        text=message.as_text(),
        context=spoken(before) if before else "",
        spoken=spoken(message),
        speaker=message.speaker,
        said_at=message.time.isoformat() if message.time else "",
    )


def spoken(message: Message) -> str:
    """`speaker: text`, the words of a turn that gives the next one its context."""
    return f"{message.speaker}: {message.text}" if message.speaker else message.text


def message_source(message: Message, position: int) -> Source:
    """A message as a source: under its id when it has one (a new text under it replaces it)."""
    return text_source(message.as_text(), name=message.id or f"message {position}", external_id=message.id)


class MessageIn(BaseModel):
    """A message as a conversation's JSON holds it: a chat API's `role` and `content`, or kenning's
    `speaker` and `text`; `time` an ISO 8601 string. Strings stay strings (nothing is coerced)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    speaker: StrictStr = Field(default="", validation_alias=AliasChoices("speaker", "role"))
    text: StrictStr = Field(min_length=1, validation_alias=AliasChoices("text", "content"))
    time: StrictStr | None = None
    id: StrictStr = ""

    def message(self) -> Message:
        return Message(speaker=self.speaker, text=self.text, time=_when(self.time), id=self.id)


_CONVERSATION = TypeAdapter(list[MessageIn])


def messages_from_json(raw: str, name: str) -> list[Message]:
    """The messages of a conversation given as a JSON list (see `MessageIn`); InputError naming
    `name`, the message and the field at the first thing wrong."""
    try:
        found = _CONVERSATION.validate_python(json.loads(raw))
    except json.JSONDecodeError as error:
        raise InputError(f"{name}: not JSON: {error.msg} at line {error.lineno}") from None
    except ValidationError as error:
        raise InputError(f"{name}: {_first_problem(error)}") from None
    if not found:
        raise InputError(f"{name}: no messages (a JSON list of {{speaker, text, time}})")
    messages = []
    for number, message in enumerate(found, 1):
        try:
            messages.append(message.message())
        except ValueError as error:
            raise InputError(f"{name}: message {number}: {error}") from None
    return messages


def _first_problem(error: ValidationError) -> str:
    problem = error.errors()[0]
    where = list(problem["loc"])
    if not where:
        return "expected a JSON list of messages ({speaker, text, time})"
    at = f"message {int(where[0]) + 1}" if isinstance(where[0], int) else "the list"
    field = {"speaker": "speaker (or role)", "text": "text (or content)"}.get(str(where[-1]), str(where[-1]))
    if problem["type"] == "missing":
        return f"{at}: no {field}"
    if len(where) == 1:
        return f"{at}: expected an object with speaker, text and time"
    return f"{at}: {field}: {problem['msg']}"


def _when(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"time {value!r} is not an ISO 8601 date and time") from None
