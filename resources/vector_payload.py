"""The point a chunk becomes in the vector store, and which points a search keeps: one place for both.

A point's id is uuid5(docqueue namespace, chunk_id), so re-running a chunk overwrites its point instead of adding a
second one. The payload carries the chunk_id too (stores take only unsigned integers and UUIDs as ids), the
document and tenant it belongs to, where it sits and its text (the sparse vector is computed from it).

A search keeps one document's points when asked, never the excluded documents' (versions being replaced or not yet
complete) and only one tenant's; points written before tenants carry no tenant_id and are the base tenant's. Each
adapter translates `PointFilter` into its own query language, and nothing else decides what a filter keeps.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from queue_db.tenants import BASE_TENANT
from resources.ports import ChunkPoint, VectorStoreError

# fixed forever: changing it would orphan every stored point
DOCQUEUE_POINT_NAMESPACE = uuid.UUID("6f1d5c0e-3b7a-5a49-9c1e-0d0c0e0a7e21")
REQUIRED_PAYLOAD = ("document_id",)
# keyword payload indexes: deleting a document filters on document_id, a tenant's search on tenant_id
INDEXED_PAYLOAD = ("document_id", "tenant_id")


def point_id(chunk_id: str) -> str:
    if not chunk_id:
        raise ValueError("chunk_id must be a non-empty string")
    return str(uuid.uuid5(DOCQUEUE_POINT_NAMESPACE, chunk_id))


def chunk_payload(
    *,
    document_id: str,
    document_key: str,
    tenant_id: str,
    filename: str,
    page_number: int,
    chunk_index: int,
    text: str,
    content_hash: str,
    tokens: int,
    embedded_tokens: int,
    vector_reused_from: str | None = None,
) -> dict:
    """The payload of a chunk's point. `embedded_tokens` < `tokens` says the vector covers only the start of the
    text (DOCQUEUE_EMBED_MAX_WINDOWS); `vector_reused_from` names the chunk whose vector was copied."""
    payload = {
        "document_id": document_id,
        "document_key": document_key,
        "tenant_id": tenant_id,
        "filename": filename,
        "page_number": page_number,
        "chunk_index": chunk_index,
        "text": text,
        "content_hash": content_hash,
        "tokens": tokens,
        "embedded_tokens": embedded_tokens,
    }
    if vector_reused_from is not None:
        payload["vector_reused_from"] = vector_reused_from
    return payload


def stored_payload(point: ChunkPoint) -> dict:
    """The payload as stored: the given one with the chunk_id and a string document_id; refused when it lacks what
    deletes and searches filter on."""
    missing = [key for key in REQUIRED_PAYLOAD if not point.payload.get(key)]
    if missing:
        raise VectorStoreError(f"chunk {point.chunk_id}: payload lacks {missing}")
    payload = {**point.payload, "chunk_id": point.chunk_id}
    payload["document_id"] = str(payload["document_id"])
    return payload


@dataclass(frozen=True)
class PointFilter:
    """Which points a search, count or delete keeps; empty fields keep everything."""

    document_id: str | None = None
    exclude_document_ids: tuple[str, ...] = ()
    tenant: str | None = None

    @property
    def untagged_are_tenants(self) -> bool:
        """True when points without a tenant_id (written before tenants) belong to `tenant`."""
        return self.tenant == BASE_TENANT


def search_filter(
    document_id: str | None = None, exclude_document_ids: Sequence[str] = (), tenant: str | None = None
) -> PointFilter | None:
    """What a search keeps (None: every point)."""
    found = PointFilter(
        str(document_id) if document_id is not None and str(document_id) else None,
        tuple(str(d) for d in exclude_document_ids),
        tenant,
    )
    return found if (found.document_id or found.exclude_document_ids or found.tenant is not None) else None


def document_filter(document_id: str) -> PointFilter:
    """One document's points."""
    return PointFilter(document_id=str(document_id))
