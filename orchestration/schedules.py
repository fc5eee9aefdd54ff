"""Stale-task recovery every TASK_QUEUE_CHECK_INTERVAL and a nightly reconciliation; both report what they
changed as run metadata, and both skip while TASK_QUEUE_ENABLED is false."""

import dagster as dg
from dagster import AssetExecutionContext, OpExecutionContext, SensorEvaluationContext

from orchestration.checks import checks_job
from queue_db.config import DagsterConfig, QueueConfig, settings
from orchestration.cluster import celery_queue_tags
from orchestration.maintenance import index_vector_tail as build_vector_tail, nightly, recover
from orchestration.retention import retire_partitions
from resources.database import DatabaseResource
from resources.embeddings import EmbeddingResource
from resources.neo4j import Neo4jResource
from resources.qdrant import QdrantResource


@dg.op(pool="maintenance", tags=celery_queue_tags("maintenance"),
       description="Release tasks whose heartbeat went stale (counting the attempt) and bubble up.")
def recover_stale_tasks(context: OpExecutionContext, database: DatabaseResource) -> dg.Output[dict]:
    result = recover(database.get_queue())
    context.log.info(f"released {result['released_total']} stale task(s): {result['released']}")
    return dg.Output(result, metadata={"released_total": result["released_total"],
                                       **{f"released_{k}": v for k, v in result["released"].items()}})


@dg.op(pool="maintenance", tags=celery_queue_tags("maintenance"),
       description="Retire the Dagster partitions of pages and chunks completed longer ago than "
                   "DOCQUEUE_PARTITION_RETENTION, or beyond DOCQUEUE_PARTITION_MAX_COMPLETED (one batch each).")
def retire_completed_partitions(context: OpExecutionContext, database: DatabaseResource) -> dg.Output[dict]:
    retired = retire_partitions(context.instance, database.get_queue().engine)
    context.log.info(f"retired partitions: {retired}")
    return dg.Output(retired, metadata={f"retired_{name}": n for name, n in retired.items()})


@dg.op(pool="maintenance", tags=celery_queue_tags("maintenance"),
       description="Build the vector index of the points written since the last build once "
                   "DOCQUEUE_QDRANT_INDEX_TAIL of them wait (the embedded store; a Qdrant server indexes by itself).")
def index_vector_tail(context: OpExecutionContext, embeddings: EmbeddingResource,
                      qdrant: QdrantResource) -> dg.Output[dict]:
    result = build_vector_tail(qdrant, embeddings.model)
    context.log.info(f"vector index: {result['waiting']} point(s) waiting, built: {result['built']}")
    return dg.Output(result, metadata=result)


@dg.op(pool="maintenance", tags=celery_queue_tags("maintenance"),
       description="Recompute every parent status, release tasks of dead runs, verify Qdrant and the graph "
                   "against the queue and re-queue what is missing.")
def reconcile_and_verify(context: OpExecutionContext, database: DatabaseResource, embeddings: EmbeddingResource,
                         qdrant: QdrantResource, neo4j: Neo4jResource) -> dg.Output[dict]:
    queue = database.get_queue()
    embedder = embeddings.get_embedder()
    store = qdrant.get_store(embedder.model_id, embedder.dim)
    graph = neo4j.get_store()
    try:
        store.ensure_collection()
        result = nightly(queue, context.instance, store, graph)
    finally:
        store.close()
        graph.close()
    context.log.info(f"nightly reconciliation: {result}")
    verification = result.pop("verification")
    return dg.Output({**result, "verification": verification}, metadata={
        **{k: v for k, v in result.items() if isinstance(v, int)},
        "corrections": dg.MetadataValue.json(result["corrections"]),
        "verification": dg.MetadataValue.json(verification)})


@dg.job(name="recovery_job", tags={"docqueue/phase": "maintenance"})
def recovery_job():
    recover_stale_tasks()
    retire_completed_partitions()
    index_vector_tail()


@dg.job(name="nightly_reconciliation_job", tags={"docqueue/phase": "maintenance"})
def reconciliation_job():
    reconcile_and_verify()


def _unless_disabled() -> dg.RunRequest | dg.SkipReason:
    if not settings(QueueConfig).enabled:
        return dg.SkipReason(QueueConfig.disabled_reason)
    return dg.RunRequest()


@dg.schedule(name="stale_task_recovery", job=recovery_job, cron_schedule=settings(QueueConfig).recovery_cron(),
             default_status=dg.DefaultScheduleStatus.RUNNING,
             description="Release stale heartbeats; bubble up what changed (every TASK_QUEUE_CHECK_INTERVAL).")
def recovery_schedule(context: dg.ScheduleEvaluationContext):
    return _unless_disabled()


@dg.schedule(name="nightly_reconciliation", job=reconciliation_job, cron_schedule=settings(DagsterConfig).nightly_cron,
             default_status=dg.DefaultScheduleStatus.RUNNING, description="Reconcile parents, verify stores, repair.")
def nightly_schedule(context: dg.ScheduleEvaluationContext):
    return _unless_disabled()


@dg.schedule(name="asset_checks", job=checks_job, cron_schedule=settings(DagsterConfig).checks_cron,
             default_status=dg.DefaultScheduleStatus.RUNNING,
             description="Evaluate every asset check, after the nightly reconciliation has repaired what it could.")
def checks_schedule(context: dg.ScheduleEvaluationContext):
    return _unless_disabled()

all_schedules = [recovery_schedule, nightly_schedule, checks_schedule]
maintenance_jobs = [recovery_job, reconciliation_job, checks_job]
