"""The caller-gate property on the other three surfaces: MCP (the SDK's client over streamable
HTTP, each caller with its own API key), the `kenning` command (a process acting as KENNING_USER
of KENNING_TENANT, reading KENNING_READ_SCOPES) and the service tasks sent by name (acting for the
request's tenant, reading what the worker's read scopes allow).

No caller reads, writes or learns the existence of what it may not read: no text, id or listing
of such a dataset in results, errors, counts or session history, and the same error for a dataset
missing and one not readable. Markers, callers and grants are those of test_caller_gate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kenning.pipeline.models import Scope
from kenning.pipeline.permission import Caller, User, caller_of
from kenning.workers.api import create_app
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from kenning.workers.runtime.wiring import Wiring
from tests.integration.cluster import ROOT
from tests.integration.test_caller_gate import DATASETS, GRANTS, QUERY, READ, Echo, add_users, marker
from tests.integration.test_mcp import connected, served, text_of

TENANTS = ("acme", "umbra")
MISSING = "0123456789abcdef0123456789abcdef"


@dataclass
class World:
    memory: Kenning
    url: str
    tokens: dict[str, str]
    users: dict[str, User]

    def caller(self, name: str) -> Caller:
        return caller_of(self.memory.wiring.permissions, self.users[name])

    def reads(self, name: str) -> set[tuple[str, str]]:
        """The (tenant, dataset) pairs the caller may read now (its grants read afresh)."""
        caller = self.caller(name)
        return {(caller.tenant, d) for d in DATASETS if caller.may(READ, d)}

    def hidden(self, name: str) -> set[str]:
        """The markers and ids of every dataset the caller may not read now, its items and runs."""
        readable = self.reads(name)
        return {
            thing
            for pair, things in contents(self.memory).items()
            if pair not in readable
            for thing in things | {marker(*pair)}
        }


def contents(memory: Kenning) -> dict[tuple[str, str], set[str]]:
    """Per (tenant, dataset): the ids of the dataset, its items and its runs."""
    metadata = memory.wiring.metadata
    return {
        (tenant, d.name): {d.id}
        | {item.id for item in metadata.list_items(d.id)}
        | {run.id for run in metadata.list_runs(d.id)}
        for tenant in TENANTS
        for d in metadata.list_datasets(tenant)
    }


def stored_texts(memory: Kenning) -> dict[tuple[str, str], str]:
    metadata, blobs = memory.wiring.metadata, memory.wiring.blobs
    return {
        (tenant, d.name): "\n".join(
            blobs.get(item.content_hash).decode() for item in metadata.list_items(d.id)
        )
        for tenant in TENANTS
        for d in metadata.list_datasets(tenant)
    }


def each_holds_its_own(memory: Kenning) -> None:
    every = {marker(t, d) for t in TENANTS for d in DATASETS}
    for pair, text in stored_texts(memory).items():
        assert not any(m in text for m in every - {marker(*pair)}), f"{pair} holds another's text"


def populate(memory: Kenning) -> None:
    for tenant in TENANTS:
        setup = memory.as_caller(Caller(tenant=tenant, user="setup", admin=True))
        for dataset in DATASETS:
            setup.add_text(f"The {QUERY} of {dataset} says {marker(tenant, dataset)}.", dataset)
            setup.cognify(dataset)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    home = tmp_path_factory.mktemp("gate-surfaces") / "home"
    config = load_settings(home=home, embedding_provider="hash", tenant="acme")
    with Kenning(config, Wiring(config, {"completer": Echo()})) as memory:
        populate(memory)
        tokens, users = add_users(memory)
        with served(create_app(memory)) as url:
            yield World(memory, url, tokens, users)


# MCP: one session per call, with the caller's own key


async def tool(world: World, name: str, tool_name: str, arguments: dict[str, Any]) -> tuple[bool, str, Any]:
    """Whether the tool failed, everything it answered as text, and its structured answer."""
    async with connected(world.url, world.tokens[name]) as session:
        result = await session.call_tool(tool_name, arguments)
    structured = result.structured_content
    return result.is_error, json.dumps(structured) + text_of(result), structured


def over_mcp(world: World, name: str, operation: str, datasets: list[str], session: str) -> str:
    """Make the call as `name` over MCP; everything it was shown, as text."""
    if operation in ("remember", "forget"):
        return refused_alike(world, name, operation, datasets[0])
    if operation == "search":
        arguments: dict[str, Any] = {"query": QUERY, "type": "RAG_COMPLETION", "datasets": datasets}
    elif operation == "recall":
        arguments = {"query": QUERY, "datasets": datasets, "session_id": session}
    elif operation == "session":  # the session's entries, then every dataset the caller may read
        arguments = {"query": QUERY, "session_id": session}
    else:
        return listings(world, name)
    return anyio.run(tool, world, name, "recall" if operation == "session" else operation, arguments)[1]


def refused_alike(world: World, name: str, operation: str, dataset: str) -> str:
    """Remember into the dataset, or forget from it every item of the other datasets (which must
    all stay): where the caller may not read it, the answer is that for a dataset not there."""
    caller = world.caller(name)
    others = {pair: ids for pair, ids in contents(world.memory).items() if pair != (caller.tenant, dataset)}
    if operation == "remember":
        arguments: dict[str, Any] = {"data": f"A {QUERY} note: {marker(caller.tenant, dataset)}"}
    else:
        arguments = {"data_ids": [MISSING, *sorted(i for ids in others.values() for i in ids)]}
    failed, answer, _ = anyio.run(tool, world, name, operation, {**arguments, "dataset": dataset})
    if not caller.may(READ, dataset):
        refused, as_missing, _ = anyio.run(tool, world, name, operation, {**arguments, "dataset": "zz"})
        assert failed and refused and answer.replace(repr(dataset), repr("zz")) == as_missing
    kept = contents(world.memory)
    assert all(kept.get(pair, set()) >= ids for pair, ids in others.items()), f"{name} removed another's"
    return answer


def listings(world: World, name: str) -> str:
    """list_datasets and status: only datasets the caller holds a permission on (reads, for status)."""
    caller = world.caller(name)
    _, listed, datasets = anyio.run(tool, world, name, "list_datasets", {})
    _, status, statuses = anyio.run(tool, world, name, "status", {})
    assert all(caller.permissions(d["name"]) for d in datasets["datasets"])
    assert all(caller.may(READ, d["dataset"]) for d in statuses["datasets"])
    return listed + status


OPERATIONS = ("search", "recall", "session", "remember", "forget", "listing", "ask", "revoke_b", "grant_b")
steps = st.lists(
    st.tuples(
        st.sampled_from(sorted(GRANTS)),
        st.sampled_from(OPERATIONS),
        st.lists(st.sampled_from(DATASETS), min_size=1, max_size=2, unique=True),
        st.sampled_from(["s1", "s2"]),
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=steps)
@example(  # an answer over a and b in a session, then b revoked: the session must hide it
    script=[
        ("both", "grant_b", ["a"], "s1"),
        ("both", "ask", ["a", "b"], "s1"),
        ("both", "recall", ["a", "b"], "s1"),
        ("both", "revoke_b", ["a"], "s1"),
        ("both", "session", ["a"], "s1"),
        ("both", "recall", ["a"], "s1"),
        ("reader", "remember", ["b"], "s1"),
        ("other", "forget", ["b"], "s1"),
        ("reader", "listing", ["a"], "s1"),
    ]
)
@example(script=[("writer", "remember", ["a"], "s2"), ("admin", "forget", ["a"], "s2")])
def test_no_mcp_caller_sees_what_it_may_not_read(world: World, script: list[Any]) -> None:
    for name, operation, datasets, session in script:
        if operation in ("revoke_b", "grant_b"):  # `both`'s read on b: the next call must obey
            store = world.memory.wiring.permissions
            change = store.grant if operation == "grant_b" else store.revoke
            change(world.users["both"], "b", [READ])
            continue
        if operation == "ask":  # an answer in its session, by the Python facade (MCP has no RAG with one)
            asking = world.memory.as_caller(world.caller(name))
            asking.search(QUERY, "RAG_COMPLETION", datasets=datasets, session_id=session)
            continue
        seen = over_mcp(world, name, operation, datasets, session)
        for thing in world.hidden(name):
            assert thing not in seen, f"{name} saw {thing} by {operation} over MCP"
        each_holds_its_own(world.memory)


# The `kenning` command: a process of its own on the same home


def kenning(
    world: World, *args: str, tenant: str = "acme", user: str = "local", scopes: str = ""
) -> subprocess.CompletedProcess[str]:
    """Run the command as the user of the tenant, reading the scopes."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("KENNING_")}
    env |= {
        "KENNING_HOME": str(world.memory.settings.home),
        "KENNING_EMBEDDING_PROVIDER": "hash",
        "KENNING_TENANT": tenant,
        "KENNING_USER": user,
        "KENNING_READ_SCOPES": json.dumps([scopes] if scopes else []),
    }
    return subprocess.run(
        [sys.executable, "-m", "kenning.workers.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def refusal(done: subprocess.CompletedProcess[str]) -> str:
    """A failed command's message."""
    assert done.returncode != 0, done.stdout
    return done.stderr


def item_of(world: World, tenant: str, dataset: str) -> str:
    found = world.memory.wiring.metadata.get_dataset(Scope(tenant=tenant, dataset=dataset))
    assert found is not None
    return world.memory.wiring.metadata.list_items(found.id)[0].id


def answer_over_a_and_b(world: World, tenant: str, user: str, session: str) -> None:
    """An answer over the tenant's a and b in the user's session, rated (improve takes those)."""
    memory = world.memory.as_caller(Caller(tenant=tenant, user=user, admin=True))
    answer = memory.search(QUERY, "RAG_COMPLETION", datasets=["a", "b"], session_id=session)
    assert marker(tenant, "b") in str(answer.answer)
    entry = memory.get_session(session)[-1]
    assert entry.cited == ["a", "b"]
    memory.add_feedback(session, entry.id, 5)


CLI_CASES = {
    "search": (["search", QUERY, "--type", "CHUNKS", "--dataset", "a", "--dataset", "b", "--json"], "acme"),
    "recall": (["recall", QUERY, "--session", "cli", "--json"], "umbra"),
    "session": (["session", "show", "cli"], "acme"),
    "status": (["status", "--json"], "acme"),
    "improve": (["improve", "--dataset", "a"], "acme"),
}


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_the_command_shows_nothing_its_read_scopes_do_not_cover(world: World, case: str) -> None:
    # Given a user's session with an answer over a and b of its tenant
    args, tenant = CLI_CASES[case]
    name = "other" if tenant == "umbra" else "both"
    answer_over_a_and_b(world, tenant, name, "cli")
    # When the command runs as that user, reading only dataset a of its tenant
    shown = kenning(world, *args, tenant=tenant, user=name, scopes=f"{tenant}/a")
    # Then it answers, and shows nothing of any other dataset: no text, no id
    assert shown.returncode == 0, shown.stderr[-3000:]
    said = shown.stdout + shown.stderr
    hidden = {t for pair, things in contents(world.memory).items() if pair != (tenant, "a") for t in things}
    for thing in hidden | {marker(t, d) for t in TENANTS for d in DATASETS} - {marker(tenant, "a")}:
        assert thing not in said, f"{case} showed {thing}"
    if case == "status":
        assert [d["dataset"] for d in json.loads(shown.stdout)["datasets"]] == ["a"]
    if case == "search":
        assert marker("acme", "a") in said  # what it may read, it reads
    each_holds_its_own(world.memory)


def test_the_command_answers_a_record_it_may_not_read_as_a_missing_one(world: World) -> None:
    # Given the command reading only acme's a, and an item of acme's b
    hidden = item_of(world, "acme", "b")
    # When it asks for that item by id, in b and in a, and for datasets and ids that are not there
    in_b = refusal(kenning(world, "memory", "get", hidden, "--dataset", "b", scopes="acme/a"))
    nowhere = refusal(kenning(world, "memory", "get", hidden, "--dataset", "zz", scopes="acme/a"))
    in_a = refusal(kenning(world, "memory", "get", hidden, "--dataset", "a", scopes="acme/a"))
    missing = refusal(kenning(world, "memory", "get", MISSING, "--dataset", "a", scopes="acme/a"))
    # Then b is answered as a dataset that does not exist, and its item as an id that names nothing
    assert in_b.replace("'b'", "'zz'") == nowhere
    assert in_a.replace(hidden, MISSING) == missing
    assert marker("acme", "b") not in in_b + in_a


# Service tasks sent by name: the worker reads acme alone, a request acts for umbra

SERVICE = textwrap.dedent(
    """
    import json, sys
    from kenning.pipeline.models import Scope
    from kenning.pipeline.permission import Caller
    from kenning.workers.celery.app import app
    from kenning.workers.memory import Kenning
    from kenning.workers.runtime.settings import load_settings
    from kenning.workers.services import tasks

    home, redis_url, prefix, query = sys.argv[1:5]
    base = dict(home=home, embedding_provider="hash", tenant="acme")
    with Kenning(load_settings(**base)) as memory:
        for tenant in ("acme", "umbra"):
            setup = memory.as_caller(Caller(tenant=tenant, user="setup", admin=True))
            for dataset in ("a", "b"):
                setup.add_text(f"The {query} of {dataset} says MK{tenant}{dataset}.".upper(), dataset)
                setup.cognify(dataset)
    app.use_settings(load_settings(
        **base, redis_url=redis_url, broker_url=redis_url, queue_prefix=prefix, read_scopes=["acme/*"],
    ))
    metadata, blobs = app.resources().wiring.metadata, app.resources().wiring.blobs

    def items(tenant, dataset):
        found = metadata.get_dataset(Scope(tenant=tenant, dataset=dataset))
        return [] if found is None else metadata.list_items(found.id)

    def texts():
        return {f"{t}/{d}": [blobs.get(i.content_hash).decode() for i in items(t, d)]
                for t in ("acme", "umbra") for d in ("a", "b")}

    def search(tenant, **extra):
        return json.dumps(tasks.search_task({"query": query, "tenant": tenant, **extra}))

    found = {
        "umbra": [search("umbra", type="CHUNKS"), search("umbra", type="CHUNKS", datasets=["a", "b"]),
                  search("umbra", type="GRAPH_COMPLETION", only_context=True)],
        "acme": search("acme", type="CHUNKS", datasets=["a", "b"]),
        "added": tasks.add_task({"tenant": "umbra", "dataset": "a",
                                 "texts": [{"name": "n.txt", "text": "A note MKUMBRANEW."}]}),
        "after_add": texts(),
        "forgot_others": tasks.forget_task({"tenant": "umbra", "dataset": "a",
                                            "data_ids": [i.id for i in items("acme", "a")]}),
        "forgot_b": tasks.forget_task({"tenant": "umbra", "dataset": "b"}),
        "after_forget": texts(),
    }
    print(json.dumps(found))
    app.close_resources()
    """
)


@pytest.mark.redis
def test_tasks_by_name_act_for_the_request_tenant_and_read_only_the_worker_scopes(
    tmp_path: Path, redis_url: str, key_prefix: str
) -> None:
    # Given tenants acme and umbra with datasets a and b, and a worker that reads acme alone
    script = tmp_path / "service.py"
    script.write_text(SERVICE)
    # When a service searches, adds and forgets for umbra by task name
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "home"), redis_url, key_prefix, QUERY],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    # Then umbra's searches show no text of umbra (not in the worker's scopes), nor of acme
    for searched in found["umbra"]:
        assert "MKUMBRA" not in searched and "MKACME" not in searched
    assert marker("acme", "a") in found["acme"]  # what the worker may read, it reads
    # And the text added for umbra went into umbra's a alone
    after_add = found["after_add"]
    assert found["added"]["added"] == 1 and any("MKUMBRANEW" in t for t in after_add["umbra/a"])
    assert not any("MKUMBRANEW" in t for key, texts in after_add.items() if key != "umbra/a" for t in texts)
    # And forgetting acme's item ids under umbra's a forgot nothing; umbra's b went, acme's b stayed
    assert found["forgot_others"]["items"] == []
    assert found["after_forget"]["acme/a"] == after_add["acme/a"]
    assert found["after_forget"]["acme/b"] == after_add["acme/b"] and found["after_forget"]["umbra/b"] == []
    assert found["after_forget"]["umbra/a"] == after_add["umbra/a"]
