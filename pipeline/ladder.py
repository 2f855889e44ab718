"""Structured output that fits the server: a ladder of the ways to ask an endpoint for JSON.

Servers differ in the `response_format` they take: OpenAI and vLLM take a JSON schema,
llama.cpp-family servers take `json_object` with the schema beside it, and some take no
`response_format` at all. An extractor asks on the highest rung first; an endpoint that refuses a
rung by name (an error answer whose text names `response_format` or the schema) sends it one rung
down at once. The first rung that works is remembered per endpoint and model in `OutputRungs`
(the metadata database: every process of a deployment reads it), unless a setting forces one.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol

from pydantic import BaseModel


class Rung(StrEnum):
    """How structured output is asked for, best first."""

    JSON_SCHEMA = "json_schema"
    JSON_OBJECT = "json_object"
    PROMPT = "prompt"


LADDER = (Rung.JSON_SCHEMA, Rung.JSON_OBJECT, Rung.PROMPT)
AUTO = "auto"
STRUCTURED_CHOICES = (AUTO, *(rung.value for rung in LADDER))

# What an error answer says when the server does not take a response format: it names it.
_CAPABILITY = re.compile(r"response_format|json_schema|json_object|\bschema\b", re.IGNORECASE)
_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)


class RungRecord(BaseModel):
    """The rung an endpoint's model answered on, and when it was found."""

    endpoint: str
    model: str
    rung: Rung
    changed_at: datetime


class OutputRungs(Protocol):
    """Where the working rung of each (endpoint, model) is kept, for every process."""

    def rung(self, endpoint: str, model: str) -> RungRecord | None:
        """The rung remembered for the endpoint's model, or None when none is."""
        ...

    def remember_rung(self, endpoint: str, model: str, rung: Rung) -> None:
        """Remember `rung` as the one the endpoint's model answers on (replacing any)."""
        ...


def below(rung: Rung) -> Rung | None:
    """The next rung down, or None from the last one."""
    position = LADDER.index(rung)
    return LADDER[position + 1] if position + 1 < len(LADDER) else None


def names_the_format(error_text: str) -> bool:
    """Whether an error answer is about the response format or the schema: a capability answer."""
    return bool(_CAPABILITY.search(error_text))


def json_of_reply(content: str) -> dict[str, Any]:
    """The JSON object a model's reply holds, read tolerantly: inside a code fence, or from its
    first `{` to its last `}`, with text before and after ignored. ValueError when there is none."""
    fenced = _FENCE.search(content)
    text = fenced.group(1) if fenced else content
    start, end = text.find("{"), text.rfind("}")
    if start == -1 or end <= start:
        raise ValueError("the reply holds no JSON object")
    try:
        found = json.loads(text[start : end + 1])
    except json.JSONDecodeError as exc:
        raise ValueError(f"the reply's JSON does not parse: {exc.msg} at character {exc.pos}") from exc
    if not isinstance(found, dict):
        raise ValueError("the reply's JSON is not an object")
    return found


def schema_instruction(schema: dict[str, Any]) -> str:
    """What a prompt says of the answer's shape when the server does not enforce it."""
    return (
        "Answer with one JSON object and nothing else: no prose, no code fence. It must match this "
        f"JSON schema:\n{json.dumps(schema, separators=(',', ':'))}"
    )


def repair_instruction(problem: str) -> str:
    """The follow-up message asking a model to correct its reply once."""
    return (
        f"Your reply could not be used: {problem}. Answer again with the corrected JSON object only, "
        "matching the schema, with nothing before or after it."
    )
