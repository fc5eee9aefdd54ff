"""Dagster's dynamic partitions of the queue: one definition per level, registering the keys of new rows and
retiring those of completed pages and chunks.

Registering: keys are registered in blocks under a PostgreSQL advisory lock, one `add_dynamic_partitions` call per
block with keys in (document, page, chunk) order; each row records its block and position. Positions that are
consecutive within a block are therefore adjacent in Dagster's own key order, which is what makes a run over
positions [a, b] exactly the Dagster partition range [key(a), key(b)].

Retiring: Dagster resolves a ranged run's keys by loading every key of its dynamic partitions definition
(`get_partition_keys_in_range` calls `get_partition_keys()`), so a run's fixed cost, and the UI's partition
pages, grow with the partitions ever registered. Retiring completed ones keeps the live set near
DOCQUEUE_PARTITION_MAX_COMPLETED plus the unfinished work. The recovery job calls `retire_partitions` every run,
a batch of DOCQUEUE_PARTITION_RETIRE_BATCH per definition, so a backlog drains within minutes and a run stays
short. Which rows are retirable, and how a requeued one comes back, is queue_db.partition_retention's rule.
"""

from __future__ import annotations

import zlib

import dagster as dg
import sqlalchemy as sa

from orchestration.dagster_pooled_storage import delete_dynamic_partitions
from queue_db.partition_keys import record_block, unregistered
from queue_db.partition_retention import RETIRABLE_LEVELS, retire_batch
from queue_db.phases import Level
from queue_db.service_config import DagsterConfig

documents_partitions = dg.DynamicPartitionsDefinition(name="documents")
pages_partitions = dg.DynamicPartitionsDefinition(name="pages")
chunks_partitions = dg.DynamicPartitionsDefinition(name="chunks")

PARTITIONS_BY_LEVEL = {
    Level.DOCUMENT: documents_partitions,
    Level.PAGE: pages_partitions,
    Level.CHUNK: chunks_partitions,
}
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


def retire_partitions(
    instance: dg.DagsterInstance, engine: sa.Engine, *, retention_s: float, max_completed: int, batch: int
) -> dict[str, int]:
    """Retire one batch of completed partitions per definition (pages, chunks); returns how many each."""
    retired = {}
    for level in RETIRABLE_LEVELS:
        name = PARTITIONS_BY_LEVEL[level].name
        retired[name] = retire_batch(
            engine,
            level,
            retention_s,
            max_completed,
            batch,
            lambda keys, name=name: delete_dynamic_partitions(instance, name, keys),
        )
    return retired


def retire_partitions_as_configured(
    instance: dg.DagsterInstance, engine: sa.Engine, dagster: DagsterConfig
) -> dict[str, int]:
    """`retire_partitions` with DOCQUEUE_PARTITION_RETENTION, _MAX_COMPLETED and _RETIRE_BATCH."""
    return retire_partitions(
        instance,
        engine,
        retention_s=dagster.partition_retention_s,
        max_completed=dagster.partition_max_completed,
        batch=dagster.partition_retire_batch,
    )
