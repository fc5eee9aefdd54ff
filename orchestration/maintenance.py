"""Recovery and nightly reconciliation, as plain functions (the schedules' jobs and the CLI call these)."""
from __future__ import annotations

import re

import dagster as dg

from orchestration.verify import verify_stores
from queue_db.config import DagsterConfig, default
from queue_db.inspection import holding_workers
from queue_db.lifecycle import apply_reindex_requests
from queue_db.phases import GRAPHRAG_CHUNK, VECTOR_CHUNK
from queue_db.queue import TaskQueue
from resources.embeddings import MODELS
from resources.ports import VectorStoreError

_RUN_ID = re.compile(r"^run:([0-9a-f-]{36}):")
FINISHED = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


def recover(queue: TaskQueue, stale_after_s: float | None = None) -> dict:
    """Release stale tasks, then re-index the chunks whose re-index waited for their running task."""
    released = queue.recover_stale(stale_after_s)
    return {"released": released, "released_total": sum(released.values()),
            "reindexed_after_running": apply_reindex_requests(queue)}


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


def nightly(queue: TaskQueue, instance: dg.DagsterInstance | None, vector_store=None, graph_store=None, *,
            page_size: int = default(DagsterConfig, "verify_page")) -> dict:
    """Reconcile parents, release tasks of dead runs, verify the stores (DOCQUEUE_VERIFY_PAGE ids at a time) and
    re-queue what is missing."""
    corrections = queue.reconcile()
    dead = dead_run_workers(queue, instance) if instance is not None else []
    released = queue.release_workers(dead, "worker lost: its Dagster run is no longer alive") if dead else {}
    report = verify_stores(queue, vector_store, graph_store, page_size)
    requeued_vector = queue.requeue(VECTOR_CHUNK, report.chunks_without_point,
                                    "repair: completed chunk had no Qdrant point") if report.chunks_without_point else 0
    requeued_graph = queue.requeue(GRAPHRAG_CHUNK, report.chunks_without_graph,
                                   "repair: completed chunk had no graph writes") if report.chunks_without_graph else 0
    if report.points_without_chunk and vector_store is not None:
        vector_store.delete_chunks(report.points_without_chunk)
    # embedded shards build their HNSW indexes here, off the write path of the runs
    indexed = vector_store.optimize() if vector_store is not None else False
    return {
        "parents_corrected": len(corrections),
        "corrections": [f"{c.level} {c.id} {c.phase}: {c.old} -> {c.new}" for c in corrections[:50]],
        "dead_run_workers": len(dead), "tasks_released": sum(released.values()) if released else 0,
        "requeued_vector_chunks": requeued_vector, "requeued_graph_chunks": requeued_graph,
        "orphan_points_deleted": len(report.points_without_chunk), "vector_index_built": indexed,
        "verification": report.as_dict(),
    }


def index_vector_tail(qdrant, model: str, index_tail: int) -> dict:
    """Build the vector index of the points written since the last build once `index_tail`
    (DOCQUEUE_QDRANT_INDEX_TAIL) of them wait: the recovery schedule's op, and `docqueue run` after each vector run
    (it has no schedules). Only the collection's name and size are needed, so the model (DOCQUEUE_EMBEDDING_MODEL)
    is never loaded; reading the waiting count opens nothing. Returns {"waiting", "built"}."""
    spec = MODELS.get(model)
    if spec is None:
        raise VectorStoreError(f"unknown embedding model {model!r} in DOCQUEUE_EMBEDDING_MODEL; "
                               f"known: {', '.join(MODELS)}")
    store = qdrant.get_store(spec.model_id, spec.dim)
    try:
        waiting = store.unindexed()
        return {"waiting": waiting, "built": store.index_tail(index_tail)}
    finally:
        store.close()
