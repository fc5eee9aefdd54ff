"""Recovery and nightly reconciliation, as plain functions (the maintenance jobs, the recovery sensor and the CLI
call these)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import dagster as dg

from orchestration.verify import verify_stores
from queue_db.config import default
from queue_db.inspection import holding_workers, stale_counts
from queue_db.lifecycle import apply_reindex_requests, reindex_due
from queue_db.partition_retention import RETIRABLE_LEVELS, retirement_due
from queue_db.phases import GRAPHRAG_CHUNK, VECTOR_CHUNK
from queue_db.queue import TaskQueue
from queue_db.service_config import DagsterConfig
from resources.embeddings import MODELS
from resources.ports import VectorStoreError

_RUN_ID = re.compile(r"^run:([0-9a-f-]{36}):")
FINISHED = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


def recover(queue: TaskQueue, stale_after_s: float | None = None) -> dict:
    """Release stale tasks, then re-index the chunks whose re-index waited for their running task."""
    released = queue.recover_stale(stale_after_s)
    return {
        "released": released,
        "released_total": sum(released.values()),
        "reindexed_after_running": apply_reindex_requests(queue),
    }


def dead_run_workers(queue: TaskQueue, instance: dg.DagsterInstance) -> list[str]:
    """Worker ids of `processing` tasks whose Dagster run has finished (or no longer exists)."""
    dead = []
    for worker in sorted(holding_workers(queue.engine)):
        match = _RUN_ID.match(worker)
        if not match:
            continue  # not a Dagster run's worker: only its heartbeat can tell
        run = instance.get_run_by_id(match.group(1))
        if run is None or run.status in FINISHED:
            dead.append(worker)
    return dead


def nightly(
    queue: TaskQueue,
    instance: dg.DagsterInstance | None,
    vector_store=None,
    graph_store=None,
    *,
    page_size: int = default(DagsterConfig, "verify_page"),
) -> dict:
    """Reconcile parents, release tasks of dead runs, verify the stores (DOCQUEUE_VERIFY_PAGE ids at a time) and
    re-queue what is missing."""
    corrections = queue.reconcile()
    dead = dead_run_workers(queue, instance) if instance is not None else []
    released = queue.release_workers(dead, "worker lost: its Dagster run is no longer alive") if dead else {}
    report = verify_stores(queue, vector_store, graph_store, page_size)
    requeued_vector = (
        queue.requeue(VECTOR_CHUNK, report.chunks_without_point, "repair: completed chunk had no Qdrant point")
        if report.chunks_without_point
        else 0
    )
    requeued_graph = (
        queue.requeue(GRAPHRAG_CHUNK, report.chunks_without_graph, "repair: completed chunk had no graph writes")
        if report.chunks_without_graph
        else 0
    )
    if report.points_without_chunk and vector_store is not None:
        vector_store.delete_chunks(report.points_without_chunk)
    # embedded shards build their HNSW indexes here, off the write path of the runs
    indexed = vector_store.optimize() if vector_store is not None else False
    return {
        "parents_corrected": len(corrections),
        "corrections": [f"{c.level} {c.id} {c.phase}: {c.old} -> {c.new}" for c in corrections[:50]],
        "dead_run_workers": len(dead),
        "tasks_released": sum(released.values()) if released else 0,
        "requeued_vector_chunks": requeued_vector,
        "requeued_graph_chunks": requeued_graph,
        "orphan_points_deleted": len(report.points_without_chunk),
        "vector_index_built": indexed,
        "verification": report.as_dict(),
    }


def _vector_store(qdrant, model: str):
    """The store of `model`'s collection, opened from its name and size alone: the model is never loaded."""
    spec = MODELS.get(model)
    if spec is None:
        raise VectorStoreError(
            f"unknown embedding model {model!r} in DOCQUEUE_EMBEDDING_MODEL; known: {', '.join(MODELS)}"
        )
    return qdrant.get_store(spec.model_id, spec.dim)


def vector_tail_waiting(qdrant, model: str) -> int:
    """Points written to the embedded store since its last index build (0 for a Qdrant server, which indexes by
    itself); reading the count opens no shard."""
    store = _vector_store(qdrant, model)
    try:
        return store.unindexed()
    finally:
        store.close()


def index_vector_tail(qdrant, model: str, index_tail: int) -> dict:
    """Build the vector index of the points written since the last build once `index_tail`
    (DOCQUEUE_QDRANT_INDEX_TAIL) of them wait: the recovery job's op, and `docqueue run` after each vector run
    (it has no sensors). Only the collection's name and size are needed, so the model (DOCQUEUE_EMBEDDING_MODEL)
    is never loaded; reading the waiting count opens nothing. Returns {"waiting", "built"}."""
    store = _vector_store(qdrant, model)
    try:
        waiting = store.unindexed()
        return {"waiting": waiting, "built": store.index_tail(index_tail)}
    finally:
        store.close()


def vector_tail_sentence(waiting: int, index_tail: int, built: bool = False) -> str:
    """One sentence on the embedded store's unindexed tail, for logs and skip reasons."""
    if built:
        return (
            f"embedded vector index: built the index of the {waiting} point(s) written since the last build "
            f"(DOCQUEUE_QDRANT_INDEX_TAIL={index_tail})"
        )
    if index_tail <= 0:
        return (
            f"embedded vector index: {waiting} point(s) written since the last index build; the nightly "
            "reconciliation builds it (DOCQUEUE_QDRANT_INDEX_TAIL=0)"
        )
    return (
        f"embedded vector index: {waiting} point(s) written since the last index build; the index is rebuilt at "
        f"DOCQUEUE_QDRANT_INDEX_TAIL={index_tail} points"
    )


@dataclass(frozen=True)
class RecoveryCheck:
    """What the recovery sensor found, each read bounded whatever the corpus holds: stale heartbeats (the oldest
    entries of each kind's partial heartbeat index), a settled re-index request (the first one), partitions due for
    retirement (retention's own cut-off), the embedded vector index's tail (a count kept in a file)."""

    stale_timeout_s: float
    stale: dict[str, int] = field(default_factory=dict)
    reindex_waiting: bool = False
    retirable: tuple[str, ...] = ()
    vector_waiting: int = 0
    index_tail: int = 0

    @property
    def tail_due(self) -> bool:
        return 0 < self.index_tail <= self.vector_waiting

    def due(self) -> list[str]:
        """Why a recovery run is needed; empty when it would find nothing to do."""
        reasons = []
        stale = {kind: n for kind, n in self.stale.items() if n}
        if stale:
            reasons.append(
                f"heartbeat stale (older than STALE_TASK_TIMEOUT={self.stale_timeout_s:g} s): "
                + ", ".join(f"{n} {kind}" for kind, n in stale.items())
            )
        if self.reindex_waiting:
            reasons.append("a re-index request waits for chunks whose tasks have settled")
        if self.retirable:
            reasons.append(f"completed partitions due for retirement: {', '.join(self.retirable)}")
        if self.tail_due:
            reasons.append(vector_tail_sentence(self.vector_waiting, self.index_tail))
        return reasons

    def nothing_due(self) -> str:
        """The sentence of a check that found nothing: what was looked at."""
        return (
            f"nothing to recover: no held task's heartbeat is older than STALE_TASK_TIMEOUT="
            f"{self.stale_timeout_s:g} s ({len(self.stale)} task kinds), no re-index request waits, no completed "
            f"partition is due for retirement; {vector_tail_sentence(self.vector_waiting, self.index_tail)}"
        )


def recovery_check(
    queue: TaskQueue, dagster: DagsterConfig, vector_waiting: int = 0, index_tail: int = 0
) -> RecoveryCheck:
    """Whether the recovery job has something to do (the recovery sensor's tick; `vector_waiting` is the embedded
    store's unindexed count, see `vector_tail_waiting`)."""
    stale_s = queue.settings.stale_timeout_s
    with queue.engine.connect() as conn:
        stale = stale_counts(conn, stale_s, tuple(queue.phases.kinds))
    retirable = tuple(
        f"{level.value}s"
        for level in RETIRABLE_LEVELS
        if retirement_due(
            queue.engine, level, dagster.partition_retention_s, dagster.partition_max_completed, queue.phases
        )
    )
    return RecoveryCheck(stale_s, stale, reindex_due(queue), retirable, vector_waiting, index_tail)
