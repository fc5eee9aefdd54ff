"""Sensors that watch the queue tables: intake from the inbox, ready work per task kind, document roll-ups.

Each tick is bounded (candidates read through the claim index with a LIMIT, at most `max_runs` requests) and
idempotent: ranges already covered by a queued or running run are skipped. With TASK_QUEUE_ENABLED=false every
sensor skips its tick without touching the queue.

Every sensor is made from the settings the code location was built with (`phase_sensors`, `intake_sensors`): one
task sensor per task kind and one roll-up sensor per phase of the phase specs."""

import os
from pathlib import Path

import dagster as dg
from dagster import SensorEvaluationContext

from orchestration.assets.rollups import rollup_asset_name, rollup_run_name
from orchestration.intake import IntakeRules, ingest_file, iter_files
from orchestration.jobs import job_name
from orchestration.partitions import register_partitions
from orchestration.planning import (
    SETTLE_LIMIT,
    RunSizing,
    in_flight_by_name,
    in_flight_positions,
    plan_rollup_runs,
    plan_runs,
    pool_slots,
)
from orchestration.s3_intake import IntakeCursor, S3Source, ingest_s3
from orchestration.sensor_ticks import surviving_database
from queue_db.config import QueueConfig, Settings
from queue_db.inbox import remember, unchanged
from queue_db.partition_keys import rollup_backlog, settle_known_failures
from queue_db.phases import Level, PhaseRegistry, PhaseSpec, TaskKind
from queue_db.queue import source_path_text
from queue_db.run_costs import run_costs
from resources.database import DatabaseResource
from resources.storage_resource import StorageResource


def _requests(planned) -> list[dg.RunRequest]:
    # No run key: the daemon never launches a run key twice, so a range whose run was canceled or died before
    # claiming (its tasks unchanged, the same key planned again) would wait forever. Skipping in-flight ranges
    # is what prevents duplicates; an interrupted tick is resumed by the daemon through its reserved run ids.
    return [dg.RunRequest(tags=run.tags) for run in planned]


def _task_sensor(settings: Settings, kind: TaskKind) -> dg.SensorDefinition:
    enabled, max_runs = settings.queue.enabled, settings.dagster.sensor_max_runs
    max_keys, overhead_share = settings.dagster.max_keys_per_run(kind.name), settings.dagster.run_overhead_share

    @dg.sensor(
        name=f"{kind.name}_sensor",
        job_name=job_name(kind.name),
        minimum_interval_seconds=settings.dagster.sensor_interval_s,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Requests ranged runs of `{kind.name}` for ready tasks (pending, or failed with retries "
        "left and back-off elapsed, dependency met).",
    )
    def sensor(context: SensorEvaluationContext, database: DatabaseResource):
        if not enabled:
            return dg.SkipReason(QueueConfig.disabled_reason)
        return surviving_database(
            context, lambda: _plan_kind(context, database, kind, max_keys, max_runs, overhead_share)
        )

    return sensor


def _plan_kind(
    context: SensorEvaluationContext,
    database: DatabaseResource,
    kind: TaskKind,
    max_keys: int,
    max_runs: int,
    overhead_share: float,
):
    queue = database.get_queue()
    registered = register_partitions(context.instance, queue.engine, kind.level)
    sizing = RunSizing(
        run_costs(queue.engine).get(kind.name), overhead_share, pool_slots(context.instance, kind.phase.pool)
    )
    planned = plan_runs(
        queue.engine,
        kind,
        in_flight=in_flight_positions(context.instance, kind.name),
        max_keys=max_keys,
        max_runs=max_runs,
        sizing=sizing,
    )
    if not planned:
        known = f" ({registered} partitions registered)" if registered else ""
        return dg.SkipReason(f"no ready {kind.name} tasks{known}")
    return dg.SensorResult(run_requests=_requests(planned))


def _rollup_sensor(settings: Settings, phases: PhaseRegistry, spec: PhaseSpec) -> dg.SensorDefinition:
    enabled, phase, run_name = settings.queue.enabled, spec.name, rollup_run_name(spec)
    hold_s = settings.dagster.rollup_hold_s

    @dg.sensor(
        name=f"{run_name}_sensor",
        job_name=job_name(run_name),
        minimum_interval_seconds=settings.dagster.sensor_interval_s,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Materializes `{rollup_asset_name(spec)}` for documents whose {phase} phase "
        "reached a final status.",
    )
    def sensor(context: SensorEvaluationContext, database: DatabaseResource):
        if not enabled:
            return dg.SkipReason(QueueConfig.disabled_reason)
        return surviving_database(context, lambda: _plan_rollups(context, database, phases, spec, hold_s))

    return sensor


def _plan_rollups(
    context: SensorEvaluationContext, database: DatabaseResource, phases: PhaseRegistry, spec: PhaseSpec, hold_s: float
):
    queue = database.get_queue()
    settled = settle_known_failures(queue.engine, spec, SETTLE_LIMIT, phases=phases)
    # the roll-up's runs in flight and its phase's kinds', in one read of the run storage
    in_flight = in_flight_by_name(context.instance, [rollup_run_name(spec), *(k.name for k in spec.kinds)])
    planned = plan_rollup_runs(
        queue.engine,
        spec,
        phases=phases,
        in_flight=in_flight.get(rollup_run_name(spec), {}),
        phase_busy=(busy := hold_s > 0 and any(k.name in in_flight for k in spec.kinds)),
        hold_s=hold_s,
    )
    again = (
        f"; {len(settled)} document(s) failed the {spec.name} phase again with the reason their roll-up already "
        f"shows (first: {settled[0]}), so no run"
        if settled
        else ""
    )
    if not planned:
        waiting = rollup_backlog(queue.engine, spec, 1, phases=phases).documents if busy else 0
        if waiting:
            return dg.SkipReason(
                f"documents finished their {spec.name} phase: their roll-up waits up to {hold_s:g} s for more "
                f"while {spec.name} runs go on (DOCQUEUE_ROLLUP_HOLD_S){again}"
            )
        return dg.SkipReason(f"no document finished its {spec.name} phase{again}")
    if settled:
        context.log.info(again[2:])
    return dg.SensorResult(run_requests=_requests(planned))


def inbox_sensor(settings: Settings) -> dg.SensorDefinition:
    enabled, intake, rules = settings.queue.enabled, settings.intake, IntakeRules.from_settings(settings)

    @dg.sensor(
        name="inbox_sensor",
        minimum_interval_seconds=settings.dagster.sensor_interval_s,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Registers new files dropped into DOCQUEUE_INBOX (the same bytes twice are one document) "
        "and adds their `documents` partitions.",
    )
    def sensor(context: SensorEvaluationContext, database: DatabaseResource, storage: StorageResource):
        if not enabled:
            return dg.SkipReason(QueueConfig.disabled_reason)
        return surviving_database(context, lambda: _read_inbox(context, intake, rules, database, storage))

    return sensor


def _read_inbox(
    context: SensorEvaluationContext, intake, rules: IntakeRules, database: DatabaseResource, storage: StorageResource
) -> dg.SkipReason:
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
    fresh = [(p, *seen) for p, seen in observed.items() if p not in same][: intake.inbox_max_files]
    store = storage.get_storage()
    results = [ingest_file(queue, store, f, rules=rules) for _, f, _, _ in fresh]
    remember(
        queue.engine, [(p, size, mtime, r.document_id, r.status) for (p, _, size, mtime), r in zip(fresh, results)]
    )
    registered = register_partitions(context.instance, queue.engine, Level.DOCUMENT)
    for r in results:
        if r.status == "rejected":
            context.log.warning(f"inbox: rejected {r.path}: {r.reason}")
    counts = {
        status: sum(1 for r in results if r.status == status)
        for status in ("new", "new-version", "duplicate", "rejected")
    }
    return dg.SkipReason(
        f"inbox: {len(files)} file(s), {len(same)} unchanged, {counts['new']} new, "
        f"{counts['new-version']} new version(s), {counts['duplicate']} duplicate, "
        f"{counts['rejected']} rejected; {registered} partition(s) registered"
    )


def s3_intake_sensor(settings: Settings) -> dg.SensorDefinition:
    enabled, source, scratch = settings.queue.enabled, S3Source.from_config(settings.intake), scratch_folder(settings)
    rules = IntakeRules.from_settings(settings)

    @dg.sensor(
        name="s3_intake_sensor",
        minimum_interval_seconds=settings.dagster.sensor_interval_s,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Registers new objects of DOCQUEUE_S3_BUCKET under DOCQUEUE_S3_PREFIX (endpoint "
        "DOCQUEUE_S3_URL) as documents, at most DOCQUEUE_S3_MAX_OBJECTS a tick; a changed object "
        "is a new version. The cursor remembers what was handled.",
    )
    def sensor(context: SensorEvaluationContext, database: DatabaseResource, storage: StorageResource):
        if not enabled:
            return dg.SkipReason(QueueConfig.disabled_reason)
        if source is None:
            return dg.SkipReason("DOCQUEUE_S3_BUCKET is not set")
        return surviving_database(context, lambda: _read_s3(context, source, scratch, rules, database, storage))

    return sensor


def scratch_folder(settings: Settings) -> Path:
    """Where downloads wait to be registered: `tmp` in DOCQUEUE_HOME."""
    return Path(settings.database.home).expanduser().resolve() / "tmp"


def _read_s3(
    context: SensorEvaluationContext,
    source: S3Source,
    scratch: Path,
    rules: IntakeRules,
    database: DatabaseResource,
    storage: StorageResource,
) -> dg.SkipReason:
    queue = database.get_queue()
    report = ingest_s3(
        queue, storage.get_storage(), source, IntakeCursor.from_json(context.cursor), scratch=scratch, rules=rules
    )
    context.update_cursor(report.cursor.to_json())
    registered = register_partitions(context.instance, queue.engine, Level.DOCUMENT)
    for r in report.results:
        if r.status == "rejected":
            context.log.warning(f"s3 intake: rejected {r.path}: {r.reason}")
    if report.error:
        context.log.warning(f"s3 intake: {report.error}")
    return dg.SkipReason(f"{report.summary()}; {registered} partition(s) registered")


def intake_sensors(settings: Settings) -> list[dg.SensorDefinition]:
    return [inbox_sensor(settings), s3_intake_sensor(settings)]


def phase_sensors(settings: Settings, phases: PhaseRegistry) -> list[dg.SensorDefinition]:
    """A task sensor per kind, then a roll-up sensor per phase, in pipeline order."""
    return [
        *(_task_sensor(settings, kind) for spec in phases for kind in spec.kinds),
        *(_rollup_sensor(settings, phases, spec) for spec in phases),
    ]
