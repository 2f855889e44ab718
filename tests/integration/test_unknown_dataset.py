"""A dataset name that does not exist is an error listing those that do, never an empty result;
except where the caller may not read it: then nothing, and nothing tells whether it exists."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from kenning.pipeline.errors import InputError
from kenning.workers.application.lifecycle import Message
from kenning.workers.cli.main import run
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import Settings, load_settings


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # Given a tenant with two datasets, one of them cognified
    settings = load_settings(home=tmp_path / "home", embedding_provider="hash", tenant="acme")
    with Kenning(settings) as memory:
        memory.add_text("Harrow Point lighthouse was first lit in 1822.", "notes")
        memory.add_text("The guild met every spring.", "archive")
        memory.cognify("notes")
    return settings


class Cli:
    """Runs `kenning` in this process, as the console script does; (exit code, stdout, stderr)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
        self._monkeypatch = monkeypatch
        self._capsys = capsys

    def __call__(self, *arguments: str, stdin: str = "") -> tuple[int, str, str]:
        self._monkeypatch.setattr(sys, "argv", ["kenning", *arguments])
        self._monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
        code = 0
        try:
            run()
        except SystemExit as stopped:
            code = int(stopped.code or 0)
        out, err = self._capsys.readouterr()
        return code, out, err


@pytest.fixture
def cli(settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Cli:
    monkeypatch.setenv("KENNING_HOME", str(settings.home))
    monkeypatch.setenv("KENNING_EMBEDDING_PROVIDER", "hash")
    monkeypatch.setenv("KENNING_TENANT", "acme")
    return Cli(monkeypatch, capsys)


@pytest.mark.parametrize(
    "arguments",
    [
        ("search", "lighthouse", "--dataset", "typo"),
        ("search", "lighthouse", "--type", "CHUNKS", "--dataset", "notes", "--dataset", "typo"),
        ("recall", "lighthouse", "--dataset", "typo"),
        ("status", "--dataset", "typo"),
        ("cognify", "--dataset", "typo"),
        ("cognify", "--dataset", "typo", "--dry-run"),
    ],
)
def test_an_unknown_dataset_is_an_error_listing_those_that_exist(
    cli: Cli, arguments: tuple[str, ...]
) -> None:
    # When a command names a dataset that does not exist
    code, out, err = cli(*arguments)
    # Then it stops with one line naming it and listing the datasets there are
    assert code == 2 and out == ""
    assert err.strip().splitlines() == ["error: no dataset 'typo' (datasets: archive, notes)"]
    # And nothing was created under that name
    code, out, _ = cli("status", "--json")
    assert sorted(entry["dataset"] for entry in json.loads(out)["datasets"]) == ["archive", "notes"]


def test_search_with_no_dataset_named_uses_the_default_one_and_says_when_it_is_missing(
    settings: Settings,
) -> None:
    with Kenning(settings) as memory, pytest.raises(InputError, match=r"no dataset 'main' \(datasets: "):
        memory.search("lighthouse", "CHUNKS")


def test_a_dataset_the_caller_may_not_read_gives_nothing_whether_it_exists_or_not(settings: Settings) -> None:
    # Given a caller that may read only the tenant's `notes*` datasets
    reader = settings.model_copy(update={"read_scopes": ["acme/notes*"]})
    with Kenning(reader) as memory:
        # When it searches a dataset outside its scopes, existing or not
        for name in ("archive", "no-such-dataset"):
            result = memory.search("guild", "CHUNKS", datasets=[name])
            # Then it gets nothing, and no error that would tell which exists
            assert result.results == [] and result.notice is None
        # And an unknown dataset within its scopes is an error listing only the datasets it may read
        with pytest.raises(InputError) as raised:
            memory.search("guild", "CHUNKS", datasets=["notes-typo"])
        assert str(raised.value) == "no dataset 'notes-typo' (datasets: notes)"


def test_add_still_creates_a_dataset(cli: Cli) -> None:
    code, _, _ = cli("add", "-", "--dataset", "fresh", stdin="A new note.")
    assert code == 0
    code, _, err = cli("cognify", "--dataset", "fresh")
    assert code == 0 and "completed" in err


def test_status_shows_the_home_in_use(cli: Cli, settings: Settings) -> None:
    code, out, err = cli("status", "--json")
    assert code == 0 and json.loads(out)["home"] == str(settings.home.resolve())
    code, out, err = cli("status")
    assert code == 0 and str(settings.home.resolve()) in " ".join((out + err).split())


def test_recall_in_a_session_answers_before_its_dataset_exists(settings: Settings) -> None:
    # Given messages written to a session, whose dataset the background cognify has not made yet
    with Kenning(settings) as memory:
        memory.session_messages([Message(text="Melanie's cat is Oliver.")], "chat", "s1")
        # When the agent recalls within that session
        recalled = memory.recall("cat", ["chat"], session_id="s1")
    # Then the session answers, and the notice says the dataset is not there (yet)
    assert [hit.source for hit in recalled.results] == ["session"]
    assert "no dataset 'chat'" in recalled.notice
