"""Every transition of the queue against a real PostgreSQL."""

from __future__ import annotations

import time

import pytest

from processing.chunking import chunk_markdown
from queue_db.config import QueueSettings
from queue_db.keys import page_partition_key
from queue_db.phases import GRAPHRAG_CHUNK, OCR_DOCUMENT, OCR_PAGE, VECTOR_CHUNK, VECTOR_PAGE, Phase
from queue_db.queue import TaskQueue, make_worker_id
from queue_db.readmodels import document_progress, documents_ready, queue_statistics
from tests.queue_support import build_document, bulk_seed, chunk_all, expand, new_hash, ocr_all, register


def statuses(queue, doc_id):
    doc = queue.document(str(doc_id))
    return doc["ocr_status"], doc["vector_index_status"], doc["graphrag_index_status"]


def test_register_is_idempotent_on_content_hash(queue):
    digest = new_hash("same bytes")
    first, created = queue.register_document(filename="A Report, final.pdf", content_hash=digest, size_bytes=10)
    again, created_again = queue.register_document(filename="copy.pdf", content_hash=digest, size_bytes=10)
    assert created and not created_again
    assert again["id"] == first["id"]
    assert first["document_key"] == f"a-report-final-{digest[:8]}"
    assert "," not in first["document_key"] and "/" not in first["document_key"]


def test_full_lifecycle_bubbles_every_phase_to_completed(queue):
    doc = register(queue)
    assert statuses(queue, doc["id"]) == ("pending", "pending", "pending")
    worker = make_worker_id()
    claimed = queue.claim(OCR_DOCUMENT, worker, 5)
    assert [c["id"] for c in claimed] == [str(doc["id"])]
    assert statuses(queue, doc["id"])[0] == "processing"
    assert queue.complete_document_expansion(worker, doc["id"], page_count=2)
    assert statuses(queue, doc["id"]) == ("pending", "pending", "pending")

    page_tasks = queue.claim(OCR_PAGE, worker, 1)
    assert statuses(queue, doc["id"])[0] == "processing"  # rule 1: any child processing
    queue.complete(OCR_PAGE, worker, [page_tasks[0]["id"]])
    assert statuses(queue, doc["id"])[0] == "pending"  # rule 2: one page still pending
    queue.complete(OCR_PAGE, worker, [t["id"] for t in queue.claim(OCR_PAGE, worker, 5)])
    assert statuses(queue, doc["id"]) == ("completed", "pending", "pending")
    assert queue.document(str(doc["id"]))["ocr_completed_at"] is not None

    for page in queue.claim(VECTOR_PAGE, worker, 5):
        queue.complete_chunking(
            worker,
            page["id"],
            [{"chunk_index": i, "content_hash": new_hash(), "content": "x", "token_count": 1} for i in range(2)],
        )
    assert queue.claim(GRAPHRAG_CHUNK, worker, 10) == []  # gated: vector not done
    chunks = queue.claim(VECTOR_CHUNK, worker, 10)
    assert len(chunks) == 4
    assert statuses(queue, doc["id"]) == ("completed", "processing", "pending")
    queue.complete(VECTOR_CHUNK, worker, [{"id": c["id"], "vector_seconds": 0.01} for c in chunks])
    assert statuses(queue, doc["id"]) == ("completed", "completed", "pending")
    chunks = queue.claim(GRAPHRAG_CHUNK, worker, 10)
    result = queue.complete(
        GRAPHRAG_CHUNK, worker, [{"id": c["id"], "entities_extracted": 3, "relationships_extracted": 1} for c in chunks]
    )
    assert len(result.applied) == 4 and result.rejected == []
    assert statuses(queue, doc["id"]) == ("completed", "completed", "completed")
    assert all(c["entities_extracted"] == 3 for c in queue.chunks(document_id=doc["id"]))
    assert all(
        p["vector_status"] == "completed" and p["graphrag_status"] == "completed" for p in queue.pages(doc["id"])
    )


def test_vector_page_task_waits_for_ocr_of_that_page(queue):
    doc = register(queue)
    expand(queue, doc, 2)
    worker = make_worker_id()
    assert queue.claim(VECTOR_PAGE, worker, 5) == []
    first = queue.claim(OCR_PAGE, worker, 1)
    queue.complete(OCR_PAGE, worker, [first[0]["id"]])
    ready = queue.claim(VECTOR_PAGE, worker, 5)
    assert [r["id"] for r in ready] == [first[0]["id"]]


def test_vector_chunk_is_gated_on_its_page_ocr(queue, engine):
    doc = build_document(queue, pages=1, chunks_per_page=2)
    # an operator re-opened the page's OCR: its chunks must not be claimable until OCR completes again
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE task_queue_page SET ocr_status = 'pending' WHERE document_id = %(d)s", {"d": str(doc["id"])}
        )
    assert queue.claim(VECTOR_CHUNK, make_worker_id(), 10) == []


def test_blank_page_with_zero_chunks_is_complete_in_later_phases(queue):
    doc = register(queue)
    expand(queue, doc, 1)
    ocr_all(queue, doc)
    chunk_all(queue, doc, 0)
    page = queue.pages(doc["id"])[0]
    assert (page["vector_status"], page["graphrag_status"], page["chunk_count"]) == ("completed", "completed", 0)
    assert statuses(queue, doc["id"]) == ("completed", "completed", "completed")


def test_chunk_ids_are_derived_by_the_queue_and_a_foreign_one_is_refused(queue):
    """Chunk ids are unique by construction (migration 0011 dropped the unique index that re-checked them): the
    queue derives each from document key, page number, chunk index and content hash, the same way the chunker
    does, and refuses a chunk that brings another id without storing anything of the page's chunks."""
    doc = register(queue)
    expand(queue, doc, 2)
    ocr_all(queue, doc)
    worker = make_worker_id()
    first, second = sorted(queue.claim(VECTOR_PAGE, worker, 2), key=lambda p: p["page_number"])
    page_key = page_partition_key(doc["document_key"], first["page_number"])
    from_chunker = chunk_markdown(
        "# Title\n\nOne paragraph of text.\n\nAnother paragraph.",
        page_key=page_key,
        target_tokens=8,
        overlap_tokens=0,
        max_tokens=16,
    )
    assert len(from_chunker) >= 2
    assert queue.complete_chunking(
        worker,
        first["id"],
        [
            {
                "chunk_id": c.chunk_id,
                "chunk_index": c.index,
                "content_hash": c.content_hash,
                "content": c.text,
                "token_count": c.token_count,
            }
            for c in from_chunker
        ],
    )
    stored = {c["chunk_index"]: c["chunk_id"] for c in queue.chunks(page_id=first["id"])}
    assert stored == {c.index: c.chunk_id for c in from_chunker}

    same_content = [
        {"chunk_index": c.index, "content_hash": c.content_hash, "content": c.text, "token_count": 1}
        for c in from_chunker
    ]
    with pytest.raises(ValueError, match="derived id"):
        queue.complete_chunking(worker, second["id"], [{**same_content[0], "chunk_id": from_chunker[0].chunk_id}])
    assert queue.chunks(page_id=second["id"]) == []
    assert queue.complete_chunking(worker, second["id"], same_content)  # the failed call left the claim intact
    ids = [c["chunk_id"] for c in queue.chunks()]
    assert len(ids) == len(set(ids)) == 2 * len(from_chunker), "same content on another page: other ids"


def test_document_with_zero_pages_fails_with_reason_and_is_not_retried(queue):
    doc = register(queue)
    expand(queue, doc, 0)
    row = queue.document(str(doc["id"]))
    assert row["ocr_status"] == "failed"
    assert row["ocr_error"] == "empty: document has no pages"
    assert queue.claim(OCR_DOCUMENT, make_worker_id(), 5) == []
    assert queue.reconcile() == []  # reconcile must not turn "no children" into completed


def test_completion_is_fenced_by_ownership(queue):
    build_document(queue, pages=1, chunks_per_page=2)
    owner, intruder = make_worker_id("owner"), make_worker_id("intruder")
    claimed = queue.claim(VECTOR_CHUNK, owner, 2)
    result = queue.complete(VECTOR_CHUNK, intruder, [c["id"] for c in claimed])
    assert result.applied == [] and sorted(result.rejected) == sorted(c["id"] for c in claimed)
    failed = queue.fail(VECTOR_CHUNK, intruder, [{"id": claimed[0]["id"], "error": "nope"}])
    assert failed.applied == []
    assert all(c["vector_status"] == "processing" for c in queue.chunks())


def test_failure_retries_after_backoff_then_stays_failed(engine):
    queue = TaskQueue(engine, QueueSettings(max_retries=2, retry_backoff_base_s=0.6, retry_backoff_max_s=5))
    build_document(queue, pages=1, chunks_per_page=1)
    worker = make_worker_id()
    task = queue.claim(VECTOR_CHUNK, worker, 1)[0]
    queue.fail(
        VECTOR_CHUNK, worker, [{"id": task["id"], "error": "qdrant: connection refused", "error_class": "connection"}]
    )
    chunk = queue.chunks()[0]
    assert (chunk["vector_status"], chunk["vector_retry_count"], chunk["vector_error_class"]) == (
        "failed",
        1,
        "connection",
    )
    assert queue.claim(VECTOR_CHUNK, worker, 1) == []  # back-off not elapsed
    time.sleep(0.7)
    again = queue.claim(VECTOR_CHUNK, worker, 1)
    assert [a["id"] for a in again] == [task["id"]]
    queue.fail(VECTOR_CHUNK, worker, [{"id": task["id"], "error": "still down"}])
    time.sleep(1.3)
    assert queue.claim(VECTOR_CHUNK, worker, 1) == []  # 2 of 2 attempts used
    chunk = queue.chunks()[0]
    assert (chunk["vector_status"], chunk["vector_retry_count"], chunk["vector_error"]) == ("failed", 2, "still down")
    assert queue.document(str(chunk["document_id"]))["vector_index_status"] == "failed"
    assert queue.document(str(chunk["document_id"]))["vector_error"] == "page 1: chunk 0: still down"


def test_non_retryable_failure_is_never_claimed_again(queue):
    doc = register(queue)
    worker = make_worker_id()
    queue.claim(OCR_DOCUMENT, worker, 1)
    queue.fail(
        OCR_DOCUMENT,
        worker,
        [{"id": doc["id"], "error": "encrypted: password required", "error_class": "encrypted", "retryable": False}],
    )
    row = queue.document(str(doc["id"]))
    assert (row["ocr_status"], row["retry_count"], row["ocr_error"]) == ("failed", 1, "encrypted: password required")
    assert queue.claim(OCR_DOCUMENT, worker, 1) == []
    # an operator's retry resets it
    assert queue.retry_failed(Phase.OCR, str(doc["id"]))["ocr_document"] == 1
    assert [c["id"] for c in queue.claim(OCR_DOCUMENT, worker, 1)] == [str(doc["id"])]


def test_manual_backfill_overrides_the_retry_limit(queue):
    build_document(queue, pages=1, chunks_per_page=1)
    worker = make_worker_id()
    for _ in range(3):
        task = queue.claim(VECTOR_CHUNK, worker, 1, override_retry_limit=True)[0]
        queue.fail(VECTOR_CHUNK, worker, [{"id": task["id"], "error": "boom"}])
    assert queue.claim(VECTOR_CHUNK, worker, 1) == []
    again = queue.claim(VECTOR_CHUNK, worker, 1, only_ids=[task["id"]], override_retry_limit=True)
    assert [a["id"] for a in again] == [task["id"]]


def test_claim_order_priority_then_failed_first_then_fewest_retries_then_oldest(queue):
    register(queue, "low-old.pdf", priority=0)
    register(queue, "low-new.pdf", priority=0)
    register(queue, "high.pdf", priority=7)
    retried = register(queue, "retried.pdf", priority=0)
    worker = make_worker_id()
    queue.claim(OCR_DOCUMENT, worker, 1, only_ids=[retried["id"]])
    queue.fail(OCR_DOCUMENT, worker, [{"id": retried["id"], "error": "transient"}])
    order = [c["filename"] for c in (queue.claim(OCR_DOCUMENT, worker, 1) for _ in range(4)) for c in c]
    assert order == ["high.pdf", "retried.pdf", "low-old.pdf", "low-new.pdf"]


def test_priority_is_carried_to_pages_and_chunks(queue):
    build_document(queue, pages=1, chunks_per_page=2, name="normal.pdf", priority=0)
    urgent = build_document(queue, pages=1, chunks_per_page=2, name="urgent.pdf", priority=9)
    first = queue.claim(VECTOR_CHUNK, make_worker_id(), 2)
    assert {c["document_id"] for c in first} == {str(urgent["id"])}


def test_stale_tasks_are_released_and_the_attempt_is_counted(queue, engine):
    build_document(queue, pages=1, chunks_per_page=1)
    worker = make_worker_id("dies")
    assert queue.claim(VECTOR_CHUNK, worker, 1), "the one chunk task is claimed"
    assert queue.recover_stale(stale_after_s=60)["vector_chunk"] == 0
    with engine.begin() as conn:  # the worker died 5 minutes ago
        conn.exec_driver_sql("UPDATE task_queue_chunk SET vector_last_heartbeat = now() - interval '5 minutes'")
    assert queue.recover_stale(stale_after_s=60)["vector_chunk"] == 1
    chunk = queue.chunks()[0]
    assert (chunk["vector_status"], chunk["vector_retry_count"], chunk["vector_worker_id"]) == ("pending", 1, None)
    assert chunk["vector_error"].startswith("worker lost: heartbeat stale since ")
    assert queue.document(str(chunk["document_id"]))["vector_index_status"] == "pending"
    # a task that keeps killing its worker ends failed instead of looping forever
    for _ in range(2):
        queue.claim(VECTOR_CHUNK, make_worker_id("dies"), 1)
        with engine.begin() as conn:
            conn.exec_driver_sql("UPDATE task_queue_chunk SET vector_last_heartbeat = now() - interval '5 minutes'")
        queue.recover_stale(stale_after_s=60)
    chunk = queue.chunks()[0]
    assert (chunk["vector_status"], chunk["vector_retry_count"], chunk["vector_error_class"]) == (
        "failed",
        3,
        "worker_lost",
    )
    assert queue.claim(VECTOR_CHUNK, worker, 1) == []


def test_heartbeat_keeps_a_slow_task_and_reports_lost_ones(queue, engine):
    build_document(queue, pages=1, chunks_per_page=2)
    worker = make_worker_id()
    tasks = queue.claim(VECTOR_CHUNK, worker, 2)
    time.sleep(1.2)
    assert queue.heartbeat(VECTOR_CHUNK, worker, [t["id"] for t in tasks]) == {t["id"] for t in tasks}
    assert queue.recover_stale(stale_after_s=1.0)["vector_chunk"] == 0
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE task_queue_chunk SET vector_last_heartbeat = now() - interval '1 hour' WHERE id = %(i)s",
            {"i": tasks[0]["id"]},
        )
    assert queue.recover_stale(stale_after_s=1.0)["vector_chunk"] == 1
    assert queue.heartbeat(VECTOR_CHUNK, worker, [t["id"] for t in tasks]) == {tasks[1]["id"]}


def test_late_finisher_after_recovery_cannot_overwrite_the_new_owner(queue, engine):
    build_document(queue, pages=1, chunks_per_page=1)
    worker_a, worker_b = make_worker_id("a"), make_worker_id("b")
    task = queue.claim(GRAPHRAG_CHUNK, worker_a, 1) or None
    assert task is None  # vector first
    vec = queue.claim(VECTOR_CHUNK, worker_a, 1)[0]
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE task_queue_chunk SET vector_last_heartbeat = now() - interval '1 hour'")
    queue.recover_stale(stale_after_s=60)
    assert [t["id"] for t in queue.claim(VECTOR_CHUNK, worker_b, 1)] == [vec["id"]]
    late = queue.complete(VECTOR_CHUNK, worker_a, [{"id": vec["id"], "vector_seconds": 99.0}])
    assert late.applied == [] and late.rejected == [vec["id"]]
    late_fail = queue.fail(VECTOR_CHUNK, worker_a, [{"id": vec["id"], "error": "late"}])
    assert late_fail.applied == []
    assert queue.chunks()[0]["vector_worker_id"] == worker_b
    done = queue.complete(VECTOR_CHUNK, worker_b, [{"id": vec["id"], "vector_seconds": 1.5}])
    assert done.applied == [vec["id"]]
    chunk = queue.chunks()[0]
    assert (chunk["vector_status"], chunk["vector_seconds"]) == ("completed", 1.5)


def test_release_workers_of_dead_runs(queue):
    build_document(queue, pages=1, chunks_per_page=2)
    dead, alive = make_worker_id("dead"), make_worker_id("alive")
    queue.claim(VECTOR_CHUNK, dead, 1)
    queue.claim(VECTOR_CHUNK, alive, 1)
    released = queue.release_workers([dead])
    assert released["vector_chunk"] == 1
    states = sorted((c["vector_status"], c["vector_worker_id"] or "") for c in queue.chunks())
    assert states == [("pending", ""), ("processing", alive)]


def test_reconcile_fixes_deliberately_corrupted_parents(queue, engine):
    good = build_document(queue, pages=2, chunks_per_page=2)
    worker = make_worker_id()
    queue.complete(VECTOR_CHUNK, worker, [c["id"] for c in queue.claim(VECTOR_CHUNK, worker, 100)])
    assert statuses(queue, good["id"]) == ("completed", "completed", "pending")
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE documents SET ocr_status = 'failed', vector_index_status = 'processing'")
        conn.exec_driver_sql("UPDATE task_queue_page SET graphrag_status = 'completed' WHERE page_number = 1")
    corrections = queue.reconcile()
    fixed = {(c.level, c.phase, c.old, c.new) for c in corrections}
    assert ("document", "ocr", "failed", "completed") in fixed
    assert ("document", "vector", "processing", "completed") in fixed
    assert ("page", "graphrag", "completed", "pending") in fixed
    assert statuses(queue, good["id"]) == ("completed", "completed", "pending")
    assert queue.reconcile() == []


def test_read_models(queue, engine):
    doc = build_document(queue, pages=2, chunks_per_page=3, name="progress.pdf")
    worker = make_worker_id()
    queue.complete(VECTOR_CHUNK, worker, [c["id"] for c in queue.claim(VECTOR_CHUNK, worker, 4)])
    progress = document_progress(engine, str(doc["id"]))
    row = progress.iloc[0].to_dict()
    assert (row["total_pages"], row["ocr_completed_pages"], row["total_chunks"], row["vector_completed_chunks"]) == (
        2,
        2,
        6,
        4,
    )
    stats = queue_statistics(engine)
    counts = {(r.task_type, r.status): r.count for r in stats.itertuples()}
    assert counts[("vector_chunks", "completed")] == 4 and counts[("vector_chunks", "pending")] == 2
    assert counts[("ocr_pages", "completed")] == 2
    assert list(documents_ready(engine, Phase.VECTOR)["id"]) == [str(doc["id"])]
    assert documents_ready(engine, Phase.GRAPHRAG).empty


def test_hostile_text_is_stored_verbatim(queue):
    name = '\'; DROP TABLE documents; -- "quoted" \u00e9\u00e8 \x00nul.pdf'
    doc, _ = queue.register_document(
        filename=name, content_hash=new_hash(), size_bytes=1, filename_bytes=name.encode("utf-8", "surrogateescape")
    )
    stored = queue.document(str(doc["id"]))
    assert stored["filename"] == name.replace("\x00", "\\x00")
    assert bytes(stored["filename_bytes"]) == name.encode()
    worker = make_worker_id()
    queue.claim(OCR_DOCUMENT, worker, 1)
    queue.fail(OCR_DOCUMENT, worker, [{"id": doc["id"], "error": "bad -- '; \x00 \udcff", "retryable": False}])
    assert queue.document(str(doc["id"]))["ocr_error"].startswith("bad -- '; \\x00")


def test_priority_cascades_to_unfinished_pages_and_chunks_only(queue):
    doc = build_document(queue, pages=2, chunks_per_page=2, priority=1)
    worker = make_worker_id()
    done = queue.claim(VECTOR_CHUNK, worker, 1)
    queue.complete(VECTOR_CHUNK, worker, [c["id"] for c in done])
    queue.complete(GRAPHRAG_CHUNK, worker, [c["id"] for c in queue.claim(GRAPHRAG_CHUNK, worker, 1)])
    counts = queue.set_priority(str(doc["id"]), 8)
    assert counts == {"chunks": 3, "pages": 2, "documents": 1}
    chunks = {str(c["id"]): c["priority"] for c in queue.chunks(document_id=doc["id"])}
    assert chunks.pop(str(done[0]["id"])) == 1, "a finished chunk keeps its priority"
    assert set(chunks.values()) == {8}
    assert queue.claim(VECTOR_CHUNK, worker, 1)[0]["id"] in chunks
    with pytest.raises(ValueError, match="between 0 and 10"):
        queue.set_priority(str(doc["id"]), 11)


def test_registering_known_bytes_more_urgently_raises_the_priority(queue):
    digest = new_hash()
    first, created = queue.register_document(filename="a.pdf", content_hash=digest, size_bytes=1, priority=2)
    assert created
    again, created = queue.register_document(filename="a.pdf", content_hash=digest, size_bytes=1, priority=6)
    assert not created and again["id"] == first["id"] and again["priority"] == 6
    lower, _ = queue.register_document(filename="a.pdf", content_hash=digest, size_bytes=1, priority=1)
    assert lower["priority"] == 6 and queue.document(str(first["id"]))["priority"] == 6


def test_document_progress_pages_through_documents_in_registration_order(queue, engine):
    keys = [register(queue, f"doc-{n}.pdf")["document_key"] for n in range(5)]
    first = document_progress(engine, limit=2)
    assert list(first["document_key"]) == keys[:2]
    second = document_progress(engine, limit=2, after_key=keys[1])
    assert list(second["document_key"]) == keys[2:4]
    assert list(document_progress(engine, limit=2, after_key=keys[4])["document_key"]) == []
    with engine.connect() as conn:
        plan = "\n".join(
            r[0] for r in conn.exec_driver_sql("EXPLAIN SELECT * FROM documents ORDER BY created_at, id LIMIT 2").all()
        )
    assert "idx_documents_listing" in plan or "Seq Scan" in plan  # tiny tables may be scanned; the index exists
    with engine.connect() as conn:
        assert (
            conn.exec_driver_sql("SELECT count(*) FROM pg_indexes WHERE indexname = 'idx_documents_listing'").scalar()
            == 1
        )


def test_pages_chunked_together_are_fenced_each_and_written_in_one_transaction(queue):
    """complete_chunkings: the pages still held by the worker get their chunks and bubble up; a page another worker
    took over is refused alone; a refused chunk id (ValueError) writes nothing of the whole batch."""
    doc = register(queue)
    expand(queue, doc, 3)
    ocr_all(queue, doc)
    worker, other = make_worker_id(), make_worker_id()
    first, second, third = [
        {**p, "id": str(p["id"])} for p in sorted(queue.pages(doc["id"]), key=lambda p: p["page_number"])
    ]
    assert len(queue.claim(VECTOR_PAGE, worker, 2, only_ids=[first["id"], second["id"]])) == 2
    assert len(queue.claim(VECTOR_PAGE, other, 1, only_ids=[third["id"]])) == 1  # not the worker's

    def chunks(n: int, tag: str) -> list[dict]:
        return [
            {"chunk_index": i, "content_hash": new_hash(), "content": f"{tag} {i}", "token_count": 2} for i in range(n)
        ]

    bad = [{**chunks(1, "bad")[0], "chunk_id": "not-the-derived-id"}]
    with pytest.raises(ValueError, match="derived id"):
        queue.complete_chunkings(worker, {first["id"]: chunks(2, "a"), second["id"]: bad})
    assert queue.chunks(document_id=doc["id"]) == []

    written = {first["id"]: chunks(2, "a"), second["id"]: [], third["id"]: chunks(3, "c")}
    assert queue.complete_chunkings(worker, written) == {first["id"], second["id"]}
    by_page = {p: sorted(c["chunk_index"] for c in queue.chunks(page_id=p)) for p in written}
    assert by_page == {first["id"]: [0, 1], second["id"]: [], third["id"]: []}
    pages = {str(p["id"]): p for p in queue.pages(doc["id"])}
    assert pages[second["id"]]["vector_status"] == "completed"  # no chunks: complete at once, bubbled
    assert pages[first["id"]]["chunk_count"] == 2 and pages[third["id"]]["vector_status"] == "processing"
    assert queue.complete_chunking(other, third["id"], chunks(3, "c"))
    assert len(queue.chunks(page_id=third["id"])) == 3


def _row_pages(engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            str(r[0]): int(r[1])
            for r in conn.exec_driver_sql("SELECT id, (ctid::text::point)[0] FROM task_queue_chunk").all()
        }


def test_a_batch_claim_leaves_most_rows_on_their_page(engine, settings):
    """A claim takes neighbouring rows, so its transaction needs room for new versions of most of a page's rows at
    once; the free half of each page (migration 0035) holds them. A row moved to another page costs a logged row lock
    and the whole new row in the WAL, where an update on its page logs only what changed."""
    bulk_seed(engine, 1, 2, 50)
    before = _row_pages(engine)
    claimed = TaskQueue(engine, settings).claim(VECTOR_CHUNK, make_worker_id("pages"), 50)
    after = _row_pages(engine)
    moved = sum(before[row["id"]] != after[row["id"]] for row in claimed)
    assert len(claimed) == 50 and moved <= 15, f"{moved} of 50 claimed rows moved to another page"
