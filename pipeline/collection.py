"""Vector collection names: one collection per indexed field, named `<Type>_<field>`.

Every name comes from a model's `index_fields`, so the writer (assembly) and the
readers (retrievers, load) cannot drift apart.
"""

from __future__ import annotations

from typing import Any

from kenning.pipeline.models import Chunk, DataPoint, Edge, Entity, EntityType, TextSummary
from kenning.pipeline.temporal import Event


def collection_name(model: type[DataPoint] | type[Edge] | str, field: str) -> str:
    """`<Type>_<field>`; `model` is a DataPoint class, Edge, or a type name (e.g. "Triplet")."""
    type_name = model if isinstance(model, str) else _type_name(model)
    if not isinstance(model, str) and field not in model.index_fields:
        raise ValueError(f"{type_name}.{field} is not an indexed field")
    return f"{type_name}_{field}"


def _type_name(model: Any) -> str:
    return str(model.type_name()) if hasattr(model, "type_name") else str(model.__name__)


CHUNKS = collection_name(Chunk, "text")
SUMMARIES = collection_name(TextSummary, "text")
ENTITIES = collection_name(Entity, "name")
ENTITY_TYPES = collection_name(EntityType, "name")
EDGES = collection_name(Edge, "description")
EVENTS = collection_name(Event, "text")
# A triplet is the text `source -> relationship -> target: description` of an edge, not a field.
TRIPLETS = collection_name("Triplet", "text")

NODES = (CHUNKS, SUMMARIES, ENTITIES, ENTITY_TYPES)
"""The node collections that graph completion searches."""
INDEXED = (*NODES, EDGES)
"""The node and fact collections: those the graph's retrievers search."""
FACTS = (EDGES, TRIPLETS)
"""The collections of facts: their points carry the periods the facts held."""
LOADED = (*INDEXED, TRIPLETS)
"""The collections created before every load (the events', written only with temporal on, aside)."""
