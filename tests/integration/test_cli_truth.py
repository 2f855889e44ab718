"""What the command line tells a user is true: a command that was asked to do something and did
nothing fails, with one line saying what and why, and never a traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kenning.pipeline.errors import InputError
from kenning.pipeline.permission import Caller, Permission
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import Settings, load_settings
from tests.integration.cli_runner import Cli, one_error_line


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # Given a home with one cognified dataset, `notes`
    settings = load_settings(home=tmp_path / "home", embedding_provider="hash", tenant="acme")
    with Kenning(settings) as memory:
        memory.add_text("Harrow Point lighthouse was first lit in 1822.", "notes")
        memory.cognify("notes")
    return settings


@pytest.fixture
def cli(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Cli:
    monkeypatch.setenv("KENNING_HOME", str(settings.home))
    monkeypatch.setenv("KENNING_EMBEDDING_PROVIDER", "hash")
    monkeypatch.setenv("KENNING_TENANT", "acme")
    monkeypatch.chdir(tmp_path)
    return Cli(monkeypatch, capsys)


def datasets(cli: Cli) -> list[str]:
    code, out, _ = cli("status", "--json")
    assert code == 0
    return sorted(entry["dataset"] for entry in json.loads(out)["datasets"])


def test_remember_of_a_missing_file_fails_and_makes_no_dataset(cli: Cli) -> None:
    code, out, err = cli("remember", "/nonexistent", "--dataset", "x")
    assert code != 0 and out == ""
    assert "/nonexistent" in err and "completed" not in err and "Traceback" not in err
    assert datasets(cli) == ["notes"]


def test_remember_of_a_pipe_fails_naming_it(cli: Cli, tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "p")
    code, out, err = cli("remember", "p", "--dataset", "x")
    assert code != 0 and "completed" not in err
    assert "p: skipped: a named pipe" in one_error_line(err)
    assert datasets(cli) == ["notes"]


def test_forget_of_an_unknown_item_fails_and_forgets_nothing(cli: Cli, settings: Settings) -> None:
    code, _, err = cli("forget", "--dataset", "notes", "--data-id", "nope", "--yes")
    assert code != 0
    assert one_error_line(err) == "error: no item 'nope' in dataset 'notes'"
    code, out, _ = cli("status", "--dataset", "notes", "--json")
    assert json.loads(out)["datasets"][0]["items"] == {"done": 1}


def test_forget_everything_of_a_tenant_with_no_data_fails(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KENNING_TENANT", "empty")
    code, _, err = cli("forget", "--everything", "--yes")
    assert code != 0 and "no dataset" in one_error_line(err)


def test_recall_of_an_unknown_type_lists_the_types(cli: Cli) -> None:
    code, _, err = cli("recall", "q", "--type", "bogus", "--dataset", "notes")
    line = one_error_line(err).lower()
    assert code == 2 and "'bogus'" in line and "'chunks'" in line and "'graph_completion'" in line


def test_recall_of_an_unknown_dataset_in_a_session_fails_and_writes_no_entry(cli: Cli) -> None:
    code, out, err = cli("recall", "q", "--dataset", "nosuch", "--session", "s")
    assert code == 2 and out == ""
    assert one_error_line(err) == "error: no dataset 'nosuch' (datasets: notes)"
    with Kenning(load_settings()) as memory:
        assert memory.get_session("s") == []


def test_recall_that_finds_nothing_says_so(cli: Cli) -> None:
    with Kenning(load_settings()) as memory:
        memory.add_text("", "hollow")
    code, out, err = cli("recall", "lighthouse", "--dataset", "hollow")
    assert code == 0 and " 1. " not in out and "nothing recalled" in err


def test_prune_below_a_decay_factor_with_decay_off_fails_naming_the_setting(cli: Cli) -> None:
    code, _, err = cli("prune", "--dataset", "notes", "--below", "0.5", "--yes")
    assert code != 0 and "KENNING_DECAY_HALF_LIFE_DAYS" in one_error_line(err)


def test_prune_names_its_options_not_python_parameters(cli: Cli) -> None:
    code, _, err = cli("prune", "--dataset", "notes", "--yes")
    line = one_error_line(err)
    assert code == 2 and "--older-than-days" in line and "--below" in line and "_" not in line


def test_prune_that_matched_nothing_fails(cli: Cli) -> None:
    code, _, err = cli("prune", "--dataset", "notes", "--older-than-days", "30", "--yes")
    assert code != 0 and "nothing to prune" in one_error_line(err)


@pytest.mark.parametrize(
    "arguments",
    [("status",), ("search", "lighthouse"), ("memory", "list"), ("forget", "--everything", "--yes")],
)
def test_a_home_that_is_not_one_is_refused_not_made(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arguments: tuple[str, ...]
) -> None:
    # Given KENNING_HOME naming a folder that holds no kenning home
    wrong = tmp_path / "typo"
    monkeypatch.setenv("KENNING_HOME", str(wrong))
    # When a command that reads memory runs
    code, _, err = cli(*arguments)
    # Then it says there is no home there, and makes none
    assert code != 0 and f"no kenning home at {wrong}" in one_error_line(err)
    assert not wrong.exists() and not (tmp_path / ".kenning").exists()


def test_a_command_that_writes_makes_the_home(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KENNING_HOME", str(tmp_path / "fresh"))
    code, _, _ = cli("add", "-", "--dataset", "new", stdin="A first note.")
    assert code == 0 and (tmp_path / "fresh").is_dir()
    code, _, _ = cli("status")
    assert code == 0


def test_an_unknown_dataset_lists_only_those_the_caller_may_see(settings: Settings) -> None:
    # Given a tenant with `notes` and `archive`, and a user granted write on `notes` alone
    with Kenning(settings) as memory:
        memory.add_text("The guild met every spring.", "archive")
        writer = memory.as_caller(
            Caller(tenant="acme", user="w", grants={"notes": frozenset({Permission.WRITE})})
        )
        # When it names a dataset that does not exist, to cognify or to estimate
        for operation in (writer.cognify, writer.estimate):
            with pytest.raises(InputError) as raised:
                operation("typo")
            # Then the error lists the datasets it may use, never the others
            assert str(raised.value) == "no dataset 'typo' (datasets: notes)"
