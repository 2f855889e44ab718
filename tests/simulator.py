"""An OpenAI-compatible LLM endpoint simulator for the project's tests and benchmarks.

It binds 127.0.0.1 only and answers deterministically:

- `POST /v1/chat/completions`: with a `json_schema` or `json_object` response format, an
  `Extraction` of the chunk in the last user message holding one (the offline extractor's);
  without one, that extraction in a ```json fence when a user message holds a chunk (a prompt
  asking for JSON), else a short text answer built from the last user message. A user message
  holding a listing of an entity's facts (`kenning.pipeline.contradiction`) is answered with
  `simulated_endings`: which listed fact ends which earlier one (in a fence without a format).
- `POST /v1/embeddings`: 384-dimension hashed bag-of-words vectors, L2-normalized.
- `GET /v1/models`, `GET /stats`, `POST /stats/reset` (counters, rate window and
  fault sequence start over).

Usage counts are approximate (a token is four characters). Faults are opt-in:
latency, requests and tokens per minute (429 with `Retry-After` beyond them, over a
sliding window), and random 500s, stalls past the client's timeout and malformed
JSON, drawn from a seeded generator so that a sequential run is reproducible. With
`fail_on`, every chat request whose messages contain that text is refused with a 400 whose
message is `refusal`: a permanent failure, as a provider's refusal of some content would be.
With `black_hole`, the endpoint accepts connections and reads requests but never answers them:
each request received then, and each one in its latency when it is set, is held until the
simulator stops; set it back and new requests are answered again.

`accepts` is the richest response format it takes, as servers differ: `json_schema` (the
default: all of them), `json_object` (llama-cpp-python: a `json_schema` request is answered 500
with a validation error naming `response_format`) or `text` (a `json_object` request too).
With `honor_max_tokens`, a reply longer than the request's `max_tokens` is cut there and ends
with `finish_reason` "length"; with `loops` too, an extraction repeats its first fact (its first
`loops` facts in turn, when `loops` is more than 1) until it is cut, as a small model caught in a
loop does. With `unlisted_ends`, an extraction lists no node that is only a
fact's target and names it in the fact instead, as small models do.

A chat request with `stream` true is answered as server-sent events, as OpenAI's are: a first
part with the role, the text (in parts of one token, four characters, when `token_ms` is set), a
last part with the finish reason, the tokens billed when `stream_options.include_usage` asks,
then `[DONE]`. With `streams` false, it is answered in one piece instead, as some proxies do.

`serial` makes it behave like a model server on one CPU (llama-cpp-python's, Ollama's with one
slot): one chat request is answered at a time and the others wait their turn, in the order they
came; each takes `latency_ms` to its first token and `token_ms` per token after it. A streamed
request waiting its turn gets its headers at once and a comment line every `ping_s` (as
llama-cpp-python's server sends), and its answer stops when its client goes. A request not
streamed gets nothing until its answer; one whose client went while it waited is skipped, but
one begun is answered in full even when its client has gone (as that server does). With
`interrupts` as well, a streamed answer is ended early (`[DONE]` with no finish reason) as soon
as another request waits for its turn, as llama-cpp-python's server does by default
(`interrupt_requests`).

`/stats` answers `calls` (per endpoint), `prompt_tokens`, `completion_tokens`,
`rate_limited`, `server_errors`, `timeouts`, `malformed`, `refused`, `held` (never answered:
counted as calls, billed nothing), `format_refused` (a response format it does not take),
`in_flight`, `max_in_flight` and `interrupted` (streams ended early for another request).
"""

from __future__ import annotations

import argparse
import base64
import enum
import hashlib
import json
import math
import random
import re
import select
import signal
import socket
import struct
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal

from kenning.pipeline.contradiction import unwrap_listing
from kenning.pipeline.errors import ConfigError
from kenning.pipeline.models import Extraction, KnowledgeGraph
from kenning.pipeline.offline import OfflineExtractor
from kenning.pipeline.temporal import moment_start
from kenning.storage.inference.llm_openai import unwrap_chunk

EMBEDDING_DIMENSION = 384
HOST = "127.0.0.1"
_MALFORMED_CONTENT = '{"graph": {"nodes": [{"id": "unterminated'
_WORD = re.compile(r"\w+")
_RECENT_REQUESTS = 100
_DESCRIPTION = "An OpenAI-compatible LLM endpoint simulator on 127.0.0.1."

JSON = dict[str, Any]


class Fault(enum.Enum):
    NONE = "none"
    ERROR = "error"
    TIMEOUT = "timeout"
    MALFORMED = "malformed"


@dataclass(eq=False)
class Simulator:
    """The simulator server; `start()` returns its base URL, `stop()` ends it.

    `port` 0 picks a free port. `rpm`/`tpm` 0 mean unlimited; `rpm_scope` says whether
    chat calls alone, or chat and embedding calls, count toward them. `stall_s` bounds how long a
    simulated timeout holds its request before answering 504. `fail_on` (None: off) is read
    at each request, so it may be set or cleared while the simulator serves; so is `black_hole`.
    """

    port: int = 0
    latency_ms: float = 0.0
    rpm: int = 0
    rpm_scope: Literal["all", "chat"] = "all"
    tpm: int = 0
    error_rate: float = 0.0
    timeout_rate: float = 0.0
    malformed_rate: float = 0.0
    stall_s: float = 65.0
    window_s: float = 60.0
    seed: int | None = None
    fail_on: str | None = None
    refusal: str = "simulated refusal: the request holds the fail_on text"
    black_hole: bool = False
    accepts: Literal["json_schema", "json_object", "text"] = "json_schema"
    honor_max_tokens: bool = False
    unlisted_ends: bool = False
    loops: int = 0
    serial: bool = False
    token_ms: float = 0.0
    ping_s: float = 15.0
    interrupts: bool = False
    streams: bool = True

    def __post_init__(self) -> None:
        check_options(self)
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        # When serial: whether a chat request is being answered, and those waiting, in order.
        self._turns = threading.Condition()
        self._answering = False
        self._queue: deque[object] = deque()
        self._window = _Window(self.rpm, self.tpm, self.window_s)
        self._stats = _Stats()
        self._random = random.Random(self.seed)
        self._recent: deque[JSON] = deque(maxlen=_RECENT_REQUESTS)
        self._extractor = OfflineExtractor()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("the simulator is not started")
        return f"http://{HOST}:{self._server.server_address[1]}/v1"

    def start(self) -> str:
        """Serve in a background thread; returns `http://127.0.0.1:<port>/v1`."""
        if self._server is not None:
            raise RuntimeError("the simulator is already started")
        self._server = _Server(self.port, self)
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="llm-simulator", daemon=True
        )
        self._thread.start()
        return self.base_url

    def stop(self) -> None:
        """Stop serving, wake stalled requests and close every connection."""
        if self._server is None or self._thread is None:
            return
        self._stopping.set()
        self._server.shutdown()
        self._server.close_connections()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> Simulator:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def stats(self) -> JSON:
        return self._stats.snapshot()

    def reset(self) -> None:
        with self._lock:
            self._random = random.Random(self.seed)
            self._window = _Window(self.rpm, self.tpm, self.window_s)
        self._stats.reset()

    def received(self) -> list[JSON]:
        """The bodies of the latest chat requests answered or refused for their format, oldest first."""
        with self._lock:
            return list(self._recent)

    # What the request handler uses.

    def chat_reply(self, body: JSON) -> _Reply:
        with self._lock:
            self._recent.append(body)
        reply = chat_reply(body, self._extractor, self.unlisted_ends, self.loops)
        limit = body.get("max_tokens")
        if self.honor_max_tokens and isinstance(limit, int) and reply.completion_tokens > limit:
            return reply.cut(limit)
        return reply

    def format_refusal(self, body: JSON) -> str | None:
        """The error message of a response format this simulator does not take, or None."""
        response_format = body.get("response_format")
        kind = response_format.get("type") if isinstance(response_format, dict) else None
        taken = {"json_schema": ("json_schema", "json_object"), "json_object": ("json_object",), "text": ()}
        if kind in (None, "text") or kind in taken[self.accepts]:
            return None
        with self._lock:
            self._recent.append(body)
        allowed = " or ".join(repr(name) for name in ("text", *taken[self.accepts][-1:]))
        return (
            "1 validation error for CreateChatCompletionRequest\nresponse_format.type\n"
            f"  Input should be {allowed} [type=literal_error, input_value={kind!r}, input_type=str]"
        )

    def refuses(self, body: JSON) -> bool:
        """Whether the chat request holds the `fail_on` text in one of its messages."""
        text = self.fail_on
        if not text:
            return False
        messages = body.get("messages")
        if not isinstance(messages, list):
            return False
        return any(text in _text_of(m.get("content")) for m in messages if isinstance(m, dict))

    @contextmanager
    def in_flight(self, endpoint: str, client_port: int = 0) -> Iterator[None]:
        self._stats.enter(endpoint, client_port)
        try:
            yield
        finally:
            self._stats.leave(client_port)

    def open_ports(self) -> set[int]:
        """The client ports of the model calls being served now (which client a call came from)."""
        return self._stats.open_ports()

    def admit(self, endpoint: str, tokens: int) -> float | None:
        """None when the call is within the limits; else seconds until it would be."""
        if self.rpm_scope == "chat" and endpoint != "chat":
            return None
        with self._lock:
            wait = self._window.admit(tokens, time.monotonic())
        if wait is not None:
            self._stats.add("rate_limited")
        return wait

    def draw_fault(self, endpoint: str) -> Fault:
        with self._lock:
            draw = self._random.random()
        fault = pick_fault(draw, self.error_rate, self.timeout_rate, self.malformed_rate)
        if fault is Fault.MALFORMED and endpoint != "chat":
            return Fault.NONE
        counter = {Fault.ERROR: "server_errors", Fault.TIMEOUT: "timeouts", Fault.MALFORMED: "malformed"}
        if fault in counter:
            self._stats.add(counter[fault])
        return fault

    def count(self, counter: str) -> None:
        self._stats.add(counter)

    def pause(self, seconds: float) -> None:
        """Sleep, cut short when the simulator stops."""
        if seconds > 0:
            self._stopping.wait(seconds)

    def swallowed(self) -> bool:
        """In `black_hole` mode: hold the request, unanswered, until the simulator stops."""
        if not self.black_hole:
            return False
        self._stats.add("held")
        self._stopping.wait()
        return True

    @contextmanager
    def turn(self, waiting: Callable[[], None]) -> Iterator[None]:
        """Hold the one turn to answer a chat request while the block runs, when serial (at once
        otherwise), turns given in the order they were asked for; call `waiting` every `ping_s`
        seconds until it comes. OSError from `waiting` (the client went) ends the wait."""
        if not self.serial:
            yield
            return
        ticket = object()
        with self._turns:
            self._queue.append(ticket)
        try:
            pinged = time.monotonic()
            while not self._take_turn(ticket):
                if self._stopping.is_set():
                    raise OSError("the simulator stopped")
                if self.ping_s and time.monotonic() - pinged >= self.ping_s:
                    waiting()
                    pinged = time.monotonic()
        except BaseException:
            with self._turns:
                self._queue.remove(ticket)
                self._turns.notify_all()
            raise
        try:
            yield
        finally:
            with self._turns:
                self._answering = False
                self._turns.notify_all()

    def _take_turn(self, ticket: object) -> bool:
        with self._turns:
            if not self._turns.wait_for(lambda: not self._answering and self._queue[0] is ticket, 0.05):
                return False
            self._queue.popleft()
            self._answering = True
            return True

    def interrupted(self) -> bool:
        """Whether a streamed answer ends here, early: another request waits for its turn."""
        if not (self.serial and self.interrupts):
            return False
        with self._turns:
            waiting = bool(self._queue)
        if waiting:
            self._stats.add("interrupted")
        return waiting

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def bill(self, reply: _Reply) -> None:
        self._stats.add("prompt_tokens", reply.prompt_tokens)
        self._stats.add("completion_tokens", reply.completion_tokens)


# A test's way to start simulators with options, each stopped when the test ends (the
# `start_simulator` fixture).
StartSimulator = Callable[..., Simulator]


def check_options(simulator: Simulator) -> None:
    rates = (simulator.error_rate, simulator.timeout_rate, simulator.malformed_rate)
    if any(not 0.0 <= rate <= 1.0 for rate in rates) or sum(rates) > 1.0:
        raise ConfigError(f"fault rates must lie in [0, 1] and sum to at most 1, got {rates}")
    if (
        min(simulator.rpm, simulator.tpm, simulator.latency_ms, simulator.stall_s) < 0
        or min(simulator.token_ms, simulator.ping_s) < 0
        or simulator.window_s <= 0
    ):
        raise ConfigError(
            "rpm, tpm, latency_ms, stall_s, token_ms and ping_s must be >= 0 (rpm/tpm 0: unlimited), "
            "window_s > 0"
        )
    if simulator.rpm_scope not in ("all", "chat"):
        raise ConfigError(f"rpm_scope must be 'all' or 'chat', got {simulator.rpm_scope!r}")
    if simulator.fail_on == "":
        raise ConfigError("fail_on must be None (off) or a non-empty text")
    if simulator.accepts not in ("json_schema", "json_object", "text"):
        raise ConfigError(f"accepts must be json_schema, json_object or text, got {simulator.accepts!r}")
    if simulator.loops < 0:
        raise ConfigError(f"loops must be >= 0 (0: off), got {simulator.loops}")


def pick_fault(draw: float, error_rate: float, timeout_rate: float, malformed_rate: float) -> Fault:
    if draw < error_rate:
        return Fault.ERROR
    if draw < error_rate + timeout_rate:
        return Fault.TIMEOUT
    if draw < error_rate + timeout_rate + malformed_rate:
        return Fault.MALFORMED
    return Fault.NONE


class _Window:
    """Requests and tokens admitted over a sliding window."""

    def __init__(self, rpm: int, tpm: int, window_s: float) -> None:
        self._rpm = rpm
        self._tpm = tpm
        self._window_s = window_s
        self._admitted: deque[tuple[float, int]] = deque()
        self._tokens = 0

    def admit(self, tokens: int, now: float) -> float | None:
        while self._admitted and self._admitted[0][0] <= now - self._window_s:
            self._tokens -= self._admitted.popleft()[1]
        wait = max(self._request_wait(now), self._token_wait(tokens, now))
        if wait > 0:
            return wait
        self._admitted.append((now, tokens))
        self._tokens += tokens
        return None

    def _request_wait(self, now: float) -> float:
        if not self._rpm or len(self._admitted) < self._rpm:
            return 0.0
        return self._admitted[-self._rpm][0] + self._window_s - now

    def _token_wait(self, tokens: int, now: float) -> float:
        if not self._tpm or self._tokens + tokens <= self._tpm:
            return 0.0
        if tokens > self._tpm:
            return self._window_s  # never fits: the client will keep seeing 429s
        excess = self._tokens + tokens - self._tpm
        for stamp, spent in self._admitted:
            excess -= spent
            if excess <= 0:
                return stamp + self._window_s - now
        return self._window_s


class _Stats:
    _COUNTERS = (
        "prompt_tokens",
        "completion_tokens",
        "rate_limited",
        "server_errors",
        "timeouts",
        "malformed",
        "refused",
        "held",
        "format_refused",
        "interrupted",
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in_flight = 0
        self._open: Counter[int] = Counter()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._calls: dict[str, int] = {"chat": 0, "embeddings": 0, "models": 0}
            self._counts = dict.fromkeys(self._COUNTERS, 0)
            self._max_in_flight = self._in_flight

    def enter(self, endpoint: str, client_port: int) -> None:
        with self._lock:
            self._calls[endpoint] = self._calls.get(endpoint, 0) + 1
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
            self._open[client_port] += 1

    def leave(self, client_port: int) -> None:
        with self._lock:
            self._in_flight -= 1
            self._open[client_port] -= 1
            if not self._open[client_port]:
                del self._open[client_port]

    def open_ports(self) -> set[int]:
        with self._lock:
            return set(self._open) - {0}

    def add(self, counter: str, amount: int = 1) -> None:
        with self._lock:
            self._counts[counter] += amount

    def snapshot(self) -> JSON:
        with self._lock:
            return {
                "calls": dict(self._calls),
                **self._counts,
                "in_flight": self._in_flight,
                "max_in_flight": self._max_in_flight,
            }


@dataclass(frozen=True)
class _Reply:
    body: JSON
    prompt_tokens: int
    completion_tokens: int

    def malformed(self) -> JSON:
        choice = {**self.body["choices"][0], "message": {"role": "assistant", "content": _MALFORMED_CONTENT}}
        return {**self.body, "choices": [choice]}

    def malformed_reply(self) -> _Reply:
        return _Reply(self.malformed(), self.prompt_tokens, self.completion_tokens)

    def events(self, token_chars: int | None, usage: bool) -> Iterator[JSON]:
        """The reply as the parts of a stream: the role, the text (in parts of `token_chars`, or
        whole), the finish reason, and the usage when asked."""
        choice = self.body["choices"][0]
        head = {key: self.body[key] for key in ("id", "created", "model")} | {
            "object": "chat.completion.chunk"
        }

        def part(delta: JSON, finish: str | None = None) -> JSON:
            return head | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        yield part({"role": "assistant", "content": ""})
        content = choice["message"]["content"]
        step = token_chars or max(1, len(content))
        for start in range(0, len(content), step):
            yield part({"content": content[start : start + step]})
        yield part({}, choice["finish_reason"])
        if usage:
            yield head | {"choices": [], "usage": self.body["usage"]}

    def cut(self, max_tokens: int) -> _Reply:
        """The reply cut at `max_tokens` (four characters a token), as a server stops a long one."""
        content = self.body["choices"][0]["message"]["content"][: max_tokens * 4]
        choice = {**self.body["choices"][0], "message": {"role": "assistant", "content": content}}
        choice["finish_reason"] = "length"
        usage = _usage(self.prompt_tokens, max_tokens)
        return _Reply({**self.body, "choices": [choice], "usage": usage}, self.prompt_tokens, max_tokens)


def estimate_tokens(text: str) -> int:
    return (len(text) + 3) // 4


def chat_reply(
    body: JSON, extractor: OfflineExtractor, unlisted_ends: bool = False, loops: int = 0
) -> _Reply:
    """The deterministic answer to a chat.completions request."""
    messages = [message for message in body.get("messages", []) if isinstance(message, dict)]
    if not messages:
        raise _BadRequest("'messages' must be a non-empty list")
    users = [_text_of(message.get("content")) for message in messages if message.get("role") == "user"]
    question = users[-1] if users else _text_of(messages[-1].get("content"))
    # A repair request follows the chunk's message: the chunk is in the last message holding one.
    chunk = next((text for text in reversed(users) if unwrap_chunk(text) is not None), None)
    listing = next((found for text in reversed(users) if (found := unwrap_listing(text)) is not None), None)
    if listing is not None:
        content = json.dumps(simulated_endings(listing), sort_keys=True)
        content = content if _wants_schema(body) else f"Here are the endings:\n```json\n{content}\n```"
    elif _wants_schema(body):
        content = _structured_answer(chunk or question, extractor, unlisted_ends, loops)
    elif chunk is not None:
        answer = _structured_answer(chunk, extractor, unlisted_ends, loops)
        content = f"Here is the extraction:\n```json\n{answer}\n```"
    else:
        content = _text_answer(question, extractor)
    prompt_tokens = sum(estimate_tokens(_text_of(message.get("content"))) for message in messages)
    completion_tokens = estimate_tokens(content)
    completion = {
        "id": "chatcmpl-sim-" + hashlib.sha256(content.encode()).hexdigest()[:24],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": str(body.get("model", "simulator")),
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        ],
        "usage": _usage(prompt_tokens, completion_tokens),
    }
    return _Reply(completion, prompt_tokens, completion_tokens)


def simulated_endings(listing: JSON) -> JSON:
    """The judgment of a listing of an entity's facts (`kenning.pipeline.contradiction`), as a
    model's stand-in: a fact ends an earlier one with the same source and relationship and
    another target, where either is new. Every relation is read as one value at a time, as
    none is in the listings the benchmarks and tests make, whatever a real model would say."""
    facts = [fact for fact in listing.get("facts") or [] if isinstance(fact, dict)]
    endings = []
    for later in facts:
        ended = [
            str(earlier.get("id"))
            for earlier in facts
            if (later.get("new") or earlier.get("new"))
            and _moment(later) > _moment(earlier)
            and (later.get("source"), later.get("relationship"))
            == (earlier.get("source"), earlier.get("relationship"))
            and later.get("target") != earlier.get("target")
        ]
        if ended:
            endings.append({"fact": str(later.get("id")), "ends": ended})
    return {"endings": endings}


def _moment(fact: JSON) -> datetime:
    try:
        return moment_start(str(fact.get("since") or ""))
    except ValueError:
        return datetime.min.replace(tzinfo=UTC)


def _wants_schema(body: JSON) -> bool:
    response_format = body.get("response_format")
    return isinstance(response_format, dict) and response_format.get("type") in ("json_schema", "json_object")


# How often a looping reply repeats its first fact: far past any max_tokens a test sets.
LOOP_REPEATS = 500


def _structured_answer(
    question: str, extractor: OfflineExtractor, unlisted_ends: bool = False, loops: int = 0
) -> str:
    chunk = unwrap_chunk(question)
    extraction = extractor.extract(question if chunk is None else chunk)
    if unlisted_ends:
        extraction = _without_target_nodes(extraction)
    edges = extraction.graph.edges
    if loops and edges:
        cycle = edges[:loops]
        repeats = [cycle[i % len(cycle)] for i in range(LOOP_REPEATS)]
        looped = extraction.graph.model_copy(update={"edges": [*edges, *repeats]})
        extraction = extraction.model_copy(update={"graph": looped})
    return extraction.model_dump_json()


def _without_target_nodes(extraction: Extraction) -> Extraction:
    """The extraction with each node that is only a fact's target left out, named in its facts."""
    graph = extraction.graph
    sources = {edge.source for edge in graph.edges}
    names = {node.id: node.name for node in graph.nodes}
    left_out = {edge.target for edge in graph.edges if edge.target not in sources}
    edges = [
        edge.model_copy(update={"target": names.get(edge.target, edge.target)})
        if edge.target in left_out
        else edge
        for edge in graph.edges
    ]
    nodes = [node for node in graph.nodes if node.id not in left_out]
    return extraction.model_copy(update={"graph": KnowledgeGraph(nodes=nodes, edges=edges)})


def _text_answer(question: str, extractor: OfflineExtractor) -> str:
    summary = extractor.extract(question).summary
    return summary or "There is nothing to answer."


def _text_of(content: object) -> str:
    """The text of a message content: a string or a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _usage(prompt_tokens: int, completion_tokens: int) -> JSON:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def embed_text(text: str, dimension: int = EMBEDDING_DIMENSION) -> list[float]:
    """A hashed bag of words, L2-normalized: texts sharing words lie close together."""
    vector = [0.0] * dimension
    for word in _WORD.findall(text.casefold()):
        digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
        index = int.from_bytes(digest[:4], "little") % dimension
        vector[index] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(value * value for value in vector))
    if norm == 0.0:
        vector[0] = 1.0  # a text with no words still gets a unit vector
        return vector
    return [value / norm for value in vector]


def embeddings_reply(body: JSON) -> _Reply:
    texts = _embedding_inputs(body.get("input"))
    dimension = body.get("dimensions") or EMBEDDING_DIMENSION
    if not isinstance(dimension, int) or dimension <= 0:
        raise _BadRequest("'dimensions' must be a positive integer")
    as_base64 = body.get("encoding_format") == "base64"
    data = [
        {"object": "embedding", "index": index, "embedding": _encode(embed_text(text, dimension), as_base64)}
        for index, text in enumerate(texts)
    ]
    tokens = sum(estimate_tokens(text) for text in texts)
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    reply = {"object": "list", "data": data, "model": str(body.get("model", "simulator")), "usage": usage}
    return _Reply(reply, tokens, 0)


def _embedding_inputs(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        return [str(item) for item in value]
    raise _BadRequest("'input' must be a string or a non-empty list of strings")


def _encode(vector: list[float], as_base64: bool) -> list[float] | str:
    if not as_base64:
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


class _BadRequest(Exception):
    """The request cannot be answered: a 400 for the client."""


def parse_body(raw: bytes) -> JSON:
    try:
        body = json.loads(raw or b"{}")
    except ValueError as exc:
        raise _BadRequest(f"the body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise _BadRequest("the body must be a JSON object")
    return body


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Hundreds of clients connect at once in benchmarks; the default backlog is 5.
    request_queue_size = 1024

    def __init__(self, port: int, simulator: Simulator) -> None:
        super().__init__((HOST, port), _Handler)
        self.simulator = simulator
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """Cut idle keep-alive connections, whose threads would otherwise wait for them."""
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that time out close their connection before the answer is written.
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; with Nagle's algorithm on, the second waits for an ACK.
    disable_nagle_algorithm = True
    server: _Server
    # Idle keep-alive connections are closed after this many seconds.
    timeout = 60

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request would drown a benchmark's output

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/v1/models":
            self._serve_models()
        elif path == "/stats":
            self._send_json(200, self.server.simulator.stats())
        else:
            self._send_error(404, f"no route for GET {path}", "not_found")

    def do_POST(self) -> None:
        # Read the whole body first: on a kept-alive connection, unread bytes would be the next request.
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            self._route_post(self.path.split("?", 1)[0].rstrip("/"), raw)
        except _BadRequest as exc:
            self._send_error(400, str(exc), "invalid_request_error")
        except OSError:
            raise  # the client is gone: nothing can be answered
        except Exception as exc:  # a bug here must reach the client as a 500, not a dropped connection
            self._send_error(500, f"the simulator failed: {exc!r}", "server_error")

    def _route_post(self, path: str, raw: bytes) -> None:
        simulator = self.server.simulator
        if path == "/v1/chat/completions":
            self._serve_chat(parse_body(raw))
        elif path == "/v1/embeddings":
            self._serve_model_call("embeddings", embeddings_reply(parse_body(raw)))
        elif path == "/stats/reset":
            simulator.reset()
            self._send_json(200, simulator.stats())
        else:
            self._send_error(404, f"no route for POST {path}", "not_found")

    def _serve_models(self) -> None:
        simulator = self.server.simulator
        with simulator.in_flight("models"):
            model = {"id": "simulator", "object": "model", "created": 0, "owned_by": "kenning"}
            self._send_json(200, {"object": "list", "data": [model]})

    def _serve_chat(self, body: JSON) -> None:
        simulator = self.server.simulator
        refusal = simulator.format_refusal(body)
        if refusal is not None:
            with simulator.in_flight("chat"):
                simulator.count("format_refused")
                self._send_error(500, refusal, "internal_server_error")
            return
        if not simulator.refuses(body):
            self._serve_model_call("chat", simulator.chat_reply(body), body)
            return
        with simulator.in_flight("chat"):
            simulator.pause(simulator.latency_ms / 1000)
            simulator.count("refused")
            self._send_error(400, simulator.refusal, "invalid_request")

    def _serve_model_call(self, endpoint: str, reply: _Reply, body: JSON | None = None) -> None:
        simulator = self.server.simulator
        with simulator.in_flight(endpoint, self.client_address[1]):
            if simulator.swallowed():
                return
            wait = simulator.admit(endpoint, reply.prompt_tokens + reply.completion_tokens)
            if wait is not None:
                self._send_rate_limited(wait)
                return
            if endpoint == "chat" and (simulator.serial or simulator.token_ms):
                self._generate(reply, body or {})
                return
            simulator.pause(simulator.latency_ms / 1000)
            if simulator.swallowed():
                return
            fault = simulator.draw_fault(endpoint)
            if fault is Fault.ERROR:
                self._send_error(500, "simulated server error", "server_error")
            elif fault is Fault.TIMEOUT:
                simulator.pause(simulator.stall_s)
                self._send_error(504, "simulated timeout", "timeout")
            elif body is not None and body.get("stream") and simulator.streams:
                simulator.bill(reply)
                self._send_stream(reply.malformed_reply() if fault is Fault.MALFORMED else reply, body)
            else:
                simulator.bill(reply)
                self._send_json(200, reply.malformed() if fault is Fault.MALFORMED else reply.body)

    def _generate(self, reply: _Reply, body: JSON) -> None:
        """Answer as a model server on a CPU does: in turn when serial, `latency_ms` to the first
        token, `token_ms` a token after it (faults are not drawn)."""
        simulator = self.server.simulator
        if not (body.get("stream") and simulator.streams):
            with simulator.turn(lambda: None):
                if self._client_gone():
                    return  # gone while it waited: not answered (a request begun is answered in full)
                simulator.pause((simulator.latency_ms + simulator.token_ms * reply.completion_tokens) / 1000)
                simulator.bill(reply)
            self._send_json(200, reply.body)  # its client may be gone: the answer was made anyway
            return
        self._start_stream()
        with simulator.turn(lambda: self._write_chunk(b": ping\n\n")):
            simulator.pause(simulator.latency_ms / 1000)
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            for index, event in enumerate(reply.events(4, usage)):
                if index > 1:
                    simulator.pause(simulator.token_ms / 1000)
                if simulator.stopping:
                    return
                if index > 0 and simulator.interrupted():
                    break  # ended early, with no finish reason: another request waits
                self._write_event(event)
            else:
                simulator.bill(reply)
        self._end_stream()

    def _client_gone(self) -> bool:
        """Whether the client closed its connection (it has nothing more to send on it)."""
        ready, _, _ = select.select([self.connection], [], [], 0)
        if not ready:
            return False
        try:
            return bool(self.connection.recv(1, socket.MSG_PEEK) == b"")
        except OSError:
            return True

    def _send_stream(self, reply: _Reply, body: JSON) -> None:
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self._start_stream()
        for event in reply.events(None, usage):
            self._write_event(event)
        self._end_stream()

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def _write_event(self, event: JSON) -> None:
        self._write_chunk(b"data: " + json.dumps(event).encode() + b"\n\n")

    def _end_stream(self) -> None:
        self._write_chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _write_chunk(self, data: bytes) -> None:
        """One piece of a chunked body, sent at once; OSError when the client is gone."""
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _send_rate_limited(self, wait: float) -> None:
        headers = {"Retry-After": str(max(1, math.ceil(wait))), "retry-after-ms": str(math.ceil(wait * 1000))}
        self._send_error(429, "simulated rate limit reached", "rate_limit_exceeded", headers)

    def _send_error(
        self, status: int, message: str, code: str, headers: dict[str, str] | None = None
    ) -> None:
        self._send_json(status, {"error": {"message": message, "type": code, "code": code}}, headers)

    def _send_json(self, status: int, body: JSON, headers: dict[str, str] | None = None) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.simulator", description=_DESCRIPTION)
    parser.add_argument("--port", type=int, default=8089, help="0 picks a free port")
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--rpm", type=int, default=0, help="requests per minute; 0: unlimited")
    parser.add_argument("--rpm-scope", choices=("all", "chat"), default="all")
    parser.add_argument("--tpm", type=int, default=0, help="tokens per minute; 0: unlimited")
    parser.add_argument("--error-rate", type=float, default=0.0, help="share of calls answered 500")
    parser.add_argument("--timeout-rate", type=float, default=0.0, help="share of calls that stall")
    parser.add_argument("--malformed-rate", type=float, default=0.0, help="share of chats with bad JSON")
    parser.add_argument("--stall-s", type=float, default=65.0, help="how long a stalled call holds")
    parser.add_argument("--window-s", type=float, default=60.0, help="the rate limits' sliding window")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--fail-on", default=None, help="refuse (400) chat requests holding this text")
    parser.add_argument(
        "--accepts",
        choices=("json_schema", "json_object", "text"),
        default="json_schema",
        help="the richest response format taken; richer ones are answered 500 (as llama-cpp-python)",
    )
    parser.add_argument("--honor-max-tokens", action="store_true", help="cut replies at max_tokens")
    parser.add_argument(
        "--unlisted-ends", action="store_true", help="list no node that is only a fact's target"
    )
    parser.add_argument(
        "--serial", action="store_true", help="answer one chat request at a time, as a model on one CPU"
    )
    parser.add_argument("--token-ms", type=float, default=0.0, help="milliseconds a completion token")
    parser.add_argument(
        "--ping-s", type=float, default=15.0, help="comment lines to a stream waiting its turn"
    )
    parser.add_argument(
        "--no-streams", dest="streams", action="store_false", help="answer a stream request in one piece"
    )
    parser.add_argument(
        "--interrupts", action="store_true", help="end a stream early when another request waits (serial)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Serve until SIGINT or SIGTERM."""
    simulator = Simulator(**vars(parse_args(argv)))
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    print(f"LLM simulator serving at {simulator.start()}", flush=True)
    done.wait()
    simulator.stop()


if __name__ == "__main__":
    main()
