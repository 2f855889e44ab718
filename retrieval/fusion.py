"""Reciprocal-rank fusion of ranked lanes, and the settings of the hybrid retriever's lanes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

LANES = ("chunks", "lexical", "summaries", "entities", "facts", "graph")
Depth = Annotated[int, Field(ge=1, le=1000)]
Weight = Annotated[float, Field(ge=0.0)]


class FusionConfig(BaseModel):
    """How HYBRID_COMPLETION fuses its lanes; any field can be set through `SearchRequest.options`.

    A lane of weight 0 is not searched at all. The `graph` lane is GRAPH_PPR's walk (its
    settings, `kenning.retrieval.graph_ppr.WalkConfig`, can be set through the same options). The
    weights are not tuned on any benchmark's reported questions: `bench/retrieval.py --tune`
    chooses the lexical and graph weights on the development halves of HotpotQA-100 and
    2Wiki and reports them on the test halves. The summaries and facts lanes are off by
    default: at 0.05 each (their weight before), recall@2, @5, @10 and all@5 on both
    development halves were the same or lower than with them off, and they were two of its
    three fixed vector searches (the facts lane's 160 edge hits the costliest). The context's
    `facts` best edge facts are searched for either way.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    rrf_k: int = Field(default=60, ge=0, description="The k of 1 / (k + rank)")
    weights: dict[str, Weight] = Field(
        default_factory=lambda: {
            "chunks": 1.0,
            "lexical": 0.5,
            "summaries": 0.0,
            "entities": 0.0,
            "facts": 0.0,
            "graph": 4.0,
        }
    )
    depths: dict[str, Depth] = Field(
        default_factory=lambda: {
            "chunks": 40,
            "lexical": 40,
            "summaries": 20,
            "entities": 20,
            "facts": 20,
            "graph": 40,
        },
        description="Chunks taken from each lane; a lane not named takes 20",
    )
    entity_seeds: int = Field(default=10, ge=1, le=200, description="Entity-name hits to start from")
    neighbours: int = Field(default=50, ge=0, le=1000, description="Graph neighbours of the seeds kept")
    neighbour_decay: float = Field(default=0.5, ge=0.0, le=1.0, description="A neighbour's share of its seed")
    facts: int = Field(default=10, ge=0, le=200, description="Edge facts added to the context")

    @field_validator("weights", "depths")
    @classmethod
    def _known_lanes(cls, value: dict[str, float]) -> dict[str, float]:
        return known_lanes(value, LANES)

    def weight(self, lane: str) -> float:
        return float(self.weights.get(lane, 0.0))

    def depth(self, lane: str) -> int:
        return int(self.depths.get(lane, 20))

    def best_score(self) -> float:
        """The fused score of an item ranked first in every lane."""
        return sum(self.weight(lane) for lane in LANES) / (self.rrf_k + 1)


def known_lanes(value: dict[str, float], lanes: Sequence[str]) -> dict[str, float]:
    """`value`, a mapping by lane, if it names only `lanes`; else ValueError naming them: a
    misspelt lane would be a lane silently off."""
    unknown = sorted(set(value) - set(lanes))
    if unknown:
        raise ValueError(f"no lane {', '.join(map(repr, unknown))}: the lanes are {', '.join(lanes)}")
    return value


class Fused(BaseModel):
    """One fused item: its score (higher is better) and its 1-based rank in each lane that had it."""

    id: str
    score: float
    ranks: dict[str, int]


def reciprocal_rank_fusion(
    lanes: Mapping[str, Sequence[str]], weights: Mapping[str, float], k: int
) -> list[Fused]:
    """Items by the sum over lanes of weight / (k + rank), best first; ties keep first-seen order.

    An item repeated within a lane counts at its best rank only; lanes of weight 0 are ignored.
    """
    fused: dict[str, Fused] = {}
    for lane, ranked in lanes.items():
        weight = float(weights.get(lane, 0.0))
        if weight <= 0:
            continue
        for rank, item in enumerate(dict.fromkeys(ranked), 1):
            entry = fused.setdefault(item, Fused(id=item, score=0.0, ranks={}))
            entry.score += weight / (k + rank)
            entry.ranks[lane] = rank
    return sorted(fused.values(), key=lambda entry: -entry.score)
