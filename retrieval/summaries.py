"""SUMMARIES: vector search over chunk summaries; each hit refers to the chunk it summarises."""

from __future__ import annotations

from kenning.pipeline.collection import SUMMARIES
from kenning.retrieval.vector_lane import VectorLaneRetriever


class SummariesRetriever(VectorLaneRetriever):
    collection = SUMMARIES
    kind = "summary"
