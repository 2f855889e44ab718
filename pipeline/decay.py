"""Time decay with access reinforcement: memories fade unless they are used.

An element's age runs from its last retrieval (or, never retrieved, from when its data
was added). Each retrieval also slows the fade: the age counts as age / (1 + log2(1 + n))
after n retrievals. The decay factor halves every `half_life_days` of that age; a search
lowers a hit's score by `weight * (1 - factor)`, and prune forgets items whose factor
fell below a floor, or that are older than a cutoff.
"""

from __future__ import annotations

import math
from datetime import datetime

from pydantic import BaseModel, Field


class DecayConfig(BaseModel):
    half_life_days: float = Field(default=0.0, ge=0, description="0: no decay")
    weight: float = Field(default=0.3, ge=0, description="Score taken from a fully faded hit")


def decay_factor(last_seen: datetime, count: int, now: datetime, half_life_days: float) -> float:
    """1.0 for a fresh element, halving every half-life of (reinforced) age; 1.0 when decay is off."""
    if half_life_days <= 0:
        return 1.0
    age_days = max(0.0, (now - last_seen).total_seconds() / 86400)
    effective = age_days / (1 + math.log2(1 + max(0, count)))
    return float(0.5 ** (effective / half_life_days))


def decayed(score: float, factor: float, weight: float) -> float:
    """The score (higher is better, in [0, 1]) of a hit whose element has faded to `factor`."""
    return max(0.0, score - weight * (1.0 - factor))
