"""kenning against a real OpenAI-compatible server it did not write: the quick start, every
completion type and remember/recall, with the real local model of scripts/real_llm.sh.

Only the endpoint and the model differ from the defaults. Run with `make test-llm`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kenning.retrieval.contract import SearchType
from kenning.workers.memory import Kenning
from tests.integration.test_readme import SETUP, quick_start
from tests.real_llm.conftest import Cognified, real_settings

pytestmark = pytest.mark.real_llm

GUILD = "Who founded the Harrow Point lighthouse keepers' guild?"
FOUNDER = "Elinor Vance"
# The types that end in an answer from the model (TEMPORAL needs a temporal ingest, and
# NATURAL_LANGUAGE a FalkorDB graph with Cypher enabled: neither is the default).
COMPLETIONS = [
    SearchType.RAG_COMPLETION,
    SearchType.TRIPLET_COMPLETION,
    SearchType.GRAPH_COMPLETION,
    SearchType.HYBRID_COMPLETION,
    SearchType.GRAPH_SUMMARY_COMPLETION,
    SearchType.GRAPH_COMPLETION_COT,
    SearchType.GRAPH_COMPLETION_CONTEXT_EXTENSION,
    SearchType.GRAPH_COMPLETION_DECOMPOSITION,
    SearchType.FEELING_LUCKY,
    SearchType.AGENTIC_COMPLETION,
]


def kenning(command: str, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_quick_start_extracts_every_chunk_and_answers(tmp_path: Path, llm_env: dict[str, str]) -> None:
    # Given kenning on the PATH and the endpoint and model of the real server, nothing else set
    bin_dir = Path(sys.executable).parent
    env = {**llm_env, "PATH": f"{bin_dir}{os.pathsep}{llm_env.get('PATH', '')}"}
    # When the README's quick start runs as written
    for command in quick_start():
        if not command.startswith(SETUP):
            kenning(command, tmp_path, env)
    # Then every chunk was extracted and the graph holds what the model found
    (notes,) = json.loads(kenning("kenning status --dataset notes --json", tmp_path, env))["datasets"]
    assert notes["failed_chunks"] == [], notes["failed_chunks"]
    assert notes["items"] == {"done": 4}, notes["items"]
    assert notes["graph"]["edges"] > 0
    # And the model answers the guild question from it
    found = json.loads(kenning(f'kenning search "{GUILD}" --dataset notes --json', tmp_path, env))
    assert FOUNDER in found["context"], found["context"]
    assert "vance" in (found["answer"] or "").lower(), found["answer"]


def test_cognify_extracts_every_sample_chunk(samples: Cognified) -> None:
    stats = samples.run.stats
    assert samples.run.status.value == "completed", (samples.run.status, samples.run.error)
    assert stats["failed_chunks"] == 0, samples.memory.status("samples")[0]["failed_chunks"]
    assert stats["extractions"] == stats["chunks_to_extract"] > 0, stats
    assert stats["llm_calls"] > 0, stats


@pytest.mark.parametrize("search_type", COMPLETIONS, ids=str)
def test_every_completion_type_answers_from_the_real_model(
    samples: Cognified, search_type: SearchType
) -> None:
    # When the guild question is asked with the type
    result = samples.memory.search(GUILD, search_type, datasets=["samples"])
    # Then the context holds the founder and the model's answer names her
    assert result.answer and result.answer.strip(), result
    assert FOUNDER in result.context, result.context
    assert "vance" in result.answer.lower(), result.answer


def test_remember_then_recall_from_the_graph(llm_url: str, tmp_path: Path) -> None:
    with Kenning(real_settings(tmp_path, llm_url)) as memory:
        # When a fact is remembered without a session
        remembered = memory.remember("Melanie adopted a grey cat named Oliver in 2021.", dataset="chat")
        # Then it was made memory at once, and recall finds it in the graph
        assert remembered.status == "completed", remembered
        recalled = memory.recall("What is the name of Melanie's cat?", datasets=["chat"])
    assert any("Oliver" in hit.text and hit.source == "graph" for hit in recalled.results), recalled


def test_remember_in_a_session_then_recall_it_and_later_from_the_graph(llm_url: str, tmp_path: Path) -> None:
    fact = "Jon's sister Priya plays the cello in the Leeds city orchestra."
    question = "Which instrument does Priya play?"
    with Kenning(real_settings(tmp_path, llm_url)) as memory:
        # When a message is remembered in a session
        remembered = memory.remember(fact, dataset="chat", session_id="s1")
        # Then the session answers at once
        assert remembered.status == "queued" and remembered.session_entries, remembered
        now = memory.recall(question, datasets=["chat"], session_id="s1")
        assert any("cello" in hit.text and hit.source == "session" for hit in now.results), now
    # And once the background cognify is done (closing waits for it), the graph holds it too
    with Kenning(real_settings(tmp_path, llm_url)) as memory:
        (chat,) = memory.status("chat")
        assert chat["failed_chunks"] == [] and chat["items"] == {"done": 1}, chat
        later = memory.recall(question, datasets=["chat"])
    assert any("cello" in hit.text and hit.source == "graph" for hit in later.results), later
