"""The queue's side of embedding identical chunk text once: which chunk already holds a vector for a text, and how
many vectors were copied since a moment. Both read through the partial indexes of migration 0021, so their cost
follows the batch (or the reused vectors), never the number of chunks."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    import sqlalchemy as sa


def embedded_chunks_by_hash(engine: sa.Engine, content_hashes: Iterable[str]) -> dict[str, str]:
    """content hash -> chunk_id of one chunk of that text whose vector phase completed (one index probe per hash).
    Which model embedded it is the vector store's to say: each model has its own collection."""
    hashes = sorted({h for h in content_hashes if h})
    if not hashes:
        return {}
    with engine.begin() as conn:
        # the probe must stay on idx_tqc_embedded_by_hash: where a few texts repeat across many chunks, the planner
        # expects a hash to match thousands of rows and answers the LIMIT 1 with a sequential scan per hash that
        # finds none (64 scans of the chunk table a batch: 9-10 s at a million chunks)
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        rows = conn.exec_driver_sql(
            """SELECT h.hash, c.chunk_id
               FROM unnest(%(hashes)s::text[]) AS h(hash)
               CROSS JOIN LATERAL (SELECT t.chunk_id FROM task_queue_chunk t
                                   WHERE t.chunk_content_hash = h.hash AND t.vector_status = 'completed'
                                   LIMIT 1) c""",
            {"hashes": hashes},
        ).all()
    return {h: chunk_id for h, chunk_id in rows}


def vectors_reused_since(engine: sa.Engine, since: datetime) -> int:
    """Chunks whose vector was copied from an identical chunk and completed at or after `since`."""
    with engine.connect() as conn:
        return int(
            conn.exec_driver_sql(
                """SELECT count(*) FROM task_queue_chunk
               WHERE vector_reused_from IS NOT NULL AND vector_completed_at >= %(since)s""",
                {"since": since},
            ).scalar_one()
        )
