"""`docqueue run`: process ready work through the Dagster definitions, in-process, until idle.

The same planning the sensors use picks ranged runs; each is executed in this process with
`execute_in_process` against the real instance, so every materialization lands in the Dagster event log and the
UI shows it. Several workers split the registration blocks between them (block id modulo the worker count).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import dagster as dg

from queue_db.queue import TaskQueue
from queue_db.tasks import ALL_KINDS, Level
from orchestration.assets.rollups import ROLLUP_ASSET_BY_PHASE
from orchestration.jobs import job_name
from orchestration.partitions import register_partitions
from orchestration.planning import PlannedRun, in_flight_positions, plan_rollup_runs, plan_runs


# the runs' events (failures included) go to the Dagster instance, where the UI shows them
QUIET_CONSOLE = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


@dataclass
class RunnerReport:
    runs: int = 0
    failed_runs: int = 0
    seconds: float = 0.0
    runs_by_name: dict = field(default_factory=dict)


def waiting_work(queue: TaskQueue) -> dict[str, float]:
    """Work that is not claimable now but will be: tasks held by live workers, failed tasks backing off."""
    with queue.engine.connect() as conn:
        row = conn.exec_driver_sql(
            """SELECT
                 (SELECT count(*) FROM documents WHERE ocr_status = 'processing' AND pages_created_at IS NULL)
               + (SELECT count(*) FROM task_queue_page WHERE ocr_status = 'processing'
                                                      OR (vector_status = 'processing' AND chunked_at IS NULL))
               + (SELECT count(*) FROM task_queue_chunk WHERE vector_status = 'processing' OR graphrag_status = 'processing'),
                 LEAST(
                   (SELECT min(next_attempt_at) FROM documents WHERE ocr_status = 'failed' AND pages_created_at IS NULL
                       AND retry_count < max_retries AND next_attempt_at > now() AND next_attempt_at < '9999-01-01'),
                   (SELECT min(ocr_next_attempt_at) FROM task_queue_page WHERE ocr_status = 'failed'
                       AND ocr_retry_count < max_retries AND ocr_next_attempt_at > now() AND ocr_next_attempt_at < '9999-01-01'),
                   (SELECT min(vector_next_attempt_at) FROM task_queue_chunk WHERE vector_status = 'failed'
                       AND vector_retry_count < max_retries AND vector_next_attempt_at > now() AND vector_next_attempt_at < '9999-01-01'),
                   (SELECT min(graphrag_next_attempt_at) FROM task_queue_chunk WHERE graphrag_status = 'failed'
                       AND graphrag_retry_count < max_retries AND graphrag_next_attempt_at > now() AND graphrag_next_attempt_at < '9999-01-01'))
                 - now()""").one()
    backoff = row[1].total_seconds() if row[1] is not None else None
    return {"processing": int(row[0]), "next_retry_in_s": backoff}


def plan_next(queue: TaskQueue, instance: dg.DagsterInstance, block_filter=None) -> list[PlannedRun]:
    """One planning round over every kind in phase order, then the roll-ups."""
    planned: list[PlannedRun] = []
    for level in Level:
        register_partitions(instance, queue.engine, level)
    for kind in ALL_KINDS:
        planned += plan_runs(queue.engine, kind, in_flight=in_flight_positions(instance, kind.name), max_runs=4,
                             block_filter=block_filter)
    for phase in ROLLUP_ASSET_BY_PHASE:
        planned += plan_rollup_runs(queue.engine, phase, in_flight=in_flight_positions(instance, f"rollup_{phase}"),
                                    max_runs=4, block_filter=block_filter)
    return planned


def execute(defs: dg.Definitions, instance: dg.DagsterInstance, run: PlannedRun) -> bool:
    job = defs.resolve_job_def(job_name(run.name))
    result = job.execute_in_process(instance=instance, tags={**run.tags, "docqueue/runner": "cli"},
                                    raise_on_error=False, run_config=QUIET_CONSOLE)
    return result.success


def run_until_idle(defs: dg.Definitions, instance: dg.DagsterInstance, queue: TaskQueue, *, until_idle: bool = True,
                   worker_index: int = 0, workers: int = 1, poll_s: float = 2.0, max_seconds: float | None = None,
                   on_run: Callable[[PlannedRun, bool], None] | None = None) -> RunnerReport:
    report = RunnerReport()
    started = time.monotonic()
    block_filter = (lambda block: block % workers == worker_index) if workers > 1 else None
    while True:
        if max_seconds is not None and time.monotonic() - started > max_seconds:
            break
        planned = plan_next(queue, instance, block_filter)
        for run in planned:
            ok = execute(defs, instance, run)
            report.runs += 1
            report.failed_runs += 0 if ok else 1
            report.runs_by_name[run.name] = report.runs_by_name.get(run.name, 0) + 1
            if on_run:
                on_run(run, ok)
        if planned:
            continue
        waiting = waiting_work(queue)
        if until_idle and waiting["processing"] == 0 and waiting["next_retry_in_s"] is None:
            break
        delay = poll_s if waiting["next_retry_in_s"] is None else min(max(waiting["next_retry_in_s"], 0.2), 30.0)
        time.sleep(delay)
    report.seconds = time.monotonic() - started
    return report
