"""`docqueue run`: process ready work through the Dagster definitions, in-process, until idle.

The same planning the sensors use picks ranged runs; each is executed in this process with
`execute_in_process` against the real instance, so every materialization lands in the Dagster event log and the
UI shows it. Several workers split the registration blocks between them (block id modulo the worker count).
"""

from __future__ import annotations

import getpass
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import dagster as dg
import sqlalchemy as sa

from orchestration.assets.rollups import rollup_run_name
from orchestration.idle_cores import has_an_idle_core
from orchestration.jobs import job_name
from orchestration.maintenance import index_vector_tail as build_vector_tail
from orchestration.partitions import register_partitions
from orchestration.planning import (
    IN_FLIGHT_STATUSES,
    SETTLE_LIMIT,
    PlannedRun,
    RunSizing,
    in_flight_by_name,
    plan_help_run,
    plan_rollup_runs,
    plan_runs,
)
from queue_db.config import QueueConfig, Settings
from queue_db.inspection import outlook
from queue_db.partition_keys import BlockShare, settle_known_failures
from queue_db.phases import PHASES, Level, PhaseRegistry
from queue_db.progress_signal import ProgressListener, announce
from queue_db.queue import TaskQueue
from queue_db.run_costs import least_keys, run_costs
from queue_db.run_scope import still_unfinished
from queue_db.service_config import DagsterConfig
from resources.folder_lock import QdrantStorageBusy
from resources.ports import VectorStoreError
from resources.vector_resource import QdrantResource

log = logging.getLogger(__name__)
# the runs' events (failures included) go to the Dagster instance, where the UI shows them
QUIET_CONSOLE = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
# host:pid:start-time of the `docqueue run` process executing an in-process run: nobody else can end such a run
# if that process dies, and the tag's presence marks the run as automated rather than a person's
RUNNER_TAG = "docqueue/runner"
# the runner as a person reads it ("vm, pid 13306"); RUNNER_TAG stays, as what fail_abandoned_runs reads
PROCESS_TAG = "docqueue/process"
# the UI's "Launched by" column reads Dagster's `user` tag: a CLI run says so instead of "Manually launched"
LAUNCHER_TAG = "user"


def _launcher() -> str:
    try:
        return f"{getpass.getuser()} (docqueue run)"
    except (KeyError, OSError):  # no name for this uid (a bare container)
        return "docqueue run"


LAUNCHER = _launcher()
LOG_LEVELS = ("debug", "info", "warning", "error")
# the loggers `--log-level` sets: docqueue's own packages and Dagster's
LEVELLED_LOGGERS = ("orchestration", "queue_db", "resources", "processing", "dagster")


def apply_log_level(level: str) -> None:
    """`docqueue run --log-level`: docqueue's and Dagster's records at `level` and above go to stderr; other
    libraries (Dagster's storage migrations, HTTP clients) keep to warnings unless the level is higher."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(max(logging.WARNING, logging.getLevelName(level.upper())))
    for name in LEVELLED_LOGGERS:
        logging.getLogger(name).setLevel(level.upper())


def run_config(log_level: str | None) -> dict:
    """Without a log level, a run's console stays quiet (its events are in the instance); with one, the run's
    Dagster console logger shows that level and above."""
    if log_level is None:
        return QUIET_CONSOLE
    return {"loggers": {"console": {"config": {"log_level": log_level.upper()}}}}


@dataclass
class RunnerReport:
    runs: int = 0
    failed_runs: int = 0
    seconds: float = 0.0
    runs_by_name: dict = field(default_factory=dict)


_HAS_PROC = Path("/proc/self/stat").exists()


def _start_time(pid: int) -> str | None:
    """Kernel start time of a live process (None when gone or a zombie): with the pid, a process identity that
    survives pid reuse. Without /proc only liveness is known ("?")."""
    if not _HAS_PROC:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "?"
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def this_process() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid())}"


def process_text() -> str:
    return f"{socket.gethostname()}, pid {os.getpid()}"


def _process_gone(identity: str) -> bool:
    host, _, rest = identity.partition(":")
    pid, _, started = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False  # another machine's process: only its heartbeats can tell
    now = _start_time(int(pid))
    return now is None or (now != "?" and started != "?" and now != started)


def fail_abandoned_runs(instance: dg.DagsterInstance, between_runs: bool = False) -> int:
    """Mark failed the in-process runs whose `docqueue run` process died (SIGKILL, OOM, power cut): they stay
    STARTED forever otherwise, and planning treats their ranges as in flight, so their tasks, once recovered,
    would never be planned again. `between_runs`: this process executes nothing right now, so a run of its own
    still in flight was abandoned too (its execution raised before the run's end could be recorded)."""
    me = this_process()
    failed = 0
    for run in instance.get_runs(filters=dg.RunsFilter(statuses=IN_FLIGHT_STATUSES)):
        owner = run.tags.get(RUNNER_TAG)
        # a re-execution inherits its parent's tags but runs elsewhere: not ours to judge
        if (
            owner
            and "dagster/parent_run_id" not in run.tags
            and ((between_runs and owner == me) or _process_gone(owner))
        ):
            # the queue re-runs the tasks (stale recovery); a Dagster re-execution would only compete with it
            instance.add_run_tags(run.run_id, {"dagster/will_retry": "false"})
            instance.report_run_failed(
                run,
                f"abandoned: the docqueue run process executing it ({owner}) died or "
                "lost its database mid-run; the queue re-runs its tasks",
            )
            failed += 1
    return failed


def plan_next(
    queue: TaskQueue,
    instance: dg.DagsterInstance,
    share: BlockShare | None = None,
    documents: Sequence[str] | None = None,
    *,
    dagster: DagsterConfig,
    phases: PhaseRegistry = PHASES,
    slots: int = 1,
    may_help: Callable[[], bool] = has_an_idle_core,
) -> list[PlannedRun]:
    """One planning round over every kind in phase order, then the roll-ups. Called between runs only.
    `documents`: only these documents' tasks and roll-ups are planned (`docqueue run --max-docs`); `dagster`: the
    settings of the runs' sizes (DOCQUEUE_RUN_MAX_KEYS_<KIND>, DOCQUEUE_RUN_OVERHEAD_SHARE); `slots`: runs of a kind
    the caller keeps going at once (a runner runs one at a time; its siblings plan their own shares). `share`: this
    runner's blocks under `run --workers N`; a runner with nothing of its own to run helps a sibling's run in flight
    (plan_help_run) when `may_help()` says a core is idle for it (orchestration.idle_cores)."""
    fail_abandoned_runs(instance, between_runs=True)
    planned: list[PlannedRun] = []
    for level in Level:
        register_partitions(instance, queue.engine, level)
    # every kind's and roll-up's runs in flight, in one read: a kind's planning skips their ranges, its phase's
    # roll-ups wait on them
    names = [kind.name for spec in phases for kind in spec.kinds] + [rollup_run_name(spec) for spec in phases]
    found = in_flight_by_name(instance, names)
    in_flight = {name: found.get(name, {}) for name in names}
    costs = run_costs(queue.engine)
    for spec in phases:
        for kind in spec.kinds:
            planned += plan_runs(
                queue.engine,
                kind,
                in_flight=in_flight[kind.name],
                max_keys=dagster.max_keys_per_run(kind.name),
                max_runs=4,
                share=share,
                documents=documents,
                sizing=RunSizing(costs.get(kind.name), dagster.run_overhead_share, slots),
            )
    for spec in phases:
        # a failure the roll-up already shows needs no roll-up run (the sensors do the same)
        settle_known_failures(queue.engine, spec, SETTLE_LIMIT, phases=phases)
        kinds = {kind.name for kind in spec.kinds}
        busy = dagster.rollup_hold_s > 0 and (
            any(run.name in kinds for run in planned) or any(in_flight[name] for name in kinds)
        )
        planned += plan_rollup_runs(
            queue.engine,
            spec,
            phases=phases,
            in_flight=in_flight[rollup_run_name(spec)],
            max_runs=4,
            share=share,
            documents=documents,
            phase_busy=busy,
            hold_s=dagster.rollup_hold_s,
        )
    if share is not None and not planned and any(in_flight.values()) and may_help():
        # nothing of its own: take half of what a sibling's run still has, the earliest phase's first
        for spec in phases:
            for kind in spec.kinds:
                helping = plan_help_run(
                    queue.engine,
                    kind,
                    in_flight[kind.name],
                    max_keys=dagster.max_keys_per_run(kind.name),
                    least=least_keys(costs.get(kind.name)),
                    documents=documents,
                )
                if helping is not None:
                    return [helping]
    return planned


def execute(defs: dg.Definitions, instance: dg.DagsterInstance, run: PlannedRun, log_level: str | None = None) -> bool:
    job = defs.resolve_job_def(job_name(run.name))
    result = job.execute_in_process(
        instance=instance,
        tags={**run.tags, RUNNER_TAG: this_process(), PROCESS_TAG: process_text(), LAUNCHER_TAG: LAUNCHER},
        raise_on_error=False,
        run_config=run_config(log_level),
    )
    return result.success


# the handler whose deepest kind writes the vector store: its runs are followed by an index build of the tail
VECTOR_HANDLER = "vector"


def index_vector_tail(settings: Settings) -> bool:
    """What a recovery run does under the daemon, done here after each vector run, since `docqueue run` has
    no sensors (orchestration.maintenance.index_vector_tail). A store that is busy or unusable is left for the
    next time."""
    try:
        store = QdrantResource.from_settings(settings)
        return build_vector_tail(store, settings.embedding.model, settings.vector.index_tail)["built"]
    except (QdrantStorageBusy, VectorStoreError) as exc:
        log.warning("vector index build left for later: %s", exc)
        return False


class _Outage:
    """A database that stops answering (restart, failover) pauses the runner instead of ending it; only an
    outage longer than DOCQUEUE_DB_OUTAGE_MAX_S (default 300 s) is given up on."""

    def __init__(self, limit_s: float):
        self.since: float | None = None
        self.limit_s = limit_s

    def wait_or_raise(self, exc: Exception) -> None:
        transient = isinstance(exc, sa.exc.OperationalError) or getattr(exc, "connection_invalidated", False)
        self.since = self.since or time.monotonic()
        if not transient or time.monotonic() - self.since > self.limit_s:
            raise exc
        log.warning("database unavailable (%s); retrying", type(getattr(exc, "orig", exc)).__name__)
        time.sleep(min(5.0, 0.5 + (time.monotonic() - self.since) / 4))

    def over(self) -> None:
        self.since = None


def run_until_idle(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    queue: TaskQueue,
    *,
    settings: Settings,
    phases: PhaseRegistry = PHASES,
    until_idle: bool = True,
    worker_index: int = 0,
    workers: int = 1,
    poll_s: float | None = None,
    max_seconds: float | None = None,
    on_run: Callable[[PlannedRun, bool], None] | None = None,
    documents: Sequence[str] | None = None,
    log_level: str | None = None,
    listener: ProgressListener | None = None,
) -> RunnerReport:
    """Plan and execute runs until idle (or forever); `poll_s` (default WORKER_POLL_INTERVAL) is the wait when
    nothing is ready and no retry is due. With TASK_QUEUE_ENABLED=false it returns at once, touching nothing.
    `documents`: work on these documents only, and return once none of them can make progress. `defs` are the
    definitions built from `settings` and `phases` (code_location.build_definitions). Each run's end is announced
    (queue_db.progress_signal), and a wait ends early at another runner's announcement; `listener` is the caller's
    when it waits between calls too (one connection for both), else the call opens its own."""
    report = RunnerReport()
    if not settings.queue.enabled:
        log.warning(QueueConfig.disabled_reason)
        return report
    poll_s = queue.settings.poll_interval_s if poll_s is None else poll_s
    started = time.monotonic()
    share = BlockShare(workers, worker_index) if workers > 1 else None
    outage = _Outage(settings.queue.db_outage_max_s)
    vector_kinds = {spec.leaf.name for spec in phases if spec.handler == VECTOR_HANDLER}
    own_listener = listener is None
    listener = listener or ProgressListener(queue.engine)
    try:
        while True:
            if max_seconds is not None and time.monotonic() - started > max_seconds:
                break
            try:
                planned = plan_next(queue, instance, share, documents, dagster=settings.dagster, phases=phases)
                for run in planned:
                    ok = execute(defs, instance, run, log_level)
                    report.runs += 1
                    report.failed_runs += 0 if ok else 1
                    report.runs_by_name[run.name] = report.runs_by_name.get(run.name, 0) + 1
                    if on_run:
                        on_run(run, ok)
                    if run.name in vector_kinds:
                        index_vector_tail(settings)
                    announce(queue.engine)
                if planned:
                    continue
                now = outlook(queue.engine, phases.kinds)
                # tasks of a worker that died are released here too: without a daemon nobody else would
                if now.held and sum(queue.recover_stale().values()):
                    continue
                # the chosen documents end the run once none can progress, whatever other documents are doing
                unfinished = None if documents is None else still_unfinished(queue.engine, documents)
                # a back-off that ran out after this round's planning is neither planned nor waited for: plan again
                ready_now = (
                    unfinished is None and not now.held and now.next_retry_in_s is None and any(now.ready.values())
                )
            except sa.exc.DBAPIError as exc:
                outage.wait_or_raise(exc)
                continue
            outage.over()
            if unfinished == 0 or (unfinished is None and until_idle and now.settled):
                break
            delay = poll_s if now.next_retry_in_s is None else min(max(now.next_retry_in_s, 0.2), 30.0)
            delay = 0.2 if ready_now else delay
            listener.wait(delay)
    finally:
        if own_listener:
            listener.close()
    report.seconds = time.monotonic() - started
    return report
