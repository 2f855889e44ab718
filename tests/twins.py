"""A `Services` made of in-memory twins, for fast pipeline tests."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from kenning.pipeline.context import PipelineConfig
from kenning.pipeline.errors import LLMError, NoLLMConfigured
from kenning.pipeline.models import Extraction
from kenning.pipeline.offline import OfflineExtractor
from kenning.storage.coordination.lock import MemoryLock
from kenning.storage.graph.memory import MemoryGraphStore
from kenning.storage.inference.embedder import HashEmbedder
from kenning.storage.lexical.memory import MemoryLexicalIndex
from kenning.storage.metadata.memory import MemoryMetadataStore
from kenning.storage.sources.blob import MemoryBlobStore
from kenning.storage.vectors.memory import MemoryVectorStore


class CountingExtractor:
    """The offline extractor, counting calls and failing on texts that contain `fail_on`."""

    model = "offline"
    prompt_version = "offline-1"

    def __init__(self, fail_on: str | None = None) -> None:
        self.calls = 0
        self.fail_on = fail_on
        self._inner = OfflineExtractor()
        self._mutex = threading.Lock()

    def extract(self, text: str) -> Extraction:
        with self._mutex:
            self.calls += 1
        if self.fail_on and self.fail_on in text:
            raise LLMError(f"the model refused: {self.fail_on}")
        return self._inner.extract(text)


class NoCompleter:
    def complete(self, system: str, prompt: str) -> str:
        raise NoLLMConfigured("no LLM is configured")


@dataclass
class TwinServices:
    config: PipelineConfig = field(default_factory=PipelineConfig)
    metadata: MemoryMetadataStore = field(default_factory=MemoryMetadataStore)
    blobs: MemoryBlobStore = field(default_factory=MemoryBlobStore)
    graph: MemoryGraphStore = field(default_factory=MemoryGraphStore)
    vectors: MemoryVectorStore = field(default_factory=MemoryVectorStore)
    lexical: MemoryLexicalIndex = field(default_factory=MemoryLexicalIndex)
    embedder: HashEmbedder = field(default_factory=HashEmbedder)
    extractor: CountingExtractor = field(default_factory=CountingExtractor)
    completer: NoCompleter = field(default_factory=NoCompleter)
    lock: MemoryLock = field(default_factory=MemoryLock)

    @property
    def chunks(self) -> MemoryMetadataStore:
        return self.metadata

    @property
    def cache(self) -> MemoryMetadataStore:
        return self.metadata
