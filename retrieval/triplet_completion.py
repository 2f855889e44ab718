"""TRIPLET_COMPLETION: vector search over facts embedded as `source -> relationship -> target: text`."""

from __future__ import annotations

from retrieval.vector_lane import VectorLaneRetriever

TRIPLET_COLLECTION = "Triplet_text"


class TripletCompletionRetriever(VectorLaneRetriever):
    collection = TRIPLET_COLLECTION
    kind = "triplet"
    extra_fields = ("source_id", "target_id", "relationship")
    separator = "\n"
