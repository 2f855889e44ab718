"""A caller learns nothing of what it may not read: a record, run or dataset of another tenant
(or one the caller holds no permission on) gets the same answer, byte for byte, as one that does
not exist; and the extraction cache, shared by the stores, is kept per tenant."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from kenning.pipeline.models import extraction_key
from kenning.pipeline.permission import Permission, User, issue_key
from kenning.workers.api import create_app
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings

SECRET = "The merger with Initech closes on the ninth of March at a price of forty dollars."
ALL = [Permission.READ, Permission.WRITE, Permission.DELETE]


@pytest.fixture
def memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Kenning]:
    monkeypatch.setenv("KENNING_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KENNING_EMBEDDING_PROVIDER", "hash")
    with Kenning(load_settings(home=tmp_path / "home", embedding_provider="hash")) as memory:
        yield memory


@pytest.fixture
def client(memory: Kenning) -> Iterator[TestClient]:
    with TestClient(create_app(memory)) as client:
        yield client


def key_for(memory: Kenning, tenant: str, name: str, grants: dict[str, list[Permission]]) -> dict[str, str]:
    store = memory.wiring.permissions
    user = User(tenant=tenant, name=name)
    store.add_user(user)
    for dataset, permissions in grants.items():
        store.grant(user, dataset, permissions)
    token, key = issue_key(user)
    store.add_key(key)
    return {"Authorization": f"Bearer {token}"}


def same_answer(
    client: TestClient, auth: dict[str, str], method: str, path: str, held: str, missing: str
) -> None:
    """The answers for the held id and for the missing one differ only by the id they name."""
    one = client.request(method, path.format(held), headers=auth)
    other = client.request(method, path.format(missing), headers=auth)
    assert one.status_code == other.status_code == 404, (one.text, other.text)
    assert one.content.replace(held.encode(), missing.encode()) == other.content


@pytest.mark.parametrize("stranger", ["other-tenant", "same-tenant-no-grant"])
def test_a_record_run_or_dataset_not_yours_answers_as_one_missing(
    memory: Kenning, client: TestClient, stranger: str
) -> None:
    # Given a record and a run of tenant acme's dataset `deals`
    owner = key_for(memory, memory.settings.tenant, "owner", {"deals": ALL})
    created = client.post("/v1/records", headers=owner, json={"text": SECRET, "dataset": "deals"})
    assert created.status_code == 201, created.text
    record_id = created.json()["id"]
    run = client.post("/v1/cognify?wait=true", headers=owner, json={"dataset": "deals"})
    assert run.status_code == 200, run.text
    run_id = run.json()["id"]
    # And a caller who may not read it (of another tenant, or of the same one with no grant)
    tenant = "globex" if stranger == "other-tenant" else memory.settings.tenant
    auth = key_for(memory, tenant, "eve", {"mine": ALL})
    missing = str(uuid.uuid4())

    # When it asks for them, and for ids that do not exist
    # Then each answer is the answer for a missing one, byte for byte but for the id it sent
    for method in ("GET", "PUT", "DELETE"):
        if method == "PUT":
            one = client.put(f"/v1/records/{record_id}", headers=auth, json={"text": "x"})
            other = client.put(f"/v1/records/{missing}", headers=auth, json={"text": "x"})
            assert one.status_code == other.status_code == 404
            assert one.content.replace(record_id.encode(), missing.encode()) == other.content
            continue
        same_answer(client, auth, method, "/v1/records/{}", record_id, missing)
    same_answer(client, auth, "GET", "/v1/runs/{}", run_id, missing)
    for path in ("cancel", "retry"):
        one = client.post(f"/v1/runs/{run_id}/{path}", headers=auth)
        other = client.post(f"/v1/runs/{missing}/{path}", headers=auth)
        assert one.status_code == other.status_code == 404
        assert one.content.replace(run_id.encode(), missing.encode()) == other.content
    same_answer(client, auth, "GET", "/v1/datasets/{}/permissions", "deals", "nothing")
    same_answer(client, auth, "GET", "/v1/datasets/{}/graph", "deals", "nothing")
    one = client.get("/v1/runs?dataset=deals", headers=auth)
    other = client.get("/v1/runs?dataset=nothing", headers=auth)
    assert one.status_code == other.status_code == 404
    assert one.content.replace(b"deals", b"nothing") == other.content


def test_the_extraction_cache_tells_no_tenant_what_another_holds(tmp_path: Path) -> None:
    # Given tenant initech, who cognified a text
    home = tmp_path / "home"
    with Kenning(load_settings(home=home, embedding_provider="hash", tenant="initech")) as initech:
        initech.add_text(SECRET, "deals")
        initech.cognify("deals")
    # When tenant globex guesses that very text and cognifies it
    with Kenning(load_settings(home=home, embedding_provider="hash", tenant="globex")) as globex:
        globex.add_text(SECRET, "guesses")
        run = globex.cognify("guesses")
    # Then its run found nothing in the cache: the guess is extracted afresh
    assert run.stats["cache_hits"] == 0, run.stats


def test_forget_drops_the_tenant_s_cached_extraction_though_another_tenant_holds_the_text(
    tmp_path: Path,
) -> None:
    # Given two tenants that cognified the same text
    home = tmp_path / "home"
    with Kenning(load_settings(home=home, embedding_provider="hash", tenant="globex")) as globex:
        globex.add_text(SECRET, "deals")
        globex.cognify("deals")
    with Kenning(load_settings(home=home, embedding_provider="hash", tenant="initech")) as initech:
        added = initech.add_text(SECRET, "deals")
        initech.cognify("deals")
        extractor, text_hash = initech.wiring.extractor, added.added[0].content_hash
        keys = {
            tenant: extraction_key(tenant, extractor.model, extractor.prompt_version, text_hash)
            for tenant in ("initech", "globex")
        }
        assert set(keys.values()) <= set(initech.wiring.cache.get_extractions(list(keys.values())))
        # When initech forgets it
        initech.forget("deals", [added.added[0].id])
        # Then initech's cached extraction is gone, and globex's stays
        assert set(initech.wiring.cache.get_extractions(list(keys.values()))) == {keys["globex"]}
