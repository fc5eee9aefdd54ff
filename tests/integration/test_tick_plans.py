"""No whole-table work per tick: every statement a sensor tick (the recovery sensor's checks included), a
recovery run (stale-task release, re-index requests, partition retention) and a roll-up run sends to the queue
database is captured as it runs, then EXPLAINed with its own parameters on a queue large enough that the planner
prefers indexes; none may read a queue table with a sequential scan."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from queue_db.partition_keys import document_rollup, mark_rolled_up, rollup_backlog
from tests.integration.test_sensors import tick
from tests.queue_support import Captured, bulk_seed

QUEUE_TABLES = {
    "documents",
    "task_queue_page",
    "task_queue_chunk",
    "task_queue_chunk_text",
    "reindex_requests",
    "inbox_files",
    "idempotency_keys",
}


@pytest.fixture
def env(docqueue_env):
    from orchestration.code_location import build_definitions
    from queue_db.config import Settings as _Settings

    # built here, with this test's environment: the resources carry its home and stores
    defs = build_definitions(_Settings.from_env())
    from orchestration.environment import dagster_instance
    from queue_db.config import Settings
    from resources.database import open_queue

    instance = dagster_instance(Settings.from_env())
    yield defs, instance, open_queue(Settings.from_env())
    instance.dispose()


def _seed(engine) -> None:
    """15,000 chunks whose vectors are done (GraphRAG waiting, the oldest 10,000 completed a week ago) beside
    5,000 waiting for vectors; every row registered, as the sensors leave them. Set-based, a few seconds. With
    sequential scans disabled the verdict does not depend on the tables' size; the rows make the plans realistic."""
    bulk_seed(engine, 15, 10, 100, chunk_vector_status="completed")
    bulk_seed(engine, 5, 10, 100)
    with engine.begin() as conn:
        for table in ("documents", "task_queue_page", "task_queue_chunk"):
            conn.exec_driver_sql(
                f"""UPDATE {table} t SET partition_block = 1, partition_pos = n.pos
                    FROM (SELECT id, row_number() OVER (ORDER BY id) AS pos FROM {table}) n WHERE n.id = t.id"""
            )
        conn.exec_driver_sql(
            """UPDATE task_queue_chunk SET graphrag_status = 'completed',
                      vector_completed_at = now() - interval '8 days',
                      graphrag_completed_at = now() - interval '8 days'
               WHERE id IN (SELECT id FROM task_queue_chunk WHERE vector_status = 'completed'
                            ORDER BY id LIMIT 10000)"""
        )
        conn.exec_driver_sql("UPDATE documents SET vector_completed_at = now() WHERE vector_index_status = 'completed'")
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE")


def _plan_without_seqscan(engine, statement, parameters, explain: str = "FORMAT JSON"):
    """`EXPLAIN (explain)` of `statement` with sequential scans off: a Seq Scan left in the plan then means no index
    can serve the statement, whatever the table's size."""
    with engine.connect() as conn:
        raw = conn.connection.driver_connection
        with raw.cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute(f"EXPLAIN ({explain}) " + statement, parameters)
            plan = cursor.fetchall()
        conn.rollback()
    return plan[0][0] if explain == "FORMAT JSON" else "\n".join(row[0] for row in plan)


def _seq_scans(engine, statement, parameters) -> list[str]:
    plan = _plan_without_seqscan(engine, statement, parameters)
    scans = sorted(
        {
            n["Relation Name"]
            for n in _nodes(plan[0]["Plan"])
            if n["Node Type"] == "Seq Scan" and n.get("Relation Name") in QUEUE_TABLES
        }
    )
    if scans:  # the readable plan, for the failure message
        scans.append(_plan_without_seqscan(engine, statement, parameters, explain="COSTS ON"))
    return scans


def _nodes(node: dict):
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)


def test_ticks_recovery_and_rollups_read_queue_tables_through_indexes(env):
    from orchestration.maintenance import recover, recovery_check
    from orchestration.partitions import retire_partitions
    from queue_db.config import DagsterConfig
    from queue_db.inspection import expansions_without_outcome, outlook

    defs, instance, queue = env
    started = time.perf_counter()
    _seed(queue.engine)
    seeded = time.perf_counter() - started
    with queue.engine.connect() as conn:
        documents = conn.exec_driver_sql("SELECT document_key, id::text FROM documents LIMIT 20").all()
    captured = Captured(queue.engine.url.database)
    sa.event.listen(sa.engine.Engine, "before_cursor_execute", captured)
    try:
        for sensor in defs.sensors:
            if sensor.name not in ("inbox_sensor", "s3_intake_sensor"):
                tick(defs, instance, sensor.name)
        # the recovery sensor's reads, whatever the settings of the moment make it skip
        recovery_check(queue, DagsterConfig())
        recover(queue)
        retire_partitions(instance, queue.engine, retention_s=7 * 86400, max_completed=10_000, batch=500)
        for phase in ("ocr", "vector", "graphrag"):
            rollup_backlog(queue.engine, phase, 200)  # what a busy phase's roll-up sensor reads to hold or go
            document_rollup(queue.engine, phase, [key for key, _ in documents])
            mark_rolled_up(queue.engine, phase, [id_ for _, id_ in documents])
        # the checks a roll-up evaluates for its documents
        ids = [id_ for _, id_ in documents]
        queue.disagreeing_parents(ids, [queue.phases.phases[0]])
        expansions_without_outcome(queue.engine, queue.phases.phases[0].kinds[0], "task_queue_page", ids)
        # what `run --until-idle` and a worker of `run --workers N` read to decide whether to leave
        outlook(queue.engine, queue.phases.kinds)
        outlook(queue.engine, queue.phases.kinds, count_ready=True)
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", captured)
    assert len(captured.statements) > 20
    assert sum("AS next_retry_in_s" in statement for statement, _ in captured.statements) == 2  # the outlooks

    offenders = {}
    for statement, parameters in captured.statements:
        scans = _seq_scans(queue.engine, statement, parameters)
        if scans:
            offenders[" ".join(statement.split())[:300]] = scans
    print(f"\nseeded in {seeded:.1f} s; {len(captured.statements)} statements explained")
    assert not offenders, "sequential scans of queue tables:\n" + "\n".join(
        f"{tables}: {statement}" for statement, tables in offenders.items()
    )


def _limit_child(node: dict) -> dict | None:
    """The node under the first Limit of a plan (the ready-task pick)."""
    for found in _nodes(node):
        if found["Node Type"] == "Limit":
            return found["Plans"][0]
    return None


@pytest.mark.parametrize("kind_name", ["vector_chunk", "graphrag_chunk"])
def test_ready_pick_walks_the_claim_index_and_stops_at_its_limit(env, kind_name):
    """The ready-task pick of a tick must not read and sort every claimable task: it walks the claim index in its
    order and stops after the limit. Here the limit (a tick's 10 runs of 1,000 keys) exceeds the 5,000 claimable
    tasks, which is where the planner, left alone, reads and sorts them all."""
    from orchestration.planning import candidate_limit
    from queue_db.config import DagsterConfig, settings
    from queue_db.partition_keys import ready_candidates_sql
    from queue_db.phases import ALL_KINDS

    _, _, queue = env
    _seed(queue.engine)
    kind = next(k for k in ALL_KINDS if k.name == kind_name)
    config = settings(DagsterConfig)
    limit = candidate_limit(config.sensor_max_runs, config.max_keys_per_run(kind.name), {})
    planner_settings, statement = ready_candidates_sql(kind)
    with queue.engine.connect() as conn:
        raw = conn.connection.driver_connection
        with raw.cursor() as cursor:
            for setting in planner_settings:
                cursor.execute(setting)
            cursor.execute("EXPLAIN (FORMAT JSON) " + statement, {"n": limit, "documents": []})
            pick = _limit_child(cursor.fetchone()[0][0]["Plan"])
            cursor.execute("EXPLAIN " + statement, {"n": limit, "documents": []})
            readable = "\n".join(row[0] for row in cursor.fetchall())
        conn.rollback()
    assert pick is not None and pick["Node Type"] == "Index Scan" and "claim" in pick.get("Index Name", ""), readable


def test_status_page_reads_each_documents_chunks_through_its_index(engine):
    """`docqueue status` counts a page of documents' chunks through idx_tqc_document, even while the statistics
    say no vector is completed yet (right after a first run): a condition on the status let the planner scan a
    partial index of completed vectors instead and filter tens of thousands of rows per document."""
    from queue_db import readmodels

    bulk_seed(engine, 60, 2, 100)  # analyzed with every vector pending
    with engine.begin() as conn:  # then most are embedded, before autovacuum analyzes again
        conn.exec_driver_sql(
            "UPDATE task_queue_chunk SET vector_status = 'completed', vector_completed_at = now() "
            "WHERE chunk_index < 90"
        )
    captured = {}
    original = readmodels._document_progress
    readmodels._document_progress = lambda e, sql, params: (
        captured.update(sql=sql, params=params) or original(e, sql, params)
    )
    try:
        rows = readmodels.document_progress_rows(engine, limit=50)
    finally:
        readmodels._document_progress = original
    assert len(rows) == 50 and all(r["vector_completed_chunks"] == 180 for r in rows)
    with engine.connect() as conn:
        plan = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + captured["sql"], captured["params"]).scalar()
    chunk_reads = [n for n in _nodes(plan[0]["Plan"]) if n.get("Relation Name") == "task_queue_chunk"]
    by_document = [n for n in chunk_reads if "document_id" in (n.get("Index Cond") or n.get("Recheck Cond") or "")]
    filtered = [n for n in chunk_reads if "document_id" in (n.get("Filter") or "")]
    assert by_document and not filtered, plan


def test_stats_reads_the_open_tasks_error_classes_through_their_indexes(engine):
    """`docqueue stats` lists the error classes of the open tasks, a handful of rows: each kind's are read through
    the index of the rows that carry one, not by scanning every task row of its table (0.43 s at a million
    chunks)."""
    from queue_db import readmodels

    bulk_seed(engine, 20, 10, 50)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE task_queue_chunk SET vector_status = 'failed', vector_error_class = 'timeout', "
            "vector_retry_count = 3 WHERE chunk_index = 7 AND page_id IN (SELECT id FROM task_queue_page LIMIT 3)"
        )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE")
    assert {(r["task_type"], r["error_class"], r["count"]) for r in readmodels.error_classes_rows(engine)} == {
        ("vector_chunks", "timeout", 3)
    }
    plan = _plan_without_seqscan(engine, readmodels._error_classes_sql(), {"tenant": None})
    reads = [n for n in _nodes(plan[0]["Plan"]) if n.get("Relation Name") in QUEUE_TABLES]
    # every read of a task table is bounded by an index of the rows with a class, or of processing rows
    unbounded = [
        (n["Relation Name"], n["Node Type"], n.get("Index Name"))
        for n in reads
        if not ("Index Name" in n and n["Index Name"].endswith(("_error_class", "_heartbeat")))
    ]
    assert reads and not unbounded, unbounded


def _naive_open_counts(engine) -> dict[tuple[str, str], int]:
    """Each kind's open tasks by status, counted the plain way (a scan of every row)."""
    from queue_db.phases import PHASES

    counts: dict[tuple[str, str], int] = {}
    with engine.connect() as conn:
        for k in PHASES.kinds:
            status = f"CASE WHEN {k.blocked_sql('t')} THEN 'blocked' ELSE t.{k.status}::text END"
            for row in conn.exec_driver_sql(
                f"SELECT {status}, count(*) FROM {k.table} t WHERE t.{k.status} <> 'completed' AND ({k.owns('t')}) "
                "GROUP BY 1"
            ):
                counts[(k.label, row[0])] = int(row[1])
    return counts


def test_stats_counts_the_open_tasks_through_partial_indexes(engine):
    """`docqueue stats` counts each kind's open tasks a partial index at a time: processing, failed, pending behind
    an open gate (the claim index) and pending behind a closed one (the open tasks it waits on). Read as one
    `status IN ('pending', 'failed')`, which no index covers, it scanned every page and chunk row even with
    nothing open. The counts equal a plain count over every mix of statuses the test sets."""
    from queue_db import readmodels

    bulk_seed(engine, 20, 10, 50)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE task_queue_chunk SET vector_status = 'completed', graphrag_status = 'completed' "
            "WHERE chunk_index >= 5"
        )
        for sql in (
            "UPDATE task_queue_chunk SET vector_status = 'processing' WHERE chunk_index = 0",
            "UPDATE task_queue_chunk SET vector_status = 'failed', vector_retry_count = 3 WHERE chunk_index = 1",
            "UPDATE task_queue_chunk SET vector_status = 'failed', vector_retry_count = 1 WHERE chunk_index = 2",
            "UPDATE task_queue_chunk SET vector_status = 'completed', graphrag_status = 'processing' "
            "WHERE chunk_index = 3",
            "UPDATE task_queue_chunk SET vector_status = 'completed' WHERE chunk_index = 4",
            "UPDATE task_queue_chunk SET graphrag_status = 'failed' WHERE chunk_index = 6",
            "UPDATE task_queue_chunk SET vector_status = 'pending', graphrag_status = 'pending' WHERE chunk_index = 7",
            "UPDATE task_queue_page SET ocr_status = 'pending', vector_status = 'pending', chunked_at = NULL "
            "WHERE page_number = 1",
            "UPDATE task_queue_page SET ocr_status = 'failed', ocr_retry_count = 3, vector_status = 'pending', "
            "chunked_at = NULL WHERE page_number = 2",
            "UPDATE task_queue_page SET vector_status = 'pending', chunked_at = NULL WHERE page_number = 3",
        ):
            conn.exec_driver_sql(sql)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE")
    stats = {(r["task_type"], r["status"]): r["count"] for r in readmodels.queue_statistics_rows(engine)}
    assert {key: n for key, n in stats.items() if key[1] != "completed"} == _naive_open_counts(engine)
    assert stats[("graphrag_chunks", "blocked")] == 200 and stats[("chunking_pages", "blocked")] == 20
    assert stats[("vector_chunks", "pending")] == 200 and stats[("graphrag_chunks", "pending")] == 800
    scans = _seq_scans(engine, readmodels._open_counts_sql(), {"tenant": None})
    # the documents' table is a document's row per file: its few open tasks are read as they come
    assert [s for s in scans[:-1] if s != "documents"] == [], scans
