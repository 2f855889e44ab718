"""What the command line prints of what users supplied (names, errors, texts): as text, never as
rich markup or terminal control, and the names it takes, checked as every surface checks them."""

from __future__ import annotations

import re
from typing import Any

import click
from rich.markup import escape

from kenning.pipeline.names import name_problem

# C0 and C1 controls but tab and newline, DEL, and the bidirectional overrides.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(value: object) -> str:
    """`value` as text with every control character shown as its escape (`\\x1b`), never sent."""
    return _CONTROL.sub(lambda match: match.group().encode("unicode_escape").decode("ascii"), str(value))


def safe(value: object) -> str:
    """`value` to put in rich markup: printable, and its brackets taken literally."""
    return escape(printable(value))


class NameType(click.ParamType[str]):
    """A dataset or user name, refused at once with what is wrong (`kenning.pipeline.names`)."""

    name = "name"

    def __init__(self, field: str) -> None:
        self.field = field

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        problem = name_problem(text)
        if problem:
            self.fail(f"{self.field} {printable(problem)}", param, ctx)
        return text


DATASET_NAME = NameType("dataset")
USER_NAME = NameType("user")
