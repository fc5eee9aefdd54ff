"""How `docqueue search` shows the graph beside its hits: the entities a hit's chunk mentions and, with `--graph`,
the entities most related to those (resources/hit_entities.py reads them)."""

from __future__ import annotations

from typing import Any

from processing.entities import CO_OCCURS
from resources.search_session import Hit


def entities_cell(hit: Hit) -> str:
    """`Name (TYPE)` a line, and how many more the chunk mentions than the bound shows."""
    lines = [f"{entity.name} ({entity.type})" for entity in hit.entities]
    if hit.entities_total > len(hit.entities):
        lines.append(f"+{hit.entities_total - len(hit.entities)} more")
    return "\n".join(lines)


def related_cell(hit: Hit) -> str:
    """`Entity -RELATION weight-> Other (TYPE)` a line, the arrow the way the relation points; a co-occurrence has
    no direction (its stored one is only the order of the two keys), so it has no arrow."""
    lines = []
    for rel in hit.related:
        edge = f"-{rel.relation} {rel.weight}-"
        if rel.relation != CO_OCCURS:
            edge = f"{edge}>" if rel.direction == "out" else f"<{edge}"
        lines.append(f"{rel.entity} {edge} {rel.name} ({rel.type})")
    return "\n".join(lines)


def graph_columns(hits: list[Hit], related: bool) -> tuple[list[str], list[list[Any]]]:
    """The columns the graph adds to the hits' table and each hit's cells, in the hits' order."""
    columns = ["entities", "related"] if related else ["entities"]
    cells = [[entities_cell(hit), related_cell(hit)] if related else [entities_cell(hit)] for hit in hits]
    return columns, cells
