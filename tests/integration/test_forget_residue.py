"""Forget leaves no residue: nothing derived from a forgotten item keeps its words, neither the
session entries it was remembered through nor the descriptions of the entities it shared."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from kenning.pipeline.permission import User, issue_key
from kenning.pipeline.session import SessionEntry
from kenning.workers.api import create_app
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings

# --- Session entries -------------------------------------------------------------------------


@pytest.fixture(params=["file", pytest.param("redis", marks=pytest.mark.redis)])
def session_stores(request: pytest.FixtureRequest) -> dict[str, str]:
    """Where sessions live: files in the home, or Redis under a prefix of this test's own."""
    if request.param == "file":
        return {"session_backend": "file"}
    url: str = request.getfixturevalue("redis_url")
    return {
        "session_backend": "redis",
        "redis_url": url,
        "queue_prefix": f"kenning-residue-{uuid.uuid4().hex[:8]}",
    }


def open_memory(home: Path, tenant: str, **settings: str) -> Kenning:
    return Kenning(load_settings(home=home, tenant=tenant, embedding_provider="hash", **settings))


def operator_key(kenning: Kenning) -> str:
    """A key of the operator's own user: over HTTP, the same sessions as in Python."""
    user = User(tenant=kenning.settings.tenant, name=kenning.settings.user, admin=True)
    token, key = issue_key(user)
    kenning.wiring.permissions.add_user(user)
    kenning.wiring.permissions.add_key(key)
    return token


def session_text(kenning: Kenning, token: str, session_id: str) -> str:
    """Every entry of the session, as Python and as HTTP give it."""
    entries = kenning.get_session(session_id)
    with TestClient(create_app(kenning)) as client:
        answer = client.get(f"/v1/sessions/{session_id}", headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200, answer.text
    return "\n".join([*(entry.model_dump_json() for entry in entries), answer.text])


@pytest.mark.parametrize("how", ["item", "dataset", "everything"])
def test_forget_removes_the_session_entries_of_what_it_forgets(
    tmp_path: Path, session_stores: dict[str, str], how: str
) -> None:
    # Given a secret and a harmless message remembered into a session (the graph follows them)
    secret = f"My bank PIN is 4321-{uuid.uuid4().hex[:8]}"
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    home = tmp_path / "home"
    with open_memory(home, tenant, **session_stores) as kenning:
        kenning.remember([{"speaker": "Ada", "text": secret}], "chat", session_id="s1")
        kenning.remember([{"speaker": "Ada", "text": "The weather is mild."}], "chat", session_id="s1")
    with open_memory(home, tenant, **session_stores) as kenning:
        dataset = kenning.wiring.metadata.get_dataset(kenning.scope("chat"))
        assert dataset is not None
        items = {item.id: item for item in kenning.wiring.metadata.list_items(dataset.id)}
        [secret_id] = [
            i for i, item in items.items() if secret.encode() in kenning.wiring.blobs.get(item.content_hash)
        ]
        # And an answer that read the secret's item, and one that read only the dataset
        assert kenning.wiring.sessions is not None
        key = kenning.session_key("s1")
        cited = SessionEntry(
            kind="qa", question="PIN?", answer=secret, data_ids=[secret_id], datasets=["chat"]
        )
        kenning.wiring.sessions.append(key, cited)
        if how != "item":
            read = SessionEntry(
                kind="qa", question="What PIN?", answer=secret, datasets=["chat"], dataset="chat"
            )
            kenning.wiring.sessions.append(key, read)
        token = operator_key(kenning)
        assert secret in session_text(kenning, token, "s1")

        # When the item, the dataset or everything is forgotten
        if how == "item":
            kenning.forget("chat", [secret_id])
        elif how == "dataset":
            kenning.forget("chat")
        else:
            kenning.forget(everything=True)

        # Then no session entry holds the secret, nor does recall bring it back
        assert secret not in session_text(kenning, token, "s1")
        if how == "item":
            assert "weather is mild" in session_text(kenning, token, "s1")
            recalled = kenning.recall("bank PIN", ["chat"], session_id="s1")
            assert all(secret not in r.text for r in recalled.results)
        kenning.wiring.sessions.delete_session(key)
