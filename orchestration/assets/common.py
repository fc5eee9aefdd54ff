"""Materializing a range of task partitions through the queue, with per-partition truth.

A run covers a range of partition keys. The asset claims exactly those keys' tasks (fenced by this run's worker
id), heartbeats them from a background thread, processes them in batches through `pipeline.Pipeline`, and then:
- logs one AssetMaterialization per key whose task completed, with that key's own metadata;
- yields no Output (output_required=False), so Dagster records nothing for the other keys of the range;
- raises if any key's task failed, so the run fails and Dagster marks exactly the keys that were planned but not
  materialized as failed. Keys whose task was already completed by someone else are then logged as materialized
  too, so a failed run never paints a completed partition red.
A run launched by a person (UI backfill, manual launch) overrides the retry limit and back-off; a run launched by
a docqueue sensor or `docqueue run` respects them.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import dagster as dg

from orchestration.pipeline import Pipeline
from orchestration.planning import KIND_TAG, PHASE_TAG, RANGE_TAG, range_text
from orchestration.task_outcomes import Outcome
from queue_db.heartbeat import Heartbeat
from queue_db.partition_keys import rows_for_keys
from queue_db.phases import PHASES, PhaseRegistry, TaskKind
from queue_db.queue import TaskQueue, make_worker_id
from queue_db.run_costs import record_run_cost, seconds_before_work

CLAIM_BATCH = {"ocr_document": 4, "ocr_page": 4, "vector_page": 25, "vector_chunk": 64, "graphrag_chunk": 64}
# tasks per claim of a kind the table above does not name (a phase added by its spec and handler alone)
DEFAULT_CLAIM_BATCH = 64
# a long run tells its progress in the run's log at most this often (its summary ends it); every message is a
# write to Dagster's event log, one per claimed batch of four OCR pages would be a write per 0.1 s of text pages
PROGRESS_EVERY_S = 5.0
AUTOMATED_RUN_TAGS = ("dagster/sensor_name", "docqueue/runner", "dagster/schedule_name")


@dataclass
class RangeReport:
    kind: str
    keys: int = 0
    completed: dict[str, Outcome] = field(default_factory=dict)
    failed: dict[str, Outcome] = field(default_factory=dict)
    already_completed: list[str] = field(default_factory=list)
    not_ready: dict[str, str] = field(default_factory=dict)
    taken_elsewhere: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    seconds: float = 0.0


def queue_of(database, phases: PhaseRegistry) -> TaskQueue:
    """The queue a run works through: the database resource's, serving `phases` (the code location's registry)."""
    queue = database.get_queue()
    return queue if phases is PHASES else TaskQueue(queue.engine, queue.settings, phases=phases)


def is_manual_run(tags: dict) -> bool:
    return not any(tag in tags for tag in AUTOMATED_RUN_TAGS)


def tag_launched_run(context: dg.AssetExecutionContext, name: str, phase: str, unit: str) -> None:
    """Give a run a person launched (a UI backfill, a launch of the asset job) the docqueue tags a sensor's run
    carries, so that the runs list reads the same whoever launched it. Dagster takes a backfill's run tags from
    its dialog only (no hook of the code location sees the launch), so the step adds them to its run when it
    starts. The span tag stays the planner's own: a backfill's range need not be one registration block."""
    if KIND_TAG in context.run.tags:
        return
    keys = list(context.partition_keys)
    context.instance.add_run_tags(
        context.run.run_id,
        {KIND_TAG: name, PHASE_TAG: phase, RANGE_TAG: range_text(keys[0], keys[-1], len(keys), unit)},
    )


class EarlierAttempt:
    """Tasks of this range held by an earlier delivery of the same step (same run, another worker id): a Celery
    worker machine that died mid-step, whose message the broker handed to us, or a delivery still running. Its
    tasks are waited for, never taken over, while their holder heartbeats: a live holder finishes them, a dead
    one's go stale and are released (the lost attempt counted, as a recovery run would) and claimed again.
    Either way the wait ends, so the run ends only when its range is settled."""

    def __init__(self, queue: TaskQueue, kind: TaskKind, key_of_id: dict[str, str], run_prefix: str, worker_id: str):
        self.queue, self.kind, self.key_of_id = queue, kind, key_of_id
        self.run_prefix, self.worker_id = run_prefix, worker_id
        self.poll_s = max(0.5, min(queue.settings.heartbeat_interval_s, 5.0))
        self.announced = False

    def holds(self, remaining: list[str], log=None) -> bool:
        """True (after one poll interval) while an earlier delivery still holds some of `remaining`."""
        rows = rows_for_keys(self.queue.engine, self.kind, [self.key_of_id[i] for i in remaining])
        held = [
            key
            for key, row in rows.items()
            if row["status"] == "processing"
            and (row["worker_id"] or "").startswith(self.run_prefix)
            and row["worker_id"] != self.worker_id
        ]
        if not held:
            return False
        if log and not self.announced:
            self.announced = True
            log.info(
                f"{self.kind.name}: {len(held)} task(s) of this range are held by an earlier delivery of this "
                f"step; waiting until they settle or their heartbeat goes stale "
                f"({self.queue.settings.stale_timeout_s:g} s)"
            )
        time.sleep(self.poll_s)
        self.queue.recover_stale()
        return True


def process_keys(
    queue: TaskQueue,
    pipeline: Pipeline,
    kind: TaskKind,
    keys: list[str],
    worker_id: str,
    *,
    override_retry_limit: bool,
    log=None,
    run_prefix: str | None = None,
) -> RangeReport:
    """Claim, heartbeat, process and settle the tasks behind `keys`. Dagster-free, so it is testable alone.
    `run_prefix` (the worker-id prefix of this run) makes it wait for tasks an earlier delivery of the step holds."""
    started = time.perf_counter()
    report = RangeReport(kind.name, keys=len(keys))
    rows = rows_for_keys(queue.engine, kind, keys)
    key_of_id = {row["id"]: key for key, row in rows.items()}
    earlier = EarlierAttempt(queue, kind, key_of_id, run_prefix, worker_id) if run_prefix else None
    remaining = [row["id"] for row in rows.values() if row["status"] != "completed"]
    report.already_completed = [key for key, row in rows.items() if row["status"] == "completed"]
    batch = CLAIM_BATCH.get(kind.name, DEFAULT_CLAIM_BATCH)
    # a task whose last attempt died with its worker may be what kills workers (poison input): it is claimed
    # alone, first, so it cannot take a batch of good tasks down with it again and again
    suspects = [
        row["id"] for row in rows.values() if row["status"] != "completed" and row.get("error_class") == "worker_lost"
    ]
    isolated = set(suspects)
    logged = started
    with Heartbeat(queue, kind, worker_id) as heartbeat:
        while remaining:
            if suspects:
                tasks = queue.claim(
                    kind, worker_id, 1, only_ids=[suspects.pop(0)], override_retry_limit=override_retry_limit
                )
                if not tasks:
                    continue  # not claimable now: reported with the rest below
            else:
                others = [i for i in remaining if i not in isolated]
                tasks = queue.claim(kind, worker_id, batch, only_ids=others, override_retry_limit=override_retry_limit)
                if not tasks:
                    if earlier is not None and earlier.holds(remaining, log):
                        continue
                    break
            claimed = _process_claimed(pipeline, kind, worker_id, tasks, heartbeat, key_of_id, report)
            remaining = [i for i in remaining if i not in claimed]
            if log and remaining and time.perf_counter() - logged >= PROGRESS_EVERY_S:
                logged = time.perf_counter()
                log.info(
                    f"{kind.name}: {len(report.completed)} completed, {len(report.failed)} failed, "
                    f"{len(remaining)} left of {len(keys)}"
                )
        report.lost += [key_of_id[i] for i in heartbeat.lost if key_of_id.get(i) not in report.lost]
    _report_unclaimed(queue, kind, [key_of_id[i] for i in remaining], report)
    report.not_ready.update({k: "no such task (unknown partition key)" for k in keys if k not in rows})
    report.seconds = time.perf_counter() - started
    return report


def _process_claimed(
    pipeline: Pipeline,
    kind: TaskKind,
    worker_id: str,
    tasks: list[dict],
    heartbeat: Heartbeat,
    key_of_id: dict[str, str],
    report: RangeReport,
) -> set[str]:
    """Process claimed tasks under the heartbeat and sort their outcomes into `report`; returns the claimed ids."""
    claimed = [t["id"] for t in tasks]
    waits = {t["id"]: t.get("queue_wait_s") for t in tasks}
    heartbeat.add(claimed)
    outcomes = pipeline.process(kind, worker_id, tasks)
    for outcome in outcomes:
        if waits.get(outcome.id) is not None:
            outcome.metadata["queue_wait_s"] = round(waits[outcome.id], 3)
    heartbeat.remove(claimed)
    for outcome in outcomes:
        key = key_of_id[outcome.id]
        if outcome.rejected:
            report.lost.append(key)
        elif outcome.ok:
            report.completed[key] = outcome
        else:
            report.failed[key] = outcome
    return set(claimed)


def _report_unclaimed(queue: TaskQueue, kind: TaskKind, keys: list[str], report: RangeReport) -> None:
    """Whatever we could not claim: someone else holds it, or it is not ready (gated, backing off, out of
    retries)."""
    if not keys:
        return
    now = rows_for_keys(queue.engine, kind, keys)
    for key, row in now.items():
        if row["status"] == "completed":
            report.already_completed.append(key)
        elif row["status"] == "processing":
            report.taken_elsewhere.append(key)
        else:
            report.not_ready[key] = _why_not_ready(kind, row)


def _why_not_ready(kind: TaskKind, row: dict) -> str:
    if row["status"] == "failed" and row["retries"] >= (row["max_retries"] or 0):
        return f"failed {row['retries']} times (out of retries): {row['error']}"
    if row["status"] == "failed":
        return f"waiting for its retry back-off after: {row['error']}"
    previous = _previous_phase(kind)
    return f"waiting for its {previous.value if previous else 'parent'} phase to complete"


def _previous_phase(kind: TaskKind):
    """The phase a ready-gated task waits for: the one before its own in the default registry, else the phase of
    the kind it depends on."""
    if kind.phase in PHASES.phases:
        return PHASES.previous(kind.phase)
    return kind.depends_on.phase if kind.depends_on is not None else None


def log_materializations(context: dg.AssetExecutionContext, materializations: list[dg.AssetMaterialization]) -> None:
    """Log a run's per-partition materializations as one event batch: with DAGSTER_EVENT_BATCH_SIZE set
    (orchestration.environment sets it) the instance stores each batch with one multi-row INSERT instead of an
    INSERT and an asset-index update per key (measured: ~2.4 ms per key one by one).

    This is what Dagster does itself for the keys of a ranged Output (execute_step), through the same internal
    calls (dagster 1.13 is pinned); an asset that logs per-key truth has no public way to ask for it. Should the
    internals move, the events are logged one by one, as context.log_event would."""
    if not materializations:
        return
    try:
        from dagster._core.events import DagsterEvent, DagsterEventBatchMetadata, generate_event_batch_id

        op_context = context.op_execution_context
        step_context, logged = op_context._step_execution_context, op_context._events
    except (ImportError, AttributeError):
        for materialization in materializations:
            context.log_event(materialization)
        return
    batch_id, last = generate_event_batch_id(), len(materializations) - 1
    for index, materialization in enumerate(materializations):
        # logged (stored) here; appended so the step yields it like an event from context.log_event
        logged.append(
            DagsterEvent.asset_materialization(
                step_context, materialization, DagsterEventBatchMetadata(batch_id, index == last)
            )
        )


HEADLINE_KEYS = 3


def failure_headline(reasons: dict[str, str], counts: str) -> str:
    """The step's failure in one line a person reads first: the first keys with their reasons, then the counts
    ("wild-1a2b3c4d: empty: document has no pages (1 of 50 ocr_document tasks failed)")."""
    if not reasons:
        return counts
    named = "; ".join(f"{key}: {reason}" for key, reason in list(reasons.items())[:HEADLINE_KEYS])
    more = f"; and {len(reasons) - HEADLINE_KEYS} more" if len(reasons) > HEADLINE_KEYS else ""
    return f"{named}{more} ({counts})"


def log_failures(context: dg.AssetExecutionContext, reasons: dict[str, tuple[str | None, str, bool]]) -> None:
    """One observation per failed partition, on that partition: its error class and one-sentence reason as
    metadata, so the partition's own events say why it failed (Dagster stores no failure event of its own per
    partition here). `reasons`: key -> (error class, reason, retryable)."""
    for key, (error_class, reason, retryable) in reasons.items():
        context.log_event(
            dg.AssetObservation(
                asset_key=context.asset_key,
                partition=key,
                metadata={
                    "status": "failed",
                    "error_class": error_class or "unknown",
                    "reason": reason,
                    "retryable": retryable,
                    "run_id": context.run.run_id,
                },
            )
        )


def _fail_range(
    context: dg.AssetExecutionContext, kind: TaskKind, keys: list[str], report: RangeReport, manual: bool, summary: dict
) -> None:
    """Fail the step for the keys whose task failed (and, in a run a person launched, those not ready): each
    failed key's reason on its own partition, the first ones in the failure's headline."""
    reasons = {key: (o.error_class, o.error or "failed", o.retryable) for key, o in report.failed.items()}
    if manual:
        reasons.update({key: ("not_ready", f"not run, {why}", True) for key, why in report.not_ready.items()})
    log_failures(context, reasons)
    lines = [f"{key}: {reason}" for key, (_, reason, _) in list(reasons.items())[:40]]
    counts = f"{len(report.failed)} of {len(keys)} {kind.name} tasks failed" + (
        f", {len(report.not_ready)} not ready" if manual and report.not_ready else ""
    )
    raise dg.Failure(
        description=failure_headline({key: reason for key, (_, reason, _) in reasons.items()}, counts),
        metadata={
            **{k: v for k, v in summary.items() if k != "error_classes"},
            "errors": dg.MetadataValue.md("\n".join(f"- `{line}`" for line in lines) or "-"),
        },
        # what retrying cannot fix (corrupt, empty, encrypted, ...) is not worth retrying the run either
        allow_retries=any(retryable for _, _, retryable in reasons.values()),
    )


# when this thread's current step was handed to it, where the step runs apart from its run (a Celery worker: set by
# orchestration.celery_steps); None where the step runs in its run's process
_step_handed = threading.local()


def mark_step_handed(at: float | None) -> None:
    """Record that this thread was handed a step at `at` (time.time()); None clears it."""
    _step_handed.at = at


def measure_run_cost(context: dg.AssetExecutionContext, queue: TaskQueue, kind: TaskKind, keys: int, began: float):
    """Record what this run cost (queue_db.run_costs): the seconds from the run's start to `began`, when its work
    began, and the seconds of work since, over its `keys` keys. The run's start is when its process started it (the
    run record's start time), so the launch before it, and the run's end after its step, are not counted. A step
    handed to a Celery worker counts from its hand-over instead: the time it waited on the broker behind other
    runs' steps is the cluster's queue, not this run's fixed cost."""
    try:
        record = context.instance.get_run_record_by_id(context.run_id)
        started = record.start_time if record is not None else None
        if started is None:
            return
        overhead_s = seconds_before_work(began, started, getattr(_step_handed, "at", None))
        record_run_cost(queue.engine, kind.name, keys=keys, work_s=time.time() - began, overhead_s=overhead_s)
    except Exception as exc:  # noqa: BLE001  (a figure not recorded costs the next runs their size, not this run)
        context.log.warning(f"run cost of {kind.name} not recorded: {type(exc).__name__}: {exc}")


def materialize_range(context: dg.AssetExecutionContext, kind: TaskKind, queue: TaskQueue, pipeline, after=None):
    """The body every task asset shares. `pipeline` processes claimed tasks (`process(kind, worker_id, tasks)`:
    a Pipeline, or assets.handlers.HandledTasks); `after(report)` runs once the tasks are settled (register
    children)."""
    began = time.time()
    keys = list(context.partition_keys)
    manual = is_manual_run(dict(context.run.tags))
    tag_launched_run(context, kind.name, kind.phase.name, kind.level.value)
    run_prefix = f"run:{context.run.run_id}:"
    worker_id = make_worker_id(run_prefix[:-1])
    report = process_keys(
        queue, pipeline, kind, keys, worker_id, override_retry_limit=manual, log=context.log, run_prefix=run_prefix
    )
    if after is not None:
        after(report)
    asset_key = context.asset_key
    materializations = [
        dg.AssetMaterialization(asset_key=asset_key, partition=key, metadata=outcome.metadata)
        for key, outcome in report.completed.items()
    ]
    failing = bool(report.failed) or (manual and bool(report.not_ready))
    if failing or manual:
        # a completed task is materialized truth; do not let this run's failure mark it failed
        materializations += [
            dg.AssetMaterialization(asset_key=asset_key, partition=key, metadata={"note": "task already completed"})
            for key in report.already_completed
        ]
    log_materializations(context, materializations)
    summary = {
        "keys": len(keys),
        "completed": len(report.completed),
        "failed": len(report.failed),
        "already_completed": len(report.already_completed),
        "not_ready": len(report.not_ready),
        "taken_elsewhere": len(report.taken_elsewhere),
        "lost_to_recovery": len(report.lost),
        "seconds": round(report.seconds, 2),
        "error_classes": dict(Counter(o.error_class for o in report.failed.values())),
    }
    context.log.info(f"{kind.name} range {keys[0]} .. {keys[-1]}: {summary}")
    # the tasks this run settled: keys another run took, or found completed, cost it nothing
    measure_run_cost(context, queue, kind, len(report.completed) + len(report.failed), began)
    if failing:
        # a failed batch's summary goes with its failure (the step's failure event carries it), not as an
        # observation the UI would show like any other
        _fail_range(context, kind, keys, report, manual, summary)
    # one observation per batch that did not fail: the UI plots these over time (throughput, queue wait)
    waits = [
        o.metadata["queue_wait_s"]
        for o in (*report.completed.values(), *report.failed.values())
        if "queue_wait_s" in o.metadata
    ]
    settled = len(report.completed) + len(report.failed)
    context.log_event(
        dg.AssetObservation(
            asset_key=asset_key,
            metadata={
                **{k: v for k, v in summary.items() if k != "error_classes"},
                "tasks_per_second": round(settled / report.seconds, 3) if report.seconds else 0.0,
                "queue_wait_median_s": round(sorted(waits)[len(waits) // 2], 3) if waits else 0.0,
                "error_classes": dg.MetadataValue.json(summary["error_classes"]),
            },
        )
    )
    if False:  # pragma: no cover - makes this a generator so output_required=False applies
        yield
