"""`docqueue repair --vectors` and `--graph`: a damaged shard of the embedded vector store (fault-matrix row 6), or
the embedded graph database's folder (row 7), set aside and rebuilt from what the queue holds.

Each shard (the tail, then the main one) is read back in full, a page at a time; one the engine cannot read is
renamed to `<shard>.damaged-<UTC time>` (kept, never deleted) and a fresh, empty shard of today's shape takes its
place. Then the completed chunks without a point, and only those, go back to pending through the queue's requeue
path, a page of chunk ids at a time in primary-key order, so the next `docqueue run` embeds them again from their
stored text: the healthy shard's points, OCR and chunking stay as they are, and GraphRAG re-runs on those chunks
alone (the queue requeues a chunk's later phase with it), which writes the same nodes and edges again (MERGE).
Run twice, the second run finds no damaged shard and no completed chunk without a point: it changes nothing.

`--graph` (fault-matrix row 7) does the same for the embedded Bolt server's database folder: one that lost or cut a
file (resources/bolt_files.py), cannot be read, or holds none of the chunks the queue says were written is renamed
to `<folder>.damaged-<UTC time>` with the server stopped, the server starts on a fresh one, and the GraphRAG step of
every completed chunk without a Chunk node goes back to pending (the vector step and its points stay as they are).
The next run writes them again; entities and relations are MERGEd on their keys, so writing a chunk twice adds
nothing. Run twice, the second finds a whole folder and no completed chunk without its node.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

from orchestration.verify import completed_chunk_pages, graph_against_queue
from queue_db.phases import GRAPHRAG_CHUNK, VECTOR_CHUNK
from queue_db.queue import TaskQueue
from resources.bolt_driver import neo4j
from resources.bolt_files import folder_damage
from resources.bolt_graph import GraphStore
from resources.bolt_server import BoltServer
from resources.qdrant_edge import EdgeVectorStore

REQUEUE_REASON = "repair: its point was in a damaged vector shard"
GRAPH_REQUEUE_REASON = "repair: its graph writes were in a damaged graph database"


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


def graph_damage(completed: int, without_node: int, short_of_mentions: int = 0) -> str | None:
    """Damage a whole-looking folder still shows: the graph holds none of the chunks the queue says were written
    (its database folder gone, the server made a fresh one), or chunks lack MENTIONS edges (an edge bucket cut
    short after a kill, which the file check cannot see: the vertices' edge lists still name the lost edges, so
    the folder is rebuilt whole rather than the chunks rewritten into it). A part of the chunks missing is work lost
    in a run, which the nightly reconciliation re-queues; all of it missing is the folder's."""
    if completed and without_node == completed:
        return f"it holds none of the {completed} chunk(s) the queue says were written"
    if short_of_mentions:
        return f"{short_of_mentions} completed chunk(s) lack entity mentions in it"
    return None


def repair_graph(queue: TaskQueue, server: BoltServer, open_graph: Callable[[], GraphStore], page_size: int) -> dict:
    """Set aside the embedded server's database folder if it is damaged (its files, or none of the written chunks
    in it, or chunks short of their mentions: graph_damage), let the server make a fresh one, then re-queue the
    GraphRAG step of the completed chunks without a Chunk node. Only that step: OCR, chunks and vector points stay
    as they are."""
    started = time.monotonic()
    folder = server.database_folder
    reason = folder_damage(folder)
    if reason is None:
        graph = open_graph()
        try:
            completed, missing, short = graph_against_queue(queue, graph.chunk_mention_pages(page_size))
            reason = graph_damage(completed, len(missing), len(short))
        except (neo4j.exceptions.ClientError, neo4j.exceptions.DatabaseError) as exc:
            if isinstance(exc, neo4j.exceptions.AuthError):  # the credentials', not the folder's
                raise
            reason = f"a read failed: {first_line(exc)}"
        finally:
            graph.close()
    kept = None
    if reason is not None:
        kept = server.set_aside(datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"))
    graph = open_graph()
    try:
        graph.ensure_schema()
        checked, missing, _ = graph_against_queue(queue, graph.chunk_mention_pages(page_size))
    finally:
        graph.close()
    requeued = 0
    for start in range(0, len(missing), page_size):
        requeued += queue.requeue(GRAPHRAG_CHUNK, missing[start : start + page_size], GRAPH_REQUEUE_REASON)
    return {
        "damaged_folder": None if kept is None else {"folder": str(folder), "kept_as": str(kept), "reason": reason},
        "completed_chunks_checked": checked,
        "requeued_graph_chunks": requeued,
        "seconds": round(time.monotonic() - started, 2),
    }


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
