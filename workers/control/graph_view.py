"""The graph view: one self-contained HTML page drawing a dataset's entities and their relations.

The page needs nothing from the network (its script and style are inline), so it opens offline
and can be mailed or archived as one file. It has a search box that highlights matching entities
and a panel that shows a clicked entity's description, relations and sources: the data items and
chunks it was extracted from. Above `MAX_NODES` entities it draws the best connected ones, and
says so. Facts that change keep the periods they held (`kenning.pipeline.validity`): a time slider
picks a day, and the facts that did not hold then (retired, or not yet true) are drawn dimmed.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from importlib import resources
from typing import Any

from pydantic import BaseModel, Field

from kenning.pipeline.errors import NotFound
from kenning.pipeline.models import GraphEdge, GraphNode, Scope
from kenning.pipeline.temporal import moment_start
from kenning.pipeline.validity import PERIODS, held_phrase
from kenning.workers.memory import Kenning

MAX_NODES = 5000
SNIPPET_CHARS = 280
DESCRIPTION_CHARS = 600
ENTITY = "Entity"
CHUNK = "DocumentChunk"
# Structural edges: chunk -> entity (`contains`, a citation) and entity -> its type (`is_a`, a colour).
STRUCTURAL = frozenset({"contains", "is_a"})
TEMPLATE = "assets/graph_view.html"
DATA_MARK = "/*KENNING_GRAPH_DATA*/"
# One colour per type, by the type's place among the dataset's types (not the drawn ones).
PALETTE = (
    "#4e79a7", "#f28e2b", "#e15759", "#59a14f", "#b07aa1", "#76b7b2",
    "#edc948", "#ff9da7", "#9c755f", "#86bcb6", "#d37295", "#8cd17d",
)  # fmt: skip
UNTYPED = "Entity"
TITLE_MARK = "<!--KENNING_TITLE-->"


class ViewNode(BaseModel):
    id: str
    name: str
    type: str = ""
    description: str = ""
    data_ids: list[str] = Field(default_factory=list, description="The data items it came from")
    chunk_ids: list[str] = Field(default_factory=list, description="The chunks that mention it")
    degree: int = 0


class ViewLink(BaseModel):
    source: str
    target: str
    relationship: str
    description: str = ""
    chunk_id: str | None = None
    periods: list[tuple[int, int | None]] = Field(
        default_factory=list,
        description="When the fact held: [from, to) in milliseconds since the epoch, to None while it holds; "
        "none for a relation with no time",
    )
    held: str = Field(default="", description="When it held, as a context says it: '2023-01-10 to 2024-05'")


class Citation(BaseModel):
    """A chunk an entity or relation was extracted from: its data item and the start of its text."""

    data_id: str | None = None
    text: str = ""


class GraphView(BaseModel):
    """What the page draws: entities, the relations among them and their sources."""

    tenant: str
    dataset: str
    nodes: list[ViewNode]
    links: list[ViewLink]
    chunks: dict[str, Citation] = Field(default_factory=dict)
    items: dict[str, str] = Field(default_factory=dict, description="data item id -> its name")
    total_nodes: int = Field(description="Entities in the dataset, drawn or not")
    total_links: int = Field(description="Relations among them, drawn or not")
    types: dict[str, str] = Field(
        default_factory=dict, description="Every type of the dataset's entities, drawn or not -> its colour"
    )
    now: int = Field(default=0, description="When the view was made, in milliseconds since the epoch")

    @property
    def sampled(self) -> bool:
        return len(self.nodes) < self.total_nodes


def graph_view(
    scope: Scope,
    nodes: Sequence[GraphNode],
    edges: Sequence[GraphEdge],
    items: Mapping[str, str] | None = None,
    max_nodes: int = MAX_NODES,
    now: datetime | None = None,
) -> GraphView:
    """The view of an exported graph: its `Entity` nodes and the relations among them, the
    best connected `max_nodes` entities when there are more; `items` names the data items; `now`
    (default: the end of today) is where the page's time slider ends."""
    entities = {node.id: node for node in nodes if node.type == ENTITY}
    relations = [
        e
        for e in edges
        if e.relationship not in STRUCTURAL and e.source_id in entities and e.target_id in entities
    ]
    degree: Counter[str] = Counter()
    for edge in relations:
        degree[edge.source_id] += 1
        degree[edge.target_id] += 1
    kept = sorted(entities, key=lambda i: (-degree[i], _name(entities[i]), i))[:max_nodes]
    shown = set(kept)
    links = [_link(e) for e in relations if e.source_id in shown and e.target_id in shown]
    cited = _citations(edges, entities)
    view_nodes = [_node(entities[i], degree[i], cited.get(i, [])) for i in kept]
    chunk_ids = {c for n in view_nodes for c in n.chunk_ids}
    chunk_ids |= {link.chunk_id for link in links if link.chunk_id}
    chunks = {n.id: _citation(n) for n in nodes if n.type == CHUNK and n.id in chunk_ids}
    data_ids = {d for n in view_nodes for d in n.data_ids} | {c.data_id for c in chunks.values() if c.data_id}
    names = {i: name for i, name in (items or {}).items() if i in data_ids}
    return GraphView(
        tenant=scope.tenant,
        dataset=scope.dataset,
        nodes=view_nodes,
        links=links,
        chunks=chunks,
        items=names,
        total_nodes=len(entities),
        total_links=len(relations),
        types=type_colours(type_name(node) for node in entities.values()),
        now=_ms(now or end_of_today()),
    )


def dataset_view(memory: Kenning, dataset: str | None = None, max_nodes: int = MAX_NODES) -> GraphView:
    """The view of a dataset, as `memory`'s caller may see it: NotFound for a dataset that does
    not exist or that it may not read (the same answer, so it learns nothing)."""
    scope = memory.scope(dataset)
    found = memory.wiring.metadata.get_dataset(scope)
    if found is None or not memory.may_read(scope):
        raise NotFound(f"no dataset {scope.dataset!r}")
    nodes, edges = memory.wiring.graph.export(scope)
    items = {item.id: item.name for item in memory.wiring.metadata.list_items(found.id)}
    return graph_view(scope, nodes, edges, items, max_nodes)


def graph_html(memory: Kenning, dataset: str | None = None, max_nodes: int = MAX_NODES) -> str:
    """The page for a dataset (see `dataset_view`), as one HTML string: what the HTTP API serves
    and `kenning visualize` writes."""
    return render_html(dataset_view(memory, dataset, max_nodes))


def render_html(view: GraphView) -> str:
    """The page drawing `view`: HTML with its script, style and data inline."""
    template = resources.files("kenning.workers").joinpath(TEMPLATE).read_text(encoding="utf-8")
    title = f"kenning: {view.dataset}".replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return template.replace(TITLE_MARK, title).replace(DATA_MARK, script_json(payload(view)))


def payload(view: GraphView) -> dict[str, Any]:
    """The page's data, compact: chunks, items and types as indexes into lists of their own."""
    types = sorted(view.types)
    item_ids = sorted(view.items)
    chunk_ids = sorted(view.chunks)
    type_at = {t: n for n, t in enumerate(types)}
    item_at = {i: n for n, i in enumerate(item_ids)}
    chunk_at = {c: n for n, c in enumerate(chunk_ids)}
    node_at = {node.id: n for n, node in enumerate(view.nodes)}
    return {
        "timeline": timeline(view),
        "tenant": view.tenant,
        "dataset": view.dataset,
        "total": {"nodes": view.total_nodes, "links": view.total_links},
        "sampled": view.sampled,
        "types": [{"name": t, "colour": view.types[t]} for t in types],
        "items": [{"id": i, "name": view.items[i]} for i in item_ids],
        "chunks": [
            {"id": c, "item": item_at.get(view.chunks[c].data_id or ""), "text": view.chunks[c].text}
            for c in chunk_ids
        ],
        "nodes": [
            {
                "id": node.id,
                "name": node.name,
                "type": type_at[node.type],
                "description": node.description,
                "items": _indexes(node.data_ids, item_at),
                "chunks": _indexes(node.chunk_ids, chunk_at),
                "degree": node.degree,
            }
            for node in view.nodes
        ],
        "links": [_link_row(link, node_at, chunk_at) for link in view.links],
    }


def _link_row(link: ViewLink, node_at: Mapping[str, int], chunk_at: Mapping[str, int]) -> list[Any]:
    """[source, target, relationship, description, chunk?, periods, held]: the last two (and the
    chunk, null when none) only for a fact with periods."""
    row: list[Any] = [node_at[link.source], node_at[link.target], link.relationship, link.description]
    chunk = chunk_at.get(link.chunk_id) if link.chunk_id else None
    if link.periods:
        return [*row, chunk, [list(period) for period in link.periods], link.held]
    return row + ([chunk] if chunk is not None else [])


def timeline(view: GraphView) -> dict[str, int] | None:
    """The span the time slider covers, in milliseconds since the epoch: from the first bound of a
    drawn fact to now (or its last bound, if later); None when no drawn fact has a period."""
    bounds = [
        bound for link in view.links for period in link.periods for bound in period if bound is not None
    ]
    if not bounds:
        return None
    return {"start": min(bounds), "end": max([*bounds, view.now]), "now": view.now}


def script_json(value: object) -> str:
    """JSON safe inside a <script> element: no `</script>`, `<!--` or line separators can end it."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(raw, escaped)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def type_colours(names: Iterable[str]) -> dict[str, str]:
    """Each type name -> its colour, by its place in the sorted names."""
    return {name: PALETTE[n % len(PALETTE)] for n, name in enumerate(sorted(set(names)))}


def type_name(node: GraphNode) -> str:
    """An entity's type as the page names it: capitalised (`person` and `Person` are one type),
    `Entity` when it has none."""
    raw = " ".join(str(node.properties.get("entity_type") or "").split())
    return raw[:1].upper() + raw[1:] if raw else UNTYPED


def _name(node: GraphNode) -> str:
    return str(node.properties.get("name") or node.id)


def _node(node: GraphNode, degree: int, chunk_ids: list[str]) -> ViewNode:
    props = node.properties
    return ViewNode(
        id=node.id,
        name=_name(node),
        type=type_name(node),
        description=_clip(str(props.get("description") or ""), DESCRIPTION_CHARS),
        data_ids=list(node.data_ids),
        chunk_ids=chunk_ids,
        degree=degree,
    )


def _link(edge: GraphEdge) -> ViewLink:
    chunk_id = edge.properties.get("chunk_id")
    return ViewLink(
        source=edge.source_id,
        target=edge.target_id,
        relationship=edge.relationship,
        description=_clip(str(edge.properties.get("description") or ""), DESCRIPTION_CHARS),
        chunk_id=str(chunk_id) if chunk_id else None,
        periods=_periods(edge.properties.get(PERIODS)),
        held=held_phrase(edge.properties).strip("()"),
    )


def _periods(held: object) -> list[tuple[int, int | None]]:
    """A fact's periods as [from, to) in milliseconds since the epoch; none if it has no valid ones."""
    if not isinstance(held, list):
        return []
    try:
        return [
            (_ms(moment_start(str(p["from"]))), _ms(moment_start(str(p["to"]))) if p.get("to") else None)
            for p in held
        ]
    except (KeyError, TypeError, ValueError):
        return []


def end_of_today() -> datetime:
    """The last moment of today (UTC): the slider's last day is read at its end, as `as_of` is,
    and a page made twice today is the same page."""
    today = datetime.now(UTC).date()
    return datetime.combine(today, datetime.max.time(), tzinfo=UTC)


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _citations(edges: Iterable[GraphEdge], entities: Mapping[str, GraphNode]) -> dict[str, list[str]]:
    """Entity id -> the chunks that contain it, in a stable order."""
    cited: dict[str, set[str]] = {}
    for edge in edges:
        if edge.relationship == "contains" and edge.target_id in entities:
            cited.setdefault(edge.target_id, set()).add(edge.source_id)
    return {entity: sorted(chunks) for entity, chunks in cited.items()}


def _citation(chunk: GraphNode) -> Citation:
    data_id = chunk.properties.get("source_data_id") or (chunk.data_ids[0] if chunk.data_ids else None)
    return Citation(
        data_id=str(data_id) if data_id else None,
        text=_clip(str(chunk.properties.get("text") or ""), SNIPPET_CHARS),
    )


def _indexes(ids: Iterable[str], at: Mapping[str, int]) -> list[int]:
    return [at[i] for i in ids if i in at]


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "\u2026"
