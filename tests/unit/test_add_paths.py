"""Adding paths: what is not a regular file is skipped, and the reason is said for each."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from kenning.pipeline.ingest import path_sources
from kenning.workers.cli.main import main


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def test_a_device_and_a_fifo_are_skipped_with_their_reason(fifo: Path) -> None:
    # Given a character device and a named pipe
    errors: dict[str, str] = {}
    # When they are added
    sources = list(path_sources(["/dev/zero", str(fifo)], errors))
    # Then neither is read (a device or pipe could never end), and each says why
    assert sources == []
    assert "character device" in errors["/dev/zero"] and "not a regular file" in errors["/dev/zero"]
    assert "named pipe" in errors[str(fifo)]


def test_special_files_inside_a_directory_are_reported_and_the_rest_is_added(tmp_path: Path) -> None:
    # Given a folder with a text, a named pipe, a socket, a broken link and a hidden file
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "a.txt").write_text("Ada Lovelace wrote the first program.")
    os.mkfifo(folder / "pipe")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(folder / "sock"))
    (folder / "gone").symlink_to(folder / "missing.txt")
    (folder / ".hidden").write_text("skipped by design, quietly")
    errors: dict[str, str] = {}
    try:
        sources = list(path_sources([str(folder)], errors))
    finally:
        server.close()
    # Then the text is added and each special file is named with its reason
    assert [source.name for source in sources] == ["a.txt"]
    assert "named pipe" in errors[str(folder / "pipe")]
    assert "socket" in errors[str(folder / "sock")]
    assert "broken symbolic link" in errors[str(folder / "gone")]
    assert set(errors) == {str(folder / name) for name in ("pipe", "sock", "gone")}


def test_the_cli_says_why_and_exits_non_zero(
    fifo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KENNING_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KENNING_EMBEDDING_PROVIDER", "hash")
    result = CliRunner().invoke(main, ["add", "/dev/zero", str(fifo)], catch_exceptions=False)
    assert result.exit_code == 1
    assert "/dev/zero: skipped: a character device" in " ".join(result.output.split())
    assert "added 0, unchanged 0, errors 2" in result.output
