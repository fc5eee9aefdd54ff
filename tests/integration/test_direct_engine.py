"""queue_db.direct_engine, the queue's database on psycopg alone (`status`, `stats`, `ingest`, `search`), on real
PostgreSQL: SQLAlchemy's transaction semantics as the queue uses them, its errors read by the queue's rules, and the
read models, registrations and migrations giving what they give through SQLAlchemy's pooled engine."""

from __future__ import annotations

import json
import socket
import threading

import psycopg
import pytest

from queue_db import schema as schema_file
from queue_db.database_urls import libpq_url
from queue_db.direct_engine import DirectEngine
from queue_db.migrate import pending_migrations, upgrade
from queue_db.near_duplicates import group_counts
from queue_db.phases import VECTOR_CHUNK
from queue_db.progress_signal import News, ProgressListener, announce
from queue_db.queue import TaskQueue, make_worker_id
from queue_db.readmodels import document_progress_rows, error_classes_rows, phase_timings_rows, queue_statistics_rows
from queue_db.run_costs import run_size_rows
from queue_db.transactions import is_integrity_error, is_transient, with_retries
from tests.cli_runner import probe as python_probe
from tests.queue_support import build_document, register


@pytest.fixture
def direct(database_url):
    engine = DirectEngine(database_url)
    yield engine
    engine.dispose()


def _scratch_table(engine: DirectEngine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE scratch (id int PRIMARY KEY, note text)")


def _notes(engine: DirectEngine) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.exec_driver_sql("SELECT id, note FROM scratch ORDER BY id").all()]


def test_sqlalchemy_urls_become_libpq_ones():
    assert (
        libpq_url("postgresql+psycopg://u:p%40ss@h:5/db?sslmode=disable")
        == "postgresql://u:p%40ss@h:5/db?sslmode=disable"
    )
    assert libpq_url("postgresql://h/db") == "postgresql://h/db"


def test_what_a_connection_does_not_commit_is_rolled_back_and_begin_commits(direct):
    _scratch_table(direct)
    with direct.connect() as conn:
        conn.exec_driver_sql("INSERT INTO scratch VALUES (1, 'uncommitted')")
    with direct.connect() as conn:
        conn.exec_driver_sql("INSERT INTO scratch VALUES (2, 'committed')")
        conn.commit()
    with direct.begin() as conn:
        conn.exec_driver_sql("INSERT INTO scratch VALUES (%(id)s, %(note)s)", {"id": 3, "note": "begun"})
    with pytest.raises(RuntimeError), direct.begin() as conn:
        conn.exec_driver_sql("INSERT INTO scratch VALUES (4, 'undone')")
        raise RuntimeError("the block fails")
    assert _notes(direct) == [(2, "committed"), (3, "begun")]


def test_a_savepoint_undoes_its_block_only_and_integrity_errors_are_told_apart(direct):
    _scratch_table(direct)
    with direct.begin() as conn:
        conn.exec_driver_sql("INSERT INTO scratch VALUES (1, 'kept')")
        with pytest.raises(psycopg.Error) as refused, conn.begin_nested():
            conn.exec_driver_sql("INSERT INTO scratch VALUES (1, 'a duplicate key')")
        assert is_integrity_error(refused.value) and not is_transient(refused.value)
        conn.exec_driver_sql("INSERT INTO scratch VALUES (2, 'after the savepoint')")
    assert _notes(direct) == [(1, "kept"), (2, "after the savepoint")]


def test_begin_on_a_connection_with_an_open_transaction_is_refused(direct):
    with direct.connect() as conn:
        conn.exec_driver_sql("SELECT 1")
        with pytest.raises(psycopg.ProgrammingError), conn.begin():
            pass


def test_results_read_as_sqlalchemy_results(direct):
    _scratch_table(direct)
    with direct.begin() as conn:
        inserted = conn.exec_driver_sql("INSERT INTO scratch VALUES (1, 'a'), (2, 'b')")
        assert inserted.rowcount == 2
        conn.exec_driver_sql("INSERT INTO scratch VALUES (%(id)s, %(note)s)", [{"id": 3, "note": "c"}])
    with direct.connect() as conn:
        result = conn.exec_driver_sql("SELECT id, note FROM scratch ORDER BY id")
        assert result.keys() == ["id", "note"]
        rows = result.all()
        assert [(r.id, r.note) for r in rows] == [(1, "a"), (2, "b"), (3, "c")] and rows[0][1] == "a"
        assert rows[0]._mapping == {"id": 1, "note": "a"}
        query = "SELECT id, note FROM scratch WHERE id = %(id)s"
        assert conn.exec_driver_sql(query, {"id": 2}).mappings().first() == {"id": 2, "note": "b"}
        assert conn.exec_driver_sql(query, {"id": 9}).mappings().first() is None
        assert conn.exec_driver_sql("SELECT count(*) FROM scratch").scalar_one() == 3
        assert conn.exec_driver_sql("SELECT note FROM scratch WHERE id = 9").scalar() is None
        assert [
            dict(r) for r in conn.exec_driver_sql("SELECT id FROM scratch WHERE id < 3 ORDER BY id").mappings()
        ] == [{"id": 1}, {"id": 2}]
        with pytest.raises(LookupError):
            conn.exec_driver_sql("SELECT id FROM scratch").one()


def test_autocommit_makes_each_statement_its_own_transaction(direct):
    _scratch_table(direct)
    with direct.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("INSERT INTO scratch VALUES (1, 'at once')")
    with direct.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:
        conn.exec_driver_sql("INSERT INTO scratch VALUES (2, 'at once too')")
    assert _notes(direct) == [(1, "at once"), (2, "at once too")]
    with direct.connect() as conn:  # the kept connection is back in transactions
        conn.exec_driver_sql("INSERT INTO scratch VALUES (3, 'not committed')")
    assert len(_notes(direct)) == 2


def test_one_idle_connection_is_kept_and_a_broken_one_is_replaced(direct, pg_admin_url):
    def backend(engine: DirectEngine) -> int:
        with engine.connect() as conn:
            return conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()

    first = backend(direct)
    assert backend(direct) == first
    with psycopg.connect(pg_admin_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (first,))
    # the kept connection died: the statement fails as a transient error and the retry takes a new one
    assert with_retries(lambda: backend(direct)) != first


def test_threads_never_share_a_connection(direct):
    pids: list[int] = []
    barrier = threading.Barrier(4)

    def hold() -> None:
        with direct.connect() as conn:
            pids.append(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
            barrier.wait(timeout=30)

    threads = [threading.Thread(target=hold) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(set(pids)) == 4


def test_a_refused_connection_is_a_connection_error():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    engine = DirectEngine(f"postgresql://postgres@127.0.0.1:{port}/none?connect_timeout=3")
    with pytest.raises(psycopg.OperationalError) as refused:
        engine.connect()
    assert is_transient(refused.value)


def test_read_models_and_lookups_agree_with_the_pooled_engine(queue, direct, settings):
    done = build_document(queue, pages=2, chunks_per_page=3, name="done.pdf")
    worker = make_worker_id("test")
    chunks = queue.claim(VECTOR_CHUNK, worker, 6, only_ids=[c["id"] for c in queue.chunks(document_id=str(done["id"]))])
    queue.complete(VECTOR_CHUNK, worker, [c["id"] for c in chunks[:4]])
    queue.fail(
        VECTOR_CHUNK, worker, [{"id": c["id"], "error": "model gone", "error_class": "model"} for c in chunks[4:]]
    )
    register(queue, "waiting.pdf")
    build_document(queue, pages=1, chunks_per_page=2, name="chunked.pdf")
    plain = TaskQueue(direct, settings)

    def read(q: TaskQueue) -> dict:
        engine = q.engine
        return {
            "progress": document_progress_rows(engine, None, limit=50),
            "one": document_progress_rows(engine, str(done["id"])),
            "statistics": queue_statistics_rows(engine),
            "timings": phase_timings_rows(engine, 1000),
            "errors": error_classes_rows(engine),
            "groups": group_counts(engine),
            "sizes": run_size_rows(engine, [k.name for k in q.phases.kinds], lambda kind: 100, 0.05),
            "document": q.document(done["document_key"]),
            "pages": q.pages(done["id"]),
            "chunks": q.chunks(document_id=str(done["id"])),
            "ready": q.ready_counts(),
        }

    pooled, through_psycopg = read(queue), read(plain)
    assert through_psycopg == pooled
    assert any(r["count"] for r in pooled["statistics"]) and pooled["errors"]


def test_registration_through_the_direct_engine_is_idempotent(direct, settings, queue):
    plain = TaskQueue(direct, settings)
    doc, created = plain.register_document(filename="a.pdf", content_hash="f" * 64, size_bytes=10, idempotency_key="k1")
    again, created_again = plain.register_document(filename="b.pdf", content_hash="f" * 64, size_bytes=10)
    assert created and not created_again and again["id"] == doc["id"]
    assert queue.document(str(doc["id"]))["idempotency_key"] == "k1"


def test_upgrade_through_the_direct_engine_builds_the_schema_file(create_database):
    url = create_database(prefix="direct")
    engine = DirectEngine(url)
    try:
        assert pending_migrations(engine)
        upgrade(engine)  # the embedded home's first command migrates through this engine
        assert pending_migrations(engine) == []
    finally:
        engine.dispose()
    reference = create_database(prefix="schemafile")
    schema_file.load_schema_file(reference)
    assert schema_file.dump_schema(url) == schema_file.dump_schema(reference)


def test_announce_through_the_direct_engine_reaches_a_listener(direct, engine):
    listener = ProgressListener(engine)
    try:
        assert listener.wait(0.0) is None  # listening from now on
        # another process's news: the listener ignores this one's own
        with direct.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("SELECT pg_notify('docqueue_progress', %(p)s)", {"p": "ran:somebody-else"})
        announce(direct)  # the direct engine's own notify runs too (this process's, so not news)
        assert listener.wait(5.0) is News.RAN
    finally:
        listener.close()


LIGHT_RUN = """
import json, sys
from click.testing import CliRunner
from orchestration.cli import main
for args in json.loads(sys.argv[1]):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, (args, result.output)
print(json.dumps(sorted(name for name in sys.modules if name.split(".")[0] == "sqlalchemy")))
"""


def test_the_light_commands_run_on_a_server_without_loading_sqlalchemy(database_url, tmp_path):
    note = tmp_path / "note.md"
    note.write_text("# Harbour\n\nThe storm damaged the harbour of Rotterdam.\n")
    commands = [
        ["ingest", str(note), "--json"],
        ["status", "--json"],
        ["stats", "--json"],
        ["search", "storm damage", "--json"],
    ]
    env = {"DOCQUEUE_HOME": str(tmp_path / "home"), "DOCQUEUE_DATABASE_URL": database_url}
    probe = python_probe(LIGHT_RUN, json.dumps(commands), env=env, timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert json.loads(probe.stdout.strip().splitlines()[-1]) == []
    with psycopg.connect(libpq_url(database_url)) as conn:
        assert conn.execute("SELECT filename FROM documents").fetchall() == [("note.md",)]
