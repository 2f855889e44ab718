"""SUMMARIES: vector search over chunk summaries; each hit refers to the chunk it summarises."""

from __future__ import annotations

from retrieval.vector_lane import VectorLaneRetriever

SUMMARY_COLLECTION = "TextSummary_text"


class SummariesRetriever(VectorLaneRetriever):
    collection = SUMMARY_COLLECTION
    kind = "summary"
