"""The fault matrix: each row injects one fault a PostgreSQL queue meets in production into a running fleet of
queue workers (and the code location's sensors), then counts what was lost or done twice, how long recovery took,
and the throughput during and after the fault against a clean run of the same fleet in the same invocation.

  1 backend-kill    pg_terminate_backend on the workers' and sensors' connections, --kills times (20), each caught
                    mid-claim, mid-completion, mid-bubble-up, mid-heartbeat or on a sensor's connection
  2 connections     another client holds every connection slot for --hold-s seconds (60) while workers end and
                    start runs (new connections), the sensors tick on fresh connections and `docqueue status` runs
  3 idle-in-tx      a session holds a REPEATABLE READ snapshot while --idle-tasks tasks (100,000) flow; dead tuples
                    in the queue tables, and how long they take to go after the snapshot is released
  4 sigkill         a worker SIGKILLed --sigkills times (50) at random moments and replaced; the queue runs dry.
                    Then the pipeline on mixed documents (--kill-documents text PDFs of --kill-pages pages, a scanned
                    page, Markdown, three inputs that fail for good): `docqueue run --until-idle` SIGKILLed
                    --document-kills times (50), each a random moment after it claimed work; every document must end
                    as in a clean run of the same corpus (see bench/_document_kills.py)
  5 disk-full       the pipeline itself (not the queue-only fleet): generated PDFs (--disk-documents x --disk-pages)
                    run end to end in the plain loop (OCR, chunking, embedding into the embedded Qdrant, the graph on
                    a Bolt server of the bench's own); the storage folder, then in a second run the Qdrant folder,
                    is a tmpfs of its own, filled once --fill-at of that phase is done and freed --full-s seconds
                    (10) later. Needs root (mount); skipped with one sentence otherwise
  6 damaged-store   the pipeline through the `docqueue` commands (--damaged-documents x --damaged-pages generated
                    PDFs, half indexed into the main shard, half left in the tail): with nothing running, a segment
                    file of the main shard is cut to nothing, then one of the tail's deleted; each time `verify` must
                    name the shard (exit 3), `repair --vectors` sets it aside and re-queues its chunks (a second
                    repair changes nothing) and `run --until-idle` rebuilds them (see bench/_damaged_stores.py)
  7 damaged-graph   the same on the embedded Bolt server's database folder (--damaged-documents x --damaged-pages):
                    with the server stopped, the Chunk bucket file deleted, then schema.json cut; with the server
                    SIGKILLed, an edge-list file deleted, then (after a replay of its log and more writes) the Chunk
                    bucket cut, then (after a replay and no writes) the MENTIONS edge bucket's last page cut, which
                    only verify's count of each chunk's mentions sees; each time `verify` must name the folder
                    (exit 3), `repair --graph` sets it aside and
                    re-queues the GraphRAG step of the completed chunks, `run --until-idle` rewrites them (see
                    bench/_damaged_graph.py)
  8 clock-skew      one worker's wall clock --skew-s seconds (600) ahead and one's as far behind, beside normal
                    workers, with stale recovery run from a process ahead as well as from a normal one, for
                    --skew-window-s (30); each batch's work (--skew-work-s, 4) outlasts the stale timeout (3 s), so
                    only the heartbeats keep a task; and a retryable failure made by each skewed process becomes
                    claimable after the configured back-off by the database's clock. Needs libfaketime.

"Duplicate" on these queue-only rows is a task completed by two settles (a late worker overwriting the new owner);
fenced completions the queue rejected (the task had been recovered and re-claimed) are counted beside it. Lost is a
completion a worker was told applied that the database does not hold, or a task left processing or failed after
recovery. The points, nodes and edges of the stores are checked by the reliability tests of the same rows. Row 5
counts them itself: points against chunks (and distinct chunk ids), duplicate graph nodes and relationships,
temporary files left in the storage folder, and `docqueue verify`; its throughput is completions (pages OCRed,
chunks embedded, chunks extracted) per second before, during and after the fault against a clean run.

Runs on an embedded PostgreSQL of its own (its own max_connections), never on a shared server:

  .venv/bin/python bench/faults.py                       # rows 1-3 at full size (~5 min)
  .venv/bin/python bench/faults.py --rows 4               # row 4 (~12 min, ~2 without --document-kills)
  .venv/bin/python bench/faults.py --rows 5               # row 5, as root (~3 min)
  .venv/bin/python bench/faults.py --rows 6               # row 6 (~3 min)
  .venv/bin/python bench/faults.py --rows 7               # row 7 (~8 min)
  .venv/bin/python bench/faults.py --rows 8               # row 8 (~2 min)
  .venv/bin/python bench/faults.py --rows 3 --untuned     # row 3 with the tables' storage settings reset
  .venv/bin/python bench/faults.py --quick                # a smoke run

Prints a table and ends with one line `RESULT {json}`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from functools import cached_property
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import psycopg  # noqa: E402

from bench import _fault_kit as kit  # noqa: E402
from bench._result import print_result  # noqa: E402
from queue_db.config import QueueSettings  # noqa: E402
from queue_db.phases import VECTOR_CHUNK  # noqa: E402

ROWS = {
    1: "backend-kill",
    2: "connections",
    3: "idle-in-tx",
    4: "sigkill",
    5: "disk-full",
    6: "damaged-store",
    7: "damaged-graph",
    8: "clock-skew",
}
QUEUE_TABLES = ("documents", "task_queue_page", "task_queue_chunk")
SETTINGS = QueueSettings(
    heartbeat_interval_s=0.3, stale_timeout_s=3.0, max_retries=5, retry_backoff_base_s=0.2, retry_backoff_max_s=1.0
)
RUN_BATCHES = 20  # a ranged run's worth of batches, then the run's process (and its connections) ends
# row 8: a back-off long enough to see a claim come early, short enough to wait for
SKEW_SETTINGS = dataclasses.replace(SETTINGS, retry_backoff_base_s=2.0, retry_backoff_max_s=2.0)


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.server = kit.OwnServer(args.max_connections, port_from=56400)
        self.home = Path(tempfile.mkdtemp(prefix="docqueue-faults-home-"))
        self.clones = 0

    @cached_property
    def template(self) -> str:
        """The seeded queue rows 1-4 clone (row 5 alone never seeds it)."""
        return kit.seed(self.server, self.args.tasks) if not self.args.untuned else self._seed_untuned()

    def _seed_untuned(self) -> str:
        from bench.queue_throughput import Layout, seed_ours
        from queue_db.migrate import upgrade
        from queue_db.queue import create_queue_engine

        url = self.server.create("faults_template")
        engine = create_queue_engine(url, pool_size=1, max_overflow=0)
        upgrade(engine)
        engine.dispose()
        with psycopg.connect(url, autocommit=True) as conn:
            for table in QUEUE_TABLES:  # PostgreSQL's defaults, as before migration 0025
                conn.execute(
                    f"ALTER TABLE {table} RESET (fillfactor, autovacuum_vacuum_scale_factor, "
                    "autovacuum_vacuum_threshold, autovacuum_vacuum_insert_scale_factor, "
                    "autovacuum_analyze_scale_factor, autovacuum_vacuum_cost_delay)"
                )
        seed_ours(url, Layout.for_tasks(self.args.tasks))
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM (ANALYZE)")
        return "faults_template"

    def clone(self) -> tuple[str, str]:
        self.clones += 1
        name = f"faults_run_{self.clones}"
        return self.server.create(name, self.template), name

    def fleet(
        self, url: str, *, sensors: bool, run_batches: int = 0, fresh_sensor_connections=False, work_s: float = 0.0
    ) -> kit.Fleet:
        home = self.home / f"sensors-{self.clones}" if sensors else None
        return kit.Fleet(
            url,
            self.args.workers,
            self.args.batch,
            SETTINGS,
            sensors_home=home,
            run_batches=run_batches,
            fresh_sensor_connections=fresh_sensor_connections,
            work_s=work_s,
        )

    def clean_rate(self, *, sensors: bool, run_batches: int = 0, fresh=False, work_s: float = 0.0) -> dict:
        if self.args.no_clean:
            return {"tasks_per_s": None, "errors": []}
        url, _ = self.clone()
        fleet = self.fleet(url, sensors=sensors, run_batches=run_batches, fresh_sensor_connections=fresh, work_s=work_s)
        time.sleep(self.args.window)
        end = time.monotonic()
        reports, sensor = fleet.finish()
        return {"tasks_per_s": kit.rate(reports, fleet.started, end), "errors": _errors(reports, sensor)}

    def close(self) -> None:
        self.server.stop()
        shutil.rmtree(self.home, ignore_errors=True)


def _errors(reports: list[kit.WorkerReport], sensor: kit.SensorReport | None) -> list[str]:
    return [f"{r.app}: {e}" for r in reports for e in r.errors] + (sensor.errors if sensor else [])


# ---------------------------------------------------------------------------------------------------- row 1
def backend_kills(bench: Bench) -> dict:
    args = bench.args
    rng = random.Random(args.seed)
    clean = bench.clean_rate(sensors=True, work_s=args.work_s)
    url, name = bench.clone()
    fleet = bench.fleet(url, sensors=True, work_s=args.work_s)
    recovery = kit.TaskQueueHandle(url, SETTINGS)
    kills, missed = [], []
    with psycopg.connect(bench.server.admin_url, autocommit=True) as admin:
        time.sleep(1.0)
        start = time.monotonic()
        for moment in kit.kill_schedule(args.kills, rng):
            time.sleep(rng.uniform(0.2, 2 * args.kill_gap_s))
            kill = kit.kill_one(admin, moment, name, timeout_s=5.0)
            (kills.append(kill) if kill else missed.append(moment))
            recovery.recover()  # the recovery job, as its sensor requests it
        end = time.monotonic()
        time.sleep(args.window)
        recovery.recover()
        after_end = time.monotonic()
    reports, sensor = fleet.finish()
    recovery.close()
    check = kit.queue_check(url, reports, SETTINGS)
    by_app = {r.app: r.settles for r in reports}
    if sensor:
        by_app[kit.SENSOR_APP] = sensor.ticks
    waits = [_next_after(by_app.get(k.app, []), k.at) for k in kills]
    return {
        "faults_injected": len(kills),
        "by_moment": {m: sum(1 for k in kills if k.moment == m) for m in [*kit.MOMENTS, "sensor"]},
        "not_caught": missed,
        "work_done": check["completed"],
        **check,
        "recovery_s_max": max((w for w in waits if w is not None), default=None),
        "recovery_s_median": _median([w for w in waits if w is not None]),
        "unrecovered_victims": sum(1 for w in waits if w is None),
        "released_during_run": recovery.released,
        "sensor_ticks": len(sensor.ticks) if sensor else 0,
        "sensor_ticks_after_last_kill": sum(1 for t in (sensor.ticks if sensor else []) if t > end),
        "sensor_skips": len(sensor.skipped_unavailable) if sensor else 0,
        "tasks_per_s": {
            "clean": clean["tasks_per_s"],
            "during": kit.rate(reports, start, end),
            "after": kit.rate(reports, end, after_end),
        },
        "errors": clean["errors"] + _errors(reports, sensor),
    }


def _next_after(times: list[float], at: float) -> float | None:
    later = [t for t in times if t > at]
    return round(min(later) - at, 3) if later else None


def _median(values: list[float]) -> float | None:
    values = sorted(values)
    return values[len(values) // 2] if values else None


# ---------------------------------------------------------------------------------------------------- row 2
def connections_exhausted(bench: Bench) -> dict:
    args = bench.args
    clean = bench.clean_rate(sensors=True, run_batches=RUN_BATCHES, fresh=True)
    url, _ = bench.clone()
    fleet = bench.fleet(url, sensors=True, run_batches=RUN_BATCHES, fresh_sensor_connections=True)
    time.sleep(1.0)
    holder = kit.SlotHolder(bench.server.admin_url, args.max_connections + 10)
    holder.take_all()
    start = time.monotonic()
    while time.monotonic() < start + args.hold_s:  # slots a run frees are taken too
        holder.take_all()
        time.sleep(0.1)
    held = len(holder.connections)
    holder.release()
    end = time.monotonic()
    time.sleep(args.window)
    after_end = time.monotonic()
    reports, sensor = fleet.finish()
    cli_result = _cli_against_a_full_server(url, bench.home, holder)
    check = kit.queue_check(url, reports, SETTINGS)
    waits = [line for r in reports for line in r.log_lines]
    return {
        "faults_injected": 1,
        "slots_held": held,
        "hold_s": round(end - start, 1),
        "work_done": check["completed"],
        **check,
        "worker_wait_lines": len(waits),
        "worker_log_sample": sorted(set(waits))[:2],
        "tracebacks_in_worker_logs": sum(1 for line in waits if "traceback" in line),
        "sensor_skips": len(sensor.skipped_unavailable) if sensor else 0,
        "sensor_skip_sample": (sensor.skipped_unavailable[:1] if sensor else []),
        "sensor_ticks_after": sum(1 for t in (sensor.ticks if sensor else []) if t > end),
        "completed_after_release": kit.completed_between(reports, end, float("inf")),
        "sensor_log_sample": sorted(set(sensor.log_lines))[:2] if sensor else [],
        "cli": cli_result,
        "recovery_s": kit.recovered_after(reports, end, clean["tasks_per_s"] or 0),
        "tasks_per_s": {
            "clean": clean["tasks_per_s"],
            "during": kit.rate(reports, start, end),
            "after": kit.rate(reports, end, after_end),
        },
        "errors": clean["errors"] + _errors(reports, sensor),
    }


def _cli_against_a_full_server(url: str, home: Path, holder: kit.SlotHolder) -> dict:
    """`docqueue status` started while every slot is held, the slots released once it says it waits. With the
    fleet stopped nobody else frees a slot the command could slip into (a run's or a sensor tick's closing
    connections did, between the holder's sweeps)."""
    holder.take_all()
    started = time.monotonic()
    cli = _start_cli(url, home)
    lines: list[str] = []
    waiting = threading.Event()

    def read() -> None:
        for line in cli.stderr:
            lines.append(line.rstrip("\n"))
            if "no free connection" in line:
                waiting.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    waiting.wait(timeout=120)
    held_s = time.monotonic() - started
    holder.release()
    return _finish_cli(cli, started, reader, lines) | {"held_s": round(held_s, 1)}


def _start_cli(url: str, home: Path) -> subprocess.Popen:
    import os

    env = {**os.environ, "DOCQUEUE_DATABASE_URL": url, "DOCQUEUE_HOME": str(home / "cli"), "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "orchestration.cli", "status"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish_cli(cli: subprocess.Popen, started: float, reader: threading.Thread, lines: list[str]) -> dict:
    try:
        cli.wait(timeout=600)
    except subprocess.TimeoutExpired:
        cli.kill()
        cli.wait()
    reader.join(timeout=10)
    lines = [line for line in lines if line.strip()]
    return {
        "exit_code": cli.returncode,
        "seconds": round(time.monotonic() - started, 1),
        "stderr_lines": lines[:3],
        "traceback": any("Traceback" in line for line in lines),
    }


# ---------------------------------------------------------------------------------------------------- row 3
def idle_in_transaction(bench: Bench) -> dict:
    args = bench.args
    clean = _idle_run(bench, hold_snapshot=False) if not args.no_clean else None
    fault = _idle_run(bench, hold_snapshot=True, clean_dead=clean["dead_at_mark"] if clean else None)
    if clean is None:  # the test's short form: the fault alone
        clean = {"during": None, "after": None, "dead_at_mark": None, "hot_share": None, "errors": []}
    drop = 1 - fault["during"] / clean["during"] if clean["during"] else None
    return {
        "faults_injected": 1,
        "tasks_under_snapshot": fault["tasks"],
        "snapshot_held_s": fault["seconds"],
        "work_done": fault["check"]["completed"],
        **fault["check"],
        "dead_tuples": {"clean": clean["dead_at_mark"], "held": fault["dead_at_mark"]},
        "dead_tuples_ratio": round(fault["dead_at_mark"] / max(1, clean["dead_at_mark"] or 0), 1),
        "dead_tuples_recovery_s": fault["dead_recovery_s"],
        "hot_update_share": {"clean": clean["hot_share"], "held": fault["hot_share"]},
        "recovery_s": kit.recovered_after(fault["reports"], fault["mark"], clean["during"] or 0, share=0.9),
        "tasks_per_s": {
            "clean": clean["during"],
            "during": fault["during"],
            "after": fault["after"],
            "clean_after": clean["after"],
        },
        "throughput_drop": round(drop, 3) if drop is not None else None,
        "tuned": not args.untuned,
        "idle_in_transaction_session_timeout_s": args.idle_timeout_s,
        "errors": fault["errors"] + clean["errors"],
    }


def _idle_run(bench: Bench, hold_snapshot: bool, clean_dead: int | None = None) -> dict:
    args = bench.args
    url, _ = bench.clone()
    fleet = bench.fleet(url, sensors=False)
    holder = psycopg.connect(url)
    watcher = psycopg.connect(url, autocommit=True)
    if hold_snapshot:  # a report run at the wrong moment: a snapshot taken, then nothing
        holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        if args.idle_timeout_s:  # what docs/operations.md advises: the server ends such a session
            holder.execute(f"SET idle_in_transaction_session_timeout = '{int(args.idle_timeout_s * 1000)}ms'")
        holder.execute("SELECT count(*) FROM documents").fetchone()  # the snapshot is taken here, then kept
    while _completed(watcher) < args.idle_tasks:
        time.sleep(0.25)
    mark = time.monotonic()
    time.sleep(1.1)  # the workers' statistics reach pg_stat_user_tables at most once a second
    dead_at_mark, hot_share = _dead_tuples(watcher)
    try:
        holder.rollback()
    except psycopg.Error:  # idle_in_transaction_session_timeout ended it already
        pass
    holder.close()
    time.sleep(args.window)
    after_end = time.monotonic()
    reports, _ = fleet.finish()
    floor = max(dead_at_mark / 10, clean_dead or 0)
    dead_recovery_s = _wait_dead_tuples(watcher, mark, args.vacuum_timeout_s, floor) if hold_snapshot else None
    watcher.close()
    return {
        "reports": reports,
        "mark": mark,
        "tasks": kit.completed_between(reports, fleet.started, mark),
        "seconds": round(mark - fleet.started, 1),
        "during": kit.rate(reports, fleet.started, mark),
        "after": kit.rate(reports, mark, after_end),
        "dead_at_mark": dead_at_mark,
        "hot_share": hot_share,
        "dead_recovery_s": dead_recovery_s,
        "check": kit.queue_check(url, reports, SETTINGS),
        "errors": _errors(reports, None),
    }


def _completed(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT count(*) FROM task_queue_chunk WHERE vector_status = 'completed'").fetchone()[0]


def _dead_tuples(conn: psycopg.Connection) -> tuple[int, float | None]:
    rows = conn.execute(
        "SELECT sum(n_dead_tup), sum(n_tup_hot_upd), sum(n_tup_upd) FROM pg_stat_user_tables WHERE relname = ANY(%s)",
        (list(QUEUE_TABLES),),
    ).fetchone()
    return int(rows[0] or 0), (round(float(rows[1]) / float(rows[2]), 3) if rows[2] else None)


def _wait_dead_tuples(conn: psycopg.Connection, since: float, timeout_s: float, floor: float) -> float | None:
    """Seconds from the release until autovacuum brought the dead tuples down to `floor`: a tenth of their peak,
    or the clean run's level, whichever is higher."""
    while time.monotonic() < since + timeout_s:
        if _dead_tuples(conn)[0] <= floor:
            return round(time.monotonic() - since, 1)
        time.sleep(1.0)
    return None


# ---------------------------------------------------------------------------------------------------- row 4
def fleet_kills(bench: Bench) -> dict:
    """Workers SIGKILLed at random moments and replaced; the queue runs dry. Each worker writes what it completed to
    a ledger file as it goes (a killed worker cannot report), so a task completed twice shows in the ledgers."""
    args = bench.args
    rng = random.Random(args.seed + 4)
    clean = bench.clean_rate(sensors=False)
    url, _ = bench.clone()
    ledgers = Path(tempfile.mkdtemp(prefix="ledgers-", dir=bench.home))
    fleet = kit.Fleet(url, args.workers, args.batch, SETTINGS, ledgers=ledgers)
    recovery = kit.TaskQueueHandle(url, SETTINGS)
    with psycopg.connect(url, autocommit=True) as watcher:
        total = watcher.execute("SELECT count(*) FROM task_queue_chunk").fetchone()[0]
        start, done_at_start = time.monotonic(), _completed(watcher)
        for _ in range(args.sigkills):
            time.sleep(rng.uniform(0.05, 2 * args.sigkill_gap_s))
            fleet.kill_worker(rng)
            recovery.recover()  # the recovery job, as its sensor requests it
        end, done_at_end = time.monotonic(), _completed(watcher)
        while _completed(watcher) < total and time.monotonic() < end + args.drain_timeout_s:
            recovery.recover()
            time.sleep(0.5)
        drained, done_at_drain = time.monotonic(), _completed(watcher)
    reports, _ = fleet.finish()
    recovery.close()
    ledger = [kit.WorkerReport(path.stem, applied=path.read_text().split()) for path in ledgers.iterdir()]
    check = kit.queue_check(url, ledger, SETTINGS)
    return {
        "faults_injected": fleet.killed,
        "work_done": check["completed"],
        **check,
        "unfinished": total - check["completed"],
        "released_during_run": recovery.released,
        "drain_s": round(drained - end, 1),
        "tasks_per_s": {
            "clean": clean["tasks_per_s"],
            "during": round((done_at_end - done_at_start) / max(1e-6, end - start), 1),
            "after": round((done_at_drain - done_at_end) / max(1e-6, drained - end), 1),
        },
        "errors": clean["errors"] + _errors(reports, None),
    }


def repeated_kills(bench: Bench) -> dict:
    """The queue's fleet killed again and again, then `docqueue run` on mixed documents (bench/_document_kills.py):
    the fleet's figures, with the documents' as `documents` and their losses and errors counted in the row's."""
    from bench import _document_kills
    from bench._pipeline_env import own_bolt_server
    from bench.orchestration_overhead import free_port

    fleet = fleet_kills(bench)
    if not bench.args.document_kills:
        return fleet
    with own_bolt_server(bench.home / "bolt-kills", free_port()) as bolt:
        documents = _document_kills.row(bench.args, (bolt, _Databases(bench)), bench.home)
    return {
        **fleet,
        "faults_injected": fleet["faults_injected"] + documents["faults_injected"],
        "tasks_lost": fleet["tasks_lost"] + documents["tasks_lost"],
        "completed_twice": fleet["completed_twice"] + documents["completed_twice"],
        "documents": documents,
        "errors": fleet["errors"] + [f"documents: {e}" for e in documents["errors"]],
    }


# ---------------------------------------------------------------------------------------------------- row 8
def clock_skew(bench: Bench) -> dict:
    """A worker whose wall clock runs --skew-s ahead and one as far behind, beside normal workers, while stale
    recovery runs from a process ahead and from a normal one. The queue stamps and judges every heartbeat, claim and
    back-off by the database's clock, so no task may be released (every holder is alive and beating), stolen or
    completed twice; the figures also say how many held tasks a recovery would have released had it judged by its
    own clock, which is what makes the row a test: with the stale timeout at 3 s and the skew at 600 s, every one."""
    args = bench.args
    if kit.libfaketime() is None:
        raise RuntimeError(f"row 8 needs libfaketime ({kit.LIBFAKETIME_GLOB}): apt-get install libfaketime")
    normal = max(1, args.workers - 2)
    clean = _skew_clean_rate(bench, normal + 2)
    backoff = _backoff_check(bench)
    url, _ = bench.clone()
    spec = {"url": url, "settings": dataclasses.asdict(SKEW_SETTINGS), "batch": args.batch, "work_s": args.skew_work_s}
    skewed = {
        f"worker{skew:+d}": kit.SkewedProcess(
            skew, {**spec, "mode": "worker", "app": f"faults-skew{skew:+d}"}, bench.home
        )
        for skew in (args.skew_s, -args.skew_s)
    }
    skewed[f"recovery+{args.skew_s}"] = kit.SkewedProcess(
        args.skew_s, {**spec, "mode": "recover", "interval_s": 0.5}, bench.home
    )
    clocks = {name: process.wait_ready() for name, process in skewed.items()}
    fleet = kit.Fleet(url, normal, args.batch, SKEW_SETTINGS, work_s=args.skew_work_s)
    for process in skewed.values():
        process.go()
    recovery = kit.TaskQueueHandle(url, SKEW_SETTINGS)
    start = fleet.started
    while time.monotonic() < start + args.skew_window_s:
        recovery.recover()  # the recovery job on a machine with a right clock
        time.sleep(0.5)
    end = time.monotonic()
    finished = {name: process.finish() for name, process in skewed.items()}
    reports, _ = fleet.finish()
    recovery.close()
    skewed_reports = [
        kit.WorkerReport(
            **{"app": f"skewed {name}", **{k: v for k, v in finished[name].items() if k in _REPORT_FIELDS}}
        )
        for name in finished
        if name.startswith("worker")
    ]
    check = kit.queue_check(url, reports + skewed_reports, SKEW_SETTINGS)
    skewed_recovery = finished[f"recovery+{args.skew_s}"]
    errors = _errors(reports + skewed_reports, None) + skewed_recovery.get("errors", [])
    return {
        "faults_injected": len(skewed),
        "skew_s": args.skew_s,
        "stale_timeout_s": SKEW_SETTINGS.stale_timeout_s,
        "workers": {"normal": normal, "skewed": 2},
        "clocks": {
            name: {
                "wall_skew_s": clocks[name]["wall_skew_s"],
                "wall_skew_s_at_end": finished[name].get("wall_skew_s_at_end"),
                "monotonic_offset_s": clocks[name]["monotonic_offset_s"],
            }
            for name in skewed
        },
        "clock_not_skewed": sorted(
            name
            for name, process in skewed.items()
            if not _skewed_by(clocks[name]["wall_skew_s"], process.skew_s)
            or not _skewed_by(finished[name].get("wall_skew_s_at_end"), process.skew_s)
        ),
        "skewed_workers": {
            r.app: {"completed": len(r.applied), "fenced_rejected": r.rejected, "heartbeats": r.beats}
            for r in skewed_reports
        },
        "normal_workers": {
            "completed": sum(len(r.applied) for r in reports),
            "fenced_rejected": sum(r.rejected for r in reports),
            "heartbeats": sum(r.beats for r in reports),
        },
        "work_done": check["completed"],
        **check,
        "recovery_calls": {"normal": recovery.calls, "skewed": skewed_recovery.get("calls", 0)},
        "live_tasks_released": recovery.released + skewed_recovery.get("released", 0),
        "would_release_by_own_clock": skewed_recovery.get("would_release_by_own_clock"),
        "backoff": backoff,
        "backoff_wrong": sorted(name for name, b in backoff.items() if isinstance(b, dict) and not b["right"]),
        "tasks_per_s": {"clean": clean["tasks_per_s"], "during": kit.rate(reports + skewed_reports, start, end)},
        "errors": clean["errors"] + errors,
    }


_REPORT_FIELDS = {f.name for f in dataclasses.fields(kit.WorkerReport)}


def _skewed_by(measured: float | None, skew_s: int) -> bool:
    """The process's clock is off by its skew, give or take 5 s (a start on a loaded machine)."""
    return measured is not None and abs(measured - skew_s) < 5.0


def _skew_clean_rate(bench: Bench, workers: int) -> dict:
    """The same number of workers with the same work per batch, every clock right."""
    args = bench.args
    if args.no_clean:
        return {"tasks_per_s": None, "errors": []}
    url, _ = bench.clone()
    fleet = kit.Fleet(url, workers, args.batch, SKEW_SETTINGS, work_s=args.skew_work_s)
    recovery = kit.TaskQueueHandle(url, SKEW_SETTINGS)
    while time.monotonic() < fleet.started + args.skew_window_s:
        recovery.recover()
        time.sleep(0.5)
    end = time.monotonic()
    reports, _ = fleet.finish()
    recovery.close()
    errors = _errors(reports, None) + (
        [f"clean run released {recovery.released} live tasks"] if recovery.released else []
    )
    return {"tasks_per_s": kit.rate(reports, fleet.started, end), "errors": errors}


def _backoff_check(bench: Bench, tasks: int = 10) -> dict:
    """A process ahead and one behind each fail `tasks` tasks, retryable; the database then says when they are
    claimable. Right is: not before the configured back-off has passed since the failure, and soon after it, by
    the database's clock. A process clock would make them claimable 600 s early or 600 s late."""
    args = bench.args
    url, _ = bench.clone()
    with psycopg.connect(url, autocommit=True) as conn:
        pending = [
            str(r[0])
            for r in conn.execute(
                f"SELECT id FROM {VECTOR_CHUNK.table} t WHERE {VECTOR_CHUNK.claimable_sql('t')} ORDER BY id LIMIT %s",
                (2 * tasks,),
            )
        ]
    spec = {"url": url, "settings": dataclasses.asdict(SKEW_SETTINGS), "mode": "backoff"}
    processes = {
        f"{skew:+d}": kit.SkewedProcess(skew, {**spec, "ids": ids}, bench.home)
        for skew, ids in ((args.skew_s, pending[:tasks]), (-args.skew_s, pending[tasks:]))
    }
    for process in processes.values():  # both start (imports take a second or two) before either fails its tasks
        process.wait_ready()
    configured = SKEW_SETTINGS.retry_backoff_base_s
    checks: dict = {"configured_s": configured}
    with psycopg.connect(url, autocommit=True) as conn:
        # one after the other: each one's tasks are watched from their failure on
        for name, process in processes.items():
            process.go()
            result = process.finish()
            failed = result.get("failed") or []
            watched = _watch_backoff(conn, failed, configured)
            checks[name] = {"failed": len(failed), **watched, "errors": result.get("errors", [])}
            checks[name]["right"] = _backoff_right(watched, configured) and len(failed) == tasks
    return checks


def _backoff_right(watched: dict, configured: float) -> bool:
    """The rows carry the configured back-off on the database's clock, none was claimable before it passed (when
    a poll came that early), and all were claimable within 2 s after it."""
    stamped, before, at = watched["stamped_s"], watched["last_unclaimable_age_s"], watched["claimable_at_age_s"]
    return bool(
        stamped
        and all(abs(s - configured) < 0.001 for s in stamped)
        and (before is None or before < configured)
        and at is not None
        and configured <= at < configured + 2.0
    )


def _watch_backoff(conn: psycopg.Connection, ids: list[str], configured_s: float) -> dict:
    """Poll the claim rule over `ids` on the database's clock until every one is claimable: the age of the
    failures (clock_timestamp() - failed_at) at the last poll that found some not claimable and at the first that
    found all claimable; and the back-off stamped on the rows (next_attempt_at - failed_at, min and max)."""
    if not ids:
        return {"stamped_s": None, "last_unclaimable_age_s": None, "claimable_at_age_s": None}
    at, failed_at = VECTOR_CHUNK.col("next_attempt_at"), VECTOR_CHUNK.col("failed_at")
    stamped = conn.execute(
        f"SELECT min(extract(epoch FROM {at} - {failed_at}))::float8, "
        f"max(extract(epoch FROM {at} - {failed_at}))::float8 FROM {VECTOR_CHUNK.table} WHERE id = ANY(%s::uuid[])",
        (ids,),
    ).fetchone()
    last_unclaimable = claimable_at = None
    deadline = time.monotonic() + configured_s + 30.0
    while time.monotonic() < deadline:
        # the age on now(), the clock the claim rule reads in the same statement: on clock_timestamp(), a
        # millisecond later, a row could look unclaimable at an age of the whole back-off
        claimable, age = conn.execute(
            f"SELECT count(*) FILTER (WHERE {VECTOR_CHUNK.claimable_sql('t')}), "
            f"extract(epoch FROM now() - max(t.{failed_at}))::float8 "
            f"FROM {VECTOR_CHUNK.table} t WHERE t.id = ANY(%s::uuid[])",
            (ids,),
        ).fetchone()
        if claimable == len(ids):
            claimable_at = round(age, 3)
            break
        last_unclaimable = math.floor(age * 1000) / 1000  # truncated: rounding up would reach the back-off itself
        time.sleep(0.05)
    return {
        "stamped_s": [round(stamped[0], 3), round(stamped[1], 3)],
        "last_unclaimable_age_s": last_unclaimable,
        "claimable_at_age_s": claimable_at,
    }


# ---------------------------------------------------------------------------------------------------- row 5
def disk_full(bench: Bench) -> dict:
    """A clean run, then a run whose storage folder fills mid-OCR and one whose Qdrant folder fills mid-embedding,
    each on fresh databases and tmpfs mounts (see bench/_disk_full.py)."""
    from bench import _disk_full as disk
    from bench._pipeline_env import own_bolt_server
    from bench.orchestration_overhead import free_port, make_corpus

    args = bench.args
    refused = disk.mounting_permitted()
    if refused:
        print(f"row 5 skipped: {refused}", flush=True)
        return {"skipped": refused, "faults_injected": 0, "work_done": 0, "tasks_lost": 0, "errors": []}
    corpus = bench.home / "corpus"
    make_corpus(corpus, args.disk_documents, args.disk_pages)
    with own_bolt_server(bench.home / "bolt", free_port()) as bolt:
        services = (bolt, _Databases(bench))
        runs = {
            fault or "clean": disk.run_one(args, fault, corpus, services, bench.home)
            for fault in ((None,) if not args.no_clean else ()) + ("storage", "qdrant")
        }
    clean = runs.get("clean")
    faulted = {name: runs[name] for name in ("storage", "qdrant")}
    errors = [
        f"{name}: {problem}"
        for name, run in runs.items()
        for problem, bad in (
            ("tasks not completed", run["tasks_lost"]),
            ("verify not clean", not run["verify_consistent"]),
            ("duplicate points", run["duplicate_points"] or run["points"] != run["distinct_point_chunk_ids"]),
            ("duplicate nodes or edges", run["duplicate_nodes_edges"]),
            ("temporary files left", run["temp_files_left"]),
            ("no disk-full failure met", name != "clean" and not run["errors"]),
            (
                f"an error other than one sentence naming the folder: {run['errors'][:1]}",
                # the queue's error as the watcher reads it: "<error class>: <reason>"
                any(
                    not e.startswith(f"disk_full: disk full: no space left in {run['folder']}") or "\n" in e
                    for e in run["errors"]
                ),
            ),
        )
        if bad
    ]
    return {
        "faults_injected": len(faulted),
        "work_done": sum(len(run["done"]) for run in faulted.values()),
        "tasks_lost": sum(run["tasks_lost"] for run in runs.values()),
        "completed_twice": sum((run["duplicate_points"] or 0) for run in runs.values()),
        "duplicate_nodes_edges": sum((run["duplicate_nodes_edges"] or 0) for run in runs.values()),
        "fenced_rejected": 0,
        "rollup_mismatches": 0,
        "reconcile_corrections": 0,
        "corpus": {"documents": args.disk_documents, "pages": args.disk_pages},
        "by_fault": {
            name: {
                "pages": run["pages"],
                "chunks": run["chunks"],
                "points": run["points"],
                "failed_tasks": run["failed_tasks"],
                "full_s": round(run["marks"]["freed"] - run["marks"]["filled"], 1),
                "recovery_s": disk.recovery_s(run),
                "error_sample": run["errors"][:1],
                "temp_files_left": run["temp_files_left"],
                "verify_consistent": run["verify_consistent"],
                "per_s": disk.rates(run),
                "clean_per_s": disk.clean_rates_alike(clean, run) if clean else None,
            }
            for name, run in faulted.items()
        },
        "recovery_s": max((disk.recovery_s(run) or 0.0) for run in faulted.values()),
        "tasks_per_s": {
            "clean": disk.rates(clean)["overall"] if clean else None,
            "during": {name: disk.rates(run)["during"] for name, run in faulted.items()},
            "after": {name: disk.rates(run)["after"] for name, run in faulted.items()},
        },
        "errors": errors,
    }


# ---------------------------------------------------------------------------------------------------- row 6
def damaged_store(bench: Bench) -> dict:
    """A segment file of each shard damaged in turn, detected, set aside and rebuilt (see bench/_damaged_stores.py)."""
    from bench import _damaged_stores as damaged
    from bench._pipeline_env import own_bolt_server
    from bench.orchestration_overhead import free_port

    with own_bolt_server(bench.home / "bolt-damaged", free_port()) as bolt:
        return damaged.row(bench.args, (bolt, _Databases(bench)), bench.home)


# ---------------------------------------------------------------------------------------------------- row 7
def damaged_graph(bench: Bench) -> dict:
    """The embedded graph's database folder damaged five times (twice after a clean stop, three times after a SIGKILL),
    detected, set aside and rebuilt (bench/_damaged_graph.py)."""
    from bench import _damaged_graph as damaged

    return damaged.row(bench.args, _Databases(bench), bench.home)


class _Databases:
    """Row 5's databases on the bench's own server."""

    def __init__(self, bench: Bench):
        self.bench = bench

    def create(self, prefix: str) -> str:
        self.bench.clones += 1
        return self.bench.server.create(f"{prefix}_{self.bench.clones}")


# ---------------------------------------------------------------------------------------------------- the run
RUNNERS = {
    1: backend_kills,
    2: connections_exhausted,
    3: idle_in_transaction,
    4: repeated_kills,
    5: disk_full,
    6: damaged_store,
    7: damaged_graph,
    8: clock_skew,
}


def run(args: argparse.Namespace) -> int:
    bench = Bench(args)
    rows: dict[str, dict] = {}
    try:
        for number in args.rows:
            began = time.monotonic()
            figures = RUNNERS[number](bench)
            figures["row_seconds"] = round(time.monotonic() - began, 1)
            rows[f"{number}_{ROWS[number]}"] = figures
            _print_row(number, figures)
    finally:
        bench.close()
    failures = [
        f"row {name}: {what}"
        for name, f in rows.items()
        for what, bad in (
            ("tasks lost", f.get("tasks_lost")),
            ("tasks unfinished", f.get("unfinished")),
            ("tasks completed twice", f.get("completed_twice")),
            ("roll-ups left wrong", f.get("rollup_mismatches") or f.get("reconcile_corrections")),
            ("live tasks released by stale recovery", f.get("live_tasks_released")),
            ("clocks not skewed (the fault did not take)", f.get("clock_not_skewed")),
            ("back-off not by the database's clock", f.get("backoff_wrong")),
            ("errors", f.get("errors")),
        )
        if bad
    ]
    for failure in failures:
        print(f"FAIL {failure}")
    names = ("workers", "batch", "tasks", "kills", "hold_s", "idle_tasks", "sigkills", "window", "skew_s")
    names += ("skew_window_s", "skew_work_s")
    if 5 in args.rows:
        names += ("disk_documents", "disk_pages", "storage_mib", "qdrant_extra_mib", "fill_at", "full_s")
    if 4 in args.rows:
        names += ("document_kills", "document_kill_gap_s", "kill_documents", "kill_pages")
    if 6 in args.rows or 7 in args.rows:
        names += ("damaged_documents", "damaged_pages")
    config = {k: getattr(args, k) for k in names}
    print_result({"rows": rows, "config": config, "failures": failures}, sort_keys=True)
    return 1 if failures else 0


def _print_row(number: int, f: dict) -> None:
    if number == 5:
        _print_disk_row(f)
        return
    if number in (6, 7):
        _print_damaged_row(number, f)
        return
    speed = f["tasks_per_s"]
    print(
        f"row {number} {ROWS[number]:<12} faults {f['faults_injected']:>3}  done {f['work_done']:>7}  "
        f"lost {f['tasks_lost']}  twice {f['completed_twice']}  rejected {f['fenced_rejected']}  "
        f"roll-ups wrong {f['rollup_mismatches']}/{f['reconcile_corrections']}  tasks/s clean {speed['clean']} "
        f"during {speed['during']}"
        + (f" after {speed['after']}" if "after" in speed else "")
        + f"  ({f['row_seconds']} s)",
        flush=True,
    )
    if "live_tasks_released" in f:
        backoff = {k: v["claimable_at_age_s"] for k, v in f["backoff"].items() if isinstance(v, dict)}
        clocks = ", ".join(f"{name} {clock['wall_skew_s']:+.0f} s" for name, clock in f["clocks"].items())
        print(
            f"      clocks {clocks}  "
            f"live tasks released {f['live_tasks_released']} (a recovery by its own clock: "
            f"{f['would_release_by_own_clock']})  back-off {f['backoff']['configured_s']} s, claimable after {backoff}",
            flush=True,
        )


def _print_disk_row(f: dict) -> None:
    if f.get("skipped"):
        print(f"row 5 {ROWS[5]:<12} skipped: {f['skipped']}", flush=True)
        return
    speed = f["tasks_per_s"]
    print(
        f"row 5 {ROWS[5]:<12} faults {f['faults_injected']:>3}  done {f['work_done']:>7}  lost {f['tasks_lost']}  "
        f"duplicate points {f['completed_twice']} nodes/edges {f['duplicate_nodes_edges']}  "
        f"recovery {f['recovery_s']} s  completions/s clean {speed['clean']}  ({f['row_seconds']} s)",
        flush=True,
    )
    for name, run in f["by_fault"].items():
        per_s = run["per_s"]
        print(
            f"      {name:<8} full {run['full_s']} s, {run['failed_tasks']} tasks failed, "
            f"recovery {run['recovery_s']} s, completions/s before {per_s['before']} during {per_s['during']} "
            f"after {per_s['after']} (clean run, same seconds: {run['clean_per_s']}); "
            f"temp files {run['temp_files_left']}, verify {'clean' if run['verify_consistent'] else 'NOT clean'}; "
            f"{(run['error_sample'] or ['no error'])[0]}",
            flush=True,
        )


def _print_damaged_row(number: int, f: dict) -> None:
    print(
        f"row {number} {ROWS[number]:<12} faults {f['faults_injected']:>3}  rebuilt {f['work_done']:>7} chunks  "
        f"lost {f['tasks_lost']}  duplicate points {f['completed_twice']} nodes/edges {f['duplicate_nodes_edges']}  "
        f"graph {f['graph_before']} -> {f['graph_after']}  chunk completions/s clean {f['tasks_per_s']['clean']}  "
        f"({f['row_seconds']} s)",
        flush=True,
    )
    for name, run in f["by_fault"].items():
        print(
            f"      {name:<9} {run.get('shard', run.get('file'))}: detected in {run['detect_s']} s, "
            f"repair {run['repair_s']} s + "
            f"run {run['rebuild_run_s']} s for {run['rebuilt_chunks']} chunks ({run['rebuild_per_s']} chunk "
            f"completions/s); kept as {run['kept_as']}; verify said: {run['said']}",
            flush=True,
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rows", default="1,2,3", help="comma-separated rows to run (default 1,2,3; 4 to 8 on request)"
    )
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--tasks", type=int, default=None, help="tasks seeded (default: enough for the rows)")
    parser.add_argument("--kills", type=int, default=20, help="row 1: backends killed")
    parser.add_argument("--kill-gap-s", type=float, default=1.0, help="row 1: mean seconds between kills")
    parser.add_argument(
        "--work-s", type=float, default=0.4, help="row 1: seconds a batch's work takes (heartbeats beat meanwhile)"
    )
    parser.add_argument("--skew-s", type=int, default=600, help="row 8: seconds the skewed clocks are off")
    parser.add_argument("--skew-window-s", type=float, default=30.0, help="row 8: seconds the skewed fleet runs")
    parser.add_argument(
        "--skew-work-s", type=float, default=4.0, help="row 8: seconds a batch's work takes (beyond the stale timeout)"
    )
    parser.add_argument("--sigkills", type=int, default=50, help="row 4: workers SIGKILLed")
    parser.add_argument("--sigkill-gap-s", type=float, default=0.5, help="row 4: mean seconds between kills")
    parser.add_argument("--document-kills", type=int, default=50, help="row 4: `docqueue run`s SIGKILLed (0: none)")
    parser.add_argument("--document-kill-gap-s", type=float, default=3.0, help="row 4: mean seconds of work a kill")
    parser.add_argument("--kill-documents", type=int, default=6, help="row 4: text PDFs of the mixed corpus")
    parser.add_argument("--kill-pages", type=int, default=4, help="row 4: pages per text PDF")
    parser.add_argument("--drain-timeout-s", type=float, default=300.0, help="row 4: wait for the queue to run dry")
    parser.add_argument("--hold-s", type=float, default=60.0, help="row 2: seconds every slot stays taken")
    parser.add_argument("--max-connections", type=int, default=40, help="the bench server's max_connections")
    parser.add_argument("--idle-tasks", type=int, default=100_000, help="row 3: tasks that flow under the snapshot")
    parser.add_argument("--window", type=float, default=8.0, help="seconds of each clean and after-fault measure")
    parser.add_argument("--vacuum-timeout-s", type=float, default=180.0, help="row 3: wait for autovacuum")
    parser.add_argument(
        "--idle-timeout-s",
        type=float,
        default=0.0,
        help="row 3: the snapshot's session has this idle_in_transaction_session_timeout (0: none)",
    )
    parser.add_argument("--untuned", action="store_true", help="row 3 without migration 0025's table settings")
    parser.add_argument("--seed", type=int, default=26)
    parser.add_argument("--disk-documents", type=int, default=12, help="row 5: generated PDFs")
    parser.add_argument("--disk-pages", type=int, default=8, help="row 5: pages per PDF")
    parser.add_argument("--storage-mib", type=int, default=16, help="row 5: the storage folder's tmpfs")
    parser.add_argument(
        "--qdrant-extra-mib", type=int, default=32, help="row 5: the Qdrant tmpfs beyond the store's write headroom"
    )
    parser.add_argument("--fill-at", type=float, default=0.25, help="row 5: share of the phase done when it fills")
    parser.add_argument("--full-s", type=float, default=10.0, help="row 5: seconds the folder stays full")
    parser.add_argument("--disk-timeout-s", type=float, default=600.0, help="row 5: a child run's time limit")
    parser.add_argument("--damaged-documents", type=int, default=6, help="rows 6, 7: generated PDFs")
    parser.add_argument("--damaged-pages", type=int, default=4, help="rows 6, 7: pages per PDF")
    parser.add_argument("--disk-child", type=Path, help=argparse.SUPPRESS)  # row 5's child: the corpus to run
    parser.add_argument("--disk-count", action="store_true", help=argparse.SUPPRESS)  # row 5's store counter
    parser.add_argument("--no-clean", action="store_true", help="the rows without their clean runs (tests)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: a few kills, seconds, 2,000 tasks")
    args = parser.parse_args(argv)
    try:
        args.rows = sorted({int(r) for r in args.rows.split(",") if r.strip()})
    except ValueError:
        parser.error("--rows takes comma-separated row numbers, e.g. 1,3")
    if not args.rows or set(args.rows) - set(ROWS):
        parser.error(f"--rows takes numbers from {sorted(ROWS)}")
    if args.quick:
        args.kills, args.hold_s, args.idle_tasks, args.window = 5, 3.0, 1000, 1.5
        args.kill_gap_s, args.vacuum_timeout_s, args.workers = 0.3, 5.0, 2
        args.sigkills, args.sigkill_gap_s = 5, 0.3
        args.document_kills, args.document_kill_gap_s, args.kill_documents, args.kill_pages = 3, 1.0, 2, 2
        args.skew_window_s = 10.0
    if args.tasks is None:
        args.tasks = max(20_000 if args.quick else 200_000, int(args.idle_tasks * 1.6))
    return args


if __name__ == "__main__":
    options = parse_args()
    if options.disk_child:
        from bench import _disk_full

        _disk_full.child(options.disk_child, options.disk_timeout_s)
    elif options.disk_count:
        from bench import _disk_full

        _disk_full.count_stores()
    else:
        sys.exit(run(options))
