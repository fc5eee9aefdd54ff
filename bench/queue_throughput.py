"""Queue throughput: docqueue's TaskQueue vs PgQueuer 1.6.0 vs the bare SKIP LOCKED pattern, on one server.

Measures tasks claimed + completed per second for every (worker processes x batch size) configuration:

  ours      queue_db.TaskQueue.claim + .complete on VECTOR_CHUNK: fenced transitions WITH bubble-up of the
            vector status to pages and documents (a claim, then a completion: two transactions per batch, as
            a Dagster run's process_keys does), sqlalchemy + psycopg 3. Its chunks are seeded registered as
            Dagster partitions (a block per document), the state a run claims from.
  ours_settle  the same queue through TaskQueue.settle: the worker loop that completes the batch in hand and
            claims the next one in one transaction (one commit and one bubble-up pass per batch), as PgQueuer's
            own loop batches its completions.
  pgqueuer  PgQueuer 1.6.0 QueueManager per process, asyncpg, a no-op entrypoint, its own schema in its own
            database (settings chosen: see `pgqueuer_worker`).
  bare      the ceiling: a minimal jobs table with a partial index, one UPDATE ... FROM (SELECT ... LIMIT n
            FOR UPDATE SKIP LOCKED) RETURNING, then one completion UPDATE per batch; raw psycopg, autocommit.

Every configuration starts from an identical fresh copy (CREATE DATABASE ... TEMPLATE) of a seeded database with
`--tasks` pending tasks (100 documents x 10 pages x 100 chunks by default), then a CHECKPOINT, so no contender
inherits another's dead rows or WAL backlog. The contenders run back to back for each configuration, so
background load drifts over all of them alike. Workers connect and warm up, meet at a barrier, and run for
`--window` seconds; the figure is the number of tasks completed (a committed snapshot count in the database at
the end of the window) divided by the window. If a contender drains the queue inside the window, its figure is
`tasks / time of the last completion`. Each worker also records when each completion committed; the bench
checks that the workers' own totals equal what the database holds after they stop.

Server: the embedded PostgreSQL 18 (queue_db.embedded_postgres) in a temp dir with its default (durable: fsync on)
settings, or the server named by DOCQUEUE_BENCH_PG_ADMIN_URL (must allow CREATE/DROP DATABASE; the bench's
databases are dropped at the end).

  .venv/bin/python bench/queue_throughput.py [--window 8] [--tasks 100000] [--workers 1,4,8] [--batches 1,50]
  .venv/bin/python bench/queue_throughput.py --quick      # a small smoke run
  .venv/bin/python bench/queue_throughput.py --workers 4 --batches 50 --rounds 5 --contenders ours_settle,pgqueuer

On a shared machine one 8 s window can catch a neighbour's burst: `--rounds N` measures every configuration N times,
interleaved, and reports medians (a ratio is taken within each round, then the median over rounds). Each figure
also carries the WAL bytes written per completed task, which does not move with the machine's load.

Prints a table and ends with exactly one line `RESULT {json}` (key figure: ratio_ours_pgqueuer_4w_b50).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import multiprocessing as mp
import os
import queue as queue_module
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import psycopg  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from bench._result import print_result  # noqa: E402
from queue_db.config import QueueSettings  # noqa: E402
from queue_db.migrate import upgrade  # noqa: E402
from queue_db.phases import VECTOR_CHUNK  # noqa: E402
from queue_db.queue import TaskQueue, create_queue_engine, make_worker_id  # noqa: E402

ADMIN_URL_ENV = "DOCQUEUE_BENCH_PG_ADMIN_URL"
EMBEDDED_PORT = 55470
CONTENDERS = ("ours", "ours_settle", "pgqueuer", "bare")
# contenders that run on another's seeded database and count completions the same way
SAME_DATA_AS = {"ours_settle": "ours"}
PGQ_ENTRYPOINT = "bench_noop"
PGQ_ENQUEUE_BATCH = 10_000
PAGES_PER_DOCUMENT = 10
CHUNKS_PER_PAGE = 100
# limits: keep a mistyped flag from running for hours or exhausting the server's connections
MAX_WINDOW_S = 120.0
MAX_TASKS = 2_000_000
MAX_WORKERS = 32
MAX_BATCH = 1000
MAX_ROUNDS = 20
MAX_PAYLOAD_BYTES = 100_000
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0
CLONE_ATTEMPTS = 10


# ---------------------------------------------------------------------------------------------------- plumbing
def plain_url(url: str) -> str:
    """libpq/asyncpg form of a SQLAlchemy-style URL."""
    for prefix in ("postgresql+psycopg://", "postgresql+psycopg2://", "postgresql+asyncpg://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix) :]
    return url


def with_database(admin_url: str, name: str) -> str:
    return make_url(admin_url).set(database=name).render_as_string(hide_password=False)


def redacted(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def admin_execute(admin_url: str, *statements: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


@dataclass(frozen=True)
class Layout:
    documents: int
    pages_per_document: int
    chunks_per_page: int

    @property
    def tasks(self) -> int:
        return self.documents * self.pages_per_document * self.chunks_per_page

    @classmethod
    def for_tasks(cls, tasks: int) -> "Layout":
        """documents x 10 pages x 100 chunks (the shape docqueue sees), shrunk for small runs."""
        chunks = max(1, min(CHUNKS_PER_PAGE, tasks // PAGES_PER_DOCUMENT))
        documents = max(1, tasks // (PAGES_PER_DOCUMENT * chunks))
        return cls(documents, PAGES_PER_DOCUMENT, chunks)


class Databases:
    """Creates databases on the admin server and drops every one of them at the end."""

    def __init__(self, admin_url: str):
        self.admin_url = admin_url
        self.created: list[str] = []

    def create(self, prefix: str, template: str | None = None) -> str:
        name = f"qbench_{prefix}_{uuid.uuid4().hex[:10]}"
        statement = f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else "")
        for attempt in range(1, CLONE_ATTEMPTS + 1):
            try:
                admin_execute(self.admin_url, statement)
                break
            except psycopg.errors.ObjectInUse:
                # an autovacuum worker or a closing backend may still be connected to the template
                if attempt == CLONE_ATTEMPTS:
                    raise
                time.sleep(0.2 * attempt)
        self.created.append(name)
        return name

    def freeze_as_template(self, name: str) -> None:
        """No connections (not even autovacuum's) may hold the template while it is cloned."""
        admin_execute(self.admin_url, f'ALTER DATABASE "{name}" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false')

    def drop(self, name: str) -> None:
        admin_execute(
            self.admin_url,
            f'ALTER DATABASE "{name}" WITH IS_TEMPLATE false',
            f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)',
        )
        self.created.remove(name)

    def drop_all(self) -> None:
        for name in list(self.created):
            try:
                self.drop(name)
            except psycopg.Error as exc:
                print(f"warning: could not drop database {name}: {exc.__class__.__name__}", file=sys.stderr)

    def url(self, name: str) -> str:
        return with_database(self.admin_url, name)


def checkpoint(admin_url: str) -> None:
    """Start every measurement with the WAL of the preceding clone flushed, not with a pending checkpoint."""
    try:
        admin_execute(admin_url, "CHECKPOINT")
    except psycopg.errors.InsufficientPrivilege:
        pass


def vacuum_analyze(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE)")


# ---------------------------------------------------------------------------------------------------- seeding
def sql_payload(n_sql: str) -> str:
    """Task n's text, the same for every contender: 'text <n>', or padded to %(size)s characters when that is set
    (what a 256-token chunk weighs is ~1,200)."""
    return (
        f"CASE WHEN %(size)s <= 0 THEN 'text ' || {n_sql} "
        f"ELSE rpad('text ' || {n_sql} || ' ', %(size)s, md5({n_sql}::text)) END"
    )


def seed_ours(url: str, layout: Layout, payload_bytes: int = 0) -> None:
    """Migrated docqueue schema + expanded, OCR'd, chunked documents whose chunks wait for the vector phase, each
    document's chunks registered as one block of Dagster partitions (the state a run claims from: the planner
    plans registered rows only; set-based, as in tests/queue_support.bulk_seed)."""
    engine = create_queue_engine(url, pool_size=1, max_overflow=0)
    try:
        upgrade(engine)
    finally:
        engine.dispose()
    with psycopg.connect(url) as conn:
        conn.execute(
            """INSERT INTO documents (filename, document_key, content_hash, size_bytes, page_count, pages_created_at,
                                      ocr_status, ocr_completed_at, vector_index_status)
               SELECT 'bench-' || n || '.pdf', 'bench-' || n || '-' || substr(md5(random()::text), 1, 8),
                      encode(sha256(convert_to(gen_random_uuid()::text, 'UTF8')), 'hex'), 1000, %(pages)s, now(),
                      'completed', now(), 'pending'
               FROM generate_series(1, %(docs)s) n""",
            {"docs": layout.documents, "pages": layout.pages_per_document},
        )
        conn.execute(
            """INSERT INTO task_queue_page (document_id, page_number, page_file_path, ocr_status, ocr_completed_at,
                                            chunked_at, chunk_count, vector_status)
               SELECT d.id, n, 'bench/page_' || n || '_nohf.md', 'completed', now(), now(), %(chunks)s, 'pending'
               FROM documents d, generate_series(1, %(pages)s) n""",
            {"pages": layout.pages_per_document, "chunks": layout.chunks_per_page},
        )
        # each document's chunks one block of registered partitions, as orchestration.partitions.register_partitions
        # records them (queue_db.partition_keys.record_block)
        conn.execute(
            """WITH blocks AS MATERIALIZED (
                   SELECT id, nextval('docqueue_partition_block_seq') AS block FROM documents)
               INSERT INTO task_queue_chunk (page_id, document_id, chunk_id, chunk_index, chunk_content_hash,
                                             vector_status, partition_block, partition_pos)
               SELECT p.id, p.document_id, md5(p.id::text || n), n, md5(n::text), 'pending',
                      b.block, (p.page_number - 1) * %(chunks)s + n
               FROM task_queue_page p JOIN blocks b ON b.id = p.document_id, generate_series(0, %(chunks)s - 1) n
               ORDER BY p.document_id, p.page_number, n""",
            {"chunks": layout.chunks_per_page},
        )
        conn.execute(
            """INSERT INTO partition_blocks (block, size)
               SELECT partition_block, count(*) FROM task_queue_chunk GROUP BY partition_block"""
        )
        conn.execute(
            f"""INSERT INTO task_queue_chunk_text (chunk_task_id, content)
                SELECT c.id, {sql_payload("(p.page_number * 1000 + c.chunk_index)")}
                FROM task_queue_chunk c JOIN task_queue_page p ON p.id = c.page_id""",
            {"size": payload_bytes},
        )


def seed_pgqueuer(url: str, tasks: int, payload_bytes: int = 0) -> None:
    """PgQueuer's own schema (its install API) and `tasks` jobs through its batch enqueue API."""

    with psycopg.connect(url) as conn:  # the texts by the one rule the other seeds use
        payloads = [
            row[0].encode()
            for row in conn.execute(
                f"SELECT {sql_payload('n')} FROM generate_series(0, %(n)s - 1) n ORDER BY n",
                {"n": tasks, "size": payload_bytes},
            )
        ]

    # PgQueuer and asyncpg are the bench extra's: the other contenders run without them
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    async def install_and_enqueue() -> None:
        conn = await asyncpg.connect(url)
        try:
            queries = Queries(AsyncpgDriver(conn))
            await queries.install()
            for start in range(0, tasks, PGQ_ENQUEUE_BATCH):
                size = min(PGQ_ENQUEUE_BATCH, tasks - start)
                await queries.enqueue([PGQ_ENTRYPOINT] * size, payloads[start : start + size], [0] * size)
        finally:
            await conn.close()

    asyncio.run(install_and_enqueue())


BARE_SCHEMA = """
CREATE TABLE bare_jobs (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    status TEXT NOT NULL DEFAULT 'pending',
    worker_id TEXT,
    payload TEXT,
    claimed_at TIMESTAMPTZ,
    done_at TIMESTAMPTZ
);
CREATE INDEX bare_jobs_pending ON bare_jobs (id) WHERE status = 'pending';
"""
BARE_CLAIM = """
UPDATE bare_jobs j SET status = 'running', worker_id = %(worker)s, claimed_at = now()
FROM (SELECT id FROM bare_jobs WHERE status = 'pending' ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) picked
WHERE j.id = picked.id
RETURNING j.id, j.payload"""
BARE_COMPLETE = """
UPDATE bare_jobs SET status = 'done', done_at = now()
WHERE id = ANY(%(ids)s) AND status = 'running' AND worker_id = %(worker)s"""


def seed_bare(url: str, tasks: int, payload_bytes: int = 0) -> None:
    with psycopg.connect(url) as conn:
        conn.execute(BARE_SCHEMA)
        conn.execute(
            f"INSERT INTO bare_jobs (payload) SELECT {sql_payload('n')} FROM generate_series(1, %(n)s) n",
            {"n": tasks, "size": payload_bytes},
        )


# snapshot counts of completed tasks: one statement = one snapshot, so the count is what had committed when it ran
COMPLETED_SQL = {
    "ours": "SELECT count(*) FROM task_queue_chunk WHERE vector_status = 'completed'",
    # PgQueuer deletes a job from its queue table in the same statement that logs it successful
    "pgqueuer": "SELECT %(total)s - count(*) FROM pgqueuer",
    "bare": "SELECT count(*) FROM bare_jobs WHERE status = 'done'",
}


def wal_position(conn: psycopg.Connection) -> str | None:
    """The server's WAL insert position. WAL bytes per completed task is the bench's noise-free figure: it does
    not move with the load of a shared machine, and it counts the write amplification (row versions, index entries,
    row locks, full-page images after the checkpoint) that the tasks-per-second figures pay for."""
    try:
        return conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]
    except psycopg.Error:  # a role without the privilege (an external server)
        conn.rollback()
        return None


def wal_since(conn: psycopg.Connection, start: str | None) -> int | None:
    if start is None:
        return None
    return int(conn.execute("SELECT pg_current_wal_insert_lsn() - %s::pg_lsn", (start,)).fetchone()[0])


def completed_count(conn: psycopg.Connection, contender: str, total: int) -> int:
    sql = COMPLETED_SQL[SAME_DATA_AS.get(contender, contender)]
    return int(conn.execute(sql, {"total": total}).fetchone()[0])


def rollup_mismatches(url: str) -> int:
    """Pages and documents whose vector status differs from the bubble-up rule applied to their children: the
    invariant our bubble-up must keep under concurrency (0 expected)."""
    with psycopg.connect(url) as conn:
        pages = conn.execute(
            """SELECT count(*) FROM task_queue_page p
               WHERE p.vector_status IS DISTINCT FROM
                     (SELECT docqueue_rollup(c.vector_status) FROM task_queue_chunk c WHERE c.page_id = p.id)"""
        ).fetchone()[0]
        documents = conn.execute(
            """SELECT count(*) FROM documents d
               WHERE d.vector_index_status IS DISTINCT FROM
                     (SELECT docqueue_rollup(p.vector_status) FROM task_queue_page p WHERE p.document_id = d.id)"""
        ).fetchone()[0]
    return int(pages) + int(documents)


# ---------------------------------------------------------------------------------------------------- workers
# Each worker: connect and warm up, wait at the barrier, work until `stop` is set (or the queue is empty), and
# report (completions, [(monotonic time a completion batch committed, tasks in it), ...]).
Timeline = list[tuple[float, int]]


def ours_worker(url: str, batch: int, ready, stop) -> Timeline:
    queue = TaskQueue(create_queue_engine(url, pool_size=1, max_overflow=1), QueueSettings())
    worker_id = make_worker_id("bench")
    timeline: Timeline = []
    try:
        with queue.engine.connect():
            pass
        ready.wait(READY_TIMEOUT_S)
        while not stop.is_set():
            claimed = queue.claim(VECTOR_CHUNK, worker_id, batch)
            if not claimed:
                break
            outcome = queue.complete(VECTOR_CHUNK, worker_id, [row["id"] for row in claimed])
            timeline.append((time.monotonic(), len(outcome.applied)))
    finally:
        queue.engine.dispose()
    return timeline


def ours_settle_worker(url: str, batch: int, ready, stop) -> Timeline:
    """The worker loop on TaskQueue.settle: each call completes the batch in hand and claims the next one, in one
    transaction (one commit and one bubble-up pass per batch instead of two). On stop it settles what it holds."""
    queue = TaskQueue(create_queue_engine(url, pool_size=1, max_overflow=1), QueueSettings())
    worker_id = make_worker_id("bench")
    timeline: Timeline = []
    try:
        with queue.engine.connect():
            pass
        ready.wait(READY_TIMEOUT_S)
        held: list[str] = []
        while True:
            stopping = stop.is_set()
            result = queue.settle(VECTOR_CHUNK, worker_id, completed=held, claim=0 if stopping else batch)
            if result.completed.applied:
                timeline.append((time.monotonic(), len(result.completed.applied)))
            held = [row["id"] for row in result.claimed]
            if stopping or not held:
                break
    finally:
        queue.engine.dispose()
    return timeline


def bare_worker(url: str, batch: int, ready, stop) -> Timeline:
    worker_id = make_worker_id("bare")
    timeline: Timeline = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT 1")
        ready.wait(READY_TIMEOUT_S)
        while not stop.is_set():
            ids = [row[0] for row in conn.execute(BARE_CLAIM, {"worker": worker_id, "limit": batch})]
            if not ids:
                break
            done = conn.execute(BARE_COMPLETE, {"ids": ids, "worker": worker_id}).rowcount
            timeline.append((time.monotonic(), done))
    return timeline


def pgqueuer_worker(url: str, batch: int, ready, stop) -> Timeline:
    """One PgQueuer QueueManager, configured for throughput as its docs suggest:
    - asyncpg through AsyncpgPoolDriver (pool of 3: LISTEN connection + dequeue + completion-log flushes run
      concurrently instead of queueing on one connection's lock; in a trial on this machine against the
      single-connection AsyncpgDriver it was faster with 4 workers and within the noise otherwise);
    - batch_size = the configuration's batch (its dequeue LIMIT and its completion-log buffer size);
    - dequeue_timeout 1 s: only consulted when the queue is empty; with a backlog the manager dequeues back to
      back (its fetch loop never sleeps while jobs come back);
    - no concurrency limits and no max_concurrent_tasks (its cheapest dequeue shape), durable tables (its
      default, like ours), continuous mode; a no-op async entrypoint.
    Its structure verification runs once before the barrier rather than inside the window."""
    import asyncpg
    from pgqueuer import AsyncpgPoolDriver, Queries, QueueManager

    timeline: Timeline = []
    logging.getLogger("pgqueuer").setLevel(logging.WARNING)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        pool = await asyncpg.create_pool(url, min_size=3, max_size=3)
        try:
            queries = Queries(AsyncpgPoolDriver(pool))
            manager = QueueManager(queries)

            @manager.entrypoint(PGQ_ENTRYPOINT)
            async def noop(job) -> None:
                return None

            log_jobs = queries.log_jobs

            async def timed_log_jobs(job_status) -> None:
                await log_jobs(job_status)
                timeline.append((time.monotonic(), sum(1 for _, status, _ in job_status if status == "successful")))

            queries.log_jobs = timed_log_jobs  # type: ignore[method-assign]
            await manager.verify_structure()

            async def verified() -> None:
                return None

            manager.verify_structure = verified  # type: ignore[method-assign]
            await loop.run_in_executor(None, ready.wait, READY_TIMEOUT_S)
            threading.Thread(target=_shutdown_on, args=(stop, loop, manager.shutdown), daemon=True).start()
            await manager.run(dequeue_timeout=timedelta(seconds=1), batch_size=batch)
        finally:
            await pool.close()

    asyncio.run(main())
    return timeline


def _shutdown_on(stop, loop: asyncio.AbstractEventLoop, shutdown: asyncio.Event) -> None:
    stop.wait()
    try:
        loop.call_soon_threadsafe(shutdown.set)
    except RuntimeError:  # the manager already ended and its loop is closed
        pass


WORKERS: dict[str, Callable] = {
    "ours": ours_worker,
    "ours_settle": ours_settle_worker,
    "pgqueuer": pgqueuer_worker,
    "bare": bare_worker,
}


def _worker_process(contender: str, url: str, batch: int, ready, stop, results, index: int) -> None:
    try:
        timeline = WORKERS[contender](url, batch, ready, stop)
        results.put((index, timeline, None))
    except BaseException as exc:  # the parent must learn of it rather than wait for a report
        try:
            ready.abort()
        except Exception:
            pass
        results.put((index, [], f"{exc.__class__.__name__}: {str(exc)[:500]}"))


# ---------------------------------------------------------------------------------------------------- measuring
@dataclass
class Measurement:
    contender: str
    workers: int
    batch: int
    rate: float
    completed_in_window: int
    drained: bool
    worker_reported_in_window: int
    wal_bytes_per_task: float | None = None
    rollup_mismatches: int | None = None
    errors: list[str] = field(default_factory=list)


def measure(contender: str, url: str, workers: int, batch: int, window_s: float, total: int) -> Measurement:
    context = mp.get_context("fork")  # children inherit the imports; the parent holds no connection when forking
    ready, stop, results = context.Barrier(workers + 1), context.Event(), context.Queue()
    with psycopg.connect(url) as conn:
        before = completed_count(conn, contender, total)
        wal_start = wal_position(conn)
    processes = [
        context.Process(target=_worker_process, args=(contender, url, batch, ready, stop, results, i), daemon=True)
        for i in range(workers)
    ]
    for process in processes:
        process.start()
    errors: list[str] = []
    reports: dict[int, Timeline] = {}
    started, at_end = time.monotonic(), before
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT 1")
            ready.wait(READY_TIMEOUT_S)
            started = time.monotonic()
            time.sleep(max(0.0, started + window_s - time.monotonic()))
            at_end = completed_count(conn, contender, total)
    except Exception as exc:  # a broken barrier: some worker failed; its own report says why
        errors.append(f"measurement: {exc.__class__.__name__}: {str(exc)[:300]}")
    finally:
        stop.set()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while len(reports) < workers and time.monotonic() < deadline:
            try:
                index, timeline, error = results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue_module.Empty:
                break
            reports[index] = timeline
            if error:
                errors.append(f"worker {index}: {error}")
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
    if len(reports) < workers and not errors:
        errors.append(f"only {len(reports)} of {workers} workers reported")

    completed = at_end - before
    events = [event for timeline in reports.values() for event in timeline]
    reported_in_window = sum(n for t, n in events if started <= t <= started + window_s)
    drained = at_end >= total
    if drained and events:
        # emptied inside the window: the rate is over the time it actually took
        rate = completed / max(1e-6, max(t for t, _ in events) - started)
    else:
        rate = completed / window_s

    with psycopg.connect(url) as conn:
        after_stop = completed_count(conn, contender, total) - before
        wal_bytes = wal_since(conn, wal_start)
    reported_total = sum(n for _, n in events)
    if not errors and reported_total != after_stop:
        errors.append(f"workers reported {reported_total} completions, the database holds {after_stop}")
    mismatches = rollup_mismatches(url) if "ours" in (contender, SAME_DATA_AS.get(contender)) and not errors else None
    if mismatches:
        errors.append(f"{mismatches} parents disagree with the bubble-up rule of their children")
    wal_per_task = round(wal_bytes / after_stop, 1) if wal_bytes is not None and after_stop > 0 else None
    return Measurement(
        contender, workers, batch, rate, completed, drained, reported_in_window, wal_per_task, mismatches, errors
    )


# ---------------------------------------------------------------------------------------------------- the run
@dataclass
class Server:
    admin_url: str
    description: str
    stop: Callable[[], None]


def start_server() -> Server:
    configured = os.environ.get(ADMIN_URL_ENV, "").strip()
    if configured:
        url = plain_url(configured)
        return Server(url, f"external ({redacted(url)})", lambda: None)
    from queue_db.embedded_postgres import EmbeddedPostgres

    # not under any test tmp dir: the server runs as its own user and needs to reach its home
    home = Path(tempfile.mkdtemp(prefix="docqueue-bench-pg-"))
    server = EmbeddedPostgres(home, port=EMBEDDED_PORT)  # default durability: fsync and synchronous_commit on
    server.ensure_running()

    def stop() -> None:
        server.stop(mode="fast")
        shutil.rmtree(home, ignore_errors=True)

    return Server(f"postgresql://postgres@127.0.0.1:{server.port}/postgres", "embedded PostgreSQL (fsync on)", stop)


def server_version(admin_url: str) -> str:
    with psycopg.connect(admin_url) as conn:
        return conn.execute("SHOW server_version").fetchone()[0]


def build_templates(
    databases: Databases, layout: Layout, needed: set[str], payload_bytes: int = 0
) -> dict[str, tuple[str, float]]:
    """One seeded, vacuumed, frozen database per contender. Returns {contender: (template, seconds to seed)}."""
    seeders = {
        "ours": lambda url: seed_ours(url, layout, payload_bytes),
        "pgqueuer": lambda url: seed_pgqueuer(url, layout.tasks, payload_bytes),
        "bare": lambda url: seed_bare(url, layout.tasks, payload_bytes),
    }
    templates = {}
    for contender, seed in seeders.items():
        if contender not in needed:
            continue
        name = databases.create(f"{contender}_template")
        url = databases.url(name)
        began = time.monotonic()
        seed(url)
        seconds = time.monotonic() - began
        vacuum_analyze(url)
        with psycopg.connect(url) as conn:
            pending = completed_count(conn, contender, layout.tasks)
        if pending != 0:
            raise RuntimeError(f"{contender} template starts with {pending} completed tasks")
        databases.freeze_as_template(name)
        templates[contender] = (name, seconds)
    return templates


def config_key(workers: int, batch: int) -> str:
    return f"{workers}w_b{batch}"


def run(args: argparse.Namespace) -> int:
    layout = Layout.for_tasks(args.tasks)
    load_start = os.getloadavg()
    server = start_server()
    databases = Databases(server.admin_url)
    measurements: list[Measurement] = []
    try:
        version = server_version(server.admin_url)
        text = f"{args.payload_bytes} chars" if args.payload_bytes else "short"
        print(
            f"server: {server.description}, PostgreSQL {version}; {layout.tasks} tasks "
            f"({layout.documents} documents x {layout.pages_per_document} pages x {layout.chunks_per_page} "
            f"chunks, task text {text}), window {args.window:g} s, "
            f"load average {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f} on {os.cpu_count()} cores",
            flush=True,
        )
        templates = build_templates(
            databases, layout, {SAME_DATA_AS.get(c, c) for c in args.contenders}, args.payload_bytes
        )
        print("seeded: " + ", ".join(f"{c} {s:.1f} s" for c, (_, s) in templates.items()), flush=True)
        # rounds interleave: every configuration and contender once per round, so a burst of load from a
        # neighbour lands on one round's figures, and the median over rounds leaves it out
        for round_no in range(1, args.rounds + 1):
            for workers in args.workers:
                for batch in args.batches:
                    for contender in args.contenders:
                        source = templates[SAME_DATA_AS.get(contender, contender)][0]
                        name = databases.create(contender, template=source)
                        checkpoint(server.admin_url)
                        result = measure(contender, databases.url(name), workers, batch, args.window, layout.tasks)
                        databases.drop(name)
                        measurements.append(result)
                        wal = f"  {result.wal_bytes_per_task:>6.0f} WAL bytes/task" if result.wal_bytes_per_task else ""
                        print(
                            f"  round {round_no}  {contender:<11} {workers:>2} workers  batch {batch:>3}: "
                            f"{result.rate:>9.1f} tasks/s{wal}"
                            f"{'  (drained)' if result.drained else ''}"
                            f"{'  ERRORS: ' + '; '.join(result.errors) if result.errors else ''}",
                            flush=True,
                        )
    finally:
        databases.drop_all()
        server.stop()
    load_end = os.getloadavg()
    return report(args, layout, server.description, measurements, load_start, load_end)


RATIO_PAIRS = {
    "ours_pgqueuer": ("ours", "pgqueuer"),
    "ours_settle_pgqueuer": ("ours_settle", "pgqueuer"),
    "ours_bare": ("ours", "bare"),
}


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def report(args, layout: Layout, server: str, measurements: list[Measurement], load_start, load_end) -> int:
    # per (contender, configuration): the rates of the rounds, in round order
    runs: dict[str, dict[str, list[Measurement]]] = {c: {} for c in CONTENDERS}
    for m in measurements:
        runs[m.contender].setdefault(config_key(m.workers, m.batch), []).append(m)
    rates = {
        c: {k: round(statistics.median(x.rate for x in ms), 1) for k, ms in by_key.items()}
        for c, by_key in runs.items()
    }
    wal = {
        c: {k: _median([x.wal_bytes_per_task for x in ms if x.wal_bytes_per_task]) for k, ms in by_key.items()}
        for c, by_key in runs.items()
    }
    # a ratio is taken within a round (both figures measured minutes apart), then the median over rounds
    round_ratios: dict[str, dict[str, list[float]]] = {name: {} for name in RATIO_PAIRS}
    for name, (a, b) in RATIO_PAIRS.items():
        for key in set(runs[a]) & set(runs[b]):
            round_ratios[name][key] = [round(x.rate / y.rate, 3) for x, y in zip(runs[a][key], runs[b][key]) if y.rate]
    ratios = {name: {key: _median(values) for key, values in by_key.items()} for name, by_key in round_ratios.items()}
    print()
    print(f"medians over {args.rounds} round(s); ratios: median of the per-round ratios")
    print(
        f"{'workers':>7} {'batch':>5} | {'ours':>9} {'settle':>9} {'pgqueuer':>9} {'bare':>9} | "
        f"{'ours/pgq':>8} {'settle/pgq':>10} {'ours/bare':>9} | WAL bytes/task ours settle pgq bare"
    )
    print("-" * 128)
    for workers in args.workers:
        for batch in args.batches:
            key = config_key(workers, batch)
            shown = [rates[c].get(key) or 0 for c in CONTENDERS]
            shown_ratios = [ratios[name].get(key) or 0 for name in RATIO_PAIRS]
            shown_wal = " ".join(f"{wal[c].get(key) or 0:>6.0f}" for c in CONTENDERS)
            print(
                f"{workers:>7} {batch:>5} | " + " ".join(f"{r:>9.1f}" for r in shown) + " | "
                f"{shown_ratios[0]:>8.3f} {shown_ratios[1]:>10.3f} {shown_ratios[2]:>9.3f} | {shown_wal}"
            )
    errors = [f"{m.contender} {config_key(m.workers, m.batch)}: {e}" for m in measurements for e in m.errors]
    for error in errors:
        print(f"ERROR {error}")
    result = {
        "tasks": layout.tasks,
        "layout": {
            "documents": layout.documents,
            "pages_per_document": layout.pages_per_document,
            "chunks_per_page": layout.chunks_per_page,
        },
        "window_s": args.window,
        "rounds": args.rounds,
        "payload_bytes": args.payload_bytes,
        "server": server,
        "tasks_per_second": rates,
        "tasks_per_second_by_round": {
            c: {k: [round(x.rate, 1) for x in ms] for k, ms in by_key.items()} for c, by_key in runs.items() if by_key
        },
        "wal_bytes_per_task": wal,
        "ratios": ratios,
        "ratios_by_round": round_ratios,
        "ratio_ours_pgqueuer_4w_b50": ratios["ours_pgqueuer"].get("4w_b50"),
        "ratio_ours_settle_pgqueuer_4w_b50": ratios["ours_settle_pgqueuer"].get("4w_b50"),
        "ratio_ours_bare_4w_b50": ratios["ours_bare"].get("4w_b50"),
        "drained": [f"{m.contender} {config_key(m.workers, m.batch)}" for m in measurements if m.drained],
        "worker_reported_in_window": {
            f"{m.contender} {config_key(m.workers, m.batch)}": m.worker_reported_in_window for m in measurements
        },
        "loadavg_start": [round(x, 2) for x in load_start],
        "loadavg_end": [round(x, 2) for x in load_end],
        "cpus": os.cpu_count(),
        "errors": errors,
    }
    print_result(result, sort_keys=True)
    return 1 if errors else 0


def _contender_list(text: str) -> list[str]:
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    unknown = sorted(set(chosen) - set(CONTENDERS))
    if not chosen or unknown:
        raise argparse.ArgumentTypeError(f"--contenders takes names from {','.join(CONTENDERS)}; unknown: {unknown}")
    return [c for c in CONTENDERS if c in chosen]


def _int_list(text: str, limit: int, what: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{what} must be comma-separated whole numbers") from exc
    if not values or any(not 1 <= v <= limit for v in values):
        raise argparse.ArgumentTypeError(f"{what} must be between 1 and {limit}")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--window", type=float, default=None, help="seconds each configuration runs (default 8)")
    parser.add_argument("--tasks", type=int, default=None, help="pending tasks at the start (default 100000)")
    parser.add_argument(
        "--workers",
        type=lambda s: _int_list(s, MAX_WORKERS, "--workers"),
        default=None,
        help="worker process counts (default 1,4,8)",
    )
    parser.add_argument(
        "--batches",
        type=lambda s: _int_list(s, MAX_BATCH, "--batches"),
        default=None,
        help="batch sizes (default 1,50)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure every configuration this many times, interleaved; figures are medians",
    )
    parser.add_argument(
        "--contenders",
        type=_contender_list,
        default=list(CONTENDERS),
        help=f"comma-separated subset of {','.join(CONTENDERS)} (default: all)",
    )
    parser.add_argument(
        "--payload-bytes",
        type=int,
        default=0,
        help="each task's text padded to this many characters, the same for every contender "
        "(default 0: 'text <n>'; a 256-token chunk is ~1200)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 5000 tasks, 1.5 s windows, 1 and 4 workers")
    args = parser.parse_args(argv)
    quick = args.quick
    args.window = args.window if args.window is not None else (1.5 if quick else 8.0)
    args.tasks = args.tasks if args.tasks is not None else (5000 if quick else 100_000)
    args.workers = args.workers or ([1, 4] if quick else [1, 4, 8])
    args.batches = args.batches or [1, 50]
    if not 0 < args.window <= MAX_WINDOW_S:
        parser.error(f"--window must be in (0, {MAX_WINDOW_S:g}]")
    if not 0 <= args.payload_bytes <= MAX_PAYLOAD_BYTES:
        parser.error(f"--payload-bytes must be between 0 and {MAX_PAYLOAD_BYTES}")
    if not 1 <= args.rounds <= MAX_ROUNDS:
        parser.error(f"--rounds must be between 1 and {MAX_ROUNDS}")
    if not 10 <= args.tasks <= MAX_TASKS:
        parser.error(f"--tasks must be between 10 and {MAX_TASKS}")
    if "pgqueuer" in args.contenders and not all(importlib.util.find_spec(m) for m in ("pgqueuer", "asyncpg")):
        parser.error(
            "the pgqueuer contender needs PgQueuer (pip install -e .[bench]); without it, run "
            "--contenders ours,ours_settle,bare"
        )
    return args


if __name__ == "__main__":
    sys.exit(run(parse_args()))
