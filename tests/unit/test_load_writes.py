"""What a load batch writes under the dataset's write lock: each fact once, with its periods."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from kenning.pipeline.collection import EDGES, TRIPLETS
from kenning.pipeline.ingest import Source, add
from kenning.pipeline.models import Extraction, GraphEdge, KnowledgeEdge, KnowledgeGraph, KnowledgeNode, Scope
from kenning.pipeline.plan import STEPS, start_run
from kenning.pipeline.validity import PERIODS, SAID
from kenning.storage.graph.memory import MemoryGraphStore
from kenning.storage.vectors.memory import MemoryVectorStore
from tests.twins import CountingExtractor, TwinServices

SCOPE = Scope(tenant="t1", dataset="writes")


class SentenceExtractor(CountingExtractor):
    """Each sentence "A verb B." of a text as the fact A -verb-> B, with the two as people."""

    model = "sentences"
    prompt_version = "sentences-1"

    def extract(self, text: str) -> Extraction:
        nodes: dict[str, KnowledgeNode] = {}
        edges = []
        for sentence in filter(None, (part.strip() for part in text.split("."))):
            source, verb, target = sentence.split(" ", 2)
            for name in (source, target):
                nodes[name] = KnowledgeNode(id=name, name=name, type="Person")
            edges.append(KnowledgeEdge(source=source, target=target, relationship=verb, description=sentence))
        return Extraction(graph=KnowledgeGraph(nodes=list(nodes.values()), edges=edges), summary=text)


class CountingGraph(MemoryGraphStore):
    """The in-memory graph, counting how often each edge is written."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: Counter[str] = Counter()

    def upsert_edges(self, scope: Scope, edges: Sequence[GraphEdge]) -> None:
        self.writes.update(edge.id for edge in edges)
        super().upsert_edges(scope, edges)


class CountingVectors(MemoryVectorStore):
    """The in-memory vectors, counting the points whose payload was set after they were written."""

    def __init__(self) -> None:
        super().__init__()
        self.payloads_set: Counter[str] = Counter()

    def set_payload(self, scope: Scope, collection: str, values: dict[str, dict[str, Any]]) -> None:
        self.payloads_set.update(list(values))
        super().set_payload(scope, collection, values)


def test_a_load_batch_writes_each_fact_once_with_its_periods_in_the_graph_and_the_vectors() -> None:
    # Given a document stating two facts about a city, and one restating a fact already stored
    services = TwinServices(graph=CountingGraph(), vectors=CountingVectors(), extractor=SentenceExtractor())
    texts = ["Ana lives_in Oslo. Ana works_for Nordlys.", "Ana lives_in Oslo. Ivo works_for Nordlys."]
    for n, text in enumerate(texts):
        add(
            services.metadata,
            services.blobs,
            SCOPE,
            [Source(name=f"d{n}.txt", uri=f"t:d{n}", data=text.encode())],
        )
        # When each is cognified in turn (a load batch each)
        job = start_run(services, SCOPE)
        units: list[Any] = []
        for step in ("classify", "chunk", "extract", "load"):
            units = STEPS[step].run(services, job, units).items or units
    graph, vectors = services.graph, services.vectors
    assert isinstance(graph, CountingGraph) and isinstance(vectors, CountingVectors)
    facts = [edge for edge in graph.export(SCOPE)[1] if SAID in edge.properties]
    assert len(facts) >= 3
    # Then every fact was written once by each batch that stated it, never again to add its periods
    restated = {edge.id for edge in facts if len(edge.properties[SAID]) == 2}
    assert restated
    assert all(graph.writes[edge.id] == (2 if edge.id in restated else 1) for edge in facts)
    # And it holds its periods, in the graph and in its vector points, none of them set afterwards
    assert all(edge.properties.get(PERIODS) for edge in facts)
    for name in (EDGES, TRIPLETS):
        points = vectors.retrieve(SCOPE, name, [edge.id for edge in facts])
        assert points and all(point.payload.get(PERIODS) for point in points)
    assert not vectors.payloads_set
