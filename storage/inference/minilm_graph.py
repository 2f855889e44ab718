"""The ONNX graph of the bundled all-MiniLM-L6-v2 encoder, weights left out.

`kenning.storage.inference.minilm` runs `minilm_graph.onnx`, written by this module, with ONNX
Runtime, and hands it the weights of the bundled safetensors file by their names: the graph declares
each weight as external data, so the file holds the computation alone (a few kilobytes) and the
`onnx` package is needed only to write it again:

    python -m kenning.storage.inference.minilm_graph

tests/unit/test_embedder.py checks that the file is what this module writes.

The encoder is BERT's, on the tokens of one or more texts packed one after another:
- inputs: `ids` and `positions` (one per token), and `mask` (tokens x tokens), 0 where a token
  may attend to another (same text), the lowest float where not;
- word, position and token-type (always type 0) embeddings summed, then a layer norm;
- per layer: multi-head self-attention, a residual and layer norm, a GELU feed-forward block,
  a residual and layer norm;
- output: `states`, one row of `HIDDEN` floats per token (pooling is the caller's).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

GRAPH_FILE = Path(__file__).with_name("minilm_graph.onnx")
# The architecture the graph is written for (all-MiniLM-L6-v2's config.json).
ARCHITECTURE = {
    "num_hidden_layers": 6,
    "num_attention_heads": 12,
    "hidden_size": 384,
    "intermediate_size": 1536,
    "vocab_size": 30522,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
}
LAYER_NORM_EPS = 1e-12
HIDDEN = ARCHITECTURE["hidden_size"]
OPSET = 20  # Gelu
IR_VERSION = 9


LAYER_WEIGHTS = (
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "attention.output.LayerNorm",
    "intermediate.dense",
    "output.dense",
    "output.LayerNorm",
)


def weight_names() -> list[str]:
    """The names of the weights the graph is handed, as the bundled safetensors file has them."""
    embeddings = ["word_embeddings", "position_embeddings", "token_type_embeddings"]
    names = [f"embeddings.{name}.weight" for name in embeddings]
    names += ["embeddings.LayerNorm.weight", "embeddings.LayerNorm.bias"]
    for layer in range(ARCHITECTURE["num_hidden_layers"]):
        prefix = f"encoder.layer.{layer}."
        names += [f"{prefix}{part}.{kind}" for part in LAYER_WEIGHTS for kind in ("weight", "bias")]
    return names


class _Writer:
    """Nodes and initializers of a graph, each result named by a counter."""

    def __init__(self) -> None:
        from onnx import helper

        self.helper = helper
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self._count = 0

    def op(self, kind: str, *inputs: str, **attributes: Any) -> str:
        self._count += 1
        out = f"{kind.lower()}_{self._count}"
        self.nodes.append(self.helper.make_node(kind, list(inputs), [out], **attributes))
        return out

    def weight(self, name: str, *dims: int) -> str:
        """A float weight whose values the runtime is handed by name."""
        from onnx import TensorProto

        tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(dims))
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", "model.safetensors"), ("offset", "0"), ("length", "0")):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        self.initializers.append(tensor)
        return name

    def constant(self, name: str, value: Any, kind: str) -> str:
        import numpy as np
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array(np.array(value, dtype=kind), name))
        return name

    def dense(self, x: str, prefix: str, inputs: int, outputs: int) -> str:
        """x W^T + b, with W as the weights file holds it (outputs x inputs)."""
        weight = self.weight(f"{prefix}.weight", outputs, inputs)
        return self.op("Gemm", x, weight, self.weight(f"{prefix}.bias", outputs), transB=1)

    def layer_norm(self, x: str, prefix: str) -> str:
        weight, bias = self.weight(f"{prefix}.weight", HIDDEN), self.weight(f"{prefix}.bias", HIDDEN)
        return self.op("LayerNormalization", x, weight, bias, axis=-1, epsilon=LAYER_NORM_EPS)


def _embeddings(graph: _Writer) -> str:
    words = graph.weight("embeddings.word_embeddings.weight", ARCHITECTURE["vocab_size"], HIDDEN)
    positions = graph.weight(
        "embeddings.position_embeddings.weight", ARCHITECTURE["max_position_embeddings"], HIDDEN
    )
    types = graph.weight("embeddings.token_type_embeddings.weight", ARCHITECTURE["type_vocab_size"], HIDDEN)
    first_type = graph.op("Gather", types, graph.constant("type_0", 0, "int64"))
    summed = graph.op("Add", graph.op("Gather", words, "ids"), graph.op("Gather", positions, "positions"))
    return graph.layer_norm(graph.op("Add", summed, first_type), "embeddings.LayerNorm")


def _attention(graph: _Writer, x: str, prefix: str) -> str:
    def split(name: str, order: list[int]) -> str:
        projected = graph.dense(x, f"{prefix}attention.self.{name}", HIDDEN, HIDDEN)
        return graph.op("Transpose", graph.op("Reshape", projected, "by_head"), perm=order)

    query, key, value = split("query", [1, 0, 2]), split("key", [1, 2, 0]), split("value", [1, 0, 2])
    scores = graph.op("Add", graph.op("Mul", graph.op("MatMul", query, key), "scale"), "mask")
    weighted = graph.op("MatMul", graph.op("Softmax", scores, axis=-1), value)
    context = graph.op("Reshape", graph.op("Transpose", weighted, perm=[1, 0, 2]), "by_token")
    out = graph.dense(context, f"{prefix}attention.output.dense", HIDDEN, HIDDEN)
    return graph.layer_norm(graph.op("Add", out, x), f"{prefix}attention.output.LayerNorm")


def _feed_forward(graph: _Writer, x: str, prefix: str) -> str:
    inner = ARCHITECTURE["intermediate_size"]
    hidden = graph.op("Gelu", graph.dense(x, f"{prefix}intermediate.dense", HIDDEN, inner))
    out = graph.dense(hidden, f"{prefix}output.dense", inner, HIDDEN)
    return graph.layer_norm(graph.op("Add", out, x), f"{prefix}output.LayerNorm")


def build() -> Any:
    """The encoder as an `onnx.ModelProto`, its weights external."""
    from onnx import TensorProto, helper

    graph = _Writer()
    heads = ARCHITECTURE["num_attention_heads"]
    width = HIDDEN // heads
    graph.constant("by_head", [-1, heads, width], "int64")
    graph.constant("by_token", [-1, HIDDEN], "int64")
    graph.constant("scale", 1.0 / math.sqrt(width), "float32")
    x = _embeddings(graph)
    for layer in range(ARCHITECTURE["num_hidden_layers"]):
        prefix = f"encoder.layer.{layer}."
        x = _feed_forward(graph, _attention(graph, x, prefix), prefix)
    graph.nodes.append(helper.make_node("Identity", [x], ["states"]))
    inputs = [
        helper.make_tensor_value_info("ids", TensorProto.INT64, ["tokens"]),
        helper.make_tensor_value_info("positions", TensorProto.INT64, ["tokens"]),
        helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["tokens", "tokens"]),
    ]
    outputs = [helper.make_tensor_value_info("states", TensorProto.FLOAT, ["tokens", HIDDEN])]
    body = helper.make_graph(graph.nodes, "minilm", inputs, outputs, graph.initializers)
    model = helper.make_model(body, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="kenning")
    model.ir_version = IR_VERSION
    return model


if __name__ == "__main__":
    GRAPH_FILE.write_bytes(build().SerializeToString())
    print(f"wrote {GRAPH_FILE} ({GRAPH_FILE.stat().st_size} bytes)")
