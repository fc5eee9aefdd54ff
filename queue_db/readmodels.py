"""The seed's read models ("Example Queries"), as pandas DataFrames."""
from __future__ import annotations

import pandas as pd
import sqlalchemy as sa

from .tasks import Phase

_PROGRESS_SQL = """
SELECT d.id, d.document_key, d.filename, d.priority,
       d.ocr_status, d.vector_index_status, d.graphrag_index_status,
       COALESCE(d.page_count, 0) AS page_count,
       COUNT(p.id) AS total_pages,
       COUNT(p.id) FILTER (WHERE p.ocr_status = 'completed') AS ocr_completed_pages,
       COUNT(p.id) FILTER (WHERE p.ocr_status = 'failed') AS ocr_failed_pages,
       COALESCE(SUM(p.chunk_count), 0) AS total_chunks,
       (SELECT COUNT(*) FROM task_queue_chunk c WHERE c.document_id = d.id AND c.vector_status = 'completed')
           AS vector_completed_chunks,
       (SELECT COUNT(*) FROM task_queue_chunk c WHERE c.document_id = d.id AND c.graphrag_status = 'completed')
           AS graphrag_completed_chunks,
       d.ocr_error, d.vector_error, d.graphrag_error,
       COALESCE(d.ocr_error_class, d.vector_error_class, d.graphrag_error_class) AS error_class
FROM documents d
LEFT JOIN task_queue_page p ON d.id = p.document_id
{where}
GROUP BY d.id
ORDER BY d.created_at, d.id
"""

_STATISTICS_SQL = """
SELECT 'documents' AS task_type, ocr_status::text AS status, COUNT(*) AS count
FROM documents WHERE pages_created_at IS NULL GROUP BY ocr_status
UNION ALL
SELECT 'ocr_pages', ocr_status::text, COUNT(*) FROM task_queue_page GROUP BY ocr_status
UNION ALL
SELECT 'vector_chunks', vector_status::text, COUNT(*) FROM task_queue_chunk GROUP BY vector_status
UNION ALL
SELECT 'graphrag_chunks', graphrag_status::text, COUNT(*) FROM task_queue_chunk GROUP BY graphrag_status
ORDER BY 1, 2
"""

# queue wait = claim time - creation; duration = completion - claim; per phase and level, completed tasks only
_TIMINGS_SQL = """
WITH samples AS (
    SELECT 'ocr_pages' AS task_type, EXTRACT(EPOCH FROM ocr_started_at - created_at) AS wait_s,
           EXTRACT(EPOCH FROM ocr_completed_at - ocr_started_at) AS run_s
    FROM task_queue_page WHERE ocr_status = 'completed' AND ocr_started_at IS NOT NULL
    UNION ALL
    SELECT 'chunking_pages', EXTRACT(EPOCH FROM vector_started_at - ocr_completed_at),
           EXTRACT(EPOCH FROM chunked_at - vector_started_at)
    FROM task_queue_page WHERE chunked_at IS NOT NULL AND vector_started_at IS NOT NULL
    UNION ALL
    SELECT 'vector_chunks', EXTRACT(EPOCH FROM vector_started_at - created_at),
           EXTRACT(EPOCH FROM vector_completed_at - vector_started_at)
    FROM task_queue_chunk WHERE vector_status = 'completed' AND vector_started_at IS NOT NULL
    UNION ALL
    SELECT 'graphrag_chunks', EXTRACT(EPOCH FROM graphrag_started_at - vector_completed_at),
           EXTRACT(EPOCH FROM graphrag_completed_at - graphrag_started_at)
    FROM task_queue_chunk WHERE graphrag_status = 'completed' AND graphrag_started_at IS NOT NULL
)
SELECT task_type, COUNT(*) AS completed,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY wait_s) AS wait_median_s,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY wait_s) AS wait_p95_s,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY run_s) AS run_median_s,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY run_s) AS run_p95_s
FROM samples GROUP BY task_type ORDER BY task_type
"""

_ERROR_CLASSES_SQL = """
SELECT 'documents' AS task_type, ocr_error_class AS error_class, COUNT(*) AS count
FROM documents WHERE ocr_error_class IS NOT NULL AND pages_created_at IS NULL GROUP BY 2
UNION ALL SELECT 'ocr_pages', ocr_error_class, COUNT(*) FROM task_queue_page WHERE ocr_error_class IS NOT NULL GROUP BY 2
UNION ALL SELECT 'chunking_pages', vector_error_class, COUNT(*) FROM task_queue_page
          WHERE vector_error_class IS NOT NULL AND chunked_at IS NULL GROUP BY 2
UNION ALL SELECT 'vector_chunks', vector_error_class, COUNT(*) FROM task_queue_chunk WHERE vector_error_class IS NOT NULL GROUP BY 2
UNION ALL SELECT 'graphrag_chunks', graphrag_error_class, COUNT(*) FROM task_queue_chunk WHERE graphrag_error_class IS NOT NULL GROUP BY 2
ORDER BY 1, 2
"""


def _frame(engine: sa.Engine, sql: str, params: dict | None = None) -> pd.DataFrame:
    with engine.connect() as conn:
        result = conn.exec_driver_sql(sql, params or {})
        return pd.DataFrame(result.mappings().all(), columns=list(result.keys()))


def document_progress(engine: sa.Engine, document_id: str | None = None) -> pd.DataFrame:
    """Per document: the three statuses, pages, OCR completed/failed pages, chunks, vector/GraphRAG completed."""
    where, params = "", {}
    if document_id is not None:
        where, params = "WHERE d.id = %(id)s", {"id": str(document_id)}
    frame = _frame(engine, _PROGRESS_SQL.format(where=where), params)
    if not frame.empty:
        frame["id"] = frame["id"].astype(str)
    return frame


def queue_statistics(engine: sa.Engine) -> pd.DataFrame:
    """task_type x status x count (the seed's query, plus documents waiting for expansion)."""
    return _frame(engine, _STATISTICS_SQL)


def phase_timings(engine: sa.Engine) -> pd.DataFrame:
    """Queue wait and processing time (median, p95) per task type, over completed tasks."""
    return _frame(engine, _TIMINGS_SQL)


def error_classes(engine: sa.Engine) -> pd.DataFrame:
    return _frame(engine, _ERROR_CLASSES_SQL)


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
