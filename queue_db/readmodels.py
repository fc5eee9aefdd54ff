"""The seed's read models ("Example Queries"), as pandas DataFrames."""
from __future__ import annotations

import pandas as pd
import sqlalchemy as sa

from .tasks import ALL_KINDS, Level, Phase, blocked_phase_sql, leaf_kind

_PROGRESS_SQL = """
SELECT d.id, d.document_key, d.tenant_id, d.filename, d.priority,
       d.ocr_status, d.vector_index_status, d.graphrag_index_status,
       COALESCE(d.page_count, 0) AS page_count,
       COUNT(p.id) AS total_pages,
       COUNT(p.id) FILTER (WHERE p.ocr_status = 'completed') AS ocr_completed_pages,
       COUNT(p.id) FILTER (WHERE p.ocr_status = 'failed') AS ocr_failed_pages,
       COALESCE(SUM(p.chunk_count), 0) AS total_chunks,
       -- phases skipped on purpose: pages with no text to embed; text not extracted again for a re-index
       COUNT(p.id) FILTER (WHERE p.embedding_skipped) AS pages_without_text, d.extraction_skipped,
       (SELECT COUNT(*) FROM task_queue_chunk c WHERE c.document_id = d.id AND c.vector_status = 'completed')
           AS vector_completed_chunks,
       (SELECT COUNT(*) FROM task_queue_chunk c WHERE c.document_id = d.id AND c.graphrag_status = 'completed')
           AS graphrag_completed_chunks,
       d.ocr_error, d.vector_error, d.graphrag_error,
       -- when any task of the document last failed (GREATEST skips NULLs)
       GREATEST(d.ocr_failed_at, MAX(p.ocr_failed_at), MAX(p.vector_failed_at),
                (SELECT MAX(GREATEST(c.vector_failed_at, c.graphrag_failed_at)) FROM task_queue_chunk c
                 WHERE c.document_id = d.id)) AS last_failed_at,
       COALESCE(d.ocr_error_class, d.vector_error_class, d.graphrag_error_class) AS error_class,
       -- phases that wait on a task failed for good: a derived view, the stored status stays pending
       ARRAY_REMOVE(ARRAY[{blocked}], NULL) AS blocked_phases
FROM (SELECT * FROM documents {where} ORDER BY created_at, id {limit}) d
LEFT JOIN task_queue_page p ON d.id = p.document_id
GROUP BY d.id, d.created_at, d.document_key, d.tenant_id, d.filename, d.priority, d.ocr_status, d.vector_index_status,
         d.graphrag_index_status, d.page_count, d.extraction_skipped, d.ocr_error, d.vector_error, d.graphrag_error,
         d.ocr_failed_at, d.ocr_error_class, d.vector_error_class, d.graphrag_error_class
ORDER BY d.created_at, d.id
"""

def _in_tenant(kind, tenant: str | None) -> str:
    """`AND` the row belongs to a document of %(tenant)s (nothing without a tenant)."""
    if tenant is None:
        return ""
    if kind.level is Level.DOCUMENT:
        return " AND t.tenant_id = %(tenant)s"
    return f" AND t.{kind.document_column} IN (SELECT id FROM documents WHERE tenant_id = %(tenant)s)"


def _statistics_sql(tenant: str | None = None) -> str:
    return "\nUNION ALL ".join(
        f"SELECT '{k.label}' AS task_type, CASE WHEN {k.blocked_sql('t')} THEN 'blocked' "
        f"ELSE t.{k.status}::text END AS status, COUNT(*) AS count FROM {k.table} t "
        f"WHERE {k.owns('t')}{_in_tenant(k, tenant)} GROUP BY 2" for k in ALL_KINDS) + "\nORDER BY 1, 2"


def _timings_sql(tenant: str | None = None) -> str:
    """Queue wait = claim - ready (the dependency's completion); run = completion - claim; completed tasks only."""
    samples = "\n    UNION ALL ".join(
        f"SELECT '{k.label}' AS task_type, "
        f"EXTRACT(EPOCH FROM t.{k.col('started_at')} - {k.ready_since_sql}) AS wait_s, "
        f"EXTRACT(EPOCH FROM t.{k.col('completed_at')} - t.{k.col('started_at')}) AS run_s FROM {k.table} t "
        f"WHERE (t.{k.status} = 'completed' OR NOT ({k.owns('t')})) "
        f"AND t.{k.col('completed_at')} IS NOT NULL AND t.{k.col('started_at')} IS NOT NULL{_in_tenant(k, tenant)}"
        for k in ALL_KINDS)
    return f"""
WITH samples AS (
    {samples}
)
SELECT task_type, COUNT(*) AS completed,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY wait_s) AS wait_median_s,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY wait_s) AS wait_p95_s,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY run_s) AS run_median_s,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY run_s) AS run_p95_s
FROM samples GROUP BY task_type ORDER BY task_type
"""


def _error_classes_sql(tenant: str | None = None) -> str:
    return "\nUNION ALL ".join(
        f"SELECT '{k.label}' AS task_type, t.{k.col('error_class')} AS error_class, COUNT(*) AS count "
        f"FROM {k.table} t WHERE t.{k.col('error_class')} IS NOT NULL AND ({k.owns('t')}){_in_tenant(k, tenant)} "
        "GROUP BY 2"
        for k in ALL_KINDS) + "\nORDER BY 1, 2"


def phase_progress(engine: sa.Engine) -> dict[str, dict[str, int]]:
    """Per phase, its units of work (the phase's deepest kind): total, completed, failed."""
    sql = "\nUNION ALL ".join(
        f"SELECT '{phase.value}', count(*), count(*) FILTER (WHERE t.{k.status} = 'completed'), "
        f"count(*) FILTER (WHERE t.{k.status} = 'failed') FROM {k.table} t"
        for phase in Phase for k in (leaf_kind(phase),))
    with engine.connect() as conn:
        return {r[0]: {"total": int(r[1]), "completed": int(r[2]), "failed": int(r[3])}
                for r in conn.exec_driver_sql(sql).all()}


def _frame(engine: sa.Engine, sql: str, params: dict | None = None) -> pd.DataFrame:
    with engine.connect() as conn:
        result = conn.exec_driver_sql(sql, params or {})
        return pd.DataFrame(result.mappings().all(), columns=list(result.keys()))


def document_progress(engine: sa.Engine, document_id: str | None = None, *, limit: int | None = None,
                      after_key: str | None = None, tenant: str | None = None) -> pd.DataFrame:
    """Per document: the three statuses, pages, OCR completed/failed pages, chunks, vector/GraphRAG completed.
    In registration order; `limit` documents after the one keyed `after_key` (a page of a long listing, read
    through idx_documents_listing, or idx_documents_tenant_listing for one `tenant`, so every page costs the
    same)."""
    clauses, params = [], {"tenant": tenant}
    if document_id is not None:
        clauses.append("id = %(id)s")
        params["id"] = str(document_id)
    elif after_key is not None:
        clauses.append("(created_at, id) > (SELECT created_at, id FROM documents WHERE document_key = %(after)s)")
        params["after"] = after_key
    if tenant is not None:
        clauses.append("tenant_id = %(tenant)s")
    where = ("WHERE " + " AND ".join(clauses)) if clauses else ""
    blocked = ", ".join(f"CASE WHEN {blocked_phase_sql(phase, 'd')} THEN '{phase.value}' END" for phase in Phase)
    sql = _PROGRESS_SQL.format(where=where, blocked=blocked, limit=f"LIMIT {int(limit)}" if limit else "")
    frame = _frame(engine, sql, params)
    if not frame.empty:
        frame["id"] = frame["id"].astype(str)
        frame["last_failed_at"] = [None if pd.isna(t) else t.isoformat(timespec="seconds")
                                   for t in frame["last_failed_at"]]
    return frame


def queue_statistics(engine: sa.Engine, tenant: str | None = None) -> pd.DataFrame:
    """task_type x status x count over every kind (the seed's query, plus documents and pages whose status is
    still their own); of one tenant's documents when `tenant` is given."""
    return _frame(engine, _statistics_sql(tenant), {"tenant": tenant})


def phase_timings(engine: sa.Engine, tenant: str | None = None) -> pd.DataFrame:
    """Queue wait and processing time (median, p95) per task type, over completed tasks."""
    return _frame(engine, _timings_sql(tenant), {"tenant": tenant})


def error_classes(engine: sa.Engine, tenant: str | None = None) -> pd.DataFrame:
    return _frame(engine, _error_classes_sql(tenant), {"tenant": tenant})


def documents_ready(engine: sa.Engine, phase: Phase) -> pd.DataFrame:
    """Documents whose previous phase completed and whose `phase` has not started (the seed's query)."""
    previous = phase.previous
    if previous is None:
        sql = "SELECT id, filename FROM documents WHERE ocr_status = 'pending' ORDER BY created_at"
    else:
        sql = (f"SELECT id, filename FROM documents WHERE {previous.document_status_column} = 'completed' "
               f"AND {phase.document_status_column} = 'pending' ORDER BY created_at")
    frame = _frame(engine, sql)
    if not frame.empty:
        frame["id"] = frame["id"].astype(str)
    return frame
