"""Partition retention: the Dagster partitions of completed pages and chunks leave after a retention period.

Dagster resolves a ranged run's keys by loading every key of its dynamic partitions definition
(`get_partition_keys_in_range` calls `get_partition_keys()`), so a run's fixed cost, and the UI's partition
pages, grow with the partitions ever registered. Retiring completed ones keeps the live set near
DOCQUEUE_PARTITION_MAX_COMPLETED plus the unfinished work. The recovery job calls `retire_partitions` every run,
a batch of DOCQUEUE_PARTITION_RETIRE_BATCH per definition, so a backlog drains within minutes and a run stays
short. Which rows are retirable, and how a requeued one comes back, is queue_db.partition_retention's rule.
"""
from __future__ import annotations

import dagster as dg
import sqlalchemy as sa

from orchestration.dagster_pooled_storage import delete_dynamic_partitions
from orchestration.partitions import PARTITIONS_BY_LEVEL
from queue_db.config import DagsterConfig, settings
from queue_db.partition_retention import RETIRABLE_LEVELS, retire_batch


def retire_partitions(instance: dg.DagsterInstance, engine: sa.Engine, *, retention_s: float | None = None,
                      max_completed: int | None = None, batch: int | None = None) -> dict[str, int]:
    """Retire one batch of completed partitions per definition (pages, chunks); returns how many each."""
    config = settings(DagsterConfig)
    retention_s = config.partition_retention_s if retention_s is None else retention_s
    max_completed = config.partition_max_completed if max_completed is None else max_completed
    batch = config.partition_retire_batch if batch is None else batch
    retired = {}
    for level in RETIRABLE_LEVELS:
        name = PARTITIONS_BY_LEVEL[level].name
        retired[name] = retire_batch(engine, level, retention_s, max_completed, batch,
                                     lambda keys, name=name: delete_dynamic_partitions(instance, name, keys))
    return retired
