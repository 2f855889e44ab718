"""Every command of `kenning`, found by walking the command tree (a new command is tested without
being listed here), answers bad arguments with one line naming what is wrong and a non-zero exit:
never a traceback, never Python's names for things."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from kenning.workers.cli.main import main
from kenning.workers.cli.show import NameType
from tests.integration.cli_runner import Cli, one_error_line


def commands(
    group: click.Group = main, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """(its words, the command) for every command that runs, in every group, however deep."""
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))
        else:
            yield (*path, name), command


COMMANDS = dict(commands())


def required(command: click.Command) -> list[str]:
    """Arguments that let the command's parameters parse: each argument and required option given."""
    arguments = ["x" for p in command.params if isinstance(p, click.Argument) and p.required]
    return arguments + required_options(command)


def required_options(command: click.Command) -> list[str]:
    return [w for p in command.params if isinstance(p, click.Option) and p.required for w in (p.opts[0], "x")]


def bad_value(param: click.Parameter, tmp_path: Path) -> str | None:
    """A value the parameter's type refuses, or None when it takes any string."""
    kind = param.type
    if isinstance(kind, click.Choice):
        return "bogus-choice"
    if isinstance(kind, (click.types.IntParamType, click.types.FloatParamType)):
        return "not-a-number"
    if isinstance(kind, NameType):
        return "bad/name"
    if isinstance(kind, click.Path):
        file = tmp_path / "a-file"
        file.touch()
        return str(tmp_path) if not kind.dir_okay else str(file) if not kind.file_okay else None
    return None


def bad_values(tmp_path: Path) -> Iterator[tuple[tuple[str, ...], list[str], str]]:
    """(command, its arguments with one bad value, the option or argument named)."""
    for words, command in COMMANDS.items():
        for param in command.params:
            if isinstance(param, click.Option) and param.is_flag:
                continue
            value = bad_value(param, tmp_path)
            if value is None:
                continue
            if isinstance(param, click.Option):
                yield words, [*required(command), param.opts[0], value], param.opts[0]
            else:
                given = [
                    value if p is param else "x" for p in command.params if isinstance(p, click.Argument)
                ]
                yield words, [*given, *required_options(command)], param.human_readable_name


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Cli:
    monkeypatch.setenv("KENNING_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KENNING_EMBEDDING_PROVIDER", "hash")
    monkeypatch.chdir(tmp_path)
    return Cli(monkeypatch, capsys)


def test_the_walk_finds_the_commands() -> None:
    # The walk reaches nested groups: a command tree it did not walk would test nothing
    assert {("remember",), ("memory", "get"), ("runs", "list"), ("user", "create")} <= set(COMMANDS)
    assert len(COMMANDS) >= 30


@pytest.mark.parametrize("words", sorted(COMMANDS), ids=" ".join)
def test_an_unknown_option_is_one_line_naming_it(cli: Cli, words: tuple[str, ...]) -> None:
    code, out, err = cli(*words, *required(COMMANDS[words]), "--no-such-option")
    assert code == 2 and out == ""
    assert "--no-such-option" in one_error_line(err)


@pytest.mark.parametrize("words", sorted(w for w, c in COMMANDS.items() if required(c)), ids=" ".join)
def test_a_missing_argument_is_one_line_naming_it(cli: Cli, words: tuple[str, ...]) -> None:
    code, out, err = cli(*words)
    line = one_error_line(err)
    assert code == 2 and out == "" and "Missing" in line
    assert f"kenning {' '.join(words)} --help" in line


def test_a_bad_value_of_every_parameter_is_one_line_naming_it(cli: Cli, tmp_path: Path) -> None:
    tried = 0
    for words, arguments, named in bad_values(tmp_path):
        code, out, err = cli(*words, *arguments)
        line = one_error_line(err)
        assert code == 2 and out == "", (words, arguments, err)
        assert named.strip("-").lower() in line.lower(), (words, arguments, line)
        tried += 1
    assert tried >= 40
    # And none of them made a home
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize("words", sorted(COMMANDS), ids=" ".join)
def test_bad_settings_are_one_line_from_every_command(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, words: tuple[str, ...]
) -> None:
    # Given settings that cannot be used
    monkeypatch.setenv("KENNING_MODE", "bogus")
    # When the command runs with arguments that parse
    code, _, err = cli(*words, *required(COMMANDS[words]), *(["--yes"] if "--yes" in options(words) else []))
    # Then it did not need the settings, or it says in one line what is wrong: the setting, or
    # the arguments when it looks at them first (never an error it did not expect)
    if code != 0:
        line = one_error_line(err)
        assert "KENNING_MODE" in line or line.endswith("--help')"), line
    else:
        assert "Traceback" not in err


def options(words: tuple[str, ...]) -> list[str]:
    return [opt for param in COMMANDS[words].params for opt in param.opts if opt.startswith("--")]
