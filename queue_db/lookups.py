"""Lookups of single documents, pages and chunks, and of how much work is ready."""

from __future__ import annotations

from typing import Iterable, Sequence

from .inspection import outlook
from .phases import TaskKind
from .tenants import BASE_TENANT
from .transactions import QueueConnection


class Lookups(QueueConnection):
    def document(self, ref: str, tenant: str | None = None) -> dict | None:
        """A document by id, document key or content hash; with `tenant`, only one of that tenant's (a content
        hash names one document per tenant)."""
        with self.engine.connect() as conn:
            row = (
                conn.exec_driver_sql(
                    """SELECT * FROM documents
                   WHERE (document_key = %(r)s OR content_hash = %(r)s
                      OR (%(r)s ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                          AND id::text = lower(%(r)s)))
                     AND (%(t)s::text IS NULL OR tenant_id = %(t)s)
                   -- a content hash without a tenant: the base tenant's document, the one it named before tenants
                   ORDER BY tenant_id = %(base)s DESC, created_at LIMIT 1""",
                    {"r": ref, "t": tenant, "base": BASE_TENANT},
                )
                .mappings()
                .first()
            )
        return dict(row) if row else None

    def pages(self, document_id: str) -> list[dict]:
        with self.engine.connect() as conn:
            return [
                dict(r)
                for r in conn.exec_driver_sql(
                    "SELECT * FROM task_queue_page WHERE document_id = %(d)s ORDER BY page_number",
                    {"d": str(document_id)},
                )
                .mappings()
                .all()
            ]

    def chunks(self, *, document_id: str | None = None, page_id: str | None = None) -> list[dict]:
        clauses, params = [], {}
        if document_id is not None:
            clauses.append("c.document_id = %(d)s")
            params["d"] = str(document_id)
        if page_id is not None:
            clauses.append("c.page_id = %(p)s")
            params["p"] = str(page_id)
        where = ("WHERE " + " AND ".join(clauses)) if clauses else ""
        with self.engine.connect() as conn:
            return [
                dict(r)
                for r in conn.exec_driver_sql(
                    f"""SELECT c.*, x.content FROM task_queue_chunk c
                    LEFT JOIN task_queue_chunk_text x ON x.chunk_task_id = c.id
                    {where} ORDER BY c.document_id, c.page_id, c.chunk_index""",
                    params,
                )
                .mappings()
                .all()
            ]

    def chunk_context(self, ids: Sequence[str]) -> dict[str, dict]:
        """What a chunk's outputs carry besides its text: document id/key/filename and page number."""
        if not ids:
            return {}
        with self.engine.connect() as conn:
            rows = (
                conn.exec_driver_sql(
                    """SELECT c.id::text AS id, c.document_id::text AS document_id, d.document_key, d.filename,
                          d.tenant_id, p.page_number, c.chunk_index, c.chunk_id, c.chunk_content_hash
                   FROM task_queue_chunk c JOIN documents d ON d.id = c.document_id
                   JOIN task_queue_page p ON p.id = c.page_id
                   WHERE c.id = ANY(%(ids)s::uuid[])""",
                    {"ids": [str(i) for i in ids]},
                )
                .mappings()
                .all()
            )
        return {r["id"]: dict(r) for r in rows}

    def ready_counts(self) -> dict[str, int]:
        """How many tasks of each kind could be claimed right now (what sensors and --until-idle look at)."""
        return outlook(self.engine, self.phases.kinds, count_ready=True).ready

    def any_ready(self, kinds: Iterable[TaskKind]) -> bool:
        """Whether a task of any of `kinds` could be claimed right now: the first row of each claim index's walk, not
        a count."""
        probes = [f"EXISTS (SELECT 1 FROM {kind.table} t WHERE {kind.claimable_sql('t')})" for kind in kinds]
        if not probes:
            return False
        with self.engine.connect() as conn:
            return bool(conn.exec_driver_sql(f"SELECT {' OR '.join(probes)}").scalar_one())
