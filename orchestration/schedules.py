"""Maintenance: the recovery sensor, which requests a recovery run only when there is something to recover, and
the nightly reconciliation and asset checks on schedules. Their ops log one sentence each on what they found and
report it as metadata, and store no output (each returns None). Everything skips while TASK_QUEUE_ENABLED is
false. Made from the settings the code location was built with (`maintenance_jobs`, `recovery_sensor`,
`maintenance_schedules`)."""

from dataclasses import dataclass

import dagster as dg
from dagster import OpExecutionContext, SensorEvaluationContext

from orchestration.cluster import MAINTENANCE_QUEUE, celery_queue_tags
from orchestration.maintenance import index_vector_tail as build_vector_tail
from orchestration.maintenance import nightly, recover, recovery_check, vector_tail_sentence, vector_tail_waiting
from orchestration.partitions import retire_partitions_as_configured
from orchestration.sensor_ticks import surviving_database
from queue_db.config import QueueConfig, Settings
from resources.database import DatabaseResource
from resources.embedding_resource import EmbeddingResource
from resources.graph_stores import Neo4jResource
from resources.ports import GraphStoreDamaged, VectorStoreDamaged
from resources.vector_resource import QdrantResource

MAINTENANCE_POOL = "maintenance"
MAINTENANCE_TAGS = {"docqueue/phase": "maintenance"}
RECOVERY_DUE_TAG = "docqueue/recovery_due"
IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


def _recover_stale_tasks(settings: Settings) -> dg.OpDefinition:
    stale_s = settings.queue.stale_timeout_s

    @dg.op(
        name="recover_stale_tasks",
        pool=MAINTENANCE_POOL,
        tags=celery_queue_tags(MAINTENANCE_QUEUE),
        description="Release tasks whose heartbeat went stale (counting the attempt), bubble up, and re-index the "
        "chunks whose re-index waited for their running task.",
    )
    def recover_stale_tasks(context: OpExecutionContext, database: DatabaseResource) -> None:
        result = recover(database.get_queue())
        released = {kind: n for kind, n in result["released"].items() if n}
        if released:
            context.log.info(
                f"released {result['released_total']} task(s) whose heartbeat was older than "
                f"STALE_TASK_TIMEOUT={stale_s:g} s: " + ", ".join(f"{n} {kind}" for kind, n in released.items())
            )
        else:
            context.log.info(f"no task's heartbeat was older than STALE_TASK_TIMEOUT={stale_s:g} s")
        if result["reindexed_after_running"]:
            context.log.info(
                f"re-indexed {result['reindexed_after_running']} chunk(s) whose re-index waited for their running task"
            )
        context.add_output_metadata(
            {
                "released_total": result["released_total"],
                "reindexed_after_running": result["reindexed_after_running"],
                **{f"released_{k}": v for k, v in result["released"].items()},
            }
        )

    return recover_stale_tasks


def _retire_completed_partitions(settings: Settings) -> dg.OpDefinition:
    dagster = settings.dagster

    @dg.op(
        name="retire_completed_partitions",
        pool=MAINTENANCE_POOL,
        tags=celery_queue_tags(MAINTENANCE_QUEUE),
        description="Retire the Dagster partitions of pages and chunks completed longer ago than "
        "DOCQUEUE_PARTITION_RETENTION, or beyond DOCQUEUE_PARTITION_MAX_COMPLETED (one batch each).",
    )
    def retire_completed_partitions(context: OpExecutionContext, database: DatabaseResource) -> None:
        retired = retire_partitions_as_configured(context.instance, database.get_queue().engine, dagster)
        context.log.info(
            "retired the partitions of completed tasks (older than DOCQUEUE_PARTITION_RETENTION, or "
            f"beyond DOCQUEUE_PARTITION_MAX_COMPLETED={dagster.partition_max_completed} per definition; "
            f"at most DOCQUEUE_PARTITION_RETIRE_BATCH={dagster.partition_retire_batch} a run): "
            + ", ".join(f"{n} {name}" for name, n in retired.items())
        )
        context.add_output_metadata({f"retired_{name}": n for name, n in retired.items()})

    return retire_completed_partitions


def _index_vector_tail(settings: Settings) -> dg.OpDefinition:
    index_tail, default_model = settings.vector.index_tail, settings.embedding.model

    @dg.op(
        name="index_vector_tail",
        pool=MAINTENANCE_POOL,
        tags=celery_queue_tags(MAINTENANCE_QUEUE),
        description="Build the vector index of the points written since the last build once "
        "DOCQUEUE_QDRANT_INDEX_TAIL of them wait (the embedded store; a Qdrant server indexes by "
        "itself).",
    )
    def index_vector_tail(context: OpExecutionContext, embeddings: EmbeddingResource, qdrant: QdrantResource) -> None:
        # the resource's own model when its field is set, else DOCQUEUE_EMBEDDING_MODEL
        result = build_vector_tail(qdrant, embeddings.model or default_model, index_tail)
        context.log.info(vector_tail_sentence(result["waiting"], index_tail, result["built"]))
        context.add_output_metadata({**result, "index_tail": index_tail})

    return index_vector_tail


def _reconcile_and_verify(settings: Settings) -> dg.OpDefinition:
    page_size = settings.dagster.verify_page

    @dg.op(
        name="reconcile_and_verify",
        pool=MAINTENANCE_POOL,
        tags=celery_queue_tags(MAINTENANCE_QUEUE),
        description="Recompute every parent status, release tasks of dead runs, verify Qdrant and the graph "
        "against the queue and re-queue what is missing.",
    )
    def reconcile_and_verify(
        context: OpExecutionContext,
        database: DatabaseResource,
        embeddings: EmbeddingResource,
        qdrant: QdrantResource,
        neo4j: Neo4jResource,
    ) -> None:
        queue = database.get_queue()
        embedder = embeddings.get_embedder()
        store = qdrant.get_store(embedder.model_id, embedder.dim)
        graph = None
        try:
            # the embedded Bolt server refuses to start on a damaged database folder (GraphStoreDamaged)
            graph = neo4j.get_store()
            store.ensure_collection()
            result = nightly(queue, context.instance, store, graph, page_size=page_size)
        except (VectorStoreDamaged, GraphStoreDamaged) as exc:
            # the run fails with the store's one sentence (it names the repair command); repairing is a person's
            # call, since it sets files aside
            raise dg.Failure(description=str(exc), allow_retries=False) from None
        finally:
            store.close()
            if graph is not None:
                graph.close()
        context.log.info(
            f"nightly reconciliation: {result['parents_corrected']} parent status(es) corrected, "
            f"{result['tasks_released']} task(s) of {result['dead_run_workers']} ended run(s) released, "
            f"{result['requeued_vector_chunks']} vector and {result['requeued_graph_chunks']} graph "
            f"chunk(s) re-queued, {result['orphan_points_deleted']} orphan point(s) deleted; "
            f"vector index built: {result['vector_index_built']}"
        )
        verification = result.pop("verification")
        context.add_output_metadata(
            {
                **{k: v for k, v in result.items() if isinstance(v, int)},
                "corrections": dg.MetadataValue.json(result["corrections"]),
                "verification": dg.MetadataValue.json(verification),
            }
        )

    return reconcile_and_verify


@dataclass(frozen=True)
class MaintenanceJobs:
    recovery: dg.JobDefinition
    reconciliation: dg.JobDefinition


def maintenance_jobs(settings: Settings) -> MaintenanceJobs:
    recover_op, retire, index_tail, reconcile = (
        _recover_stale_tasks(settings),
        _retire_completed_partitions(settings),
        _index_vector_tail(settings),
        _reconcile_and_verify(settings),
    )

    @dg.job(
        name="recovery_job",
        tags=MAINTENANCE_TAGS,
        description="Requested by `recovery_sensor` when there is something to recover: release stale tasks, "
        "retire completed partitions, build the embedded vector index's tail.",
    )
    def recovery_job():
        recover_op()
        retire()
        index_tail()

    @dg.job(name="nightly_reconciliation_job", tags=MAINTENANCE_TAGS)
    def reconciliation_job():
        reconcile()

    return MaintenanceJobs(recovery_job, reconciliation_job)


def recovery_sensor(settings: Settings, jobs: MaintenanceJobs) -> dg.SensorDefinition:
    """Every TASK_QUEUE_CHECK_INTERVAL: a recovery run when a heartbeat went stale, a re-index request waits, a
    completed partition is due for retirement or the embedded vector index's tail reached DOCQUEUE_QDRANT_INDEX_TAIL;
    otherwise a skipped tick that says what it checked. One recovery run at a time."""
    enabled, dagster, index_tail = settings.queue.enabled, settings.dagster, settings.vector.index_tail
    default_model = settings.embedding.model

    @dg.sensor(
        name="recovery_sensor",
        job=jobs.recovery,
        minimum_interval_seconds=max(1, int(settings.queue.check_interval_s)),
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Requests a `recovery_job` run only when there is something to recover: a heartbeat older "
        "than STALE_TASK_TIMEOUT, a settled re-index request, completed partitions due for "
        "retirement, DOCQUEUE_QDRANT_INDEX_TAIL points waiting to be indexed (every "
        "TASK_QUEUE_CHECK_INTERVAL).",
    )
    def sensor(
        context: SensorEvaluationContext,
        database: DatabaseResource,
        embeddings: EmbeddingResource,
        qdrant: QdrantResource,
    ):
        if not enabled:
            return dg.SkipReason(QueueConfig.disabled_reason)
        return surviving_database(context, lambda: check_recovery(context, database, embeddings, qdrant))

    def check_recovery(context: SensorEvaluationContext, database: DatabaseResource, embeddings, qdrant):
        running = context.instance.get_runs_count(dg.RunsFilter(job_name=jobs.recovery.name, statuses=IN_FLIGHT))
        if running:
            return dg.SkipReason(
                f"a recovery run is already queued or running ({running}); checked again on the next tick"
            )
        waiting = vector_tail_waiting(qdrant, embeddings.model or default_model) if index_tail > 0 else 0
        check = recovery_check(database.get_queue(), dagster, waiting, index_tail)
        due = check.due()
        if not due:
            return dg.SkipReason(check.nothing_due())
        context.log.info("recovery due: " + "; ".join(due))
        return dg.RunRequest(tags={**MAINTENANCE_TAGS, RECOVERY_DUE_TAG: "; ".join(due)[:1000]})

    return sensor


def _unless_disabled(queue: QueueConfig):
    def evaluate(context: dg.ScheduleEvaluationContext) -> dg.RunRequest | dg.SkipReason:
        if not queue.enabled:
            return dg.SkipReason(QueueConfig.disabled_reason)
        return dg.RunRequest()

    return evaluate


def maintenance_schedules(settings: Settings, jobs: MaintenanceJobs, checks_job) -> list[dg.ScheduleDefinition]:
    unless_disabled = _unless_disabled(settings.queue)
    return [
        dg.ScheduleDefinition(
            name="nightly_reconciliation",
            job=jobs.reconciliation,
            cron_schedule=settings.dagster.nightly_cron,
            execution_fn=unless_disabled,
            default_status=dg.DefaultScheduleStatus.RUNNING,
            description="Reconcile parents, verify stores, repair.",
        ),
        dg.ScheduleDefinition(
            name="asset_checks",
            job=checks_job,
            cron_schedule=settings.dagster.checks_cron,
            execution_fn=unless_disabled,
            default_status=dg.DefaultScheduleStatus.RUNNING,
            description="Evaluate every asset check, after the nightly reconciliation has repaired what it could.",
        ),
    ]
