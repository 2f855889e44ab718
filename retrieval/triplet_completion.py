"""TRIPLET_COMPLETION: vector search over facts embedded as `source -> relationship -> target: text`.

Only facts between entities are given: a triplet of one of the pipeline's own relationships
(`contains`, `is_a`...) is skipped, whichever store or step wrote it. Each says when it held, as
every context does (`kenning.pipeline.validity.fact_line`): `Ana -> live in -> Oslo (since
2025-02-01): I live in Oslo again.`
"""

from __future__ import annotations

from kenning.pipeline.assembly import STRUCTURAL_RELATIONSHIPS, triplet_of
from kenning.pipeline.collection import TRIPLETS
from kenning.pipeline.models import Scope, ScoredPoint
from kenning.pipeline.validity import fact_line
from kenning.retrieval.vector_lane import VectorLaneRetriever


class TripletCompletionRetriever(VectorLaneRetriever):
    collection = TRIPLETS
    kind = "triplet"
    extra_fields = ("source_id", "target_id", "relationship")
    separator = "\n"
    skipped_relationships = STRUCTURAL_RELATIONSHIPS

    def _texts(self, scope: Scope, points: list[ScoredPoint], as_of: str | None) -> dict[str, str]:
        """Each triplet with when it held (as of `as_of`) after its ends, before its description;
        the ends' names are read from the graph, once for all the points."""
        ends = sorted(
            {str(p.payload.get(key) or "") for p in points for key in ("source_id", "target_id")} - {""}
        )
        found = self._ports.graph.get_nodes(scope, ends, provenance=False) if ends else []
        names = {node.id: str(node.properties.get("name") or "") for node in found}
        texts = {}
        for point in points:
            text = str(point.payload.get("text", ""))
            source = names.get(str(point.payload.get("source_id") or ""), "")
            target = names.get(str(point.payload.get("target_id") or ""), "")
            head = triplet_of(source, str(point.payload.get("relationship") or ""), target, "")
            if source and target and (text == head or text.startswith(f"{head}: ")):
                texts[point.id] = fact_line(head, point.payload, as_of, text[len(head) + 2 :])
            else:  # named otherwise since it was embedded: the time after the whole text
                texts[point.id] = fact_line(text, point.payload, as_of)
        return texts
