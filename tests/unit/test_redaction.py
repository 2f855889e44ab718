"""Errors of the LLM and embedding endpoints carry no credentials and no provider body at length."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from kenning.pipeline.errors import LLMError
from kenning.pipeline.ratelimit import provider_key
from kenning.pipeline.redact import MAX_ERROR_CHARS, provider_error, redact_url, safe_error_text
from kenning.pipeline.spend import breaker_key
from kenning.storage.inference.embedder import OpenAIEmbedder
from kenning.storage.inference.llm_openai import LLMConfig, OpenAICompleter, OpenAIExtractor
from tests.simulator import Simulator

SECRET = "s3cr3t-pass"


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def config(base_url: str, **overrides: object) -> LLMConfig:
    fields = {"base_url": base_url, "api_key": "sk-key-" + SECRET, "model": "m", "max_retries": 0}
    return LLMConfig.model_validate({**fields, "backoff_base_s": 0, "breaker_failures": 2, **overrides})


def test_redact_url_takes_the_userinfo_out_of_every_url() -> None:
    text = (
        f"at http://user:{SECRET}@127.0.0.1:1/v1 and https://u%40x:{SECRET}@h.example/p?q=a@b, http://plain/x"
    )
    assert redact_url(text) == "at http://127.0.0.1:1/v1 and https://h.example/p?q=a@b, http://plain/x"


def test_safe_error_text_is_one_bounded_line_without_secrets() -> None:
    body = f"key sk-{SECRET} refused at http://a:{SECRET}@h/v1 " + "x" * 5000 + "\nmore lines"
    summary = safe_error_text(body, secrets=[f"sk-{SECRET}"])
    assert SECRET not in summary and "\n" not in summary and len(summary) <= MAX_ERROR_CHARS
    assert provider_error(400, body).startswith("HTTP 400: key")


@pytest.mark.parametrize("make", [OpenAICompleter, OpenAIExtractor])
def test_an_unreachable_llm_with_credentials_in_its_url_fails_without_them(
    make: type[OpenAICompleter] | type[OpenAIExtractor], caplog: pytest.LogCaptureFixture
) -> None:
    # Given an LLM client pointed at a closed port through a URL with a user and password
    caller = make(config(f"http://user:{SECRET}@127.0.0.1:{closed_port()}/v1"))
    # When it is called until its breaker opens
    texts: list[str] = []
    with caplog.at_level(logging.DEBUG):
        for _ in range(3):
            with pytest.raises(LLMError) as raised:
                if isinstance(caller, OpenAICompleter):
                    caller.complete("system", "question")
                else:
                    caller.extract("some text")
            texts.append(str(raised.value))
    caller.close()
    # Then every error names the endpoint without its credentials, and no log line holds them
    assert all("127.0.0.1" in text and SECRET not in text for text in texts), texts
    assert "circuit breaker open" in texts[-1]
    assert SECRET not in caplog.text


def test_a_refusal_with_a_long_body_becomes_a_short_error_without_credentials() -> None:
    # Given an LLM that refuses a text with a long body echoing its URL and the API key
    refusal = f"bad request for http://user:{SECRET}@127.0.0.1/v1 with key sk-key-{SECRET} " + "y" * 20_000
    with Simulator(fail_on="REFUSE", refusal=refusal) as simulator:
        url = simulator.base_url.replace("http://", f"http://user:{SECRET}@")
        extractor = OpenAIExtractor(config(url))
        # When a chunk it refuses is extracted
        with pytest.raises(LLMError) as raised:
            extractor.extract("REFUSE this chunk")
        extractor.close()
    # Then the error says the status in one short line, without the URL's or the key's secret
    text = str(raised.value)
    assert "HTTP 400" in text and SECRET not in text and "\n" not in text
    assert len(text) <= 2 * MAX_ERROR_CHARS


def test_an_embedding_endpoint_error_carries_no_credentials() -> None:
    # Given an embedder pointed at a refusing endpoint through a URL with credentials
    with Simulator() as simulator:
        url = simulator.base_url.replace("http://", f"http://user:{SECRET}@").replace("/v1", "/nowhere")
        embedder = OpenAIEmbedder(url, "sk-key-" + SECRET, "m", 8, max_retries=0)
        # When it embeds
        with pytest.raises(LLMError) as raised:
            embedder.embed(["hello"])
    # Then its error is short and holds no secret
    assert SECRET not in str(raised.value) and len(str(raised.value)) <= 2 * MAX_ERROR_CHARS


def test_the_keys_an_endpoint_is_recorded_under_hold_no_credentials() -> None:
    # A limiter key names the endpoint in Redis and in the error of a wait that runs out; a
    # breaker key names it in the metadata store
    url = f"http://user:{SECRET}@127.0.0.1:8000/v1"
    assert provider_key(url, "m") == "127.0.0.1:8000/m"
    assert breaker_key(url, "m") == "http://127.0.0.1:8000/v1 m"


def test_a_redis_error_on_a_status_page_names_the_url_without_its_password(tmp_path: Path) -> None:
    # Given settings whose Redis URL carries a password, and no Redis behind it
    from kenning.pipeline.errors import StoreError
    from kenning.workers.control.runs import _coordination
    from kenning.workers.runtime.settings import load_settings

    url = "redis://kenning:hunter2secret@127.0.0.1:1/0"
    settings = load_settings(home=tmp_path / "home", redis_url=url, broker_url=url)
    # When a status page asks Redis about runs
    with pytest.raises(StoreError) as raised, _coordination(settings) as coordination:
        assert coordination.broker is not None
        coordination.broker.ping()
    # Then the error names the Redis it asked, without the password
    assert "127.0.0.1:1" in str(raised.value) and "hunter2secret" not in str(raised.value)
