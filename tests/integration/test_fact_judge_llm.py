"""The judgment of an entity's facts through the LLM client (`OpenAIExtractor.ask_structured`),
against the simulator: on every rung of structured output, with one repair of an unusable prompted
reply, retries of an unusable reply on the schema's rung, and the simulator's stand-in answer."""

from __future__ import annotations

from contextlib import closing
from typing import Any

import pytest

from kenning.pipeline.checks import REPLIES_REPAIRED
from kenning.pipeline.contradiction import Endings, FactJudge, endings_question
from kenning.pipeline.errors import LLMError
from kenning.storage.inference.llm_openai import OpenAIExtractor
from tests.integration.test_llm_ladder import config_for, first_draws_malformed_then_not, formats
from tests.simulator import StartSimulator


def fact(key: str, relationship: str, target: str, since: str, new: bool = False) -> dict[str, Any]:
    return {
        "id": key,
        "source": "Ana Berg",
        "relationship": relationship,
        "target": target,
        "since": since,
        "new": new,
    }


LISTING: dict[str, Any] = {
    "entity": "Ana Berg",
    "facts": [
        fact("f1", "play_for", "Celtic Rovers", "2021-03"),
        fact("f2", "visited", "Lyon", "2022-01-02"),
        fact("f3", "play_for", "Harbour United", "2023-05-01", new=True),
    ],
}
ENDED = Endings.model_validate({"endings": [{"fact": "f3", "ends": ["f1"]}]})


@pytest.mark.parametrize("accepts", ["json_schema", "json_object", "text"])
def test_the_judgment_is_asked_on_the_rung_the_server_takes(
    start_simulator: StartSimulator, accepts: str
) -> None:
    simulator = start_simulator(accepts=accepts)
    with closing(OpenAIExtractor(config_for(simulator))) as extractor:
        assert isinstance(extractor, FactJudge)
        endings, checks = extractor.ask_structured(*endings_question(LISTING), Endings, 512)
    assert endings == ENDED and checks == {}
    asked = {"json_schema": "json_schema", "json_object": "json_object", "text": None}[accepts]
    assert formats(simulator)[-1] == asked
    assert simulator.received()[-1]["max_tokens"] == 512


def test_an_unusable_prompted_judgment_gets_one_repair(start_simulator: StartSimulator) -> None:
    simulator = start_simulator(malformed_rate=0.5, seed=first_draws_malformed_then_not())
    with closing(OpenAIExtractor(config_for(simulator, structured="prompt"))) as extractor:
        endings, checks = extractor.ask_structured(*endings_question(LISTING), Endings, 512)
    assert endings == ENDED and checks == {REPLIES_REPAIRED: 1}
    assert len(simulator.received()) == 2


def test_a_judgment_unusable_on_the_schema_rung_is_retried_then_fails(
    start_simulator: StartSimulator,
) -> None:
    simulator = start_simulator(malformed_rate=1.0)
    with closing(OpenAIExtractor(config_for(simulator, max_retries=2))) as extractor:
        with pytest.raises(LLMError, match="not usable"):
            extractor.ask_structured(*endings_question(LISTING), Endings, 512)
        assert extractor.usage.calls == 3
