"""The three dynamic partition definitions, and the one place partition keys are registered.

Keys are registered in blocks under a PostgreSQL advisory lock, one `add_dynamic_partitions` call per block with
keys in (document, page, chunk) order; each row records its block and position. Positions that are consecutive
within a block are therefore adjacent in Dagster's own key order, which is what makes a run over
positions [a, b] exactly the Dagster partition range [key(a), key(b)].
"""
from __future__ import annotations

import zlib

import dagster as dg
import sqlalchemy as sa

from queue_db.partition_keys import record_block, unregistered
from queue_db.phases import Level

documents_partitions = dg.DynamicPartitionsDefinition(name="documents")
pages_partitions = dg.DynamicPartitionsDefinition(name="pages")
chunks_partitions = dg.DynamicPartitionsDefinition(name="chunks")

PARTITIONS_BY_LEVEL = {Level.DOCUMENT: documents_partitions, Level.PAGE: pages_partitions,
                       Level.CHUNK: chunks_partitions}
BLOCK_SIZE = 10_000


def register_partitions(instance: dg.DagsterInstance, engine: sa.Engine, level: Level) -> int:
    """Register every queue row of `level` that has no partition yet. Returns how many keys were registered."""
    registered = 0
    lock_key = zlib.crc32(f"docqueue-partitions-{level.value}".encode())
    with engine.connect() as lock_conn:
        lock_conn.exec_driver_sql("SELECT pg_advisory_lock(%(k)s)", {"k": lock_key})
        try:
            while True:
                rows = unregistered(engine, level, BLOCK_SIZE)
                if not rows:
                    break
                instance.add_dynamic_partitions(PARTITIONS_BY_LEVEL[level].name, [r["key"] for r in rows])
                record_block(engine, level, [r["id"] for r in rows])
                registered += len(rows)
                if len(rows) < BLOCK_SIZE:
                    break
        finally:
            lock_conn.exec_driver_sql("SELECT pg_advisory_unlock(%(k)s)", {"k": lock_key})
            lock_conn.commit()
    return registered
