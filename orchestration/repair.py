"""`docqueue repair --vectors`: a damaged shard of the embedded vector store (fault-matrix row 6) set aside and
rebuilt from what the queue holds.

Each shard (the tail, then the main one) is read back in full, a page at a time; one the engine cannot read is
renamed to `<shard>.damaged-<UTC time>` (kept, never deleted) and a fresh, empty shard of today's shape takes its
place. Then the completed chunks without a point, and only those, go back to pending through the queue's requeue
path, a page of chunk ids at a time in primary-key order, so the next `docqueue run` embeds them again from their
stored text: the healthy shard's points, OCR and chunking stay as they are, and GraphRAG re-runs on those chunks
alone (the queue requeues a chunk's later phase with it), which writes the same nodes and edges again (MERGE).
Run twice, the second run finds no damaged shard and no completed chunk without a point: it changes nothing.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from orchestration.verify import completed_chunk_pages
from queue_db.phases import VECTOR_CHUNK
from queue_db.queue import TaskQueue
from resources.qdrant_edge import EdgeVectorStore

REQUEUE_REASON = "repair: its point was in a damaged vector shard"


def repair_vectors(queue: TaskQueue, store: EdgeVectorStore, page_size: int) -> dict:
    """Set aside the shards that cannot be read back, then re-queue the completed chunks without a point."""
    started = time.monotonic()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    damaged = []
    for folder in store.shard_folders():
        reason = store.check_shard(folder)
        if reason is not None:
            damaged.append({"shard": str(folder), "kept_as": str(store.set_aside(folder, stamp)), "reason": reason})
    requeued = checked = 0
    for page in completed_chunk_pages(queue, "vector", page_size):
        present = store.present_chunk_ids([chunk_id for chunk_id, _ in page])
        checked += len(page)
        missing = [row for chunk_id, row in page if chunk_id not in present]
        if missing:
            requeued += queue.requeue(VECTOR_CHUNK, missing, REQUEUE_REASON)
    return {
        "damaged_shards": damaged,
        "completed_chunks_checked": checked,
        "requeued_vector_chunks": requeued,
        "seconds": round(time.monotonic() - started, 2),
    }
