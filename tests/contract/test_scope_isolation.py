"""Whatever the tenants, datasets, read scopes and search type, raw Cypher included, no
result ever comes from a dataset outside the caller's scope (FalkorDB graph, real stores)."""

from __future__ import annotations

import json
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kenning.pipeline.errors import InputError, NoLLMConfigured
from kenning.pipeline.models import Scope
from kenning.pipeline.permission import Caller
from kenning.retrieval.contract import Principal, SearchType
from kenning.retrieval.registry import REGISTRY
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import Settings, load_settings
from kenning.workers.runtime.wiring import Wiring

# Raw queries with no tenant or dataset filter: they return another dataset's text if anything can.
RAW = "MATCH (n) RETURN n.text AS text, n.name AS name"
QUESTION = "What is kept in the archive?"
# Separators and glob characters a name may hold (a "/" is refused at the boundary: see pipeline.names)
NAMES = st.text(alphabet="ab:%*?[", min_size=1, max_size=3)


class CypherWriter:
    """Writes the unfiltered query when asked for Cypher; otherwise there is no LLM."""

    def complete(self, system: str, prompt: str) -> str:
        if "Cypher" in system:
            return RAW
        raise NoLLMConfigured("no LLM is configured")


def marker(index: int) -> str:
    # Never a substring of another: Qx1Zz is not in Qx11Zz.
    return f"Qx{index}Zz"


@st.composite
def worlds(draw: st.DrawFn) -> dict[str, Any]:
    tenants = draw(st.lists(NAMES, min_size=1, max_size=2, unique=True))
    pairs = draw(st.lists(st.tuples(st.sampled_from(tenants), NAMES), min_size=2, max_size=4, unique=True))
    caller = draw(st.sampled_from([*tenants, *tenants, "outsider"]))
    known = sorted({dataset for _, dataset in pairs})
    wanted = draw(st.lists(st.sampled_from([*known, "doesnotexist"]), min_size=1, max_size=3, unique=True))
    patterns = [f"{caller}/*", "*", "*/*", *(f"{t}/{d}" for t, d in pairs), *(f"{t}/*" for t in tenants)]
    read_scopes = draw(st.lists(st.sampled_from(patterns), max_size=2, unique=True))
    return {"pairs": pairs, "caller": caller, "wanted": wanted, "read_scopes": read_scopes}


def base_settings(home: Path, falkordb_url: str, graph_name: str, **overrides: Any) -> Settings:
    return load_settings(
        home=home,
        embedding_provider="hash",
        graph_backend="falkordb",
        graph_url=falkordb_url,
        graph_name=graph_name,
        cypher_enabled=True,
        session_backend="none",
        **overrides,
    )


@pytest.mark.falkordb
@settings(
    max_examples=10,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(world=worlds())
def test_no_search_type_returns_data_outside_the_caller_s_scope(
    falkordb_url: str, world: dict[str, Any]
) -> None:
    graph_name = f"isolation-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as home:
        wiring = Wiring(base_settings(Path(home), falkordb_url, graph_name), {"completer": CypherWriter()})
        try:
            # Given a small text with its own marker in each (tenant, dataset)
            markers: dict[tuple[str, str], str] = {}
            for index, (tenant, dataset) in enumerate(world["pairs"]):
                markers[(tenant, dataset)] = marker(index)
                owner = Kenning(wiring.settings, wiring).as_caller(
                    Caller(tenant=tenant, user="owner", admin=True)
                )
                owner.add_text(f"{marker(index)} is kept in the archive.", dataset=dataset)
                assert owner.cognify(dataset).status.value == "completed"

            # And a caller with its own tenant, read scopes and datasets it asks for
            # (no read scopes: the datasets of its own tenant)
            scopes = tuple(world["read_scopes"]) or None
            caller = Kenning(wiring.settings, wiring).as_caller(
                Caller(tenant=world["caller"], user="caller", admin=True, scopes=scopes)
            )
            principal = caller.principal()
            allowed = {
                markers[key]
                for key in markers
                if key[0] == world["caller"]
                and key[1] in world["wanted"]
                and principal.may_read(Scope(tenant=key[0], dataset=key[1]))
            }

            # (a dataset it may read that does not exist is an error naming only datasets it may read)
            own = {dataset for tenant, dataset in world["pairs"] if tenant == world["caller"]}
            missing = [
                dataset
                for dataset in world["wanted"]
                if dataset not in own and principal.may_read(Scope(tenant=world["caller"], dataset=dataset))
            ]
            if missing:
                with pytest.raises(InputError) as raised:
                    caller.search(QUESTION, SearchType.CHUNKS, datasets=world["wanted"])
                listed = str(raised.value).split("(datasets: ", 1)[1].removesuffix(")")
                readable = {d for d in own if principal.may_read(Scope(tenant=world["caller"], dataset=d))}
                assert listed == (", ".join(sorted(readable)) or "none"), (world, str(raised.value))
                assert not any(m in str(raised.value) for m in markers.values())
            wanted = [dataset for dataset in world["wanted"] if dataset not in missing]
            if not wanted:
                return

            # When it searches with every registered type
            for kind in REGISTRY:
                query = RAW if kind == SearchType.CYPHER else QUESTION
                result = caller.search(query, kind, datasets=wanted, top_k=50)
                seen = {m for m in markers.values() if m in json.dumps(result.model_dump())}

                # Then it sees nothing outside its scope; raw Cypher sees all of its scope
                assert seen <= allowed, (kind, world, seen - allowed)
                if kind in (SearchType.CYPHER, SearchType.NATURAL_LANGUAGE):
                    assert seen == allowed, (kind, world)
        finally:
            wiring.close()
            drop_graphs(falkordb_url, graph_name)


def drop_graphs(falkordb_url: str, graph_name: str) -> None:
    client = redis.Redis.from_url(falkordb_url, decode_responses=True)
    try:
        for key in client.execute_command("GRAPH.LIST"):
            if key.startswith(f"{graph_name}:"):
                client.execute_command("GRAPH.DELETE", key)
    finally:
        client.close()


def test_a_principal_reads_its_own_tenant_only_unless_read_scopes_say_more() -> None:
    own = Principal(tenant="a")
    assert own.may_read(Scope(tenant="a", dataset="x/y"))
    assert not own.may_read(Scope(tenant="a/x", dataset="y"))
    assert not own.may_read(Scope(tenant="b", dataset="x"))
    listed = Principal(tenant="a", read_scopes=("a/main", "b/*"))
    assert listed.may_read(Scope(tenant="b", dataset="x"))
    assert not listed.may_read(Scope(tenant="a", dataset="other"))
    assert not Principal().may_run_cypher
