"""A run maps its partition keys back to task rows (rows_for_keys) right after those rows are written, before
autovacuum has analyzed the tables: the lookup must stay an index probe per key without statistics too."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from queue_db.partition_keys import rows_for_keys
from queue_db.phases import GRAPHRAG_CHUNK, OCR_DOCUMENT, VECTOR_CHUNK, VECTOR_PAGE
from tests.queue_support import Captured, bulk_seed

QUEUE_TABLES = ("documents", "task_queue_page", "task_queue_chunk")


def _forget_statistics(engine) -> None:
    """The planner's view of tables never analyzed: no column statistics, no row count."""
    with engine.begin() as conn:
        for table in QUEUE_TABLES:
            conn.exec_driver_sql(f"DELETE FROM pg_statistic WHERE starelid = '{table}'::regclass")
            conn.exec_driver_sql(f"UPDATE pg_class SET reltuples = -1 WHERE oid = '{table}'::regclass")


def _keys(engine, level: str, limit: int) -> list[str]:
    from queue_db.keys import chunk_partition_key, page_partition_key

    with engine.connect() as conn:
        if level == "document":
            return [r[0] for r in conn.exec_driver_sql("SELECT document_key FROM documents LIMIT %s", (limit,))]
        if level == "page":
            rows = conn.exec_driver_sql(
                """SELECT d.document_key, p.page_number FROM task_queue_page p JOIN documents d ON d.id = p.document_id
                   ORDER BY p.id LIMIT %s""",
                (limit,),
            )
            return [page_partition_key(d, p) for d, p in rows]
        rows = conn.exec_driver_sql(
            """SELECT d.document_key, p.page_number, c.chunk_index FROM task_queue_chunk c
               JOIN task_queue_page p ON p.id = c.page_id JOIN documents d ON d.id = c.document_id
               ORDER BY c.id LIMIT %s""",
            (limit,),
        )
        return [chunk_partition_key(d, p, c) for d, p, c in rows]


def _buffers(engine, statement: str, parameters) -> tuple[int, str]:
    """The shared buffers `statement` touches with its own parameters (EXPLAIN (ANALYZE, BUFFERS), run after the call
    on the same tables) and its readable plan, for a failure's message."""
    with engine.connect() as conn:
        with conn.connection.driver_connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, parameters)
            plan = cursor.fetchone()[0][0]["Plan"]
            cursor.execute("EXPLAIN " + statement, parameters)
            readable = "\n".join(row[0] for row in cursor.fetchall())
        conn.rollback()
    return plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0), readable


def _analyze(engine) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ANALYZE")


@pytest.mark.parametrize("statistics", [_forget_statistics, _analyze], ids=("unanalyzed", "analyzed"))
@pytest.mark.parametrize("kind", [OCR_DOCUMENT, VECTOR_PAGE, VECTOR_CHUNK, GRAPHRAG_CHUNK], ids=lambda k: k.name)
def test_rows_for_keys_probes_indexes_with_or_without_statistics(engine, kind, statistics):
    # 40 documents of 10 pages of 5 chunks: every page number and chunk index recurs in every document, which a
    # lookup matching a page on its number alone multiplies
    bulk_seed(engine, 40, 10, 5)
    statistics(engine)
    keys = _keys(engine, kind.level.value, 400)
    captured = Captured(engine.url.database)
    sa.event.listen(engine, "before_cursor_execute", captured)
    try:
        rows = rows_for_keys(engine, kind, keys)
    finally:
        sa.event.remove(engine, "before_cursor_execute", captured)
    assert sorted(rows) == sorted(keys)
    assert len(captured.statements) == 1
    touched, plan = _buffers(engine, *captured.statements[0])
    # an index probe per level and key: about ten buffers a chunk key (a page matched on its number alone reads
    # 16,000 a key here)
    assert touched <= 16 * len(keys) + 50, f"{touched} buffers for {len(keys)} keys:\n{plan}"
