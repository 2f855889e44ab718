"""The fenced writer: the stores a pipeline step writes through, each write checked first.

A task that runs a step sets the fence (`locking.fenced`): a check that raises `LockLost`
once its run no longer holds the dataset lock. A step is given `fenced_services(services)`
(by `plan.Step.run`, and so are the run's records of its steps and its end):
the same ports, whose every write method calls the fence before it runs, so a step that lost
its lock stops at its next write, and no write of a step can skip the check. Without a fence
set (the embedded runner, a tool) the check does nothing.

What is not fenced, on purpose: reads, and the extraction cache's put (an LLM's answer is the
chunk's whoever asked for it, and a later run reuses it; losing it would pay for the call twice).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, cast

from kenning.pipeline.context import PipelineConfig, Services
from kenning.pipeline.lexical import LexicalIndex
from kenning.pipeline.locking import check_fence
from kenning.pipeline.ports import (
    BlobStore,
    ChunkStore,
    Embedder,
    ExtractionCache,
    Extractor,
    GraphStore,
    MetadataStore,
    VectorStore,
)

# The methods of each port called without the fence: its reads (and `close`, and the cache's put).
# Every other method is a write, fenced: a method added to a port is fenced until named here.
METADATA_UNFENCED = frozenset(
    {
        "get_dataset",
        "list_datasets",
        "list_items",
        "get_items",
        "contents_in_use",
        "get_run",
        "list_runs",
        "list_running_runs",
    }
)
CHUNK_UNFENCED = frozenset(
    {
        "list_documents",
        "get_chunks",
        "list_chunk_ids",
        "data_ids_with_chunks",
        "chunks_of",
        "text_hashes_in_use",
    }
)
CACHE_UNFENCED = frozenset({"get_extractions", "put_extractions"})  # put: see the module's docstring
BLOB_UNFENCED = frozenset({"get", "exists"})
GRAPH_UNFENCED = frozenset(
    {"get_nodes", "get_edges", "edge_shapes", "neighbourhood", "export", "supported_by", "counts", "close"}
)
VECTOR_UNFENCED = frozenset({"search", "retrieve", "list_collections", "count", "close"})
LEXICAL_UNFENCED = frozenset({"search"})


class Fenced:
    """A port whose methods, but those named in `unfenced`, call the fence before they run."""

    def __init__(self, port: object, unfenced: frozenset[str]) -> None:
        self.port = port
        self.unfenced = unfenced

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.port, name)
        if name in self.unfenced or name.startswith("_") or not callable(value):
            return value
        return _after_the_fence(value)


def _after_the_fence(write: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(write)
    def fenced_write(*args: Any, **kwargs: Any) -> Any:
        check_fence()
        return write(*args, **kwargs)

    return fenced_write


class FencedServices:
    """`Services` whose stores are `Fenced`; the embedder, extractor and config are the same."""

    def __init__(self, services: Services) -> None:
        self.unfenced = services

    @property
    def config(self) -> PipelineConfig:
        return self.unfenced.config

    @property
    def metadata(self) -> MetadataStore:
        return cast(MetadataStore, Fenced(self.unfenced.metadata, METADATA_UNFENCED))

    @property
    def chunks(self) -> ChunkStore:
        return cast(ChunkStore, Fenced(self.unfenced.chunks, CHUNK_UNFENCED))

    @property
    def cache(self) -> ExtractionCache:
        return cast(ExtractionCache, Fenced(self.unfenced.cache, CACHE_UNFENCED))

    @property
    def blobs(self) -> BlobStore:
        return cast(BlobStore, Fenced(self.unfenced.blobs, BLOB_UNFENCED))

    @property
    def graph(self) -> GraphStore:
        return cast(GraphStore, Fenced(self.unfenced.graph, GRAPH_UNFENCED))

    @property
    def vectors(self) -> VectorStore:
        return cast(VectorStore, Fenced(self.unfenced.vectors, VECTOR_UNFENCED))

    @property
    def lexical(self) -> LexicalIndex:
        return cast(LexicalIndex, Fenced(self.unfenced.lexical, LEXICAL_UNFENCED))

    @property
    def embedder(self) -> Embedder:
        return self.unfenced.embedder

    @property
    def extractor(self) -> Extractor:
        return self.unfenced.extractor


def fenced_services(services: Services) -> Services:
    """The services with every store write fenced (the same object when it is fenced already)."""
    return services if isinstance(services, FencedServices) else FencedServices(services)
