"""Recovery every minute and a nightly reconciliation; both report what they changed as run metadata."""

import os

import dagster as dg
from dagster import AssetExecutionContext, OpExecutionContext, SensorEvaluationContext

from orchestration.cluster import celery_queue_tags
from orchestration.maintenance import nightly, recover
from resources.database import DatabaseResource
from resources.embeddings import EmbeddingResource
from resources.neo4j import Neo4jResource
from resources.qdrant import QdrantResource


@dg.op(tags=celery_queue_tags("maintenance"), description="Release tasks whose heartbeat went stale (counting the attempt) and bubble up.")
def recover_stale_tasks(context: OpExecutionContext, database: DatabaseResource) -> dg.Output[dict]:
    result = recover(database.get_queue())
    context.log.info(f"released {result['released_total']} stale task(s): {result['released']}")
    return dg.Output(result, metadata={"released_total": result["released_total"],
                                       **{f"released_{k}": v for k, v in result["released"].items()}})


@dg.op(tags=celery_queue_tags("maintenance"), description="Recompute every parent status, release tasks of dead runs, verify Qdrant and the graph "
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


@dg.job(name="nightly_reconciliation_job", tags={"docqueue/phase": "maintenance"})
def reconciliation_job():
    reconcile_and_verify()

recovery_schedule = dg.ScheduleDefinition(
    name="recovery_every_minute", job=recovery_job, cron_schedule="* * * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING, description="Release stale heartbeats; bubble up what changed.")
nightly_schedule = dg.ScheduleDefinition(
    name="nightly_reconciliation", job=reconciliation_job,
    cron_schedule=os.environ.get("DOCQUEUE_NIGHTLY_CRON", "0 3 * * *"),
    default_status=dg.DefaultScheduleStatus.RUNNING, description="Reconcile parents, verify stores, repair.")

all_schedules = [recovery_schedule, nightly_schedule]
maintenance_jobs = [recovery_job, reconciliation_job]
