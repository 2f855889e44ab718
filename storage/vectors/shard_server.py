"""Searches of a collection another process holds open, answered by that process.

A Qdrant Edge shard is open in one process at a time, and opening one costs 15-35 ms
(measured on a 1,000-paragraph store), so processes taking turns on every search spend
most of their time opening and closing it. Instead, the process that holds a collection's
shard answers other processes' searches over a Unix socket in the collection's folder
(`.sock`, mode 0600: its user alone may connect), for as long as it holds the shard.
A process that finds nobody answering there (no holder, a holder that died, or one that is
letting go) takes its turn on the shard itself, as before.

One request per connection: a line of JSON (scope, limit, fields, and the vector as base64 of
little-endian float32, the precision the engine searches at), answered by a line of JSON (the
hits, or an error). Writes never come this way: they take the lock.
"""

from __future__ import annotations

import base64
import contextlib
import socket
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import orjson

from kenning.pipeline.models import Scope, ScoredPoint

SOCKET_FILE = ".sock"
# The largest request or answer line read, in bytes (a 4,096-d vector in base64 is ~22 KB;
# a thousand hits with their payloads a few MB).
MAX_LINE = 64 * 2**20
BACKLOG = 64
# Threads that each accept a search and answer it, then the next. A thread started per search
# waited behind every busy thread for its first turn on the CPU: with 8 query processes on 2
# cores, a search from another process took 28 ms where a waiting thread answers in 18.
ANSWERING_THREADS = 4
# How long an answering thread waits for a request line before it gives up on the asker (which
# sends it as soon as it connects): a thread waiting answers nobody else.
READ_TIMEOUT_S = 5.0
# How long an asker waits for an answer before it takes its turn on the shard instead.
ANSWER_TIMEOUT_S = 30.0
VECTOR_DTYPE = "<f4"

Search = Callable[[Scope, Sequence[float], int, Sequence[str] | None], list[ScoredPoint]]


class SearchServer:
    """Answers searches of one collection at `<folder>/.sock` with `search`, on
    `ANSWERING_THREADS` threads."""

    def __init__(self, folder: Path, search: Search) -> None:
        self.path = folder / SOCKET_FILE
        self._search = search
        self._listener: socket.socket | None = None

    def start(self) -> None:
        """Listen, replacing what a holder before it left behind. Call it holding the collection's lock."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(self.path))
            self.path.chmod(0o600)  # for the owner of the home alone
            listener.listen(BACKLOG)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        name = f"kenning-search-{self.path.parent.name}"
        for n in range(ANSWERING_THREADS):
            threading.Thread(target=self._accept, args=(listener,), name=f"{name}-{n}", daemon=True).start()

    def stop(self) -> None:
        """Stop answering and remove the socket. The answering threads end once their search in
        hand is answered; they are not waited for, since that search may itself wait for the
        caller (the collection's holder closing its shard)."""
        listener, self._listener = self._listener, None
        if listener is None:
            return
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes the threads blocked in accept()
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def forget(self) -> None:
        """In a forked child: close this process's copy of the parent's listening socket, which
        would otherwise accept connections nobody answers once the parent is gone."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return  # stopped
            self._answer(connection)

    def _answer(self, connection: socket.socket) -> None:
        connection.settimeout(READ_TIMEOUT_S)
        with connection, connection.makefile("rwb") as stream:
            try:
                request = orjson.loads(stream.readline(MAX_LINE))
                scope = Scope(tenant=request["scope"]["tenant"], dataset=request["scope"]["dataset"])
                hits = self._search(
                    scope, _vector(request["vector"]), int(request["limit"]), request["fields"]
                )
                # Encoded here: a payload orjson cannot encode (an integer beyond 64 bits, a numpy
                # scalar, a key that is not a string) is an error answer, not a dead thread.
                answer = orjson.dumps({"hits": [[hit.id, hit.score, hit.payload] for hit in hits]})
            except Exception as exc:  # the asking process searches on its own instead
                answer = orjson.dumps({"error": f"{type(exc).__name__}: {exc}"})
            with contextlib.suppress(OSError):
                stream.write(answer + b"\n")
                stream.flush()


def _vector(sent: str | list[float]) -> list[float]:
    """The vector of a request: base64 float32, or a list of numbers as processes of an earlier
    kenning send it (still answered, so that such a process does not take the shard over)."""
    if isinstance(sent, list):
        return [float(x) for x in sent]
    decoded: list[float] = np.frombuffer(base64.b64decode(sent), dtype=VECTOR_DTYPE).tolist()
    return decoded


def search_remotely(
    folder: Path,
    scope: Scope,
    vector: Sequence[float],
    limit: int,
    fields: Sequence[str] | None,
    timeout_s: float = ANSWER_TIMEOUT_S,
) -> list[ScoredPoint] | None:
    """The hits from the process holding the collection, or None when none answers (within
    `timeout_s`, or with hits)."""
    request = {
        "scope": {"tenant": scope.tenant, "dataset": scope.dataset},
        "vector": base64.b64encode(np.asarray(vector, dtype=VECTOR_DTYPE).tobytes()).decode(),
        "limit": limit,
        "fields": None if fields is None else list(fields),
    }
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(timeout_s)
            connection.connect(str(folder / SOCKET_FILE))
            connection.sendall(orjson.dumps(request) + b"\n")
            with connection.makefile("rb") as answers:
                answer = orjson.loads(answers.readline(MAX_LINE))
    except (OSError, ValueError):
        return None
    try:
        return [ScoredPoint(id=hit[0], score=hit[1], payload=hit[2]) for hit in answer["hits"]]
    except (KeyError, IndexError, TypeError, ValueError):  # an answer from something else
        return None
