"""The bundled all-MiniLM-L6-v2 run by ONNX Runtime, without torch.

sentence-transformers needs torch and transformers, whose imports cost seconds of CPU before
a process embeds its first text: every `kenning search`, MCP server or API process paid them
for one short query. That model is a 6-layer BERT encoder 384 wide. Its forward pass is the
graph in `minilm_graph.onnx` (see `kenning.storage.inference.minilm_graph`), run by ONNX Runtime with the
weights of the bundled safetensors file; `tokenizers` cuts the words. Its vectors agree with
sentence-transformers' to about 1e-7 (tests/unit/test_embedder.py compares them).

The runtime packs each dense layer's weights once, for its own matrix kernels. A query's
embedding took half the CPU of the same graph written as numpy products (which repack the
weights on every call), and a batch of paragraphs 40% less than sentence-transformers on torch.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from kenning.pipeline.errors import ConfigError
from kenning.storage.inference.minilm_graph import ARCHITECTURE, GRAPH_FILE, LAYER_NORM_EPS, weight_names

Array = np.ndarray[Any, np.dtype[np.float32]]
# The most tokens encoded together: their attention scores are (heads, tokens, tokens) floats.
PACKED_TOKENS = 512
MASKED = np.finfo(np.float32).min
# The most threads a batch runs on: each keeps the runtime's memory arena for its largest group
# (about 30 MB) for the life of the process. Without the arena, a 256-paragraph batch took 5%
# more CPU and its peak memory grew by 390-500 MB, against 80 MB with it.
MAX_BATCH_THREADS = 4


class MiniLM:
    """Sentence vectors from a BERT sentence-transformers model folder with mean pooling and
    normalisation, of all-MiniLM-L6-v2's shape; `ConfigError` for any other model."""

    def __init__(self, folder: Path) -> None:
        import onnxruntime
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        config = _read_json(folder / "config.json")
        _require_supported(folder, config)
        weights = load_file(str(folder / "model.safetensors"))
        self._session = _session(onnxruntime, weights)
        positions = int(config["max_position_embeddings"])
        max_tokens = int(_read_json(folder / "sentence_bert_config.json").get("max_seq_length", 256))
        self._tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self._tokenizer.enable_truncation(min(max_tokens, positions))
        self._tokenizer.no_padding()  # the file pads every text to a fixed length; tokens are packed

    def encode(self, texts: list[str]) -> Array:
        """One L2-normalised float32 row per text.

        The texts' tokens are packed one after another, not padded to the longest: the dense
        products, nearly all the work, cost what the tokens do (a question and the short names
        in it took twice as long padded). Each token attends to its own text's alone. Texts of
        at most `PACKED_TOKENS` tokens in all (a query) run on the calling thread: a second
        thread inside the products saves an idle machine little and costs concurrent queries
        CPU. Larger batches run their groups on up to one thread per CPU (MAX_BATCH_THREADS
        at most)."""
        if not texts:
            return np.zeros((0, ARCHITECTURE["hidden_size"]), dtype=np.float32)
        encoded = [encoding.ids for encoding in self._tokenizer.encode_batch(texts)]
        groups = [[encoded[n] for n in group] for group in _packed_groups([len(ids) for ids in encoded])]
        workers = min(len(groups), _cpus(), MAX_BATCH_THREADS)
        if workers < 2:
            vectors = [self._encode_packed(group) for group in groups]
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="minilm") as pool:
                vectors = list(pool.map(self._encode_packed, groups))
        return np.concatenate(vectors) if len(vectors) > 1 else vectors[0]

    def _encode_packed(self, texts_ids: list[list[int]]) -> Array:
        lengths = np.array([len(ids) for ids in texts_ids])
        text_of = np.repeat(np.arange(len(lengths)), lengths)
        inputs = {
            "ids": np.concatenate([np.asarray(ids, dtype=np.int64) for ids in texts_ids]),
            "positions": np.concatenate([np.arange(length, dtype=np.int64) for length in lengths]),
            "mask": np.where(text_of[:, None] == text_of[None, :], 0.0, MASKED).astype(np.float32),
        }
        [states] = self._session.run(["states"], inputs)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        pooled = np.add.reduceat(states, starts, axis=0) / lengths[:, None].astype(np.float32)
        norms = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        vectors: Array = (pooled / norms).astype(np.float32)
        return vectors


def _cpus() -> int:
    """The CPUs this process may run on (all of the machine's where that cannot be asked)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _session(onnxruntime: Any, weights: dict[str, Array]) -> Any:
    """The graph with the weights it names, each run on its calling thread: no pool of threads
    to wait for each other (or to be lost across a fork)."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.log_severity_level = 3  # errors: the runtime's notes on its own choices are not the user's
    names = weight_names()
    values = [onnxruntime.OrtValue.ortvalue_from_numpy(weights[name]) for name in names]
    options.add_external_initializers(names, values)
    return onnxruntime.InferenceSession(GRAPH_FILE.read_bytes(), options, providers=["CPUExecutionProvider"])


def _packed_groups(lengths: list[int]) -> list[list[int]]:
    """The texts (by position) in groups of at most `PACKED_TOKENS` tokens (a text alone when it
    has more): attention over a group costs the square of its tokens."""
    groups: list[list[int]] = [[]]
    held = 0
    for position, length in enumerate(lengths):
        if groups[-1] and held + length > PACKED_TOKENS:
            groups.append([])
            held = 0
        groups[-1].append(position)
        held += length
    return groups


def _read_json(path: Path) -> dict[str, Any]:
    try:
        found: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"could not read the model's {path}: {exc}") from exc
    return found


def _require_supported(folder: Path, config: dict[str, Any]) -> None:
    pooling = _read_json(folder / "1_Pooling" / "config.json")
    modules = [str(module.get("type", "")) for module in json.loads((folder / "modules.json").read_text())]
    problems = [
        config.get("model_type") != "bert" and "not a BERT model",
        config.get("hidden_act") != "gelu" and "not GELU",
        config.get("position_embedding_type", "absolute") != "absolute" and "not absolute positions",
        not pooling.get("pooling_mode_mean_tokens") and "not mean pooling",
        not any(module.endswith("Normalize") for module in modules) and "not normalised",
        config.get("layer_norm_eps") != LAYER_NORM_EPS and f"layer_norm_eps is not {LAYER_NORM_EPS}",
        *(f"{key} is not {value}" for key, value in ARCHITECTURE.items() if config.get(key) != value),
    ]
    found = [problem for problem in problems if problem]
    if found:
        graph = GRAPH_FILE.name
        raise ConfigError(f"the model in {folder} cannot run as the graph in {graph}: {', '.join(found)}")
