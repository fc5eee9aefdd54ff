"""Sensors that watch the queue tables: intake from the inbox, ready work per task kind, document roll-ups.

Each tick is bounded (candidates read through the claim index with a LIMIT, at most `max_runs` requests) and
idempotent: ranges already covered by a queued or running run are skipped. With TASK_QUEUE_ENABLED=false every
sensor skips its tick without touching the queue."""

import os
from pathlib import Path

import dagster as dg
from dagster import AssetExecutionContext, OpExecutionContext, SensorEvaluationContext

from queue_db.inbox import remember, unchanged
from queue_db.config import DagsterConfig, IntakeConfig, QueueConfig, settings
from queue_db.queue import source_path_text
from queue_db.phases import ALL_KINDS, Level, TaskKind
from orchestration.assets.rollups import ROLLUP_ASSET_BY_PHASE
from orchestration.intake import ingest_file, iter_files
from orchestration.jobs import job_name
from orchestration.partitions import register_partitions
from orchestration.planning import in_flight_positions, plan_rollup_runs, plan_runs
from orchestration.s3_intake import IntakeCursor, S3Source, ingest_s3
from resources.database import DatabaseResource
from resources.ocr import PdfLimits
from resources.storage import StorageResource

# fixed when the code location loads (a sensor's interval is part of its definition); the rest is read per tick
SENSOR_INTERVAL_S = settings(DagsterConfig).sensor_interval_s


def _requests(planned) -> list[dg.RunRequest]:
    # No run key: the daemon never launches a run key twice, so a range whose run was canceled or died before
    # claiming (its tasks unchanged, the same key planned again) would wait forever. Skipping in-flight ranges
    # is what prevents duplicates; an interrupted tick is resumed by the daemon through its reserved run ids.
    return [dg.RunRequest(tags=run.tags) for run in planned]


def _task_sensor(kind: TaskKind) -> dg.SensorDefinition:
    @dg.sensor(name=f"{kind.name}_sensor", job_name=job_name(kind.name), minimum_interval_seconds=SENSOR_INTERVAL_S,
               default_status=dg.DefaultSensorStatus.RUNNING,
               description=f"Requests ranged runs of `{kind.name}` for ready tasks (pending, or failed with retries "
                           "left and back-off elapsed, dependency met).")
    def sensor(context: SensorEvaluationContext, database: DatabaseResource):
        if not settings(QueueConfig).enabled:
            return dg.SkipReason(QueueConfig.disabled_reason)
        queue = database.get_queue()
        registered = register_partitions(context.instance, queue.engine, kind.level)
        planned = plan_runs(queue.engine, kind, in_flight=in_flight_positions(context.instance, kind.name),
                            max_runs=settings(DagsterConfig).sensor_max_runs)
        if not planned:
            return dg.SkipReason(f"no ready {kind.name} tasks" + (f" ({registered} partitions registered)" if registered else ""))
        return dg.SensorResult(run_requests=_requests(planned))

    return sensor


def _rollup_sensor(phase: str) -> dg.SensorDefinition:
    @dg.sensor(name=f"rollup_{phase}_sensor", job_name=job_name(f"rollup_{phase}"),
               minimum_interval_seconds=SENSOR_INTERVAL_S, default_status=dg.DefaultSensorStatus.RUNNING,
               description=f"Materializes `{ROLLUP_ASSET_BY_PHASE[phase]}` for documents whose {phase} phase "
                           "reached a final status.")
    def sensor(context: SensorEvaluationContext, database: DatabaseResource):
        if not settings(QueueConfig).enabled:
            return dg.SkipReason(QueueConfig.disabled_reason)
        queue = database.get_queue()
        planned = plan_rollup_runs(queue.engine, phase,
                                   in_flight=in_flight_positions(context.instance, f"rollup_{phase}"))
        if not planned:
            return dg.SkipReason(f"no document finished its {phase} phase")
        return dg.SensorResult(run_requests=_requests(planned))

    return sensor


@dg.sensor(name="inbox_sensor", minimum_interval_seconds=SENSOR_INTERVAL_S, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Registers new files dropped into DOCQUEUE_INBOX (the same bytes twice are one document) and "
                       "adds their `documents` partitions.")
def inbox_sensor(context: SensorEvaluationContext, database: DatabaseResource, storage: StorageResource):
    if not settings(QueueConfig).enabled:
        return dg.SkipReason(QueueConfig.disabled_reason)
    intake = settings(IntakeConfig)
    inbox = intake.inbox
    if not inbox:
        return dg.SkipReason("DOCQUEUE_INBOX is not set")
    root = Path(inbox)
    if not root.is_dir():
        return dg.SkipReason(f"inbox {inbox} does not exist")
    queue = database.get_queue()
    files = list(iter_files([root], root=root))
    # a file is read (hashed) only when it is new or its size or modification time changed since it was last read:
    # a tick stays cheap on a large inbox, an edit that keeps the size is seen, a duplicate is hashed once.
    # Paths as stored: a name that is not UTF-8 is compared (and sent to the database) in its escaped form.
    observed = {}
    for f in files:
        try:
            st = f.stat()
        except OSError:  # gone between listing and looking
            continue
        observed[source_path_text(os.fsdecode(f.resolve()))] = (f, st.st_size, st.st_mtime_ns)
    same = unchanged(queue.engine, {p: (size, mtime) for p, (_, size, mtime) in observed.items()})
    fresh = [(p, *seen) for p, seen in observed.items() if p not in same][:intake.inbox_max_files]
    store, limits = storage.get_storage(), PdfLimits.from_env()
    results = [ingest_file(queue, store, f, limits=limits) for _, f, _, _ in fresh]
    remember(queue.engine, [(p, size, mtime, r.document_id, r.status)
                            for (p, _, size, mtime), r in zip(fresh, results)])
    registered = register_partitions(context.instance, queue.engine, Level.DOCUMENT)
    for r in results:
        if r.status == "rejected":
            context.log.warning(f"inbox: rejected {r.path}: {r.reason}")
    counts = {status: sum(1 for r in results if r.status == status)
              for status in ("new", "new-version", "duplicate", "rejected")}
    return dg.SkipReason(f"inbox: {len(files)} file(s), {len(same)} unchanged, {counts['new']} new, "
                         f"{counts['new-version']} new version(s), {counts['duplicate']} duplicate, "
                         f"{counts['rejected']} rejected; {registered} partition(s) registered")


@dg.sensor(name="s3_intake_sensor", minimum_interval_seconds=SENSOR_INTERVAL_S,
           default_status=dg.DefaultSensorStatus.RUNNING,
           description="Registers new objects of DOCQUEUE_S3_BUCKET under DOCQUEUE_S3_PREFIX (endpoint DOCQUEUE_S3_URL) "
                       "as documents, at most DOCQUEUE_S3_MAX_OBJECTS a tick; a changed object is a new version. "
                       "The cursor remembers what was handled.")
def s3_intake_sensor(context: SensorEvaluationContext, database: DatabaseResource, storage: StorageResource):
    if not settings(QueueConfig).enabled:
        return dg.SkipReason(QueueConfig.disabled_reason)
    source = S3Source.from_env()
    if source is None:
        return dg.SkipReason("DOCQUEUE_S3_BUCKET is not set")
    queue = database.get_queue()
    report = ingest_s3(queue, storage.get_storage(), source, IntakeCursor.from_json(context.cursor))
    context.update_cursor(report.cursor.to_json())
    registered = register_partitions(context.instance, queue.engine, Level.DOCUMENT)
    for r in report.results:
        if r.status == "rejected":
            context.log.warning(f"s3 intake: rejected {r.path}: {r.reason}")
    if report.error:
        context.log.warning(f"s3 intake: {report.error}")
    return dg.SkipReason(f"{report.summary()}; {registered} partition(s) registered")


task_sensors = [_task_sensor(kind) for kind in ALL_KINDS]
rollup_sensors = [_rollup_sensor(phase) for phase in ROLLUP_ASSET_BY_PHASE]
all_sensors = [inbox_sensor, s3_intake_sensor, *task_sensors, *rollup_sensors]
