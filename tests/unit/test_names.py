"""Names a caller gives: one check at every surface, lock names that cannot collide and fit any
filesystem, a default read scope that reads the tenant's own datasets alone, and a command
line that prints every name and error as text, never as markup or terminal control."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from pydantic import TypeAdapter, ValidationError

from kenning.pipeline.errors import InputError
from kenning.pipeline.ingest import Source
from kenning.pipeline.locking import lock_name
from kenning.pipeline.models import Scope
from kenning.pipeline.names import check_name
from kenning.pipeline.permission import User, issue_key
from kenning.storage.coordination.lock import FileLock
from kenning.workers.api import create_app
from kenning.workers.cli.main import main
from kenning.workers.mcp.server import DatasetArg, DatasetsArg
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import Settings, load_settings

LONG = "é" * 255  # 255 characters, 510 bytes: over every filesystem's name limit


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KENNING_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KENNING_EMBEDDING_PROVIDER", "hash")
    return tmp_path / "home"


@pytest.fixture
def memory(home: Path) -> Iterator[Kenning]:
    with Kenning(load_settings(home=home, embedding_provider="hash")) as memory:
        yield memory


@pytest.mark.parametrize("name", ["notes", "hr:x", "Q3 plans", "glo?ex[1]*", "カタログ", LONG])
def test_a_valid_name_passes(name: str) -> None:
    assert check_name("dataset", name) == name


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "non-empty"),
        (" notes", "space"),
        ("a" * 256, "256 characters"),
        ("hr/x", "'/'"),
        ("red\x1b[31m", "U+001B"),
        ("a\nb", "U+000A"),
        ("evil\u202etxt", "U+202E"),
    ],
)
def test_an_invalid_name_is_refused_naming_the_field(name: str, problem: str) -> None:
    with pytest.raises(InputError, match="^user ") as refused:
        check_name("user", name)
    assert problem in str(refused.value)


def test_lock_names_of_different_datasets_never_collide() -> None:
    # Given two tenants whose names, joined with a colon, read the same
    one, other = Scope(tenant="acme", dataset="hr:x"), Scope(tenant="acme:hr", dataset="x")
    # Then their dataset locks are two locks
    assert lock_name(one) != lock_name(other)


def test_a_file_lock_fits_any_dataset_name(tmp_path: Path) -> None:
    # Given the lock of a dataset named with 255 two-byte characters, and of a near twin
    locks = FileLock(tmp_path / "locks")
    name, twin = (
        lock_name(Scope(tenant="acme", dataset=LONG)),
        lock_name(Scope(tenant="acme", dataset=LONG[:-1])),
    )
    # When both are taken
    token, other = locks.acquire(name, 60), locks.acquire(twin, 60)
    # Then both are held, each a file of its own, and the first is not taken twice
    assert token is not None and other is not None
    assert locks.acquire(name, 60) is None
    assert all(len(path.name.encode()) <= 255 for path in (tmp_path / "locks").iterdir())
    locks.release(name, token)
    locks.release(twin, other)


def test_a_dataset_of_the_longest_name_is_cognified_and_forgotten(memory: Kenning) -> None:
    # Given a dataset of the longest name allowed, cognified
    added = memory.add_text("Grace Hopper built the first compiler in 1952.", LONG)
    run = memory.cognify(LONG)
    assert run.status.value == "completed", run.error
    # When its item is forgotten
    forgotten = memory.forget(LONG, [added.added[0].id])
    # Then it is gone
    assert [done.items for done in forgotten] == [[added.added[0].id]]
    assert memory.records.list(LONG).total == 0


@pytest.mark.parametrize("name", ["hr/x", "a" * 256, "bad\x1bname"])
def test_the_python_facade_refuses_a_bad_dataset_name(memory: Kenning, name: str) -> None:
    with pytest.raises(InputError, match="^dataset "):
        memory.add_text("Ada Lovelace wrote the first algorithm.", name)


def test_the_default_read_scope_reads_only_the_tenant_itself(tmp_path: Path) -> None:
    # Given a process of tenant `glo?ex`, with no read scopes set
    settings = Settings(home=tmp_path, tenant="glo?ex")
    # Then it reads its own datasets, and not those of tenant `globex`
    patterns = settings.readable
    assert any(fnmatch.fnmatchcase("glo?ex/notes", pattern) for pattern in patterns)
    assert not any(fnmatch.fnmatchcase("globex/notes", pattern) for pattern in patterns)


def test_the_cli_refuses_a_bad_dataset_name(home: Path) -> None:
    result = CliRunner().invoke(main, ["add", "-", "--dataset", "a" * 256], input="Ada Lovelace.")
    assert result.exit_code != 0
    assert "dataset" in result.output and "256" in result.output


def test_status_prints_markup_and_control_bytes_as_text(home: Path) -> None:
    # Given an item whose name holds markup and an escape sequence, and that fails to load
    with Kenning(load_settings(home=home, embedding_provider="hash")) as memory:
        bad = Source(name="notes[/red]\x1b[2J.pdf", uri="upload:notes", data=b"%PDF-1.4 broken", mime="")
        memory.add([bad], "docs[bold]")
        memory.cognify("docs[bold]")
    # When the operator asks for the status
    result = CliRunner().invoke(main, ["status"])
    # Then it prints, the names as they are but for the escape byte, which is replaced
    assert result.exit_code == 0, result.output
    assert "notes[/red]" in result.output and "docs[bold]" in result.output
    assert "\x1b" not in result.output


@pytest.mark.parametrize("name", [" padded", "evil\u202etxt", "c1\x9bcontrol"])
def test_the_api_refuses_a_bad_dataset_or_user_name_naming_the_field(memory: Kenning, name: str) -> None:
    # Given an admin's key
    store = memory.wiring.permissions
    admin = User(tenant=memory.settings.tenant, name="root", admin=True)
    store.add_user(admin)
    token, key = issue_key(admin)
    store.add_key(key)
    auth = {"Authorization": f"Bearer {token}"}
    with TestClient(create_app(memory)) as client:
        # When a request names a dataset, or a user, that is not a valid name
        as_body = client.post("/v1/records", headers=auth, json={"text": "Ada.", "dataset": name})
        as_path = client.get(f"/v1/datasets/{name}/permissions", headers=auth)
        as_user = client.post("/v1/datasets/notes/permissions", headers=auth, json={"user": name})
    # Then each is refused, the error naming the field
    for answer, field in ((as_body, "dataset"), (as_path, "dataset"), (as_user, "user")):
        assert answer.status_code == 422, answer.text
        assert field in answer.json()["error"]["message"]


@pytest.mark.parametrize("value", ["hr/x", ["notes", "bad\x1bname"], "a" * 256])
def test_the_mcp_tools_refuse_a_bad_dataset_name(value: str | list[str]) -> None:
    argument = DatasetsArg if isinstance(value, list) else DatasetArg
    with pytest.raises(ValidationError, match="dataset"):
        TypeAdapter(argument).validate_python(value)
