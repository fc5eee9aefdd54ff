"""What bench/faults.py and tests/reliability/test_database_faults.py share: an own PostgreSQL, queue workers and
sensors in processes of their own (each under an application_name, so a fault finds its connections), the fault
injectors, and the counts that say whether work was lost or done twice.

A worker is the loop a ranged run runs: `TaskQueue.settle` (complete the batch in hand, claim the next, one
transaction) with a `Heartbeat` thread beside it; every `run_batches` batches it ends its "run" and drops its
connections, as a run's process does, so the next run needs new ones. The sensors are the code location's own
(`vector_document_rollup` roll-up and inbox), evaluated as the daemon evaluates them, against an ephemeral instance.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import psycopg  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from queue_db.config import QueueSettings  # noqa: E402
from queue_db.heartbeat import Heartbeat  # noqa: E402
from queue_db.phases import VECTOR_CHUNK  # noqa: E402
from queue_db.queue import TaskQueue, create_queue_engine, make_worker_id  # noqa: E402

SENSOR_APP = "faults-sensor"
READY_TIMEOUT_S = 180.0
RUN_START_S = 0.5  # between two runs of a worker: a run's process starting (Dagster takes longer)
# what each kind of backend is busy with when pg_stat_activity catches it (the hot path's statements)
MOMENTS = {
    "claim": "%SKIP LOCKED%",
    "completion": "%jsonb_to_recordset%",
    "bubble-up": "%docqueue_after_%",
    "heartbeat": "%WITH mine AS%",
}


def free_port(start: int) -> int:
    for port in range(start, start + 500):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port")


class OwnServer:
    """An embedded PostgreSQL of the fault run's own: killing its backends and filling its connection slots
    disturbs nobody else. Not under a test's 0700 tmp dir: the server may run as its own user."""

    def __init__(self, max_connections: int, port_from: int = 56300):
        from queue_db.embedded_postgres import EmbeddedPostgres

        self.home = Path(tempfile.mkdtemp(prefix="docqueue-faults-pg-"))
        self.max_connections = max_connections
        self.server = EmbeddedPostgres(
            self.home, port=free_port(port_from), extra_settings={"max_connections": str(max_connections)}
        )
        self.server.ensure_running()
        self.admin_url = f"postgresql://postgres@127.0.0.1:{self.server.port}/postgres"

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.server.port}/{database}"

    def create(self, name: str, template: str | None = None) -> str:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            for attempt in range(10):
                try:
                    conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
                    break
                except psycopg.errors.ObjectInUse:  # autovacuum still on the template
                    time.sleep(0.2 * (attempt + 1))
        return self.url(name)

    def stop(self) -> None:
        self.server.stop(mode="immediate")
        shutil.rmtree(self.home, ignore_errors=True)


def with_app(url: str, app: str) -> str:
    return make_url(url).update_query_dict({"application_name": app}).render_as_string(hide_password=False)


def seed(server: OwnServer, tasks: int, name: str = "faults_template") -> str:
    """A migrated database with `tasks` chunk tasks waiting for the vector phase, vacuumed, as a template."""
    from bench.queue_throughput import Layout, seed_ours

    url = server.create(name)
    seed_ours(url, Layout.for_tasks(tasks))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE)")
    return name


# ---------------------------------------------------------------------------------------------------- workers
@dataclass
class WorkerReport:
    app: str
    settles: list[float] = field(default_factory=list)  # monotonic times of committed settles
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (time, tasks completed)
    applied: list[str] = field(default_factory=list)
    rejected: int = 0
    runs: int = 0
    beats: int = 0  # heartbeats that reached the database
    errors: list[str] = field(default_factory=list)  # what escaped the queue's own retries
    log_lines: list[str] = field(default_factory=list)  # the queue's warnings (connection waits)
    ledger: object = None  # the file of completed ids, when the worker may be killed

    def __getstate__(self) -> dict:
        return {**self.__dict__, "ledger": None}


class _Lines(logging.Handler):
    def __init__(self, into: list[str]):
        super().__init__(logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage() + (" [with traceback]" if record.exc_info else ""))


def worker_loop(
    url: str,
    app: str,
    batch: int,
    stop,
    settings: QueueSettings,
    run_batches: int = 0,
    ready=None,
    work_s: float = 0.0,
    ledger: str | None = None,
) -> WorkerReport:
    report = WorkerReport(app)
    report.ledger = open(ledger, "a") if ledger else None
    logging.getLogger("queue_db").addHandler(_Lines(report.log_lines))
    if ready is not None:
        ready.wait(READY_TIMEOUT_S)
    while not stop.is_set():
        queue = TaskQueue(create_queue_engine(with_app(url, app), pool_size=2, max_overflow=2), settings)
        report.runs += 1
        try:
            _one_run(queue, batch, stop, run_batches, report, work_s)
        finally:
            queue.engine.dispose()  # the run's process ends: its connections go
        if run_batches:
            stop.wait(RUN_START_S)  # the next run's process starts
    return report


def _one_run(queue: TaskQueue, batch: int, stop, run_batches: int, report: WorkerReport, work_s: float) -> None:
    worker, held, batches = make_worker_id("faults"), [], 0
    with Heartbeat(queue, VECTOR_CHUNK, worker) as heartbeat:
        while True:
            ending = stop.is_set() or (run_batches and batches >= run_batches)
            try:
                result = queue.settle(VECTOR_CHUNK, worker, completed=held, claim=0 if ending else batch)
            except Exception as exc:  # a worker would crash here: counted, and its tasks left to recovery
                report.errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                heartbeat.remove(held)
                report.beats += heartbeat.beats
                return
            now = time.monotonic()
            heartbeat.remove(held)
            report.settles.append(now)
            report.applied += result.completed.applied
            if report.ledger and result.completed.applied:  # survives a SIGKILL: what this worker completed
                report.ledger.write("".join(f"{i}\n" for i in result.completed.applied))
                report.ledger.flush()
            report.rejected += len(result.completed.rejected)
            if result.completed.applied:
                report.timeline.append((now, len(result.completed.applied)))
            held = [row["id"] for row in result.claimed]
            heartbeat.add(held)
            batches += 1
            if ending:
                report.beats += heartbeat.beats
                return
            if not held:
                time.sleep(0.1)
            elif work_s:
                time.sleep(work_s)  # the batch's own work, while the heartbeat thread keeps the tasks


def _worker_process(url, app, batch, stop, settings, run_batches, ready, work_s, results, ledger=None) -> None:
    try:
        results.put(worker_loop(url, app, batch, stop, settings, run_batches, ready, work_s, ledger))
    except BaseException as exc:  # the parent must learn of it rather than wait
        if ready is not None:
            ready.abort()
        report = WorkerReport(app, errors=[f"{type(exc).__name__}: {exc}"])
        results.put(report)


# ---------------------------------------------------------------------------------------------------- sensors
@dataclass
class SensorReport:
    ticks: list[float] = field(default_factory=list)  # monotonic times of ticks that read the queue
    skipped_unavailable: list[str] = field(default_factory=list)  # one-sentence skips: the database was away
    errors: list[str] = field(default_factory=list)  # ticks that raised (a traceback in the daemon)
    log_lines: list[str] = field(default_factory=list)  # the queue's warnings (connection waits)


def sensor_loop(url: str, home: Path, stop, interval_s: float, fresh_connections: bool, ready=None) -> SensorReport:
    """The vector roll-up sensor and the inbox sensor, ticked as the daemon ticks them."""
    import dagster as dg

    from orchestration.sensors import inbox_sensor, phase_sensors
    from queue_db.config import Settings
    from queue_db.phases import PHASES
    from resources.database import DatabaseResource, shared_engine
    from resources.storage_resource import StorageResource

    inbox = home / "inbox"
    inbox.mkdir(parents=True, exist_ok=True)
    os.environ.update({"DOCQUEUE_HOME": str(home), "DOCQUEUE_INBOX": str(inbox)})
    settings = Settings.from_env()
    sensors = [s for s in phase_sensors(settings, PHASES) if s.name == "rollup_vector_sensor"]
    if not sensors:  # a renamed sensor would otherwise leave only the inbox's ticking, unnoticed
        raise RuntimeError("the code location has no rollup_vector_sensor to evaluate")
    sensors.append(inbox_sensor(settings))
    instance = dg.DagsterInstance.ephemeral()
    sensor_url = with_app(url, SENSOR_APP)
    resources = {"database": DatabaseResource(url=sensor_url), "storage": StorageResource.from_settings(settings)}
    report = SensorReport()
    logging.getLogger("queue_db").addHandler(_Lines(report.log_lines))
    if ready is not None:
        ready.wait(READY_TIMEOUT_S)
    while not stop.is_set():
        for sensor in sensors:
            try:
                result = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, resources=resources))
            except Exception as exc:
                report.errors.append(f"{sensor.name}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                continue
            skip = result.skip_message or ""
            if "unavailable" in skip:
                report.skipped_unavailable.append(skip)
            else:
                report.ticks.append(time.monotonic())
        if fresh_connections:  # a code server restarted between ticks: no pooled connection to fall back on
            shared_engine(sensor_url).dispose()
        stop.wait(interval_s)
    instance.dispose()
    return report


def _sensor_process(url, home, stop, interval_s, fresh_connections, ready, results) -> None:
    try:
        results.put(sensor_loop(url, Path(home), stop, interval_s, fresh_connections, ready))
    except BaseException as exc:
        if ready is not None:
            ready.abort()
        results.put(SensorReport(errors=[f"sensor process: {type(exc).__name__}: {exc}"]))


# ---------------------------------------------------------------------------------------------------- a fleet
class Fleet:
    """`workers` worker processes and (optionally) a sensor process on one database, started together."""

    def __init__(
        self,
        url: str,
        workers: int,
        batch: int,
        settings: QueueSettings,
        *,
        sensors_home: Path | None = None,
        run_batches: int = 0,
        sensor_interval_s: float = 0.3,
        fresh_sensor_connections: bool = False,
        work_s: float = 0.0,
        ledgers: Path | None = None,
    ):
        # forked: the children start with the parent's imports (Dagster's among them); the parent opens its own
        # connections only after the fleet started, so no child inherits one
        context = mp.get_context("fork")
        self.context, self.ledgers, self.killed = context, ledgers, 0
        self.worker_args = (url, batch, settings, run_batches, work_s)
        self.stop, self.results = context.Event(), context.Queue()
        self.ready = context.Barrier(workers + (sensors_home is not None) + 1)
        self.apps = [f"faults-w{i}" for i in range(workers)]
        self.processes = [
            context.Process(
                target=_worker_process,
                args=(
                    url,
                    app,
                    batch,
                    self.stop,
                    settings,
                    run_batches,
                    self.ready,
                    work_s,
                    self.results,
                    self._ledger(app),
                ),
                daemon=True,
            )
            for app in self.apps
        ]
        if sensors_home is not None:
            self.processes.append(
                context.Process(
                    target=_sensor_process,
                    args=(
                        url,
                        str(sensors_home),
                        self.stop,
                        sensor_interval_s,
                        fresh_sensor_connections,
                        self.ready,
                        self.results,
                    ),
                    daemon=True,
                )
            )
        for process in self.processes:
            process.start()
        try:
            self.ready.wait(READY_TIMEOUT_S)  # every process imported and started: the clock starts now
        except threading.BrokenBarrierError:
            workers_, sensors_ = self.finish(timeout_s=10)
            errors = [e for r in workers_ for e in r.errors] + (sensors_.errors if sensors_ else [])
            raise RuntimeError(f"the fleet did not start: {errors or 'a process did not report in time'}") from None
        self.started = time.monotonic()

    def _ledger(self, app: str) -> str | None:
        return str(self.ledgers / f"{app}-{len(list(self.ledgers.iterdir()))}.ids") if self.ledgers else None

    def kill_worker(self, rng: random.Random) -> None:
        """SIGKILL one worker at whatever it is doing, and start another in its place (as a run's retry does)."""
        index = rng.randrange(len(self.apps))
        victim = self.processes[index]
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(timeout=10)
        self.killed += 1
        url, batch, settings, run_batches, work_s = self.worker_args
        app = self.apps[index]
        replacement = self.context.Process(
            target=_worker_process,
            args=(url, app, batch, self.stop, settings, run_batches, None, work_s, self.results, self._ledger(app)),
            daemon=True,
        )
        replacement.start()
        self.processes[index] = replacement

    def finish(self, timeout_s: float = 120.0) -> tuple[list[WorkerReport], SensorReport | None]:
        self.stop.set()
        reports: list = []
        deadline = time.monotonic() + timeout_s
        while len(reports) < len(self.processes) and time.monotonic() < deadline:
            try:
                reports.append(self.results.get(timeout=max(0.1, deadline - time.monotonic())))
            except Exception:
                break
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
        workers = [r for r in reports if isinstance(r, WorkerReport)]
        sensors = next((r for r in reports if isinstance(r, SensorReport)), None)
        missing = len(self.processes) - len(reports)
        if missing:
            workers.append(WorkerReport("lost", errors=[f"{missing} process(es) never reported"]))
        return workers, sensors


def completed_between(reports: list[WorkerReport], start: float, end: float) -> int:
    return sum(n for r in reports for t, n in r.timeline if start <= t < end)


def rate(reports: list[WorkerReport], start: float, end: float) -> float:
    return round(completed_between(reports, start, end) / max(1e-6, end - start), 1)


def recovered_after(reports: list[WorkerReport], since: float, clean_rate: float, share: float = 0.8) -> float | None:
    """Seconds from `since` until a 1 s window's completions first reach `share` of the clean rate."""
    events = sorted((t, n) for r in reports for t, n in r.timeline if t >= since)
    for i, (t, _) in enumerate(events):
        window = sum(n for u, n in events[i:] if u < t + 1.0)
        if window >= share * clean_rate:
            return round(t - since, 2)
    return None


# ---------------------------------------------------------------------------------------------------- injectors
@dataclass
class Kill:
    at: float
    moment: str
    app: str
    query: str


def kill_one(conn: psycopg.Connection, moment: str, datname: str, timeout_s: float) -> Kill | None:
    """Terminate one backend of the fleet caught at `moment` (a worker statement, or any sensor connection),
    polling pg_stat_activity until one is; None when none was caught within `timeout_s`."""
    if moment == "sensor":
        where, params = "application_name = %(app)s", {"app": SENSOR_APP}
    else:
        where = "application_name LIKE 'faults-w%%' AND state = 'active' AND query ILIKE %(pattern)s"
        params = {"pattern": MOMENTS[moment]}
    sql = (
        "SELECT application_name, left(query, 80), pg_terminate_backend(pid) FROM pg_stat_activity "
        f"WHERE datname = %(db)s AND pid <> pg_backend_pid() AND {where} LIMIT 1"
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        row = conn.execute(sql, {**params, "db": datname}).fetchone()
        if row and row[2]:
            return Kill(time.monotonic(), moment, row[0], " ".join(row[1].split()))
        time.sleep(0.002)
    return None


def kill_schedule(count: int, rng: random.Random) -> list[str]:
    moments = [*MOMENTS, "sensor"]
    plan = [moments[i % len(moments)] for i in range(count)]
    rng.shuffle(plan)
    return plan


class SlotHolder:
    """Another client taking every connection slot the server has left (superuser-reserved ones included)."""

    def __init__(self, url: str, limit: int):
        self.url, self.limit = url, limit
        self.connections: list[psycopg.Connection] = []

    def take_all(self) -> int:
        while len(self.connections) < self.limit:
            try:
                self.connections.append(psycopg.connect(self.url, connect_timeout=5))
            except psycopg.OperationalError:
                break
        return len(self.connections)

    def release(self) -> None:
        for conn in self.connections:
            conn.close()
        self.connections.clear()


def queue_check(url: str, reports: list[WorkerReport], settings: QueueSettings) -> dict:
    """After the fleet stopped: release what dead attempts left (as the recovery job does), then count the work
    lost (a completion the worker was told applied that the database does not hold; a task left processing or
    failed), done twice (a task completed by two settles), and the roll-ups left wrong (parents that disagree with
    their children; what reconcile() had to correct)."""
    from bench.queue_throughput import rollup_mismatches

    queue = TaskQueue(create_queue_engine(url, pool_size=1, max_overflow=1), settings)
    try:
        released = sum(queue.recover_stale(stale_after_s=0).values())
        applied = [i for r in reports for i in r.applied]
        with psycopg.connect(url) as conn:
            completed = {
                str(r[0]) for r in conn.execute("SELECT id FROM task_queue_chunk WHERE vector_status = 'completed'")
            }
            stuck = conn.execute(
                "SELECT count(*) FROM task_queue_chunk WHERE vector_status IN ('processing', 'failed')"
            ).fetchone()[0]
        mismatches = rollup_mismatches(url)
        corrections = len(queue.reconcile())
    finally:
        queue.engine.dispose()
    return {
        "completed": len(completed),
        "tasks_lost": len(set(applied) - completed) + int(stuck),
        "completed_twice": len(applied) - len(set(applied)),
        "completed_unreported": len(completed - set(applied)),
        "fenced_rejected": sum(r.rejected for r in reports),
        "released_by_recovery": released,
        "rollup_mismatches": mismatches,
        "reconcile_corrections": corrections,
    }


class TaskQueueHandle:
    """The recovery job's side of a fault run: releases stale tasks, as the recovery sensor's runs do."""

    def __init__(self, url: str, settings: QueueSettings):
        self.queue = TaskQueue(create_queue_engine(url, pool_size=1, max_overflow=1), settings)
        self.released = self.calls = 0

    def recover(self) -> None:
        self.released += sum(self.queue.recover_stale().values())
        self.calls += 1

    def close(self) -> None:
        self.queue.engine.dispose()


# ---------------------------------------------------------------------------------------------------- skewed clocks
LIBFAKETIME_GLOB = "/usr/lib/*/faketime/libfaketime.so.1"


def libfaketime() -> Path | None:
    """Debian's libfaketime (`apt-get install libfaketime`), or None when it is not installed."""
    found = sorted(Path("/").glob(LIBFAKETIME_GLOB.lstrip("/")))
    return found[0] if found else None


class SkewedProcess:
    """A queue process (bench/_skewed.py) whose wall clock runs `skew_s` seconds off the machine's, under
    libfaketime. Its monotonic clock is left alone (FAKETIME_DONT_FAKE_MONOTONIC=1): with it faked, Python's timed
    waits never return and a heartbeat thread never beats; left alone, it is the machine's, so the times the
    process reports line up with the parent's. File times are left alone too (NO_FAKE_STAT=1), so the byte-code
    caches the normal processes wrote stay valid."""

    def __init__(self, skew_s: int, spec: dict, home: Path):
        library = libfaketime()
        if library is None:
            raise RuntimeError(f"no libfaketime at {LIBFAKETIME_GLOB}: install Debian's `libfaketime` package")
        self.skew_s, self.spec = skew_s, spec
        env = {
            **os.environ,
            "LD_PRELOAD": str(library),
            "FAKETIME": f"{skew_s:+d}",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "NO_FAKE_STAT": "1",
            "PYTHONPATH": str(REPO),
        }
        home.mkdir(parents=True, exist_ok=True)
        self.stderr_path = home / f"skewed-{spec['mode']}-{skew_s:+d}-{id(self)}.log"
        self._stderr = open(self.stderr_path, "w")
        self.process = subprocess.Popen(
            [sys.executable, str(REPO / "bench" / "_skewed.py"), json.dumps(spec)],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self.ready: dict = {}

    def wait_ready(self) -> dict:
        """Its first line: its wall clock against the database's (`wall_skew_s`), and its monotonic clock's
        distance from this process's (`monotonic_offset_s`, ~0 when the two clocks are one)."""
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the skewed {self.spec['mode']} process did not start: {self.stderr_tail()}")
        self.ready = json.loads(line)
        self.ready["monotonic_offset_s"] = round(self.ready["monotonic"] - time.monotonic(), 3)
        return self.ready

    def go(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def finish(self, timeout_s: float = 120.0) -> dict:
        """Tell it to stop and return its report; {"errors": [...]} when it has none. The stop is a line, not the
        end of its input: a worker forked after it started holds a copy of the pipe's end."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write("stop\n")
            self.process.stdin.flush()
        except OSError:  # it ended already; its report, if any, is in its output
            pass
        try:
            out, _ = self.process.communicate(timeout=timeout_s)
        except Exception:
            self.process.kill()
            out, _ = self.process.communicate()
        finally:
            self._stderr.close()
        for line in reversed(out.splitlines()):
            if line.startswith('{"report"'):
                return json.loads(line)["report"]
        return {
            "errors": [f"skewed {self.spec['mode']} process (exit {self.process.returncode}): {self.stderr_tail()}"]
        }

    def stderr_tail(self) -> str:
        if not self._stderr.closed:
            self._stderr.flush()
        lines = [line for line in self.stderr_path.read_text().splitlines() if line.strip()]
        return " | ".join(lines[-3:])[-600:]
