"""The bundled all-MiniLM-L6-v2 run in numpy: the few texts of a query, without torch.

sentence-transformers needs torch and transformers, whose imports cost seconds of CPU before
a process embeds its first text: every `kenning search`, MCP server or API process paid them
for one short query. That model is a 6-layer BERT encoder 384 wide; for one short text, its
forward pass in numpy (`tokenizers` cuts the words, the weights are the bundled safetensors)
takes milliseconds, and its vectors agree with sentence-transformers' to about 1e-7
(tests/unit/test_embedder.py compares them). Batches still go to sentence-transformers,
whose kernels are faster on many long texts.

The forward pass is BERT's: word, position and token-type embeddings, layer norm; per layer,
multi-head self-attention (the texts of a call packed one after another, each token attending
only within its own text), a residual and layer norm, a GELU feed-forward block, a residual and
layer norm; then the mean of each text's token vectors, L2-normalised (the model's pooling and
normalisation modules).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kenning.pipeline.errors import ConfigError

Array = np.ndarray[Any, np.dtype[np.float32]]
# The most tokens encoded together: their attention scores are (heads, tokens, tokens) floats.
PACKED_TOKENS = 512


@dataclass(frozen=True)
class _Layer:
    qkv_weight: Array  # (hidden, 3 * hidden): query, key and value side by side
    qkv_bias: Array
    attention_out: Array
    attention_out_bias: Array
    attention_norm: tuple[Array, Array]
    intermediate: Array
    intermediate_bias: Array
    output: Array
    output_bias: Array
    output_norm: tuple[Array, Array]


class NumpyMiniLM:
    """Sentence vectors from a BERT sentence-transformers model folder with mean pooling and
    normalisation (as all-MiniLM-L6-v2 is); `ConfigError` for any other kind of model."""

    def __init__(self, folder: Path) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        config = _read_json(folder / "config.json")
        _require_supported(folder, config)
        self._heads = int(config["num_attention_heads"])
        self._eps = float(config["layer_norm_eps"])
        weights = load_file(str(folder / "model.safetensors"))
        self._words = weights["embeddings.word_embeddings.weight"]
        self._positions = weights["embeddings.position_embeddings.weight"]
        self._token_type = weights["embeddings.token_type_embeddings.weight"][0]
        self._embedding_norm = _norm(weights, "embeddings.LayerNorm")
        layers = range(int(config["num_hidden_layers"]))
        self._layers = [_layer(weights, f"encoder.layer.{n}.") for n in layers]
        max_tokens = int(_read_json(folder / "sentence_bert_config.json").get("max_seq_length", 256))
        self._tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self._tokenizer.enable_truncation(min(max_tokens, self._positions.shape[0]))
        self._tokenizer.no_padding()  # the file pads every text to a fixed length; tokens are packed

    def encode(self, texts: list[str]) -> Array:
        """One L2-normalised float32 row per text, on this thread alone: a second thread taking
        half of each feed-forward block saved a twentieth of a query's time on an idle machine
        for over a quarter more CPU, which concurrent queries pay for.

        The texts' tokens are packed one after another, not padded to the longest: the dense
        products, nearly all the work, cost what the tokens do (a question and the short names
        in it took twice as long padded). Each token attends to its own text's alone."""
        if not texts:
            return np.zeros((0, self._words.shape[1]), dtype=np.float32)
        encoded = [encoding.ids for encoding in self._tokenizer.encode_batch(texts)]
        groups = _packed_groups([len(ids) for ids in encoded])
        vectors = [self._encode_packed([encoded[n] for n in group]) for group in groups]
        return np.concatenate(vectors) if len(vectors) > 1 else vectors[0]

    def _encode_packed(self, texts_ids: list[list[int]]) -> Array:
        lengths = np.array([len(ids) for ids in texts_ids])
        ids = np.concatenate([np.asarray(ids, dtype=np.int64) for ids in texts_ids])
        positions = np.concatenate([np.arange(length) for length in lengths])
        text_of = np.repeat(np.arange(len(lengths)), lengths)
        x = self._words[ids] + self._positions[positions] + self._token_type
        x = self._layer_norm(x, self._embedding_norm)
        masked = np.where(text_of[:, None] == text_of[None, :], 0.0, np.finfo(np.float32).min).astype(
            np.float32
        )
        for layer in self._layers:
            x = self._attention(x, layer, masked)
            x = self._layer_norm(_feed_forward(x, layer) + layer.output_bias + x, layer.output_norm)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        pooled = np.add.reduceat(x, starts, axis=0) / lengths[:, None].astype(np.float32)
        norms = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        vectors: Array = (pooled / norms).astype(np.float32)
        return vectors

    def _attention(self, x: Array, layer: _Layer, masked: Array) -> Array:
        """Self-attention over packed tokens (tokens, hidden); `masked` (tokens, tokens) keeps
        each token to its own text."""
        tokens, hidden = x.shape
        width = hidden // self._heads
        qkv = x @ layer.qkv_weight + layer.qkv_bias
        # (heads, tokens, width), contiguous: numpy's matmul uses BLAS only on contiguous stacks
        query, key, value = (
            np.ascontiguousarray(
                qkv[:, part * hidden : (part + 1) * hidden]
                .reshape(tokens, self._heads, width)
                .transpose(1, 0, 2)
            )
            for part in range(3)
        )
        scores = query @ np.ascontiguousarray(key.transpose(0, 2, 1)) * (1.0 / math.sqrt(width)) + masked
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        context = (scores @ value).transpose(1, 0, 2).reshape(tokens, hidden)
        out = context @ layer.attention_out + layer.attention_out_bias
        return self._layer_norm(out + x, layer.attention_norm)

    def _layer_norm(self, x: Array, norm: tuple[Array, Array]) -> Array:
        mean = x.mean(axis=-1, keepdims=True)
        variance = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        weight, bias = norm
        normed: Array = (x - mean) / np.sqrt(variance + self._eps) * weight + bias
        return normed


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


def _feed_forward(x: Array, layer: _Layer) -> Array:
    """GELU(x W1 + b1) W2, without its bias."""
    product: Array = _gelu(x @ layer.intermediate + layer.intermediate_bias) @ layer.output
    return product


def _gelu(x: Array) -> Array:
    """BERT's exact GELU, x * Phi(x), with Phi from `_erf`."""
    phi: Array = 0.5 * (1.0 + _erf(x * np.float32(1.0 / math.sqrt(2.0))))
    return x * phi


# Abramowitz and Stegun, Handbook of Mathematical Functions, 7.1.26: erf to within 1.5e-7.
_ERF_P = np.float32(0.3275911)
_ERF_A = tuple(np.float32(a) for a in (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592))
_ERF_FLAT = np.float32(10.0)


def _erf(z: Array) -> Array:
    """erf in float32, within 7e-7 of the true value (the most lost near 0.06): a handful of
    whole-array operations, a third of the time scipy's erf takes on a query's activations (a
    fifth of the query's embedding went there)."""
    # erf is 1 in float32 from 4 on: a larger magnitude only risks overflowing its square.
    magnitude = np.minimum(np.abs(z), _ERF_FLAT)
    t = 1.0 / (1.0 + _ERF_P * magnitude)
    polynomial = _ERF_A[0] * t
    for a in _ERF_A[1:]:
        polynomial = (polynomial + a) * t
    found: Array = np.copysign(1.0 - polynomial * np.exp(-magnitude * magnitude), z)
    return found


def _layer(weights: dict[str, Array], prefix: str) -> _Layer:
    def get(name: str) -> Array:
        return weights[prefix + name]

    def dense(name: str) -> Array:
        return np.ascontiguousarray(get(f"{name}.weight").T)

    parts = ("attention.self.query", "attention.self.key", "attention.self.value")
    return _Layer(
        qkv_weight=np.concatenate([dense(part) for part in parts], axis=1),
        qkv_bias=np.concatenate([get(f"{part}.bias") for part in parts]),
        attention_out=dense("attention.output.dense"),
        attention_out_bias=get("attention.output.dense.bias"),
        attention_norm=_norm(weights, prefix + "attention.output.LayerNorm"),
        intermediate=dense("intermediate.dense"),
        intermediate_bias=get("intermediate.dense.bias"),
        output=dense("output.dense"),
        output_bias=get("output.dense.bias"),
        output_norm=_norm(weights, prefix + "output.LayerNorm"),
    )


def _norm(weights: dict[str, Array], prefix: str) -> tuple[Array, Array]:
    return weights[f"{prefix}.weight"], weights[f"{prefix}.bias"]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        found: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"could not read the model's {path.name}: {exc}") from exc
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
    ]
    found = [problem for problem in problems if problem]
    if found:
        raise ConfigError(f"the model in {folder} cannot run in numpy: {', '.join(found)}")
