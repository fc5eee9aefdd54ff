"""Re-indexing at the queue level: chunks whose task is running are counted and re-indexed once they settle, the
phase's timings start afresh, and the deadlock retry covers the whole reset."""

from __future__ import annotations

from queue_db.lifecycle import apply_reindex_requests, reset_phase
from queue_db.phases import GRAPHRAG_CHUNK, VECTOR_CHUNK, VECTOR_PAGE, Phase
from queue_db.queue import make_worker_id
from tests.queue_support import build_document


def _chunk(queue, chunk_id: str) -> dict:
    return next(c for c in queue.chunks() if str(c["id"]) == chunk_id)


def _index_everything(queue, doc) -> None:
    worker = make_worker_id("index")
    for kind in (VECTOR_CHUNK, GRAPHRAG_CHUNK):
        ids = [str(c["id"]) for c in queue.chunks(document_id=doc["id"])]
        queue.complete(kind, worker, [c["id"] for c in queue.claim(kind, worker, len(ids), only_ids=ids)])


def test_running_chunks_are_counted_and_reindexed_once_they_settle(queue):
    doc = build_document(queue, pages=1, chunks_per_page=3)
    _index_everything(queue, doc)
    first_start = queue.document(str(doc["id"]))["vector_started_at"]
    chunks = [str(c["id"]) for c in queue.chunks(document_id=doc["id"])]
    # a GraphRAG re-run is in flight on one chunk when the vector phase is re-indexed
    queue.requeue(GRAPHRAG_CHUNK, [chunks[0]], "test")
    worker = make_worker_id("graph")
    assert [c["id"] for c in queue.claim(GRAPHRAG_CHUNK, worker, 1, only_ids=[chunks[0]])] == [chunks[0]]

    counts = reset_phase(queue, Phase.VECTOR, str(doc["id"]))
    assert (counts["chunks"], counts["running"]) == (2, 1)
    for chunk_id in chunks[1:]:
        chunk = _chunk(queue, chunk_id)
        assert (chunk["vector_status"], chunk["graphrag_status"]) == ("pending", "pending")
        assert chunk["vector_started_at"] is None and chunk["vector_completed_at"] is None
    assert queue.document(str(doc["id"]))["vector_started_at"] is None, "the phase's timing starts afresh"
    assert apply_reindex_requests(queue) == 0, "still running: it waits"
    assert _chunk(queue, chunks[0])["graphrag_status"] == "processing"

    queue.complete(GRAPHRAG_CHUNK, worker, [chunks[0]])
    assert apply_reindex_requests(queue) == 1
    chunk = _chunk(queue, chunks[0])
    assert (chunk["vector_status"], chunk["graphrag_status"]) == ("pending", "pending")
    assert apply_reindex_requests(queue) == 0, "a request is applied once"
    _index_everything(queue, doc)
    document = queue.document(str(doc["id"]))
    assert (document["vector_index_status"], document["graphrag_index_status"]) == ("completed", "completed")
    assert document["vector_started_at"] > first_start


def test_a_graphrag_request_never_narrows_a_pending_vector_request(queue):
    doc = build_document(queue, pages=1, chunks_per_page=1)
    [chunk] = [str(c["id"]) for c in queue.chunks(document_id=doc["id"])]
    worker = make_worker_id("embed")
    queue.claim(VECTOR_CHUNK, worker, 1, only_ids=[chunk])
    assert reset_phase(queue, Phase.VECTOR, str(doc["id"]))["running"] == 1
    assert reset_phase(queue, Phase.GRAPHRAG, str(doc["id"]))["running"] == 1
    with queue.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT phase FROM reindex_requests").scalar() == "vector"


def test_skipped_phases_are_told_apart_from_done_ones(queue):
    from queue_db.partition_keys import document_rollup
    from queue_db.readmodels import document_progress
    from tests.queue_support import expand, ocr_all, register

    doc = register(queue, "blank-page.pdf")
    expand(queue, doc, 2)
    ocr_all(queue, doc)
    worker = make_worker_id("chunk")
    first, second = queue.claim(VECTOR_PAGE, worker, 2)
    assert queue.complete_chunking(worker, first["id"], [])  # a page with no text: nothing to embed
    assert queue.complete_chunking(
        worker, second["id"], [{"chunk_index": 0, "content_hash": "a" * 64, "content": "some words", "token_count": 2}]
    )
    progress = document_progress(queue.engine, str(doc["id"])).iloc[0]
    assert (progress["pages_without_text"], progress["extraction_skipped"]) == (1, False)

    _index_everything(queue, doc)
    reset_phase(queue, Phase.VECTOR, str(doc["id"]))
    key = queue.document(str(doc["id"]))["document_key"]
    figures = document_rollup(queue.engine, "vector", [key])[key]
    assert (figures["pages_without_text"], figures["extraction_skipped"]) == (1, True)
    assert bool(document_progress(queue.engine, str(doc["id"])).iloc[0]["extraction_skipped"])
