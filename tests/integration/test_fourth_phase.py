"""A phase is one definition: a fourth phase, `summary` (a summary of each chunk after its GraphRAG task), is
declared here by its PhaseSpec alone, added to a registry, and the queue serves it in a scratch database: its
columns and claim index (migrate.upgrade), its gate, claims, bubble-up to pages and documents, retries on its own
back-off, and stale recovery all come from the spec. Nothing in queue_db names it.

The queue part is first; the orchestration part (the phase's sensor and asset partitions) appends its tests below,
on the same SUMMARY, REGISTRY, HANDLERS and `summary_queue`.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from queue_db.config import QueueSettings
from queue_db.migrate import upgrade
from queue_db.partition_retention import live_completed
from queue_db.phases import GRAPHRAG_CHUNK, PHASES, VECTOR_CHUNK, Level, PhaseSpec, TaskKind
from queue_db.queue import TaskQueue, create_queue_engine, make_worker_id
from queue_db.readmodels import document_progress_rows, phase_progress, queue_statistics_rows
from queue_db.retry_policy import RetryPolicy
from queue_db.rollup_sql import missing_phase_ddl
from tests.queue_support import build_document

SUMMARY_RETRY = RetryPolicy(base_s=7.0, cap_s=20.0, attempts=2)
SUMMARY_CHUNK = TaskKind(
    name="summary_chunk",
    level=Level.CHUNK,
    table="task_queue_chunk",
    prefix="summary",
    # the gate: the same chunk's GraphRAG task completed
    ready_sql="t.graphrag_status = 'completed'",
    depends_on=GRAPHRAG_CHUNK,
    label="summary_chunks",
    ready_since_sql="t.graphrag_completed_at",
    returning=(
        "id",
        "page_id",
        "document_id",
        "chunk_id",
        "chunk_index",
        "content",
        "summary_retry_count",
        "max_retries",
    ),
    result_columns={"summary_text": "text"},
    retry=SUMMARY_RETRY,
)
SUMMARY = PhaseSpec(
    "summary",
    (SUMMARY_CHUNK,),
    document_status_column="summary_status",
    pool="summary",
    celery_queue="summary",
    handler="summary",
)
REGISTRY = PHASES.with_phase(SUMMARY)


def summarize(task: dict) -> dict:
    """The phase's handler: a completion's result columns from a claimed task."""
    return {"id": task["id"], "summary_text": (task["content"] or "")[:12]}


HANDLERS = {"summary": summarize}

# the other phases retry at once (the test settings' back-off is zero): the summary phase's own policy differs
SETTINGS = QueueSettings(
    heartbeat_interval_s=0.2, stale_timeout_s=2.0, max_retries=3, retry_backoff_base_s=0.0, retry_backoff_max_s=0.0
)


@pytest.fixture
def summary_queue(database_url):
    """A queue serving the four phases, on a scratch database upgraded for them."""
    engine = create_queue_engine(database_url, pool_size=4, max_overflow=8)
    upgrade(engine, phases=REGISTRY)
    yield TaskQueue(engine, SETTINGS, phases=REGISTRY)
    engine.dispose()


def _graph_indexed(queue: TaskQueue, pages: int = 2, chunks_per_page: int = 2, graph: int | None = None) -> dict:
    """A document whose chunks are embedded and (the first `graph` of them, default all) through GraphRAG."""
    doc = build_document(queue, pages=pages, chunks_per_page=chunks_per_page)
    worker = make_worker_id("vector")
    claimed = queue.claim(VECTOR_CHUNK, worker, 100)
    assert len(claimed) == pages * chunks_per_page
    assert not queue.complete(VECTOR_CHUNK, worker, [c["id"] for c in claimed]).rejected
    worker = make_worker_id("graph")
    ids = sorted(c["id"] for c in claimed)[:graph]
    assert len(queue.claim(GRAPHRAG_CHUNK, worker, 100, only_ids=ids)) == len(ids)
    assert not queue.complete(GRAPHRAG_CHUNK, worker, ids).rejected
    return doc


def _statuses(queue: TaskQueue, doc: dict) -> tuple[str, list[str]]:
    """The document's summary roll-up, and its pages' in page order."""
    with queue.engine.connect() as conn:
        document = conn.exec_driver_sql(
            "SELECT summary_status FROM documents WHERE id = %(d)s", {"d": str(doc["id"])}
        ).scalar()
        pages = [
            r[0]
            for r in conn.exec_driver_sql(
                "SELECT summary_status FROM task_queue_page WHERE document_id = %(d)s ORDER BY page_number",
                {"d": str(doc["id"])},
            )
        ]
    return document, pages


def test_the_spec_alone_adds_the_phase_columns_and_claim_index(summary_queue, create_database, migrated_template):
    with summary_queue.engine.connect() as conn:
        columns = {
            r[0]
            for r in conn.exec_driver_sql(
                "SELECT table_name || '.' || column_name FROM information_schema.columns "
                "WHERE column_name LIKE 'summary%%'"
            )
        }
        indexes = {
            r[0] for r in conn.exec_driver_sql("SELECT indexname FROM pg_indexes WHERE indexname LIKE '%%summary%%'")
        }
        assert not missing_phase_ddl(conn, REGISTRY), "a second upgrade would change something"
    three = create_queue_engine(create_database(template=migrated_template))
    with three.connect() as conn:  # a database of the three phases: their generated DDL names what exists
        assert not missing_phase_ddl(conn, PHASES)
        assert missing_phase_ddl(conn, REGISTRY)
    three.dispose()
    assert {
        "task_queue_chunk.summary_status",
        "task_queue_chunk.summary_retry_count",
        "task_queue_chunk.summary_next_attempt_at",
        "task_queue_chunk.summary_text",
        "task_queue_page.summary_status",
        "task_queue_page.summary_error",
        "documents.summary_status",
        "documents.summary_completed_at",
        "documents.summary_rollup_at",
    } <= columns
    assert {"idx_tqc_summary_claim", "idx_tqc_summary_heartbeat", "idx_documents_summary_rollup"} <= indexes
    assert REGISTRY.phase("summary") is SUMMARY and REGISTRY.previous(SUMMARY) is PHASES.phases[-1]
    assert REGISTRY.kind("summary_chunk") is SUMMARY_CHUNK and SUMMARY.leaf is SUMMARY_CHUNK


def test_not_claimable_before_its_graphrag_task_completes(summary_queue):
    doc = _graph_indexed(summary_queue, graph=1)
    worker = make_worker_id("summary")
    assert summary_queue.ready_counts()["summary_chunk"] == 1
    claimed = summary_queue.claim(SUMMARY_CHUNK, worker, 100)
    assert len(claimed) == 1 and claimed[0]["content"]  # the one chunk whose GraphRAG completed, with its text
    assert summary_queue.claim(SUMMARY_CHUNK, worker, 100) == []
    # the rest become claimable as their GraphRAG tasks complete
    graph = make_worker_id("graph")
    rest = summary_queue.claim(GRAPHRAG_CHUNK, graph, 100)
    assert len(rest) == 3
    summary_queue.complete(GRAPHRAG_CHUNK, graph, [r["id"] for r in rest])
    assert len(summary_queue.claim(SUMMARY_CHUNK, worker, 100)) == 3
    assert _statuses(summary_queue, doc)[0] == "processing"


def test_claim_and_completion_bubble_up_to_pages_and_documents(summary_queue):
    doc = _graph_indexed(summary_queue)
    assert _statuses(summary_queue, doc) == ("pending", ["pending", "pending"])
    worker = make_worker_id("summary")
    first_page = summary_queue.claim(SUMMARY_CHUNK, worker, 2)  # claim order: the first page's two chunks
    assert _statuses(summary_queue, doc)[0] == "processing"
    handler = HANDLERS[SUMMARY.handler]
    done = summary_queue.complete(SUMMARY_CHUNK, worker, [handler(t) for t in first_page])
    assert sorted(done.applied) == sorted(t["id"] for t in first_page)
    document, pages = _statuses(summary_queue, doc)
    assert document == "pending" and sorted(pages) == ["completed", "pending"]
    rest = summary_queue.claim(SUMMARY_CHUNK, worker, 100)
    assert summary_queue.settle(SUMMARY_CHUNK, worker, completed=[handler(t) for t in rest]).completed.applied
    assert _statuses(summary_queue, doc) == ("completed", ["completed", "completed"])
    with summary_queue.engine.connect() as conn:
        row = conn.exec_driver_sql(
            "SELECT ocr_status, vector_index_status, graphrag_index_status, summary_completed_at "
            "FROM documents WHERE id = %(d)s",
            {"d": str(doc["id"])},
        ).one()
        texts = conn.exec_driver_sql("SELECT count(*) FROM task_queue_chunk WHERE summary_text IS NOT NULL").scalar()
    assert row[:3] == ("completed", "completed", "completed") and row[3] is not None and texts == 4
    assert phase_progress(summary_queue.engine, REGISTRY)["summary"] == {"total": 4, "completed": 4, "failed": 0}
    assert not summary_queue.disagreeing_parents().get("page_summary")
    assert {"page_summary", "document_summary"} <= set(summary_queue.disagreeing_parents())


def test_a_failure_retries_after_its_own_back_off(summary_queue):
    doc = _graph_indexed(summary_queue, pages=1, chunks_per_page=1)
    worker = make_worker_id("summary")
    [task] = summary_queue.claim(SUMMARY_CHUNK, worker, 1)
    assert summary_queue.fail(SUMMARY_CHUNK, worker, [{"id": task["id"], "error": "model overloaded"}]).applied
    assert _statuses(summary_queue, doc) == ("failed", ["failed"])

    def delay() -> float:
        with summary_queue.engine.connect() as conn:
            return conn.exec_driver_sql(
                "SELECT EXTRACT(EPOCH FROM summary_next_attempt_at - summary_failed_at)::float8 FROM task_queue_chunk "
                "WHERE id = %(id)s",
                {"id": task["id"]},
            ).scalar()

    assert delay() == pytest.approx(SUMMARY_RETRY.delay_seconds(0)) == pytest.approx(7.0)
    assert summary_queue.claim(SUMMARY_CHUNK, worker, 1) == []  # backing off
    with summary_queue.engine.begin() as conn:  # the back-off has elapsed
        conn.exec_driver_sql("UPDATE task_queue_chunk SET summary_next_attempt_at = now() - interval '1 second'")
    [again] = summary_queue.claim(SUMMARY_CHUNK, worker, 1)
    assert again["summary_retry_count"] == 1 and _statuses(summary_queue, doc)[0] == "processing"
    summary_queue.fail(SUMMARY_CHUNK, worker, [{"id": task["id"], "error": "model overloaded"}])
    assert delay() == pytest.approx(SUMMARY_RETRY.delay_seconds(1)) == pytest.approx(14.0)
    # two failed attempts are the policy's limit, though the row's max_retries (the settings') allows three
    with summary_queue.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE task_queue_chunk SET summary_next_attempt_at = now() - interval '1 second'")
        assert conn.exec_driver_sql("SELECT max(max_retries) FROM task_queue_chunk").scalar() == 3
    assert summary_queue.claim(SUMMARY_CHUNK, worker, 1) == []
    assert summary_queue.ready_counts()["summary_chunk"] == 0

    # the other phases keep the queue's default policy (zero back-off here): a failed vector task is claimable
    # at once
    other = build_document(summary_queue, pages=1, chunks_per_page=1)
    vector = make_worker_id("vector")
    [chunk] = summary_queue.claim(VECTOR_CHUNK, vector, 1)
    summary_queue.fail(VECTOR_CHUNK, vector, [{"id": chunk["id"], "error": "timeout"}])
    assert [c["id"] for c in summary_queue.claim(VECTOR_CHUNK, vector, 1)] == [chunk["id"]]
    assert summary_queue.phases.retry_policy(VECTOR_CHUNK) != SUMMARY_RETRY
    assert other["id"] != doc["id"]


def test_a_claimed_task_without_heartbeat_is_released(summary_queue):
    doc = _graph_indexed(summary_queue, pages=1, chunks_per_page=2)
    lost, alive = make_worker_id("lost"), make_worker_id("alive")
    [mine] = summary_queue.claim(SUMMARY_CHUNK, lost, 1)
    [theirs] = summary_queue.claim(SUMMARY_CHUNK, alive, 1)
    with summary_queue.engine.begin() as conn:  # the lost worker's last heartbeat is old
        conn.exec_driver_sql(
            "UPDATE task_queue_chunk SET summary_last_heartbeat = now() - interval '1 hour' WHERE id = %(id)s",
            {"id": mine["id"]},
        )
    assert summary_queue.heartbeat(SUMMARY_CHUNK, alive, [theirs["id"]]) == {theirs["id"]}
    released = summary_queue.recover_stale(stale_after_s=60)
    assert released["summary_chunk"] == 1 and sum(released.values()) == 1
    with summary_queue.engine.connect() as conn:
        row = conn.exec_driver_sql(
            "SELECT summary_status, summary_retry_count, summary_error_class, summary_worker_id "
            "FROM task_queue_chunk WHERE id = %(id)s",
            {"id": mine["id"]},
        ).one()
    assert tuple(row) == ("pending", 1, "worker_lost", None)
    # the lost worker's completion is refused; the task is claimed again and finishes
    assert summary_queue.complete(SUMMARY_CHUNK, lost, [mine["id"]]).rejected == [mine["id"]]
    assert _statuses(summary_queue, doc)[0] == "processing"  # the other chunk is still held
    summary_queue.complete(SUMMARY_CHUNK, alive, [theirs["id"]])
    assert _statuses(summary_queue, doc) == ("pending", ["pending"])  # what is left is the released task
    [again] = summary_queue.claim(SUMMARY_CHUNK, alive, 1)
    assert again["id"] == mine["id"]
    summary_queue.complete(SUMMARY_CHUNK, alive, [summarize(again)])
    assert _statuses(summary_queue, doc) == ("completed", ["completed"])


def test_partition_retention_follows_the_phase(summary_queue):
    """The retention rule, its index and its unretire trigger cover the added phase: a chunk is retirable only once
    its summary completed, and a retired chunk whose summary is put back to work gets its partition again."""
    doc = _graph_indexed(summary_queue, pages=1, chunks_per_page=2)
    assert live_completed(summary_queue.engine, Level.CHUNK, REGISTRY) == 0, "summaries still pending"
    with summary_queue.engine.begin() as conn:
        definition = conn.exec_driver_sql(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'idx_tqc_retirable'"
        ).scalar()
        assert "summary_completed_at" in definition and "summary_status" in definition, definition
        conn.exec_driver_sql(
            "UPDATE task_queue_chunk SET summary_status = 'completed', summary_completed_at = now(), "
            "partition_block = 1, partition_pos = 0 WHERE document_id = %(d)s",
            {"d": str(doc["id"])},
        )
    assert live_completed(summary_queue.engine, Level.CHUNK, REGISTRY) == 2
    with summary_queue.engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE task_queue_chunk SET partition_retired_at = now() WHERE document_id = %(d)s", {"d": str(doc["id"])}
        )
        # the summary of one chunk is put back to work: its partition is forgotten, to be registered again
        conn.exec_driver_sql(
            "UPDATE task_queue_chunk SET summary_status = 'pending' WHERE id = (SELECT id FROM task_queue_chunk "
            "WHERE document_id = %(d)s ORDER BY chunk_index LIMIT 1)",
            {"d": str(doc["id"])},
        )
        blocks = [
            r[0]
            for r in conn.exec_driver_sql(
                "SELECT partition_block FROM task_queue_chunk WHERE document_id = %(d)s ORDER BY chunk_index",
                {"d": str(doc["id"])},
            )
        ]
    assert blocks == [None, 1]


def test_statistics_and_outcomes_count_the_phase(summary_queue):
    _graph_indexed(summary_queue, pages=1, chunks_per_page=1)
    stats = {
        (r["task_type"], r["status"]): r["count"] for r in queue_statistics_rows(summary_queue.engine, phases=REGISTRY)
    }
    assert stats[("summary_chunks", "pending")] == 1
    with summary_queue.engine.connect() as conn:
        assert (
            conn.exec_driver_sql(
                f"SELECT count(*) FROM documents d WHERE {REGISTRY.blocked_phase_sql(SUMMARY, 'd')}"
            ).scalar()
            == 0
        )
    assert isinstance(summary_queue.engine, sa.Engine)
    # the status listing has the phase's status and its chunks' progress, beside the three phases'
    [listed] = document_progress_rows(summary_queue.engine, phases=REGISTRY)
    assert (
        listed["summary_status"],
        listed["summary_completed_chunks"],
        listed["summary_failed_chunks"],
        listed["graphrag_completed_chunks"],
        listed["total_chunks"],
    ) == ("pending", 0, 0, 1, 1)
    assert listed["blocked_phases"] == []


# -- the orchestration part (sensor, asset partitions) is appended below ---------------------------------------------
