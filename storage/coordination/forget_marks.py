"""A deployment's forget mark: a token every forget changes, which each process reads before it
uses what it keeps in memory of texts (the embedder's cache), and drops that when the token has
changed. Embedded: a file under the home, so a `kenning serve` sees a `kenning forget` run
beside it; distributed: a Redis key (`forget_marks_redis`), so every worker sees a forget made
anywhere."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Protocol


class ForgetMark(Protocol):
    def current(self) -> str:
        """The token now ("" before the first forget); a store error when it cannot be read."""
        ...

    def advance(self) -> None:
        """Change the token (a forget has ended)."""
        ...


class FileForgetMark:
    """The mark in a file; written whole (a new file moved in place), so a reader sees the old
    token or the new one."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def current(self) -> str:
        try:
            return self._path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return ""

    def advance(self) -> None:
        staged = self._path.with_name(f".{self._path.name}.{uuid.uuid4().hex}")
        staged.write_text(uuid.uuid4().hex, encoding="utf-8")
        os.replace(staged, self._path)
