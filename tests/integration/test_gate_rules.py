"""One gate for every read and write: session entries cite every dataset they were built from and
are shown only to who may read them all, `improve` takes only what a writer of the dataset wrote
from that dataset alone, and `share` never changes its holder's own permissions."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from kenning.pipeline.errors import Forbidden, NotFound
from kenning.pipeline.permission import Caller, Permission, User, issue_key
from kenning.pipeline.session import SessionEntry, SessionKey
from kenning.workers.api import create_app
from kenning.workers.cli.main import main
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from kenning.workers.runtime.wiring import Wiring

READ, WRITE, DELETE, SHARE = Permission
RAG = "RAG_COMPLETION"


class Echo:
    """A completer whose answer is its whole prompt: whatever it was shown, it repeats."""

    def complete(self, system: str, prompt: str) -> str:
        return prompt


@pytest.fixture
def memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Kenning]:
    monkeypatch.setenv("KENNING_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KENNING_EMBEDDING_PROVIDER", "hash")
    settings = load_settings()
    with Kenning(settings, Wiring(settings, {"completer": Echo()})) as memory:
        memory.add_text("The alpha lighthouse keeper logs AAAMARK every night.", "a")
        memory.add_text("The bravo lighthouse keeper hides BBBMARK in the ledger.", "b")
        memory.cognify("a")
        memory.cognify("b")
        yield memory


@pytest.fixture
def client(memory: Kenning) -> Iterator[TestClient]:
    with TestClient(create_app(memory)) as client:
        yield client


def user(memory: Kenning, name: str, grants: dict[str, set[Permission]], admin: bool = False) -> User:
    store = memory.wiring.permissions
    made = User(tenant=memory.settings.tenant, name=name, admin=admin)
    store.add_user(made)
    for dataset, held in grants.items():
        store.grant(made, dataset, held)
    return made


def bearer(memory: Kenning, who: User) -> dict[str, str]:
    token, key = issue_key(who)
    memory.wiring.permissions.add_key(key)
    return {"Authorization": f"Bearer {token}"}


def texts_of(memory: Kenning, dataset: str) -> str:
    """Every stored text of the dataset, as the operator reads it."""
    found = memory.dataset(dataset)
    items = memory.wiring.metadata.list_items(found.id)
    return "\n".join(memory.wiring.blobs.get(item.content_hash).decode() for item in items)


def test_an_answer_over_two_datasets_is_shown_only_to_who_reads_both_and_improve_leaves_it(
    memory: Kenning, client: TestClient
) -> None:
    # Given a user who reads a and b (and writes a), with an answer over both in its session
    both = user(memory, "both", {"a": {READ, WRITE}, "b": {READ}})
    auth = bearer(memory, both)
    body = {"query": "lighthouse keeper", "datasets": ["a", "b"], "type": RAG, "session_id": "s1"}
    answer = client.post("/v1/search", headers=auth, json=body).json()["answer"]
    assert "BBBMARK" in answer and "AAAMARK" in answer
    assert [e["datasets"] for e in client.get("/v1/sessions/s1", headers=auth).json()] == [["a", "b"]]

    # When its read on b is revoked
    memory.wiring.permissions.revoke(both, "b", [READ])

    # Then at once neither its session, nor recall, nor a completion's history shows b's text
    assert "BBBMARK" not in client.get("/v1/sessions/s1", headers=auth).text
    recall = {"query": "lighthouse keeper ledger", "datasets": ["a"], "session_id": "s1"}
    assert "BBBMARK" not in client.post("/v1/recall", headers=auth, json=recall).text
    again = {**body, "datasets": ["a"]}
    assert "BBBMARK" not in client.post("/v1/search", headers=auth, json=again).json()["answer"]

    # And improve of a remembers the answer over a alone, never the one over a and b
    memory.improve("a")
    stored = texts_of(memory, "a")
    assert "BBBMARK" not in stored and stored.count("Q: lighthouse keeper") == 1


def test_an_answer_built_on_history_cites_the_history_datasets_too(
    memory: Kenning, client: TestClient
) -> None:
    # Given an answer over b in the session, then a question over a that sees it as history
    both = user(memory, "both", {"a": {READ, WRITE}, "b": {READ}})
    auth = bearer(memory, both)
    client.post(
        "/v1/search", headers=auth, json={"query": "bravo", "datasets": ["b"], "type": RAG, "session_id": "s"}
    )
    client.post(
        "/v1/search", headers=auth, json={"query": "alpha", "datasets": ["a"], "type": RAG, "session_id": "s"}
    )

    # Then the second answer cites a and b: improve of a does not take it
    assert [e["datasets"] for e in client.get("/v1/sessions/s", headers=auth).json()] == [["b"], ["a", "b"]]
    memory.improve("a")
    assert "BBBMARK" not in texts_of(memory, "a")


def test_improve_takes_only_entries_of_users_who_may_write_the_dataset(
    memory: Kenning, client: TestClient
) -> None:
    # Given a reader and a writer of a, each with an answered question over a in a session
    reader = bearer(memory, user(memory, "reader", {"a": {READ}}))
    writer = bearer(memory, user(memory, "writer", {"a": {READ, WRITE}}))
    for auth, words in ((reader, "READERWORDS lighthouse"), (writer, "WRITERWORDS lighthouse")):
        body = {"query": words, "datasets": ["a"], "type": RAG, "session_id": "s"}
        assert client.post("/v1/search", headers=auth, json=body).status_code == 200
    # And an entry of a user the permission store does not know
    ghost = SessionKey(tenant=memory.settings.tenant, user="ghost", session_id="s")
    memory.wiring.sessions.append(ghost, SessionEntry(question="GHOSTWORDS", answer="boo", datasets=["a"]))

    # When the operator improves a
    memory.improve("a")

    # Then only the writer's question became data of a
    stored = texts_of(memory, "a")
    assert "WRITERWORDS" in stored
    assert "READERWORDS" not in stored and "GHOSTWORDS" not in stored


def test_the_operators_own_entries_count_as_a_writers(memory: Kenning) -> None:
    # Given the operator's own answered question (its user is no user of the permission store)
    memory.search("lighthouse OPERATORWORDS", RAG, datasets=["a"], session_id="mine")
    user(memory, "someone", {"a": {READ, WRITE}})

    # When the operator improves a, its own entry is remembered
    memory.improve("a")
    assert "OPERATORWORDS" in texts_of(memory, "a")


def test_with_no_users_at_all_every_entry_counts_as_a_writers(memory: Kenning) -> None:
    # Given no users in the deployment, and an entry of a session user the store does not know
    ghost = SessionKey(tenant=memory.settings.tenant, user="agent", session_id="s")
    memory.wiring.sessions.append(ghost, SessionEntry(question="AGENTWORDS", answer="yes", datasets=["a"]))

    # When improve runs, the entry is remembered
    memory.improve("a")
    assert "AGENTWORDS" in texts_of(memory, "a")


def test_an_old_entry_naming_one_dataset_counts_as_citing_it() -> None:
    old = SessionEntry.model_validate_json('{"question": "q", "dataset": "a"}')
    assert old.cited == ["a"] and SessionEntry(datasets=["a", "b"]).cited == ["a", "b"]


def test_share_changes_others_permissions_never_its_holders_own(memory: Kenning, client: TestClient) -> None:
    # Given a sharer of a that reads it, another user, and an admin
    sharer = user(memory, "sharer", {"a": {READ, SHARE}})
    user(memory, "other", {})
    auth = bearer(memory, sharer)
    admin = bearer(memory, user(memory, "boss", {}, admin=True))

    def grant(headers: dict[str, str], who: str, *held: str) -> int:
        body = {"user": who, "permissions": list(held)}
        return client.post("/v1/datasets/a/permissions", headers=headers, json=body).status_code

    # Then it may not grant itself anything, nor grant what it lacks, nor grant share
    assert grant(auth, "sharer", "write") == 403
    assert grant(auth, "sharer", "read") == 403
    assert grant(auth, "other", "write") == 403
    assert grant(auth, "other", "share") == 403
    # But it may grant others what it holds, and revoke it
    assert grant(auth, "other", "read") == 200
    assert client.delete("/v1/datasets/a/permissions/other", headers=auth).status_code == 200
    assert client.delete("/v1/datasets/a/permissions/sharer", headers=auth).status_code == 403
    # And only an admin grants or revokes share
    assert grant(admin, "other", "share") == 200
    revoke_share = client.delete(
        "/v1/datasets/a/permissions/other", headers=auth, params={"permission": "share"}
    )
    assert revoke_share.status_code == 403
    assert memory.wiring.permissions.grants_on(memory.settings.tenant, "a")["sharer"] == {READ, SHARE}


def test_the_share_rule_is_one_function() -> None:
    sharer = Caller(tenant="t", user="s", grants={"a": frozenset({READ, SHARE})})
    sharer.check_share("a", "o", [READ])
    with pytest.raises(Forbidden):
        sharer.check_share("a", "s", [READ])
    with pytest.raises(Forbidden):
        sharer.check_share("a", "o", [WRITE])
    with pytest.raises(Forbidden):
        sharer.check_share("a", "o", [SHARE])
    with pytest.raises(NotFound):
        sharer.check_share("b", "o", [READ])
    Caller(tenant="t", user="root", admin=True).check_share("a", "o", list(Permission))


def test_the_cli_share_follows_the_same_rule(memory: Kenning, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given the command line run as a known user that holds read and share on a
    user(memory, "sharer", {"a": {READ, SHARE}})
    user(memory, "other", {})
    monkeypatch.setenv("KENNING_USER", "sharer")
    runner = CliRunner()

    # Then it may share what it holds with others, and nothing more
    assert runner.invoke(main, ["dataset", "share", "a", "--user", "other"]).exit_code == 0
    refused = runner.invoke(main, ["dataset", "share", "a", "--user", "sharer", "--permission", "write"])
    assert refused.exit_code != 0 and "your own" in str(refused.exception)
    assert runner.invoke(main, ["user", "grant", "other", "a", "--permission", "share"]).exit_code != 0
    held = memory.wiring.permissions.grants_on(memory.settings.tenant, "a")
    assert held["sharer"] == {READ, SHARE} and held["other"] == {READ}
