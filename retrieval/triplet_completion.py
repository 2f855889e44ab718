"""TRIPLET_COMPLETION: vector search over facts embedded as `source -> relationship -> target: text`.

Only facts between entities are given: a triplet of one of the pipeline's own relationships
(`contains`, `is_a`...) is skipped, whichever store or step wrote it.
"""

from __future__ import annotations

from kenning.pipeline.assembly import STRUCTURAL_RELATIONSHIPS
from kenning.pipeline.collection import TRIPLETS
from kenning.retrieval.vector_lane import VectorLaneRetriever


class TripletCompletionRetriever(VectorLaneRetriever):
    collection = TRIPLETS
    kind = "triplet"
    extra_fields = ("source_id", "target_id", "relationship")
    separator = "\n"
    skipped_relationships = STRUCTURAL_RELATIONSHIPS
