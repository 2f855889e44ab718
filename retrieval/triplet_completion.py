"""TRIPLET_COMPLETION: vector search over facts embedded as `source -> relationship -> target: text`."""

from __future__ import annotations

from kenning.pipeline.collection import TRIPLETS
from kenning.retrieval.vector_lane import VectorLaneRetriever


class TripletCompletionRetriever(VectorLaneRetriever):
    collection = TRIPLETS
    kind = "triplet"
    extra_fields = ("source_id", "target_id", "relationship")
    separator = "\n"
