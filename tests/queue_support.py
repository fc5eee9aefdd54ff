"""Helpers that drive the queue through its public API to build realistic states quickly, and that show the plans of
the statements it sends."""

from __future__ import annotations

import hashlib
import uuid
from typing import Callable

import psycopg
import pytest

from queue_db.phases import OCR_DOCUMENT, OCR_PAGE, VECTOR_PAGE
from queue_db.queue import TaskQueue, make_worker_id

EXPLAINABLE = ("select", "with", "update", "insert", "delete")


def new_hash(seed: str | None = None) -> str:
    return hashlib.sha256((seed or uuid.uuid4().hex).encode()).hexdigest()


def register(queue: TaskQueue, name: str = "report.pdf", priority: int = 0) -> dict:
    doc, created = queue.register_document(filename=name, content_hash=new_hash(), size_bytes=1234, priority=priority)
    assert created
    return doc


def expand(queue: TaskQueue, doc: dict, pages: int) -> None:
    worker = make_worker_id("expand")
    claimed = queue.claim(OCR_DOCUMENT, worker, 1, only_ids=[doc["id"]])
    assert [c["id"] for c in claimed] == [str(doc["id"])]
    assert queue.complete_document_expansion(worker, doc["id"], page_count=pages)


def ocr_all(queue: TaskQueue, doc: dict) -> None:
    worker = make_worker_id("ocr")
    page_ids = [p["id"] for p in queue.pages(doc["id"])]
    claimed = queue.claim(OCR_PAGE, worker, len(page_ids), only_ids=page_ids)
    queue.complete(
        OCR_PAGE,
        worker,
        [
            {
                "id": c["id"],
                "page_file_path": f"x/page_{c['page_number']:04d}_nohf.md",
                "ocr_method": "text-layer",
                "ocr_chars": 10,
                "ocr_seconds": 0.1,
            }
            for c in claimed
        ],
    )


def chunk_all(queue: TaskQueue, doc: dict, chunks_per_page: int) -> None:
    worker = make_worker_id("chunk")
    page_ids = [p["id"] for p in queue.pages(doc["id"])]
    for page in queue.claim(VECTOR_PAGE, worker, len(page_ids), only_ids=page_ids):
        chunks = [
            {
                "chunk_index": i,
                "content_hash": new_hash(),
                "content": f"chunk {i} of page {page['page_number']}",
                "token_count": 5,
            }
            for i in range(chunks_per_page)
        ]
        assert queue.complete_chunking(worker, page["id"], chunks)


def build_document(
    queue: TaskQueue, pages: int = 2, chunks_per_page: int = 3, name: str = "report.pdf", priority: int = 0
) -> dict:
    """A document expanded, OCR'd and chunked: its chunks wait for the vector phase."""
    doc = register(queue, name, priority)
    expand(queue, doc, pages)
    ocr_all(queue, doc)
    chunk_all(queue, doc, chunks_per_page)
    return queue.document(str(doc["id"]))


def bulk_seed(
    engine, documents: int, pages_per_document: int, chunks_per_page: int, *, chunk_vector_status: str = "pending"
) -> None:
    """Set-based seeding of the state the API produces for expanded, OCR'd, chunked documents (fast enough
    for 100,000+ chunk rows). Used by the concurrency and EXPLAIN tests and the benchmarks."""
    tag = f"bulk{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        conn.exec_driver_sql(
            """INSERT INTO documents (filename, document_key, content_hash, size_bytes, page_count, pages_created_at,
                                      ocr_status, ocr_completed_at)
               SELECT %(tag)s || '-' || n || '.pdf', %(tag)s || '-' || n,
                      encode(sha256(convert_to(gen_random_uuid()::text, 'UTF8')), 'hex'), 1000, %(pages)s, now(),
                      'completed', now()
               FROM generate_series(1, %(docs)s) n""",
            {"docs": documents, "pages": pages_per_document, "tag": tag},
        )
        conn.exec_driver_sql(
            """INSERT INTO task_queue_page (document_id, page_number, page_file_path, ocr_status, ocr_completed_at,
                                            chunked_at, chunk_count)
               SELECT d.id, n, %(tag)s || '/page_' || n || '_nohf.md', 'completed', now(), now(), %(chunks)s
               FROM documents d, generate_series(1, %(pages)s) n WHERE d.filename LIKE %(tag)s || '-%%'""",
            {"pages": pages_per_document, "chunks": chunks_per_page, "tag": tag},
        )
        conn.exec_driver_sql(
            """WITH created AS (
                   INSERT INTO task_queue_chunk (page_id, document_id, chunk_id, chunk_index, chunk_content_hash,
                                                 vector_status)
                   SELECT p.id, p.document_id, md5(p.id::text || n), n, md5(n::text), %(status)s::task_status
                   FROM task_queue_page p, generate_series(0, %(chunks)s - 1) n
                   WHERE p.page_file_path LIKE %(tag)s || '/%%'
                   RETURNING id, chunk_index)
               INSERT INTO task_queue_chunk_text (chunk_task_id, content)
               SELECT id, 'text ' || chunk_index FROM created""",
            {"chunks": chunks_per_page, "status": chunk_vector_status, "tag": tag},
        )
        conn.exec_driver_sql(
            "UPDATE task_queue_page SET vector_status = %(s)s::task_status WHERE page_file_path LIKE %(tag)s || '/%%'",
            {"s": chunk_vector_status, "tag": tag},
        )
        conn.exec_driver_sql(
            "UPDATE documents SET vector_index_status = %(s)s::task_status WHERE filename LIKE %(tag)s || '-%%'",
            {"s": chunk_vector_status, "tag": tag},
        )
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE")


# every executed statement's plan with its buffers, as JSON: what the buffer-counting tests read
BUFFER_PLANS = ("log_min_duration = 0", "log_analyze = on", "log_buffers = on", "log_timing = off", "log_format = json")


def load_auto_explain(pg: psycopg.Connection, *settings: str, on_skip: Callable[[], object] | None = None) -> None:
    """auto_explain on `pg`'s session with `settings` (each `auto_explain.<setting>`), its plans sent to the client
    as notices. Skips the test on a server without the module, or a role that may not load it: `pg` rolled back,
    then `on_skip` called."""
    try:
        pg.execute("LOAD 'auto_explain'")
    except psycopg.Error as exc:
        pg.rollback()
        if on_skip is not None:
            on_skip()
        pytest.skip(f"auto_explain is not available on this server: {exc.__class__.__name__}")
    for setting in settings:
        pg.execute(f"SET auto_explain.{setting}")
    pg.execute("SET client_min_messages = log")


class Captured:
    """Statements sent to the queue database `database` (not Dagster's), with their parameters: listen with it on
    "before_cursor_execute", then EXPLAIN what it caught."""

    def __init__(self, database: str):
        self.database, self.statements = database, []

    def __call__(self, conn, cursor, statement, parameters, context, executemany):
        if conn.engine.url.database == self.database and statement.lstrip().lower().startswith(EXPLAINABLE):
            self.statements.append((statement, parameters))
