"""Runs `kenning` in the test's process as the console script does: its exit code and output."""

from __future__ import annotations

import io
import sys

import pytest

from kenning.workers.cli.main import run


class Cli:
    """`kenning` with arguments and stdin (bytes or text): (exit code, stdout, stderr)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
        self._monkeypatch = monkeypatch
        self._capsys = capsys

    def __call__(self, *arguments: str, stdin: str | bytes = "") -> tuple[int, str, str]:
        raw = stdin.encode() if isinstance(stdin, str) else stdin
        self._monkeypatch.setattr(sys, "argv", ["kenning", *arguments])
        self._monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw)))
        code = 0
        try:
            run()
        except SystemExit as stopped:
            code = stopped.code if isinstance(stopped.code, int) else 1
        out, err = self._capsys.readouterr()
        return code, out, err


def one_error_line(err: str) -> str:
    """The one line an error prints (on stderr), checked to be that and no more."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]
