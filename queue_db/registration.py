"""Registering documents: new bytes become a pending document, known bytes (or a known idempotency key) return
the document they already are, with its priority raised when asked more urgently."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Sequence

from .idempotency import IdempotencyConflict, checked_key
from .keys import document_key_for
from .phases import PHASES, TaskKind
from .tenants import checked_tenant, tenant_document_key
from .text import clean_text, source_path_text
from .transactions import QueueConnection, is_integrity_error

if TYPE_CHECKING:
    import sqlalchemy as sa


def check_priority(priority: int) -> None:
    if not 0 <= priority <= 10:
        raise ValueError(f"priority must be between 0 and 10, got {priority}")


def apply_priority(
    conn: sa.Connection, document_id: str, priority: int, kinds: Sequence[TaskKind] = PHASES.kinds
) -> dict[str, int]:
    """Set the priority of a document and of its pages and chunks with a phase (of `kinds`) still to finish,
    locking in the queue's order (chunks, pages, document)."""
    counts = {}
    for level, table in (("chunks", "task_queue_chunk"), ("pages", "task_queue_page")):
        unfinished = " OR ".join(f"t.{k.status} <> 'completed'" for k in kinds if k.table == table)
        counts[level] = conn.exec_driver_sql(
            f"UPDATE {table} t SET priority = %(p)s, updated_at = now() WHERE t.document_id = %(d)s "
            f"AND t.priority <> %(p)s AND ({unfinished})",
            {"p": priority, "d": document_id},
        ).rowcount
    counts["documents"] = conn.exec_driver_sql(
        "UPDATE documents SET priority = %(p)s, updated_at = now() WHERE id = %(d)s AND priority <> %(p)s",
        {"p": priority, "d": document_id},
    ).rowcount
    return counts


def _document_under_key(conn: sa.Connection, key: str, tenant: str, content_hash: str) -> dict | None:
    """The document `key` names in `tenant` (None when the key is new); IdempotencyConflict for other bytes."""
    row = (
        conn.exec_driver_sql(
            "SELECT * FROM documents WHERE idempotency_key = %(k)s AND tenant_id = %(t)s", {"k": key, "t": tenant}
        )
        .mappings()
        .first()
    )
    if row is not None and row["content_hash"] != content_hash:
        raise IdempotencyConflict(key, row["document_key"])
    return dict(row) if row is not None else None


class Registration(QueueConnection):
    def register_document(
        self,
        *,
        filename: str,
        content_hash: str,
        size_bytes: int,
        storage_key: str | None = None,
        source_path: str | None = None,
        priority: int = 0,
        password_ref: str | None = None,
        mime_type: str | None = "application/pdf",
        filename_bytes: bytes | None = None,
        metadata: dict | None = None,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> tuple[dict, bool]:
        """Idempotent on content hash: the same bytes twice give the same document. Returns (row, created).
        Known bytes registered again with a higher priority raise the document's (and its unfinished tasks').

        With `idempotency_key`, the same key twice is one document too, and the key with other bytes raises
        IdempotencyConflict. Bytes already registered without a key take the key, so it names them from then on;
        bytes already registered under another key stay one document, under that other key.

        Both hold within `tenant` (None: DOCQUEUE_DEFAULT_TENANT): the same bytes in two tenants are two documents."""
        idempotency_key = checked_key(idempotency_key)
        tenant = checked_tenant(tenant)
        check_priority(priority)
        if not re.fullmatch(r"[0-9a-f]{64}", content_hash):
            raise ValueError("content_hash must be a sha256 hex digest")

        def work(conn: sa.Connection) -> tuple[dict, bool]:
            for key_length in (8, 12, 16, 64):
                row = (
                    conn.exec_driver_sql(
                        """INSERT INTO documents (filename, filename_bytes, document_key, source_path, storage_key,
                                              size_bytes, content_hash, mime_type, priority, password_ref,
                                              metadata, max_retries, idempotency_key, tenant_id)
                       VALUES (%(filename)s, %(filename_bytes)s, %(key)s, %(source_path)s, %(storage_key)s,
                               %(size)s, %(hash)s, %(mime)s, %(priority)s, %(password_ref)s, %(metadata)s::jsonb,
                               %(max_retries)s, %(idempotency_key)s, %(tenant)s)
                       ON CONFLICT DO NOTHING
                       RETURNING *""",
                        {
                            "filename": clean_text(filename, 1000),
                            "filename_bytes": filename_bytes,
                            "key": tenant_document_key(tenant, document_key_for(filename, content_hash, key_length)),
                            "source_path": source_path_text(source_path) if source_path else None,
                            "storage_key": storage_key,
                            "size": size_bytes,
                            "hash": content_hash,
                            "mime": mime_type,
                            "priority": priority,
                            "password_ref": password_ref,
                            "metadata": json.dumps(metadata or {}),
                            "max_retries": self.phases.default_retry.attempts,
                            "idempotency_key": idempotency_key,
                            "tenant": tenant,
                        },
                    )
                    .mappings()
                    .first()
                )
                if row is not None:
                    return dict(row), True
                if idempotency_key is not None:
                    named = _document_under_key(conn, idempotency_key, tenant, content_hash)
                    if named is not None:
                        return self._known(conn, named, priority)
                existing = (
                    conn.exec_driver_sql(
                        "SELECT * FROM documents WHERE content_hash = %(hash)s AND tenant_id = %(t)s",
                        {"hash": content_hash, "t": tenant},
                    )
                    .mappings()
                    .first()
                )
                if existing is not None:
                    return self._registered_again(conn, dict(existing), idempotency_key, tenant, priority)
                # the key collided with a different file's key: lengthen the hash part and try again
            raise RuntimeError("could not allocate a unique document key")

        return self._transaction(work)

    def _known(self, conn: sa.Connection, existing: dict, priority: int) -> tuple[dict, bool]:
        """Known bytes registered again: (the document, False), its priority raised when asked more urgently."""
        if priority > existing["priority"]:  # asked for again, more urgently
            apply_priority(conn, str(existing["id"]), priority, self.phases.kinds)
            existing = {**existing, "priority": priority}
        return existing, False

    def _registered_again(
        self, conn: sa.Connection, existing: dict, idempotency_key: str | None, tenant: str, priority: int
    ) -> tuple[dict, bool]:
        """Bytes already registered: without a key they take this one, so it names them from then on."""
        if idempotency_key is not None and existing["idempotency_key"] is None:
            try:
                with conn.begin_nested():
                    updated = (
                        conn.exec_driver_sql(
                            "UPDATE documents SET idempotency_key = %(k)s WHERE id = %(id)s RETURNING *",
                            {"k": idempotency_key, "id": existing["id"]},
                        )
                        .mappings()
                        .first()
                    )
            except Exception as exc:
                if not is_integrity_error(exc):
                    raise
                # other bytes took the key since the INSERT above: the key is theirs
                keyed = _document_under_key(conn, idempotency_key, tenant, existing["content_hash"])
                return keyed or existing, False
            assert updated is not None, "the document read in this transaction vanished before it took its key"
            existing = dict(updated)
        return self._known(conn, existing, priority)

    def set_storage_key(self, document_id: str, storage_key: str) -> None:
        self._transaction(
            lambda conn: conn.exec_driver_sql(
                "UPDATE documents SET storage_key = %(k)s, updated_at = now() WHERE id = %(id)s",
                {"k": storage_key, "id": document_id},
            )
        )
