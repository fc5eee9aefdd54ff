"""What one chunk's extraction puts in the graph, as pure rules the graph adapters share: its entities under their
document-level keys (a short form resolved to the fuller name the document uses), its checked relations, and which of
several writes of one chunk wins. No store is touched here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from processing.entities import ChunkGraph, Entity, normalize_entity_name
from queue_db.tenants import tenant_entity_key


@dataclass
class DocumentAliases:
    """What the short forms of one document resolve to."""

    canonical: dict[str, str] = field(default_factory=dict)  # short key -> full key
    entities: dict[str, Entity] = field(default_factory=dict)  # full key -> the entity written for it


def last_write_wins(chunks: Iterable[ChunkGraph]) -> list[ChunkGraph]:
    by_id: dict[str, ChunkGraph] = {}
    for chunk in chunks:
        by_id[chunk.chunk_id] = chunk
    return list(by_id.values())


@dataclass
class ChunkContent:
    """One chunk's entities (under their document-level keys) and relations, deduplicated and checked."""

    entities: dict[str, Entity]
    relations: set[tuple[str, str, str]]
    aliases: dict[str, list[str]] = field(default_factory=dict)  # full key -> the short keys the chunk used for it


def chunk_key(chunk: ChunkGraph, name: str) -> str:
    """The graph key of a name an extraction gave (never prefixed: extractors know no tenants)."""
    return tenant_entity_key(chunk.tenant_id, normalize_entity_name(name))


def chunk_keys(chunk: ChunkGraph) -> dict[str, Entity]:
    # keys are normalised again here (idempotent) so a caller's hand-made key cannot split one entity in two
    entities: dict[str, Entity] = {}
    for entity in chunk.extraction.entities:
        key = chunk_key(chunk, entity.key or entity.name)
        if key and key not in entities:
            entities[key] = Entity(name=" ".join(entity.name.split()) or key, type=entity.type, key=key)
    return entities


def chunk_content(chunk: ChunkGraph, aliases: DocumentAliases | None = None) -> ChunkContent:
    aliases = aliases or DocumentAliases()
    extracted = chunk_keys(chunk)
    entities: dict[str, Entity] = {}
    used: dict[str, set[str]] = {}
    for key, entity in extracted.items():
        full = aliases.canonical.get(key, key)
        if full != key:
            used.setdefault(full, set()).add(key)
            entities.setdefault(full, aliases.entities[full])
        elif key not in entities or key in used:  # the chunk's own spelling of a full name wins
            entities[key] = entity
    relations: set[tuple[str, str, str]] = set()
    for relation in chunk.extraction.relations:
        source, target = chunk_key(chunk, relation.source), chunk_key(chunk, relation.target)
        for endpoint in (source, target):
            if endpoint not in extracted:
                raise ValueError(f"chunk {chunk.chunk_id}: relation endpoint {endpoint!r} is not one of its entities")
        source, target = aliases.canonical.get(source, source), aliases.canonical.get(target, target)
        if source != target and relation.type:
            relations.add((source, target, relation.type))
    return ChunkContent(entities, relations, {full: sorted(keys) for full, keys in used.items()})
