"""Two clients of one real server at once: a question asked while a cognify runs.

llama-cpp-python's server, by default, ends the answer it is streaming when another request
comes; scripts/real_llm.sh starts it so that requests wait their turn instead.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.real_llm.server import real_llm_model

pytestmark = pytest.mark.real_llm

CLIENTS = 2


def streamed_to_the_end(url: str, started: threading.Barrier, number: int) -> str | None:
    """The finish reason of one streamed answer, sent when every client is ready; None when the
    stream ended without one (the server cut it)."""
    body = {
        "model": real_llm_model(),
        "messages": [{"role": "user", "content": f"Count from {number} to {number + 20}, one a line."}],
        "max_tokens": 32,
        "temperature": 0,
        "stream": True,
    }
    finished = None
    started.wait(timeout=60)
    with httpx.stream("POST", f"{url.rstrip('/')}/chat/completions", json=body, timeout=600) as response:
        response.raise_for_status()
        try:
            for line in response.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    choice = json.loads(line.removeprefix("data: "))["choices"][0]
                    finished = choice.get("finish_reason") or finished
        except httpx.RemoteProtocolError:
            return None  # the server closed the stream in the middle of its answer
    return finished


def test_two_clients_streaming_at_once_both_get_whole_answers(llm_url: str) -> None:
    # When two clients stream an answer from the server at the same moment
    started = threading.Barrier(CLIENTS)
    with ThreadPoolExecutor(CLIENTS) as pool:
        reasons = list(pool.map(lambda n: streamed_to_the_end(llm_url, started, n), range(CLIENTS)))
    # Then neither answer is cut: each ends with its reason, the one that waited as well
    assert all(reason in ("stop", "length") for reason in reasons), reasons
