"""The work of one tick, one claim, one recovery run and one status page does not grow with the corpus: the calls
the sensors, workers, recovery job and CLI make, through the same functions, on a home of 21,000 chunks (1,000
completed, 20,000 pending) and on one of 160,000 (100,000 completed, 60,000 pending), both seeded by bench/scale.py's
own seeding, counted in database buffers, not in seconds. Every statement they send to the queue database and to
Dagster's runs under auto_explain (ANALYZE, BUFFERS); each call must send the same statements at both sizes, and
each statement may read at most FACTOR x its small figure + SLACK at the large one. A statement that reads a table
whole, reads and sorts every waiting task, or walks an index without stopping, reads several times more at 160,000
and fails it. Buffer counts do not depend on the machine's load. What it leaves out (the vector store, the graph,
`docqueue stats`, sizes past 160,000) is listed in docs/development.md, "Tests"."""

from __future__ import annotations

import json
import re
import time
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import sqlalchemy as sa

from bench._scale_work import make_recovery_work
from bench.scale import CHUNKS, PAGES, retire_all, seed_dagster_partitions, seed_queue
from orchestration.code_location import build_definitions
from orchestration.environment import dagster_instance, prepare_environment
from orchestration.maintenance import recover
from orchestration.partitions import chunks_partitions, retire_partitions_as_configured
from queue_db.config import Settings
from queue_db.phases import VECTOR_CHUNK
from queue_db.readmodels import document_progress_rows
from resources.database import open_queue
from tests.figures import announce
from tests.integration.test_sensors import tick

PER_DOCUMENT = PAGES * CHUNKS
# (completed documents, pending documents): the history grows a hundredfold, the backlog threefold; 20,000 chunks
# waiting are more than a tick's 10 runs of 1,000 keys read
SMALL, LARGE = (5, 100), (500, 300)
STALE_TASKS, RETIRED_DOCUMENTS = 500, 25  # the recovery job's work, the same at either size
# the live completed partitions are capped, and so are the reads of the cap (retire_before reads cap + 1 index
# entries, each with its row when the planner prefers an index scan to a bitmap scan): a cap below the small
# home's 1,000 completed chunks makes both homes read the same entries
MAX_COMPLETED = 250
# What one statement may read in the large home: its figure in the small one by FACTOR, plus SLACK for the level
# B-trees gain in between (a buffer per index descent: a few hundred in a statement settling 500 tasks) and for a
# planner choosing an index scan of MAX_COMPLETED rows over a bitmap scan. A sequential scan of the chunk table
# reads ~1,300 buffers at 21,000 chunks and ~9,000 at 160,000
FACTOR, SLACK = 1.5, 600
UNMEASURED_SENSORS = ("inbox_sensor", "s3_intake_sensor")  # they read folders and buckets, not the corpus
EXPLAIN = (
    "LOAD 'auto_explain'",
    "SET auto_explain.log_min_duration = 0",
    "SET auto_explain.log_analyze = on",
    "SET auto_explain.log_buffers = on",
    "SET auto_explain.log_timing = off",
    "SET auto_explain.log_format = json",
    # a statement inside a function is counted in the buffers of the statement calling it
    "SET auto_explain.log_nested_statements = off",
    "SET client_min_messages = log",
)
# the liveness check Dagster's pooled storage sends on a checkout after a second idle
# (orchestration.dagster_pooled_storage): whether it is sent depends on how long the work before took, not on the
# corpus, so it is left out of the statements compared
PING = "SELECT 1"
COUNTED = ("Shared Hit Blocks", "Shared Read Blocks", "Local Hit Blocks", "Local Read Blocks", "Temp Read Blocks")


class BufferCounts:
    """Buffers the statements sent to `databases` read, summed per named call (`measuring`). Every pooled
    connection to them gets auto_explain when it is checked out, so a statement is counted whatever engine sends
    it: the queue's shared engine, the resources' engines, Dagster's storage."""

    def __init__(self, databases: set[str]):
        self.databases = databases
        self.call: str | None = None
        # per call, in the order sent: each statement's buffers, its text and the shape of its plan
        self.calls: dict[str, list[tuple[int, str, str]]] = {}

    def checkout(self, dbapi_connection, record, _proxy) -> None:
        if record.info.get("explained") or dbapi_connection.info.dbname not in self.databases:
            return
        was = dbapi_connection.autocommit
        dbapi_connection.autocommit = True  # the settings outlive any transaction the caller rolls back
        with dbapi_connection.cursor() as cursor:
            for statement in EXPLAIN:
                cursor.execute(statement)
        dbapi_connection.autocommit = was
        if hasattr(dbapi_connection, "add_notice_handler"):  # psycopg 3: the queue's engines
            dbapi_connection.add_notice_handler(lambda diagnostic: self.notice(diagnostic.message_primary or ""))
        else:  # psycopg2, Dagster's storage: its notices list may be anything with an append
            dbapi_connection.notices = _Appended(self.notice)
        record.info["explained"] = True

    def notice(self, message: str) -> None:
        if self.call is None or "plan:" not in message:
            return
        explained = json.loads(message.split("plan:", 1)[1])
        buffers = sum(explained["Plan"].get(name, 0) for name in COUNTED)
        text = " ".join(explained.get("Query Text", "").split())
        if text == PING:
            return
        self.calls.setdefault(self.call, []).append((buffers, text, _shape(explained["Plan"])))

    @contextmanager
    def measuring(self, call: str):
        self.call = call
        try:
            yield
        finally:
            self.call = None


def _shape(node: dict) -> str:
    """A plan in one line: its nodes with their relation or index, heap fetches and buffers."""
    own = " ".join(
        str(part)
        for part in (
            node["Node Type"],
            node.get("Index Name") or node.get("Relation Name") or "",
            f"fetches={node['Heap Fetches']}" if "Heap Fetches" in node else "",
            f"rows={node.get('Actual Rows')}",
            f"buffers={sum(node.get(name, 0) for name in COUNTED)}",
        )
        if part
    )
    children = [_shape(child) for child in node.get("Plans", [])]
    return own + (" (" + "; ".join(children) + ")" if children else "")


class _Appended:
    def __init__(self, receive):
        self.append = receive


@contextmanager
def explained(databases: set[str]):
    counts = BufferCounts(databases)
    sa.event.listen(sa.pool.Pool, "checkout", counts.checkout)
    try:
        yield counts
    finally:
        sa.event.remove(sa.pool.Pool, "checkout", counts.checkout)


def _home(name: str, tmp_path: Path, monkeypatch, create_database, migrated_template):
    """A queue database, a Dagster database and a DAGSTER_HOME of their own, in this test's environment."""

    monkeypatch.setenv("DOCQUEUE_PARTITION_MAX_COMPLETED", str(MAX_COMPLETED))
    queue_url = create_database(template=migrated_template)
    dagster_url = create_database(prefix="dagster")
    monkeypatch.setenv("DOCQUEUE_DATABASE_URL", queue_url)
    monkeypatch.setenv("DOCQUEUE_DAGSTER_PG_URL", dagster_url)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / name / "dagster"))
    prepare_environment(Settings.from_env())
    settings = Settings.from_env()
    return build_definitions(settings), dagster_instance(settings), open_queue(settings), dagster_url


def _measure(size: tuple[int, int], tmp_path, monkeypatch, create_database, migrated_template) -> dict:
    """Seed a home, then make each call with its statements counted: the chunk rows, the seeding's seconds and,
    per call, its statements in order (BufferCounts.calls)."""
    completed_documents, pending_documents = size
    defs, instance, queue, dagster_url = _home(
        f"n{completed_documents}", tmp_path, monkeypatch, create_database, migrated_template
    )
    started = time.perf_counter()
    seed_queue(queue.engine, completed_documents, pending_documents)
    seed_dagster_partitions(queue.engine, dagster_url.replace("postgresql://", "postgresql+psycopg://", 1))
    # a corpus this size as the recovery schedule keeps it: partitions past DOCQUEUE_PARTITION_MAX_COMPLETED
    # retired, and the row versions and index entries that leaves behind vacuumed, as autovacuum does between runs.
    retire_all(instance, queue.engine)
    # A home registers and retires its keys a batch at a time, so Dagster's table of keys stays near its live set
    # (autovacuum's freed space is filled again); seeded at once and then 99% retired, it would be a heap five
    # times that, which Dagster's read of a definition's keys (a scan of the table) would pay for
    for url, vacuum in ((queue.engine.url, "VACUUM ANALYZE"), (sa.engine.make_url(dagster_url), "VACUUM FULL ANALYZE")):
        engine = sa.create_engine(url.set(drivername="postgresql+psycopg"))
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql(vacuum)
        engine.dispose()
    with queue.engine.connect() as conn:
        chunks = conn.exec_driver_sql("SELECT count(*) FROM task_queue_chunk").scalar()
    assert chunks == (completed_documents + pending_documents) * PER_DOCUMENT
    seeded = time.perf_counter() - started

    dagster = Settings.from_env().dagster
    first_pending = completed_documents + 1
    # a ranged run's 1,000 keys: five pending documents' chunks, the range a vector_chunk run resolves when it starts
    start = f"scale-{first_pending:06d}/p0001/c000"
    end = f"scale-{first_pending + 1000 // PER_DOCUMENT - 1:06d}/p{PAGES:04d}/c{CHUNKS - 1:03d}"
    databases = {queue.engine.url.database, sa.engine.make_url(dagster_url).database}
    with explained(databases) as counts:
        for sensor in defs.sensors:
            if sensor.name not in UNMEASURED_SENSORS:
                with counts.measuring(f"tick {sensor.name}"):
                    tick(defs, instance, sensor.name)
        with counts.measuring("ranged run keys"):
            with dg.partition_loading_context(dynamic_partitions_store=instance):
                keys = chunks_partitions.get_partition_keys_in_range(dg.PartitionKeyRange(start, end))
        assert len(keys) == 1000
        with counts.measuring("claim 50"):
            claimed = queue.settle(VECTOR_CHUNK, "scale-work", completed=[], claim=50).claimed
        with counts.measuring("settle 50 + claim 50"):
            queue.settle(VECTOR_CHUNK, "scale-work", completed=[str(r["id"]) for r in claimed], claim=50)
        with counts.measuring("status page"):
            assert len(document_progress_rows(queue.engine, limit=50)) == 50
        make_recovery_work(queue, STALE_TASKS, RETIRED_DOCUMENTS)
        with counts.measuring("recovery tick with work"):
            tick(defs, instance, "recovery_sensor")
        with counts.measuring("recovery release"):
            released = recover(queue)["released_total"]
        with counts.measuring("recovery retire"):
            retired = sum(retire_partitions_as_configured(instance, queue.engine, dagster).values())
    instance.dispose()
    assert released == STALE_TASKS and retired > 0, (released, retired)
    return {"chunks": chunks, "seeded_s": seeded, "calls": counts.calls}


def _literals_out(text: str) -> str:
    """A statement's text without its literals (keys and ids differ between the homes)."""
    return re.sub(r"\b\d+\b", "?", re.sub(r"'[^']*'", "?", text))


def test_per_call_work_stays_flat_from_21000_to_160000_chunks(
    docqueue_env, tmp_path, monkeypatch, create_database, migrated_template, request
):
    small = _measure(SMALL, tmp_path, monkeypatch, create_database, migrated_template)
    large = _measure(LARGE, tmp_path, monkeypatch, create_database, migrated_template)
    assert large["chunks"] - small["chunks"] >= 99_000

    lines = [
        f"buffers per call, {small['chunks']:,} chunks (seeded in {small['seeded_s']:.0f} s) -> "
        f"{large['chunks']:,} chunks (seeded in {large['seeded_s']:.0f} s); statements sent:"
    ]
    grown, changed = [], []
    closest = (0.0, "")
    for call, statements in small["calls"].items():
        at_large = large["calls"].get(call, [])
        lines.append(
            f"  {call}: {sum(b for b, _, _ in statements):,} -> {sum(b for b, _, _ in at_large):,} "
            f"({len(statements)} -> {len(at_large)})"
        )
        # the same statements in the same order: a loop that runs once more per so many rows is a cost of N too
        if [_literals_out(t) for _, t, _ in statements] != [_literals_out(t) for _, t, _ in at_large]:
            changed.append(call)
            continue
        for (before, text, shape_before), (after, _, shape_after) in zip(statements, at_large):
            closest = max(closest, (after / (FACTOR * before + SLACK), f"{call}: {before:,} -> {after:,}"))
            if after > FACTOR * before + SLACK:
                grown.append(
                    f"{call}: {before:,} -> {after:,}: {text[:200]}\n    [{shape_before}]\n    [{shape_after}]"
                )
    lines.append(f"closest to the bound ({closest[0]:.2f} of it): {closest[1]}")
    announce(request, "\n".join(lines))
    assert set(large["calls"]) == set(small["calls"]), lines
    # every call sent statements the counts saw: a call counted as nothing would pass whatever it read
    assert all(statements for statements in small["calls"].values()), lines
    assert not changed, (
        f"calls sending other statements at {large['chunks']:,} chunks than at {small['chunks']:,}: {changed}\n"
        + "\n".join(lines)
    )
    assert not grown, (
        f"statements reading more than {FACTOR:g} x + {SLACK} buffers at {large['chunks']:,} chunks:\n"
        + "\n".join(grown)
        + "\n"
        + "\n".join(lines)
    )
