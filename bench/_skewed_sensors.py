"""The Dagster side of the fault matrix's row 8: the code location's sensors and schedules, and the recovery and
nightly reconciliation work they drive, evaluated the way the daemon evaluates them, in a process whose wall clock
is wrong (bench/_skewed.py's mode "sensors", started under libfaketime with the environment of a docqueue home:
its queue and Dagster databases, stores, inbox and S3 source).

One pass: every sensor ticks once (the S3 intake sensor from the cursor it is given); the run records the daemon
would create for the requests of the sensors named in `queue_runs_of` are created, queued, so the next tick of any
process finds them in flight; a recovery run, when the recovery sensor requests one, executes in this process, and
so does the queue part of the nightly reconciliation; every schedule is evaluated. Beside what happened, the report
says what a judgement by this process's own clock would have done to the same rows (`by_own_clock`: the held tasks
it would release, the backing-off tasks it would find due, the completed partitions it would retire), which is
what makes the check a test, and how far Dagster's own time stamps (ticks, schedules) stand from the database's.
"""

from __future__ import annotations

import time

import dagster as dg
import psycopg

from orchestration import maintenance
from orchestration.code_location import build_definitions, build_resources
from orchestration.environment import dagster_instance
from queue_db.config import Settings
from queue_db.partition_retention import done_at_sql, live_completed_sql
from queue_db.phases import VECTOR_CHUNK, Level
from resources.database import open_queue

RECOVERY_JOB = "recovery_job"


def queue_run(defs: dg.Definitions, instance: dg.DagsterInstance, request: dg.RunRequest, job: str) -> str:
    """The run record the daemon creates for a sensor's request before the run coordinator starts it: QUEUED, with
    the request's tags. Returns its id."""
    from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    location = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(module_name="orchestration.definitions"), location_name="docqueue"
    )
    run = instance.create_run_for_job(
        job_def=defs.resolve_job_def(job),
        tags=dict(request.tags),
        status=dg.DagsterRunStatus.QUEUED,
        remote_job_origin=RemoteJobOrigin(RemoteRepositoryOrigin(location, "__repository__"), job),
    )
    return run.run_id


def tick(defs: dg.Definitions, instance: dg.DagsterInstance, resources: dict, name: str, cursor: str | None = None):
    """One evaluation of sensor `name` as the daemon makes it (a context built from the instance's ref, so dynamic
    partitions load)."""
    with dg.build_sensor_context(
        instance_ref=instance.get_ref(), definitions=defs, sensor_name=name, resources=resources, cursor=cursor
    ) as context:
        return defs.get_sensor_def(name).evaluate_tick(context)


def by_own_clock(url: str, stale_s: float, retention_s: float) -> dict[str, list[str]]:
    """The vector_chunk rows a judgement by this process's clock would pick: held tasks whose heartbeat looks
    stale, backing-off tasks that look due, completed chunk partitions that look past the retention."""
    own = time.time()
    kind, done_at = VECTOR_CHUNK, done_at_sql(Level.CHUNK)
    attempt = f"t.{kind.col('next_attempt_at')}"
    statements = {
        "stale": f"SELECT t.id::text FROM {kind.table} t WHERE {kind.held_sql('t')} "
        f"AND t.{kind.col('last_heartbeat')} < to_timestamp(%(own)s - %(stale)s)",
        "due": f"SELECT t.id::text FROM {kind.table} t WHERE {kind.status} = 'failed' "
        f"AND {attempt} <= to_timestamp(%(own)s) AND {attempt} > now() - interval '1 day'",
        "retirable": f"SELECT t.id::text FROM task_queue_chunk t WHERE {live_completed_sql(Level.CHUNK)} "
        f"AND {done_at} < to_timestamp(%(own)s - %(retention)s)",
    }
    with psycopg.connect(url, autocommit=True) as conn:
        return {
            name: sorted(r[0] for r in conn.execute(sql, {"own": own, "stale": stale_s, "retention": retention_s}))
            for name, sql in statements.items()
        }


def dagster_clock_skew_s(url: str) -> float:
    """Dagster's own clock (the one it stamps ticks and schedule times with) less the database's, seconds."""
    from dagster._time import get_current_timestamp

    with psycopg.connect(url, autocommit=True) as conn:
        database = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0]
    return round(get_current_timestamp() - database, 1)


def _metadata(result: dg.ExecuteInProcessResult, node: str) -> dict:
    [event] = [e for e in result.events_for_node(node) if e.is_successful_output]
    return {k: v.value for k, v in event.step_output_data.metadata.items() if isinstance(v.value, (int, float, str))}


def _execute(defs: dg.Definitions, instance: dg.DagsterInstance, job: str, nodes: tuple[str, ...]) -> dict:
    result = defs.resolve_job_def(job).execute_in_process(instance=instance, raise_on_error=False)
    return {"success": result.success, **{node: _metadata(result, node) for node in nodes if result.success}}


def evaluate(spec: dict) -> dict:
    """One pass of every sensor and schedule, and the runs they drive (see the module's docstring)."""
    settings = Settings.from_env()
    url = spec["url"]
    defs, instance, resources = build_definitions(settings), dagster_instance(settings), build_resources(settings)
    queue = open_queue(settings)
    try:
        cursors = spec.get("cursors") or {}
        ticks, runs = {}, {}
        for sensor in defs.sensors:
            result = tick(defs, instance, resources, sensor.name, cursors.get(sensor.name))
            ticks[sensor.name] = {
                "requests": [dict(r.tags) for r in result.run_requests or []],
                "skip": result.skip_message,
                "cursor": result.cursor,
            }
            if sensor.name in spec.get("queue_runs_of", ()):
                job = sensor.job_name
                runs[sensor.name] = [queue_run(defs, instance, r, job) for r in result.run_requests or []]
        # after the ticks, which register the new rows' partitions; before the runs, which change the rows
        own = by_own_clock(url, settings.queue.stale_timeout_s, settings.dagster.partition_retention_s)
        recovery = (
            _execute(defs, instance, RECOVERY_JOB, ("recover_stale_tasks", "retire_completed_partitions"))
            if ticks["recovery_sensor"]["requests"]
            else None
        )
        schedules = {}
        for schedule in defs.schedules:
            with dg.build_schedule_context(instance=instance) as context:
                data = schedule.evaluate_tick(context)
            schedules[schedule.name] = {"requests": len(data.run_requests or []), "skip": data.skip_message}
        nightly = None
        if spec.get("nightly"):
            # the nightly run's queue part: parents recomputed, the tasks of ended runs released (its store
            # verification compares ids, never times, and would re-queue the planted completions, which have no
            # points)
            nightly = {k: v for k, v in maintenance.nightly(queue, instance).items() if isinstance(v, int)}
        return {
            "ticks": ticks,
            "queued_runs": runs,
            "recovery": recovery,
            "schedules": schedules,
            "nightly": nightly,
            "by_own_clock": own,
            "dagster_clock_skew_s": dagster_clock_skew_s(url),
        }
    finally:
        queue.engine.dispose()
        instance.dispose()
