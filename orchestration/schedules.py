"""Stale-task recovery every TASK_QUEUE_CHECK_INTERVAL and a nightly reconciliation; both report what they
changed as run metadata, and both skip while TASK_QUEUE_ENABLED is false. Made from the settings the code
location was built with (`maintenance_jobs`, `maintenance_schedules`)."""

from dataclasses import dataclass

import dagster as dg
from dagster import OpExecutionContext

from orchestration.cluster import MAINTENANCE_QUEUE, celery_queue_tags
from orchestration.maintenance import index_vector_tail as build_vector_tail
from orchestration.maintenance import nightly, recover
from orchestration.partitions import retire_partitions_as_configured
from queue_db.config import QueueConfig, Settings
from resources.database import DatabaseResource
from resources.embedding_resource import EmbeddingResource
from resources.graph_stores import Neo4jResource
from resources.vector_resource import QdrantResource

MAINTENANCE_POOL = "maintenance"
MAINTENANCE_TAGS = {"docqueue/phase": "maintenance"}


@dg.op(pool=MAINTENANCE_POOL, tags=celery_queue_tags(MAINTENANCE_QUEUE),
       description="Release tasks whose heartbeat went stale (counting the attempt) and bubble up.")
def recover_stale_tasks(context: OpExecutionContext, database: DatabaseResource) -> dg.Output[dict]:
    result = recover(database.get_queue())
    context.log.info(f"released {result['released_total']} stale task(s): {result['released']}")
    return dg.Output(result, metadata={"released_total": result["released_total"],
                                       **{f"released_{k}": v for k, v in result["released"].items()}})


def _retire_completed_partitions(settings: Settings) -> dg.OpDefinition:
    dagster = settings.dagster

    @dg.op(name="retire_completed_partitions", pool=MAINTENANCE_POOL, tags=celery_queue_tags(MAINTENANCE_QUEUE),
           description="Retire the Dagster partitions of pages and chunks completed longer ago than "
                       "DOCQUEUE_PARTITION_RETENTION, or beyond DOCQUEUE_PARTITION_MAX_COMPLETED (one batch each).")
    def retire_completed_partitions(context: OpExecutionContext, database: DatabaseResource) -> dg.Output[dict]:
        retired = retire_partitions_as_configured(context.instance, database.get_queue().engine, dagster)
        context.log.info(f"retired partitions: {retired}")
        return dg.Output(retired, metadata={f"retired_{name}": n for name, n in retired.items()})

    return retire_completed_partitions


def _index_vector_tail(settings: Settings) -> dg.OpDefinition:
    index_tail, default_model = settings.vector.index_tail, settings.embedding.model

    @dg.op(name="index_vector_tail", pool=MAINTENANCE_POOL, tags=celery_queue_tags(MAINTENANCE_QUEUE),
           description="Build the vector index of the points written since the last build once "
                       "DOCQUEUE_QDRANT_INDEX_TAIL of them wait (the embedded store; a Qdrant server indexes by "
                       "itself).")
    def index_vector_tail(context: OpExecutionContext, embeddings: EmbeddingResource,
                          qdrant: QdrantResource) -> dg.Output[dict]:
        # the resource's own model when its field is set, else DOCQUEUE_EMBEDDING_MODEL
        result = build_vector_tail(qdrant, embeddings.model or default_model, index_tail)
        context.log.info(f"vector index: {result['waiting']} point(s) waiting, built: {result['built']}")
        return dg.Output(result, metadata=result)

    return index_vector_tail


def _reconcile_and_verify(settings: Settings) -> dg.OpDefinition:
    page_size = settings.dagster.verify_page

    @dg.op(name="reconcile_and_verify", pool=MAINTENANCE_POOL, tags=celery_queue_tags(MAINTENANCE_QUEUE),
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
            result = nightly(queue, context.instance, store, graph, page_size=page_size)
        finally:
            store.close()
            graph.close()
        context.log.info(f"nightly reconciliation: {result}")
        verification = result.pop("verification")
        return dg.Output({**result, "verification": verification}, metadata={
            **{k: v for k, v in result.items() if isinstance(v, int)},
            "corrections": dg.MetadataValue.json(result["corrections"]),
            "verification": dg.MetadataValue.json(verification)})

    return reconcile_and_verify


@dataclass(frozen=True)
class MaintenanceJobs:
    recovery: dg.JobDefinition
    reconciliation: dg.JobDefinition


def maintenance_jobs(settings: Settings) -> MaintenanceJobs:
    retire, index_tail, reconcile = (_retire_completed_partitions(settings), _index_vector_tail(settings),
                                     _reconcile_and_verify(settings))

    @dg.job(name="recovery_job", tags=MAINTENANCE_TAGS)
    def recovery_job():
        recover_stale_tasks()
        retire()
        index_tail()

    @dg.job(name="nightly_reconciliation_job", tags=MAINTENANCE_TAGS)
    def reconciliation_job():
        reconcile()

    return MaintenanceJobs(recovery_job, reconciliation_job)


def _unless_disabled(queue: QueueConfig):
    def evaluate(context: dg.ScheduleEvaluationContext) -> dg.RunRequest | dg.SkipReason:
        if not queue.enabled:
            return dg.SkipReason(QueueConfig.disabled_reason)
        return dg.RunRequest()
    return evaluate


def maintenance_schedules(settings: Settings, jobs: MaintenanceJobs,
                          checks_job) -> list[dg.ScheduleDefinition]:
    unless_disabled = _unless_disabled(settings.queue)
    return [
        dg.ScheduleDefinition(
            name="stale_task_recovery", job=jobs.recovery, cron_schedule=settings.queue.recovery_cron(),
            execution_fn=unless_disabled, default_status=dg.DefaultScheduleStatus.RUNNING,
            description="Release stale heartbeats; bubble up what changed (every TASK_QUEUE_CHECK_INTERVAL)."),
        dg.ScheduleDefinition(
            name="nightly_reconciliation", job=jobs.reconciliation, cron_schedule=settings.dagster.nightly_cron,
            execution_fn=unless_disabled, default_status=dg.DefaultScheduleStatus.RUNNING,
            description="Reconcile parents, verify stores, repair."),
        dg.ScheduleDefinition(
            name="asset_checks", job=checks_job, cron_schedule=settings.dagster.checks_cron,
            execution_fn=unless_disabled, default_status=dg.DefaultScheduleStatus.RUNNING,
            description="Evaluate every asset check, after the nightly reconciliation has repaired what it could."),
    ]
