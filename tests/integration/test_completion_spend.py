"""Every LLM request of a search is counted once: `status`, the session record and `/metrics` show
what the provider (the simulator) saw, for every search type, on every surface."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kenning.pipeline.errors import KenningError
from kenning.pipeline.spend import Charge
from kenning.retrieval.contract import SearchType
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from tests.integration.cluster import ROOT
from tests.simulator import Simulator

TEXT = (
    "Marie Curie won the Nobel Prize in Physics in 1903 with Pierre Curie. "
    "Niels Bohr founded the Institute for Theoretical Physics in Copenhagen in 1921."
)
QUESTION = "Who won the Nobel Prize in Physics in 1903?"
PRICES = {"llm_price_prompt_per_1k": 0.15, "llm_price_completion_per_1k": 0.6}
# A caller-written graph query: no LLM request of its own (it answers nothing without one).
TYPES = [t for t in SearchType if t is not SearchType.CYPHER]


@pytest.fixture(scope="module")
def simulator() -> Iterator[Simulator]:
    with Simulator() as running:
        yield running


def online(home: Path, simulator: Simulator, **more: Any) -> Kenning:
    settings = load_settings(
        home=home,
        embedding_provider="hash",
        llm_url=simulator.base_url,
        llm_api_key="test",
        **PRICES,
        **more,
    )
    return Kenning(settings)


@pytest.fixture(scope="module")
def memory(tmp_path_factory: pytest.TempPathFactory, simulator: Simulator) -> Iterator[Kenning]:
    with online(tmp_path_factory.mktemp("spend") / "home", simulator, cypher_enabled=True) as made:
        made.add_text(TEXT, "science")
        made.cognify("science")
        yield made


def shown(memory: Kenning) -> tuple[int, int, int]:
    status = memory.status("science")[0]
    return status["llm_calls"], status["tokens"]["prompt"], status["tokens"]["completion"]


def billed(simulator: Simulator) -> tuple[int, int, int]:
    stats = simulator.stats()
    return stats["calls"]["chat"], stats["prompt_tokens"], stats["completion_tokens"]


@pytest.mark.parametrize("search_type", TYPES, ids=str)
def test_status_and_the_session_count_every_request_of_a_search(
    memory: Kenning, simulator: Simulator, search_type: SearchType
) -> None:
    # Given the dataset's status equal to what the provider billed so far
    assert shown(memory) == billed(simulator)
    before = billed(simulator)
    # When a search of that type runs in a session of its own
    session = f"s-{search_type.value.lower()}"
    try:
        memory.search(QUESTION, search_type, datasets=["science"], session_id=session)
    except KenningError:
        pass  # what it asked before it failed is counted all the same
    # Then status still equals what the provider billed, requests and tokens
    after = billed(simulator)
    assert shown(memory) == after
    # And the session's record holds exactly this search's requests
    record = memory.session_summary(session)
    calls, prompt, completion = (now - then for now, then in zip(after, before, strict=True))
    assert (record.llm_calls, record.tokens_in, record.tokens_out) == (calls, prompt, completion)
    assert sum(usage.calls for usage in record.models.values()) == calls


def test_a_completion_search_makes_requests_the_dataset_is_charged_for(
    memory: Kenning, simulator: Simulator
) -> None:
    # Given a dataset cognified (its extraction requests)
    extraction = memory.status("science")[0]["spend"]["extraction"]["llm_calls"]
    before = billed(simulator)[0]
    # When RAG_COMPLETION and GRAPH_COMPLETION answer
    memory.search(QUESTION, "RAG_COMPLETION", datasets=["science"])
    memory.search(QUESTION, "GRAPH_COMPLETION", datasets=["science"])
    # Then the provider saw two more requests, and status shows them as completions, priced
    assert billed(simulator)[0] == before + 2
    status = memory.status("science")[0]
    assert status["spend"]["extraction"]["llm_calls"] == extraction
    completion = status["spend"]["completion"]
    assert completion["llm_calls"] >= 2 and completion["cost"] > 0
    assert status["llm_calls"] == extraction + completion["llm_calls"] == billed(simulator)[0]


def test_a_natural_language_query_counts_the_requests_that_wrote_its_cypher(
    tmp_path: Path, simulator: Simulator, falkordb_url: str
) -> None:
    # Given a dataset on FalkorDB, where Cypher runs, and Cypher allowed
    more = {"graph_backend": "falkordb", "graph_url": falkordb_url, "cypher_enabled": True}
    with online(tmp_path / "home", simulator, **more) as memory:
        memory.add_text(TEXT, "nl")
        memory.cognify("nl")
        before = billed(simulator)[0]
        status_before = memory.status("nl")[0]["llm_calls"]
        # When a question is asked in natural language (the LLM writes the Cypher, then answers)
        try:
            memory.search(QUESTION, "NATURAL_LANGUAGE", datasets=["nl"], session_id="nl")
        except KenningError:
            pass
        # Then every request it made is counted, in status and in the session
        made = billed(simulator)[0] - before
        assert made >= 1
        assert memory.status("nl")[0]["llm_calls"] - status_before == made
        assert memory.session_summary("nl").llm_calls == made


QUERY_WORKER = textwrap.dedent(
    """
    import json, sys
    from kenning.workers.celery.app import app
    from kenning.workers.memory import Kenning
    from kenning.workers.runtime.settings import load_settings
    from kenning.workers.services import tasks

    home, redis_url, prefix, llm_url, question = sys.argv[1:6]
    base = dict(home=home, embedding_provider="hash", llm_url=llm_url, llm_api_key="test")
    with Kenning(load_settings(**base)) as memory:
        memory.add_text("Marie Curie won the Nobel Prize in Physics in 1903.", "worker")
        memory.cognify("worker")
    app.use_settings(load_settings(**base, redis_url=redis_url, broker_url=redis_url, queue_prefix=prefix))
    answered = tasks.search_task({"query": question, "type": "GRAPH_COMPLETION_COT", "datasets": ["worker"]})
    app.close_resources()
    with Kenning(load_settings(**base)) as memory:
        status = memory.status("worker")[0]
    print(json.dumps({"answer": answered["answer"], "status": status}))
    """
)


@pytest.mark.redis
def test_a_query_worker_counts_the_requests_of_its_searches(
    tmp_path: Path, simulator: Simulator, redis_url: str, key_prefix: str
) -> None:
    # Given a dataset cognified, and a query worker on its home
    script = tmp_path / "worker.py"
    script.write_text(QUERY_WORKER)
    before = billed(simulator)
    # When the worker answers a search sent by name (its chain of thought makes several requests)
    done = subprocess.run(
        [
            sys.executable,
            str(script),
            str(tmp_path / "home"),
            redis_url,
            key_prefix,
            simulator.base_url,
            QUESTION,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    # Then the dataset's status shows every request the provider saw, its completions apart
    assert found["answer"]
    made = tuple(now - then for now, then in zip(billed(simulator), before, strict=True))
    status = found["status"]
    assert (status["llm_calls"], status["tokens"]["prompt"], status["tokens"]["completion"]) == made
    assert status["spend"]["completion"]["llm_calls"] >= 2


def test_a_run_recorded_before_the_ledger_counts_by_its_own_counters(tmp_path: Path) -> None:
    # Given a run whose requests the ledger never saw (it was made before it), and a search's
    settings = load_settings(home=tmp_path / "home", embedding_provider="hash")
    with Kenning(settings) as memory:
        memory.add_text(TEXT, "old")
        run = memory.cognify("old")
        stats = {**run.stats, "llm_calls": 3, "prompt_tokens": 300, "completion_tokens": 30}
        memory.wiring.metadata.save_run(run.model_copy(update={"stats": stats}))
        dataset = memory.dataset("old")
        memory.wiring.spend.sent("a1", Charge("search-1", dataset.id, "completion"), "m", 10, 0)
        memory.wiring.spend.answered("a1", 10, 2)
        # Then status counts the run by its counters, as an extraction, and the search apart
        status = memory.status("old")[0]
    assert status["runs"][0]["llm_calls"] == 3
    assert status["spend"]["extraction"]["llm_calls"] == 3
    assert status["spend"]["completion"]["llm_calls"] == 1
    assert (status["llm_calls"], status["tokens"]) == (4, {"prompt": 310, "completion": 32})
