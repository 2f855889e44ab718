"""kenning's defaults against a model server on one CPU, as people run one on a laptop.

The simulator in its `serial` mode behaves like llama-cpp-python's server with a small model on a
CPU: one request answered at a time, the others waiting their turn in order; replies streamed a
token at a time, the long one taking more than a minute; a stream ended early when another
request comes in; `json_schema` refused. Nothing is set but the URL and the model (and hashed
embeddings, which call no server).

With every extraction sent at once and each request timed as a whole (60 s, the default), the
long reply times out even alone; its retry waits behind the answer it abandoned, which the
server finishes anyway, and times out again, until the breaker opens or the call's deadline ends.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kenning.pipeline.offline import OfflineExtractor
from kenning.workers.control.runs import llm_breaker
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from tests.simulator import Simulator, estimate_tokens

pytestmark = pytest.mark.slow

MODEL = "qwen2.5-coder-1.5b-instruct-q4_k_m"
LONG = (
    "Elinor Vance founded the Harrow Point keepers guild in 1871 with her father Samuel Vance. "
    "Thomas Reed fitted a paraffin lamp at Harrow Point Lighthouse in 1868 for the Northern "
    "Lighthouse Board. The Osprey, a ship of the Blackwall Line, ran aground near Harrow Point in "
    "1889. Divers from Portsmouth recovered the porcelain of the Osprey near Harrow Point in 1890. "
    "Margaret Hale kept the logbook of the Harrow Point Lighthouse from 1902 to 1931."
)
NOTES = [LONG, "Ada Lovelace met Charles Babbage in London.", "The Marigold sank off Harrow Point in 1911."]
# Seconds the long reply streams: more than the default request timeout of 60 s (the short ones
# take about six seconds).
LONG_REPLY_S = 66.0


def token_ms() -> float:
    """Milliseconds a token such that the long extraction's reply takes `LONG_REPLY_S`."""
    return LONG_REPLY_S * 1000 / estimate_tokens(OfflineExtractor().extract(LONG).model_dump_json())


def test_every_chunk_is_extracted_from_a_one_request_at_a_time_server_with_the_defaults(
    tmp_path: Path,
) -> None:
    # Given a server like llama-cpp-python's on a CPU, and kenning with its defaults
    with Simulator(
        serial=True, interrupts=True, accepts="json_object", latency_ms=1000, token_ms=token_ms()
    ) as simulator:
        settings = load_settings(
            home=tmp_path / "home", embedding_provider="hash", llm_url=simulator.base_url, llm_model=MODEL
        )
        with Kenning(settings) as memory:
            for number, note in enumerate(NOTES):
                memory.add_text(note, "harbour", name=f"note-{number}")
            # When the notes are cognified
            run = memory.cognify("harbour")
            [status] = memory.status("harbour")
            breaker = llm_breaker(memory)
            extractor = memory.wiring.extractor

    # Then every chunk was extracted, nothing failed, and the breaker stayed closed
    assert run.status.value == "completed", (run.error, status["failed_chunks"])
    assert run.stats["failed_chunks"] == 0 and run.stats["extractions"] == len(NOTES), run.stats
    assert breaker is None or breaker["breaker"] == "closed", breaker
    # And the server is asked one request at a time, since it was seen to take no more
    window = extractor.window  # type: ignore[attr-defined]
    assert window.limit == 1 and window.ceiling == 1
    # And the graph holds what the notes say
    with Kenning(settings) as memory:
        nodes, _ = memory.wiring.graph.export(memory.scope("harbour"))
    assert {"Elinor Vance", "Osprey", "Marigold"} <= {node.properties.get("name") for node in nodes}
