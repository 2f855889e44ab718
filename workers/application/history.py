"""An entity's history: every fact about it, retired ones too, with when each held and the data
items that said so (`kenning.pipeline.validity`)."""

from __future__ import annotations

from kenning.pipeline.errors import InputError, NotFound
from kenning.pipeline.linking import canonical_name
from kenning.pipeline.models import Entity
from kenning.pipeline.temporal import parse_moment
from kenning.pipeline.validity import Fact, history
from kenning.workers.application.context import Context
from kenning.workers.application.lifecycle import readable_dataset


def fact_history(context: Context, entity: str, dataset: str | None, as_of: str | None = None) -> list[Fact]:
    """The facts of the entity named, oldest first (with `as_of`: those that held then); NotFound
    when the dataset the caller may read has no entity of that name."""
    if not entity.strip():
        raise InputError("name an entity, e.g. kenning history Ana")
    moment = moment_of(as_of)
    scope = readable_dataset(context, dataset).scope
    graph = context.wiring.graph
    for name in dict.fromkeys((entity, canonical_name(entity))):
        entity_id = Entity(name=name, tenant=scope.tenant, dataset=scope.dataset).id
        if graph.get_nodes(scope, [entity_id], provenance=False):
            facts = history(graph, scope, entity_id)
            return facts if moment is None else [fact for fact in facts if fact.held_at(moment)]
    raise NotFound(f"no entity {entity!r} in dataset {scope.dataset!r}")


def moment_of(as_of: str | None) -> str | None:
    """The moment `as_of` names, or None; InputError saying what a moment looks like otherwise."""
    if as_of is None:
        return None
    try:
        return parse_moment(as_of)
    except ValueError as error:
        raise InputError(f"as of: {error}") from None
