"""Partition keys: readable, stable, comma-free (a comma breaks UI backfills), and parseable back to rows.

document  <stem>-<hash8>            e.g. annual-report-1a2b3c4d (another tenant's: acme--annual-report-1a2b3c4d)
page      <document>/p0003
chunk     <document>/p0003/c012
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import PurePath

_KEY = re.compile(r"^(?P<doc>[a-z0-9][a-z0-9_-]*)(?:/p(?P<page>\d{4,}))?(?:/c(?P<chunk>\d{3,}))?$")


def document_partition_key(document_key: str) -> str:
    return document_key


def page_partition_key(document_key: str, page_number: int) -> str:
    return f"{document_key}/p{page_number:04d}"


def chunk_partition_key(document_key: str, page_number: int, chunk_index: int) -> str:
    return f"{document_key}/p{page_number:04d}/c{chunk_index:03d}"


def chunk_id_for(page_key: str, index: int, content_hash: str | None) -> str:
    """A chunk's stable identity, 32 hex digits: the same page, position and content give the same id, so
    re-chunking is idempotent (vector point ids are uuid5 of it, graph chunk nodes are merged on it)."""
    return hashlib.sha256(f"{page_key}\x1f{index}\x1f{content_hash or ''}".encode("utf-8")).hexdigest()[:32]


def chunk_id(document_key: str, page_number: int, chunk_index: int, content_hash: str | None) -> str:
    """The chunk id of a row: unique by construction, because document keys are unique, page numbers are unique
    within a document and chunk indexes within a page (the queue derives every chunk id this way: migration 0011)."""
    return chunk_id_for(page_partition_key(document_key, page_number), chunk_index, content_hash)


@dataclass(frozen=True)
class ParsedKey:
    document_key: str
    page_number: int | None = None
    chunk_index: int | None = None


def parse_partition_key(key: str) -> ParsedKey:
    match = _KEY.match(key)
    if not match or (match.group("chunk") is not None and match.group("page") is None):
        raise ValueError(f"not a docqueue partition key: {key!r}")
    page, chunk = match.group("page"), match.group("chunk")
    return ParsedKey(match.group("doc"), int(page) if page else None, int(chunk) if chunk else None)


def document_key_for(filename: str, content_hash: str, length: int = 8) -> str:
    """`<filename-stem>-<hash8>`: readable, stable, and safe as a Dagster partition key (no commas, no slashes)."""
    stem = PurePath(filename.replace("\\", "/")).stem
    slug = re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-")[:60] or "document"
    return f"{slug}-{content_hash[:length]}"
