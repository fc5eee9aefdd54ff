"""Every per-kind query, for every kind, against real queue states.

Each test case holds one task of its kind (claimed, heartbeat stale) and one failed task of its kind backing off,
beside a background document whose page was chunked and whose chunks are being embedded: the page's vector status
and the document's OCR status are their children's roll-up there, although the page still carries its chunking
worker and an old heartbeat. No query may take those roll-ups for tasks a worker holds.
"""

from __future__ import annotations

import threading

import pytest

from queue_db import inspection, lifecycle
from queue_db.config import QueueSettings
from queue_db.phases import ALL_KINDS, GRAPHRAG_CHUNK, OCR_DOCUMENT, OCR_PAGE, VECTOR_CHUNK, VECTOR_PAGE, TaskKind
from queue_db.queue import TaskQueue, make_worker_id
from queue_db.readmodels import document_progress, error_classes, queue_statistics
from tests.queue_support import chunk_all, expand, ocr_all, register

BACKOFF_S = 300.0


def _ready_for(queue: TaskQueue, kind: TaskKind, name: str) -> dict:
    """A document with exactly one task of `kind` ready (one page, one chunk)."""
    doc = register(queue, name)
    steps = [OCR_DOCUMENT, OCR_PAGE, VECTOR_PAGE, VECTOR_CHUNK, GRAPHRAG_CHUNK]
    for step in steps[: steps.index(kind)]:
        if step is OCR_DOCUMENT:
            expand(queue, doc, 1)
        elif step is OCR_PAGE:
            ocr_all(queue, doc)
        elif step is VECTOR_PAGE:
            chunk_all(queue, doc, 1)
        else:
            worker = make_worker_id("embed")
            ids = [c["id"] for c in queue.chunks(document_id=doc["id"])]
            queue.complete(VECTOR_CHUNK, worker, [c["id"] for c in queue.claim(VECTOR_CHUNK, worker, 9, only_ids=ids)])
    return queue.document(str(doc["id"]))


def _ids_of(queue: TaskQueue, kind: TaskKind, doc: dict) -> list[str]:
    with queue.engine.connect() as conn:
        return [
            r[0]
            for r in conn.exec_driver_sql(
                f"SELECT id::text FROM {kind.table} WHERE {kind.document_column} = %(d)s ORDER BY id",
                {"d": str(doc["id"])},
            ).all()
        ]


def _age_heartbeats(queue: TaskQueue, kind: TaskKind, ids: list[str], seconds: int = 3600) -> None:
    with queue.engine.begin() as conn:
        conn.exec_driver_sql(
            f"UPDATE {kind.table} SET {kind.col('last_heartbeat')} = now() - make_interval(secs => %(s)s) "
            f"WHERE id = ANY(%(ids)s::uuid[])",
            {"s": seconds, "ids": ids},
        )


def _row(queue: TaskQueue, kind: TaskKind, task_id: str) -> dict:
    with queue.engine.connect() as conn:
        return dict(
            conn.exec_driver_sql(f"SELECT * FROM {kind.table} WHERE id = %(id)s", {"id": task_id}).mappings().one()
        )


@pytest.fixture
def backing_off_queue(engine) -> TaskQueue:
    return TaskQueue(
        engine,
        QueueSettings(
            heartbeat_interval_s=0.2,
            stale_timeout_s=2.0,
            max_retries=3,
            retry_backoff_base_s=BACKOFF_S,
            retry_backoff_max_s=BACKOFF_S,
        ),
    )


@pytest.fixture
def rolled_up(backing_off_queue) -> dict:
    """The background: a chunked page whose chunk is being embedded (fresh heartbeat) while the page keeps
    its chunking worker and a heartbeat an hour old; the document keeps its expansion worker likewise."""
    queue = backing_off_queue
    doc = _ready_for(queue, VECTOR_CHUNK, "background.pdf")
    embedder = make_worker_id("embed-bg")
    chunks = [c["id"] for c in queue.claim(VECTOR_CHUNK, embedder, 9, only_ids=_ids_of(queue, VECTOR_CHUNK, doc))]
    page_id = _ids_of(queue, VECTOR_PAGE, doc)[0]
    _age_heartbeats(queue, VECTOR_PAGE, [page_id])
    _age_heartbeats(queue, OCR_DOCUMENT, [str(doc["id"])])
    page = _row(queue, VECTOR_PAGE, page_id)
    assert page["vector_status"] == "processing" and page["vector_worker_id"] and page["chunked_at"] is not None
    return {
        "doc": doc,
        "page_id": page_id,
        "chunks": chunks,
        "embedder": embedder,
        "stale_owners": [page["vector_worker_id"], queue.document(str(doc["id"]))["current_worker_id"]],
    }


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.name)
def test_every_per_kind_query_sees_exactly_the_tasks_of_its_kind(kind, backing_off_queue, rolled_up):
    queue = backing_off_queue
    # one task of the kind held by a worker whose heartbeat went stale
    held_doc = _ready_for(queue, kind, "held.pdf")
    worker = make_worker_id("held")
    held = queue.claim(kind, worker, 1, only_ids=_ids_of(queue, kind, held_doc))
    assert len(held) == 1
    held_id = held[0]["id"]
    _age_heartbeats(queue, kind, [held_id])
    # one task of the kind failed and backing off
    failed_doc = _ready_for(queue, kind, "failed.pdf")
    failer = make_worker_id("fail")
    failed_id = queue.claim(kind, failer, 1, only_ids=_ids_of(queue, kind, failed_doc))[0]["id"]
    queue.fail(kind, failer, [{"id": failed_id, "error": "boom", "error_class": "test_failure"}])
    background = {k.name: 0 for k in ALL_KINDS} | {VECTOR_CHUNK.name: len(rolled_up["chunks"])}

    with queue.engine.connect() as conn:
        held_counts = inspection.held_counts(conn)
        stuck = inspection.stuck_counts(conn, 2.0)
        of_held_doc = inspection.document_held_counts(conn, str(held_doc["id"]))
        of_background = inspection.document_held_counts(conn, str(rolled_up["doc"]["id"]))
    assert held_counts == {k.name: background[k.name] + (k is kind) for k in ALL_KINDS}
    assert stuck == {k.name: int(k is kind) for k in ALL_KINDS}
    assert of_held_doc == {k.name: int(k is kind) for k in ALL_KINDS}
    assert of_background == background

    now = inspection.outlook(queue.engine)
    assert now.held == 1 + sum(background.values())
    assert now.next_retry_in_s is not None and 0 < now.next_retry_in_s <= BACKOFF_S

    assert inspection.holding_workers(queue.engine) == {worker, rolled_up["embedder"]}

    counts = {(r.task_type, r.status): r.count for r in queue_statistics(queue.engine).itertuples()}
    assert counts[(kind.label, "processing")] == 1 + background[kind.name]
    assert counts[(kind.label, "failed")] == 1
    errors = {(r.task_type, r.error_class): r.count for r in error_classes(queue.engine).itertuples()}
    assert errors[(kind.label, "test_failure")] == 1
    assert document_progress(queue.engine, str(failed_doc["id"])).iloc[0]["last_failed_at"] is not None
    assert document_progress(queue.engine, str(rolled_up["doc"]["id"])).iloc[0]["last_failed_at"] is None

    for doc in (held_doc, rolled_up["doc"]):
        with pytest.raises(RuntimeError, match="running"):
            lifecycle.delete_rows(queue, str(doc["id"]))

    # the roll-ups' stale owners hold nothing: releasing them changes nothing
    assert queue.release_workers(rolled_up["stale_owners"]) == {k.name: 0 for k in ALL_KINDS}
    assert queue.recover_stale(2.0) == {k.name: int(k is kind) for k in ALL_KINDS}
    page = _row(queue, VECTOR_PAGE, rolled_up["page_id"])
    assert (page["vector_status"], page["vector_retry_count"], page["vector_error"]) == ("processing", 0, None)
    released = _row(queue, kind, held_id)
    assert (released[kind.status], released[kind.col("retry_count")]) == ("pending", 1)
    # both a failed attempt and a lost worker record when the task last failed
    assert released[kind.col("failed_at")] is not None
    assert _row(queue, kind, failed_id)[kind.col("failed_at")] is not None

    # requeue and retry act on the kind's own statuses, never on a roll-up
    if kind.owns_sql != "TRUE":
        rolled_id = rolled_up["page_id"] if kind is VECTOR_PAGE else str(rolled_up["doc"]["id"])
        assert queue.requeue(kind, [rolled_id], "test") == 0
    assert queue.requeue(kind, [held_id], "test") == 1
    assert queue.retry_failed(kind.phase, str(failed_doc["id"]))[kind.name] == 1
    assert _row(queue, kind, failed_id)[kind.status] == "pending"
    assert inspection.outlook(queue.engine).next_retry_in_s is None


def test_a_chunked_page_with_processing_chunks_is_not_released(backing_off_queue, rolled_up):
    """Stale recovery on the issue's reproduction: one page, its chunks embedding with fresh heartbeats."""
    queue = backing_off_queue
    assert sum(queue.recover_stale(2.0).values()) == 0
    page = _row(queue, VECTOR_PAGE, rolled_up["page_id"])
    assert (page["vector_status"], page["vector_retry_count"], page["vector_error"]) == ("processing", 0, None)


def test_a_chunking_retry_in_back_off_is_waiting_work(backing_off_queue):
    """`run --until-idle` goes idle only when nothing waits: a page whose chunking failed and backs off waits."""
    queue = backing_off_queue
    doc = _ready_for(queue, VECTOR_PAGE, "chunking.pdf")
    worker = make_worker_id("chunk")
    page = queue.claim(VECTOR_PAGE, worker, 1, only_ids=_ids_of(queue, VECTOR_PAGE, doc))[0]
    queue.fail(VECTOR_PAGE, worker, [{"id": page["id"], "error": "tokenizer crashed"}])
    assert queue.ready_counts()[VECTOR_PAGE.name] == 0
    now = inspection.outlook(queue.engine)
    assert now.next_retry_in_s is not None and now.next_retry_in_s > BACKOFF_S / 2


def test_the_outlook_sees_a_task_that_is_claimed_and_released_over_and_over(queue):
    """`run --until-idle` and a worker of `run --workers N` leave once the outlook is settled. A task a sibling
    claims and releases again and again is, at every instant, held or claimable; read apart, a claim between the
    read of the held tasks and that of the claimable ones hid it from both, and the queue looked settled."""
    page_id = _ids_of(queue, OCR_PAGE, _ready_for(queue, OCR_PAGE, "flicker.pdf"))[0]
    status, worker, heartbeat = OCR_PAGE.status, OCR_PAGE.col("worker_id"), OCR_PAGE.col("last_heartbeat")
    stop = threading.Event()

    def flicker() -> None:
        with queue.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            while not stop.is_set():
                for now, owner in (("processing", "w-flicker"), ("pending", None)):
                    conn.exec_driver_sql(
                        f"UPDATE {OCR_PAGE.table} SET {status} = %(s)s, {worker} = %(w)s, {heartbeat} = now() "
                        "WHERE id = %(id)s",
                        {"s": now, "w": owner, "id": page_id},
                    )

    thread = threading.Thread(target=flicker, daemon=True)
    thread.start()
    try:
        looks = [inspection.outlook(queue.engine) for _ in range(400)]
    finally:
        stop.set()
        thread.join(10)
    assert not [look for look in looks if look.settled]
    assert any(look.held for look in looks) and any(look.ready[OCR_PAGE.name] for look in looks)


def test_the_outlook_counts_or_probes_the_claimable_tasks(queue):
    for name in ("one.pdf", "two.pdf"):
        _ready_for(queue, OCR_PAGE, name)
    assert inspection.outlook(queue.engine, count_ready=True).ready[OCR_PAGE.name] == 2
    assert inspection.outlook(queue.engine).ready[OCR_PAGE.name] == 1
    assert queue.ready_counts() == inspection.outlook(queue.engine, count_ready=True).ready


@pytest.mark.parametrize(
    "build",
    [
        inspection.held_sql,
        inspection.stuck_sql,
        inspection.next_retry_sql,
        inspection.holders_sql,
        inspection.document_held_sql,
    ],
)
def test_generated_queries_name_every_kind(build):
    sql = build()
    assert all(f"'{kind.name}'" in sql and kind.table in sql for kind in ALL_KINDS)


def test_a_phase_waiting_on_a_task_failed_for_good_is_blocked(queue):
    """A derived view: the stored statuses stay `pending`; status, stats and the roll-up figures say `blocked`."""
    from queue_db.partition_keys import document_rollup
    from tests.queue_support import build_document

    doc = build_document(queue, pages=1, chunks_per_page=2)
    worker = make_worker_id("embed")
    first, second = queue.claim(VECTOR_CHUNK, worker, 2)
    queue.complete(VECTOR_CHUNK, worker, [first["id"]])
    queue.fail(VECTOR_CHUNK, worker, [{"id": second["id"], "error": "unreadable", "retryable": False}])
    progress = document_progress(queue.engine, str(doc["id"])).iloc[0]
    assert list(progress["blocked_phases"]) == [], "the GraphRAG task of the first chunk can still run"
    counts = {(r.task_type, r.status): r.count for r in queue_statistics(queue.engine).itertuples()}
    assert counts[("graphrag_chunks", "blocked")] == 1 and counts[("graphrag_chunks", "pending")] == 1

    graph = make_worker_id("graph")
    queue.complete(GRAPHRAG_CHUNK, graph, [c["id"] for c in queue.claim(GRAPHRAG_CHUNK, graph, 5)])
    document = queue.document(str(doc["id"]))
    assert (document["vector_index_status"], document["graphrag_index_status"]) == ("failed", "pending")
    progress = document_progress(queue.engine, str(doc["id"])).iloc[0]
    assert list(progress["blocked_phases"]) == ["graphrag"]
    key = document["document_key"]
    assert document_rollup(queue.engine, "graphrag", [key])[key]["status"] == "blocked"
    # an operator retry unblocks it
    queue.retry_failed(document_id=str(doc["id"]))
    assert list(document_progress(queue.engine, str(doc["id"])).iloc[0]["blocked_phases"]) == []
