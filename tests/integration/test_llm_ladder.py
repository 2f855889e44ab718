"""Structured output that fits the server: the extractor's ladder against simulators that refuse
`json_schema` as llama-cpp-python does, and `json_object` too; max_tokens and cut replies."""

from __future__ import annotations

import random
from contextlib import closing
from typing import Any

import pytest

from kenning.pipeline.checks import REPLIES_CUT_KEPT, REPLIES_REPAIRED, REPLIES_SALVAGED, REPLIES_SPLIT
from kenning.pipeline.errors import LLMError, TransientLLMError
from kenning.pipeline.ladder import Rung
from kenning.pipeline.models import Extraction
from kenning.pipeline.offline import OfflineExtractor
from kenning.storage.inference.llm_openai import (
    LOOP_STOP_TIMES,
    LOOP_TAIL,
    LLMConfig,
    OpenAIExtractor,
    repeats_at_end,
    salvaged_cut,
    salvaged_loop,
    split_in_two,
    tolerant_extraction,
)
from kenning.storage.metadata.memory import MemoryOutputRungs
from tests.simulator import _MALFORMED_CONTENT, Simulator, StartSimulator

TEXT = (
    "Ada Lovelace worked with Charles Babbage in London. "
    "She published her notes on the Analytical Engine in 1843."
)
LONG = (
    "Elinor Vance founded the Harrow Point keepers' guild in Portsmouth. Samuel Vance kept the light "
    "at Harrow Point for thirty years.\n\nThe Marigold ran aground near Gull Rock in 1931. Thomas Reed "
    "rowed out from Harrow Point with Martha Reed and brought the crew of the Marigold ashore."
)


def config_for(simulator: Simulator, **overrides: Any) -> LLMConfig:
    settings: dict[str, Any] = {
        "base_url": simulator.base_url,
        "model": "sim-model",
        "timeout_s": 10.0,
        "max_retries": 3,
        "backoff_base_s": 0.01,
    }
    return LLMConfig(**(settings | overrides))


def formats(simulator: Simulator) -> list[str | None]:
    """The response format type of each chat request the simulator received, in order."""
    return [(body.get("response_format") or {}).get("type") for body in simulator.received()]


def test_a_server_taking_json_object_is_asked_with_the_schema_beside_it(
    start_simulator: StartSimulator,
) -> None:
    # Given a server that answers json_schema with a 500 naming response_format (llama-cpp-python)
    simulator = start_simulator(accepts="json_object")
    rungs = MemoryOutputRungs()
    with closing(OpenAIExtractor(config_for(simulator), rungs=rungs)) as extractor:
        # When two chunks are extracted
        first = extractor.extract(TEXT)
        second = extractor.extract(f"{TEXT} Again.")
        usage = extractor.usage

    # Then the refusal moved it down at once (no retry), and json_object with the schema worked
    assert first == OfflineExtractor().extract(TEXT)
    assert second == OfflineExtractor().extract(f"{TEXT} Again.")
    assert formats(simulator) == ["json_schema", "json_object", "json_object"]
    assert simulator.received()[1]["response_format"]["schema"] == Extraction.model_json_schema()
    assert simulator.stats()["format_refused"] == 1
    assert usage.retries == 0
    # And the rung is remembered for the endpoint's model
    found = rungs.rung(simulator.base_url, "sim-model")
    assert found is not None and found.rung is Rung.JSON_OBJECT


def test_a_remembered_rung_is_where_another_extractor_starts(start_simulator: StartSimulator) -> None:
    # Given the rung a first process found
    simulator = start_simulator(accepts="json_object")
    rungs = MemoryOutputRungs()
    with closing(OpenAIExtractor(config_for(simulator), rungs=rungs)) as extractor:
        extractor.extract(TEXT)
    simulator.reset()
    # When another extractor sharing the store extracts
    with closing(OpenAIExtractor(config_for(simulator), rungs=rungs)) as other:
        assert other.rung is Rung.JSON_OBJECT
        other.extract(TEXT)
    # Then it asks on that rung straight away
    assert simulator.stats()["format_refused"] == 0
    assert formats(simulator)[-1] == "json_object"


def test_a_server_taking_no_response_format_gets_a_prompt_read_tolerantly(
    start_simulator: StartSimulator,
) -> None:
    # Given a server refusing json_schema and json_object (it answers the JSON in a code fence)
    simulator = start_simulator(accepts="text")
    rungs = MemoryOutputRungs()
    with closing(OpenAIExtractor(config_for(simulator), rungs=rungs)) as extractor:
        extraction = extractor.extract(TEXT)
        again = extractor.extract(TEXT)

    # Then it went down two rungs, one request each, and read the fenced reply
    assert extraction == again == OfflineExtractor().extract(TEXT)
    assert formats(simulator) == ["json_schema", "json_object", None, None]
    prompt = simulator.received()[2]["messages"][0]["content"]
    assert "JSON schema" in prompt and '"graph"' in prompt
    found = rungs.rung(simulator.base_url, "sim-model")
    assert found is not None and found.rung is Rung.PROMPT


def test_a_forced_rung_is_asked_alone_and_its_refusal_says_why(start_simulator: StartSimulator) -> None:
    # Given KENNING_LLM_STRUCTURED=json_schema against a server that does not take it
    simulator = start_simulator(accepts="json_object")
    rungs = MemoryOutputRungs()
    config = config_for(simulator, structured="json_schema")
    with closing(OpenAIExtractor(config, rungs=rungs)) as extractor:
        # When a chunk is extracted
        with pytest.raises(LLMError) as raised:
            extractor.extract(TEXT)
        usage = extractor.usage

    # Then it failed at once, with the endpoint's own words, and nothing was remembered
    message = str(raised.value)
    assert not isinstance(raised.value, TransientLLMError)
    assert "HTTP 500" in message and "response_format" in message and "forced" in message
    assert usage.calls == 1 and usage.retries == 0
    assert rungs.rung(simulator.base_url, "sim-model") is None


def test_a_forced_lower_rung_is_used_on_a_server_taking_more(start_simulator: StartSimulator) -> None:
    simulator = start_simulator()
    with closing(OpenAIExtractor(config_for(simulator, structured="prompt"))) as extractor:
        assert extractor.extract(TEXT) == OfflineExtractor().extract(TEXT)
    assert formats(simulator) == [None]


def test_a_server_error_not_about_the_format_is_retried_and_its_text_kept(
    start_simulator: StartSimulator,
) -> None:
    simulator = start_simulator(error_rate=1.0)
    with closing(OpenAIExtractor(config_for(simulator, max_retries=1, api_key="sk-secret"))) as extractor:
        with pytest.raises(TransientLLMError) as raised:
            extractor.extract(TEXT)

    assert "HTTP 500: simulated server error" in str(raised.value)
    assert "sk-secret" not in str(raised.value)
    assert formats(simulator) == ["json_schema", "json_schema"]


def first_draws_malformed_then_not() -> int:
    """A simulator seed whose first chat is garbled (rate 0.5) and whose second is not."""
    for seed in range(1000):
        draws = random.Random(seed)
        if draws.random() < 0.5 <= draws.random():
            return seed
    raise AssertionError("no such seed")


def test_an_unusable_prompted_reply_gets_one_repair_request(start_simulator: StartSimulator) -> None:
    # Given a prompted server whose first reply is garbled JSON
    simulator = start_simulator(malformed_rate=0.5, seed=first_draws_malformed_then_not())
    with closing(OpenAIExtractor(config_for(simulator, structured="prompt"))) as extractor:
        # When a chunk is extracted
        extraction = extractor.extract(TEXT)

    # Then the reply and the problem were sent back once, and the repaired reply was used
    assert extraction == OfflineExtractor().extract(TEXT)
    assert extraction.checks == {REPLIES_REPAIRED: 1}
    first, repair = simulator.received()
    assert [m["role"] for m in repair["messages"]] == ["system", "user", "assistant", "user"]
    assert repair["messages"][2]["content"] == _MALFORMED_CONTENT
    assert "could not be used" in repair["messages"][3]["content"]


def test_a_reply_unusable_after_its_repair_fails_the_chunk_without_retries(
    start_simulator: StartSimulator,
) -> None:
    simulator = start_simulator(malformed_rate=1.0)
    with closing(OpenAIExtractor(config_for(simulator, structured="prompt"))) as extractor:
        with pytest.raises(LLMError, match="even repaired once") as raised:
            extractor.extract(TEXT)
        usage = extractor.usage

    assert not isinstance(raised.value, TransientLLMError)
    assert usage.calls == 2 and usage.retries == 0


def test_extraction_requests_carry_max_tokens_sized_from_their_text(start_simulator: StartSimulator) -> None:
    simulator = start_simulator()
    config = config_for(
        simulator, output_tokens_per_input=2.0, min_output_tokens=16, max_output_tokens=10_000
    )
    with closing(OpenAIExtractor(config)) as extractor:
        extractor.extract(TEXT)
        extractor.extract(TEXT * 20)

    short, long = (body["max_tokens"] for body in simulator.received())
    assert short == 2 * ((len(TEXT) + 3) // 4)
    assert long > 10 * short


def test_max_tokens_stays_within_its_bounds(start_simulator: StartSimulator) -> None:
    simulator = start_simulator()
    config = config_for(simulator, min_output_tokens=300, max_output_tokens=400)
    with closing(OpenAIExtractor(config)) as extractor:
        extractor.extract("Ada.")
        extractor.extract(TEXT * 50)

    assert [body["max_tokens"] for body in simulator.received()] == [300, 400]


def test_a_reply_cut_at_max_tokens_is_asked_again_as_two_halves(start_simulator: StartSimulator) -> None:
    # Given a server that cuts replies at max_tokens, and a cap the whole text's reply passes
    simulator = start_simulator(honor_max_tokens=True)
    whole = len(OfflineExtractor().extract(LONG).model_dump_json()) // 4
    halves = split_in_two(LONG)
    assert halves is not None
    parts = [len(OfflineExtractor().extract(half).model_dump_json()) // 4 for half in halves]
    cap = (whole + max(parts)) // 2
    assert max(parts) < cap < whole
    config = config_for(simulator, min_output_tokens=cap, max_output_tokens=cap)
    with closing(OpenAIExtractor(config)) as extractor:
        # When the text is extracted
        extraction = extractor.extract(LONG)

    # Then the cut reply was followed by one request per half, merged into one extraction
    assert len(simulator.received()) == 3
    assert extraction.checks == {REPLIES_SPLIT: 1}
    names = {node.name for node in extraction.graph.nodes}
    expected = {node.name for half in halves for node in OfflineExtractor().extract(half).graph.nodes}
    assert names == expected and {"Elinor Vance", "Marigold"} <= names
    ids = [node.id for node in extraction.graph.nodes]
    assert len(ids) == len(set(ids))
    assert extraction.usage is not None
    assert extraction.usage.completion_tokens == simulator.stats()["completion_tokens"]


def test_a_reply_cut_again_on_half_the_text_fails_the_chunk(start_simulator: StartSimulator) -> None:
    simulator = start_simulator(honor_max_tokens=True)
    config = config_for(simulator, min_output_tokens=8, max_output_tokens=8)
    with closing(OpenAIExtractor(config)) as extractor:
        with pytest.raises(LLMError, match="cut off .* for the whole text and for half of it"):
            extractor.extract(LONG)

    assert len(simulator.received()) == 2


def test_a_half_cut_again_keeps_what_its_reply_holds_whole(start_simulator: StartSimulator) -> None:
    # Given a server that cuts replies at max_tokens, and a cap each half's reply passes only in part
    simulator = start_simulator(honor_max_tokens=True)
    halves = split_in_two(LONG)
    assert halves is not None
    shortest = min(len(OfflineExtractor().extract(half).model_dump_json()) // 4 for half in halves)
    cap = shortest * 2 // 3
    config = config_for(simulator, min_output_tokens=cap, max_output_tokens=cap)
    with closing(OpenAIExtractor(config)) as extractor:
        # When the text is extracted
        extraction = extractor.extract(LONG)

    # Then the text and each half were asked once, and each half's whole nodes were kept, counted
    assert len(simulator.received()) == 3
    assert extraction.checks == {REPLIES_SPLIT: 1, REPLIES_CUT_KEPT: 2}
    names = {node.name for node in extraction.graph.nodes}
    assert "Elinor Vance" in names and "Marigold" in names
    assert len(names) < len({n.name for h in halves for n in OfflineExtractor().extract(h).graph.nodes})
    assert extraction.usage is not None
    assert extraction.usage.completion_tokens == simulator.stats()["completion_tokens"]


def test_a_reply_looping_until_it_is_cut_keeps_what_it_holds_whole(
    start_simulator: StartSimulator,
) -> None:
    # Given a model that repeats a fact until max_tokens cuts its reply, as small models do
    simulator = start_simulator(honor_max_tokens=True, loops=True)
    expected = OfflineExtractor().extract(LONG)
    cap = len(expected.model_dump_json()) // 4 + 100  # the whole extraction and a few repeats
    config = config_for(simulator, min_output_tokens=cap, max_output_tokens=cap)
    with closing(OpenAIExtractor(config)) as extractor:
        # When the text is extracted
        extraction = extractor.extract(LONG)

    # Then the cut reply was not asked again, on the text or its halves (they would loop too):
    # what it held whole was kept, each fact once, and the salvage counted
    assert len(simulator.received()) == 1
    assert extraction.checks == {REPLIES_SALVAGED: 1}
    assert [node.name for node in extraction.graph.nodes] == [node.name for node in expected.graph.nodes]
    assert extraction.graph.edges == expected.graph.edges
    assert extraction.usage is not None and extraction.usage.completion_tokens == cap


@pytest.mark.parametrize("cycle", [False, True], ids=["one-fact", "every-fact-in-turn"])
def test_a_streamed_reply_that_loops_is_stopped_where_it_starts_repeating(
    start_simulator: StartSimulator, cycle: bool
) -> None:
    # Given a model that repeats a fact far past its reply, or lists all its facts again and
    # again in turn (a cycle longer than the repeats a reply's end is searched for), streamed a
    # few characters a part, under a max_tokens with room for thousands of repeats
    expected = OfflineExtractor().extract(LONG)
    facts = len(expected.graph.edges) if cycle else 1
    if cycle:
        assert sum(len(edge.model_dump_json()) for edge in expected.graph.edges) * LOOP_STOP_TIMES > LOOP_TAIL
    simulator = start_simulator(honor_max_tokens=True, loops=facts, serial=True)
    whole = len(expected.model_dump_json()) // 4
    cap = 4096
    config = config_for(simulator, min_output_tokens=cap, max_output_tokens=cap)
    with closing(OpenAIExtractor(config)) as extractor:
        # When the text is extracted
        extraction = extractor.extract(LONG)

    # Then the reply was read only until it had repeated itself a few times, not to max_tokens,
    # and what it held whole was kept, once
    assert len(simulator.received()) == 1
    assert extraction.checks == {REPLIES_SALVAGED: 1}
    assert extraction.usage is not None and extraction.usage.completion_tokens < whole * 2 < cap
    assert [node.name for node in extraction.graph.nodes] == [node.name for node in expected.graph.nodes]
    assert extraction.graph.edges == expected.graph.edges


def test_tolerant_reading_takes_a_fenced_or_flattened_reply() -> None:
    flat = '{"nodes": [{"name": "Ada Lovelace", "type": "Person"}], "edges": [], "summary": "Ada."}'
    reply = f"Sure! Here it is:\n```json\n{flat}\n```\nAnything else?"

    extraction = tolerant_extraction(reply)

    assert [(node.id, node.name) for node in extraction.graph.nodes] == [("Ada Lovelace", "Ada Lovelace")]
    assert extraction.summary == "Ada."
    with pytest.raises(ValueError, match="no JSON object"):
        tolerant_extraction("I cannot help with that.")
    with pytest.raises(ValueError):
        tolerant_extraction('{"graph": {"nodes": [{"id": 3}]}}')


def test_split_in_two_cuts_near_the_middle_at_a_paragraph() -> None:
    halves = split_in_two(LONG)

    assert halves is not None
    assert halves[0].endswith("thirty years.") and halves[1].startswith("The Marigold")
    assert split_in_two("Word") is None


def test_a_reply_cut_while_it_repeats_words_keeps_the_items_it_holds_whole() -> None:
    # Given a reply cut while a description said the same words over and over
    loop = "the lighthouse keeper kept the light, " * 40
    node = '{"id": "ada", "name": "Ada Lovelace", "type": "Person"}'
    edge = '{"source": "ada", "target": "ada2", "relationship": "met", "description": "' + loop
    reply = '{"graph": {"nodes": [' + node + ', {"id": "ada2", "name": "Charles Babbage"}], "edges": [' + edge

    # When what it holds is salvaged
    kept = salvaged_loop(reply[: len(reply) - 7])

    # Then its whole nodes are kept and the fact being written at the cut is left out
    assert kept is not None
    assert [n.name for n in kept.graph.nodes] == ["Ada Lovelace", "Charles Babbage"]
    assert kept.graph.edges == []
    # And a reply cut without repeating itself is not salvaged (its text's halves may each fit)
    assert salvaged_loop('{"graph": {"nodes": [' + node + ', {"id": "b", "name": "Charles Bab') is None
    assert not repeats_at_end("Ada Lovelace met Charles Babbage in London in 1833, at a party")
    assert not repeats_at_end('{"graph": {"nodes": [\n' + " " * 64)  # indentation, not a loop
    # But read as a cut reply, looping or not, it keeps its whole node
    cut = salvaged_cut('{"graph": {"nodes": [' + node + ', {"id": "b", "name": "Charles Bab')
    assert cut is not None and [n.name for n in cut.graph.nodes] == ["Ada Lovelace"]
