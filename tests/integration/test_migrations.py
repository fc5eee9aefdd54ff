"""Schema migrations: idempotent, queue_db/schema.sql is what they build (fresh or step by step, with data), and
the seed's legacy data migration."""

from __future__ import annotations

import difflib
import json

import pytest
import sqlalchemy as sa

import queue_db.migrate
from queue_db import schema as schema_file
from queue_db.migrate import Migration, available_migrations, upgrade
from queue_db.queue import create_queue_engine

DOCQUEUE_TABLES = ("documents", "task_queue_page", "task_queue_chunk", "task_queue_chunk_text")


def schema_of(engine: sa.Engine) -> dict:
    """Catalog facts that define the schema: columns, indexes, constraints, types and functions."""
    with engine.connect() as conn:
        columns = conn.exec_driver_sql(
            """SELECT table_name, column_name, data_type, udt_name, is_nullable, column_default,
                      character_maximum_length
               FROM information_schema.columns WHERE table_schema = 'public' AND table_name = ANY(%(t)s)""",
            {"t": list(DOCQUEUE_TABLES)},
        ).all()
        indexes = conn.exec_driver_sql(
            "SELECT tablename, indexname, indexdef FROM pg_indexes "
            "WHERE schemaname = 'public' AND tablename = ANY(%(t)s)",
            {"t": list(DOCQUEUE_TABLES)},
        ).all()
        constraints = conn.exec_driver_sql(
            """SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint
               WHERE conrelid::regclass::text = ANY(%(t)s)""",
            {"t": list(DOCQUEUE_TABLES)},
        ).all()
        enum = conn.exec_driver_sql(
            "SELECT enumlabel FROM pg_enum e JOIN pg_type t ON t.oid = e.enumtypid "
            "WHERE t.typname = 'task_status' ORDER BY enumsortorder"
        ).all()
        functions = conn.exec_driver_sql(
            "SELECT proname, md5(prosrc) FROM pg_proc WHERE proname LIKE 'docqueue%%' ORDER BY proname"
        ).all()
    return {
        "columns": {tuple(map(str, c)) for c in columns},
        "indexes": {tuple(i) for i in indexes},
        "constraints": {tuple(c) for c in constraints},
        "enum": [e[0] for e in enum],
        "functions": list(functions),
    }


@pytest.fixture
def fresh(create_database):
    engine = create_queue_engine(create_database())
    upgrade(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def from_schema_file(create_database):
    """A database built from queue_db/schema.sql alone: the reference every migrated database is held to."""
    url = create_database(prefix="schemafile")
    schema_file.load_schema_file(url)
    engine = create_queue_engine(url)
    yield engine
    engine.dispose()


def _url(engine: sa.Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def schema_difference(migrated: sa.Engine, reference: sa.Engine) -> str:
    """Unified diff of the two catalogs (normalised pg_dump --schema-only); empty when they are the same."""
    built, expected = schema_file.dump_schema(_url(migrated)), schema_file.dump_schema(_url(reference))
    return "".join(
        difflib.unified_diff(
            expected.splitlines(True),
            built.splitlines(True),
            "database built from queue_db/schema.sql",
            "database built by the migrations",
        )
    )


def assert_schema_file_describes(migrated: sa.Engine, reference: sa.Engine, how: str) -> None:
    difference = schema_difference(migrated, reference)
    if difference:
        pytest.fail(f"{how}: {schema_file.stale_message()}\n{difference}", pytrace=False)


def test_schema_file_is_what_the_migrations_build(fresh, from_schema_file):
    assert_schema_file_describes(fresh, from_schema_file, "applying every migration to an empty database")


def assert_schema_file_is_built_through_the_latest_migration() -> None:
    latest = queue_db.migrate.available_migrations()[-1]
    built = schema_file.built_through(schema_file.SCHEMA_FILE.read_text(encoding="utf-8"))
    assert built == f"{latest.version:04d}_{latest.name}", (
        f"queue_db/schema.sql was built through migration {built}, the latest is "
        f"{latest.version:04d}_{latest.name}: {schema_file.stale_message()}"
    )


def test_schema_file_is_built_through_the_latest_migration():
    assert_schema_file_is_built_through_the_latest_migration()


def test_a_new_migration_makes_the_schema_file_stale(
    create_database, from_schema_file, monkeypatch, tmp_path, pg_admin_url
):
    """What an engineer adding migration 0013 sees until schema.sql is regenerated: both checks above fail and
    name the command, and the command's --check agrees until it has rewritten the file."""
    latest = available_migrations()[-1]
    added = Migration(latest.version + 1, "probe_column", "ALTER TABLE documents ADD COLUMN probe INTEGER;")
    monkeypatch.setattr(queue_db.migrate, "available_migrations", lambda: [*available_migrations(), added])
    monkeypatch.setattr(schema_file, "available_migrations", queue_db.migrate.available_migrations)
    engine = create_queue_engine(create_database())
    upgrade(engine)
    engine.dispose()
    with pytest.raises(pytest.fail.Exception, match=r"python -m queue_db\.schema") as failure:
        assert_schema_file_describes(engine, from_schema_file, "with the probe migration")
    assert "+    probe integer" in str(failure.value)
    with pytest.raises(AssertionError, match=r"python -m queue_db\.schema"):
        assert_schema_file_is_built_through_the_latest_migration()

    stale = tmp_path / "schema.sql"
    stale.write_text(schema_file.SCHEMA_FILE.read_text(encoding="utf-8"), encoding="utf-8")
    assert schema_file.main(["--check", "--admin-url", pg_admin_url, "--output", str(stale)]) == 1
    assert schema_file.main(["--admin-url", pg_admin_url, "--output", str(stale)]) == 0
    assert schema_file.built_through(stale.read_text(encoding="utf-8")) == f"{added.version:04d}_probe_column"
    assert "    probe integer" in stale.read_text(encoding="utf-8")
    assert schema_file.main(["--check", "--admin-url", pg_admin_url, "--output", str(stale)]) == 0


def test_upgrade_is_idempotent_and_records_versions(fresh):
    assert upgrade(fresh) == []
    with fresh.connect() as conn:
        versions = [r[0] for r in conn.exec_driver_sql("SELECT version FROM docqueue_schema_version ORDER BY 1")]
    assert versions == [m.version for m in available_migrations()]


def test_seed_schema_is_present_verbatim(fresh):
    schema = schema_of(fresh)
    assert schema["enum"] == ["pending", "processing", "completed", "failed"]
    index_names = {i[1] for i in schema["indexes"]}
    for name in (
        "idx_tqp_ocr_status",
        "idx_tqp_vector_status",
        "idx_tqp_graphrag_status",
        "idx_tqp_document",
        "idx_tqp_ocr_heartbeat",
        "idx_tqp_vector_heartbeat",
        "idx_tqp_graphrag_heartbeat",
        "idx_tqc_vector_status",
        "idx_tqc_graphrag_status",
        "idx_tqc_document",
        "idx_tqc_vector_heartbeat",
        "idx_tqc_graphrag_heartbeat",
    ):
        assert name in index_names
    # migration 0031: a chunk's page is looked up through the unique key (page_id, chunk_index) alone
    assert "idx_tqc_page" not in index_names and "task_queue_chunk_page_id_chunk_index_key" in index_names
    cols = {(c[0], c[1]) for c in schema["columns"]}
    for table, col in [
        ("documents", "ocr_status"),
        ("documents", "vector_index_status"),
        ("documents", "graphrag_index_status"),
        ("documents", "current_worker_id"),
        ("documents", "last_heartbeat"),
        ("task_queue_page", "ocr_last_heartbeat"),
        ("task_queue_page", "chunk_count"),
        ("task_queue_chunk", "chunk_content_hash"),
        ("task_queue_chunk", "entities_extracted"),
        ("task_queue_chunk", "relationships_extracted"),
    ]:
        assert (table, col) in cols


def test_stepwise_upgrade_with_data_matches_the_schema_file(create_database, from_schema_file):
    engine = create_queue_engine(create_database())
    upgrade(engine, target=1)
    with engine.begin() as conn:  # data written by a version-1 deployment
        doc = conn.exec_driver_sql("INSERT INTO documents (filename) VALUES ('old.pdf') RETURNING id").scalar()
        conn.exec_driver_sql("INSERT INTO task_queue_page (document_id, page_number) VALUES (%(d)s, 1)", {"d": doc})
    upgrade(engine)
    assert_schema_file_describes(engine, from_schema_file, "upgrading a version-1 database that holds data")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT document_key FROM documents").scalar().startswith("old-")
    engine.dispose()


def test_chunk_text_moves_off_the_queue_row(create_database, from_schema_file):
    """Migration 0012: chunk text written by an earlier version moves to task_queue_chunk_text, and the claim
    still hands it to the worker."""
    from queue_db.phases import VECTOR_CHUNK
    from queue_db.queue import TaskQueue

    engine = create_queue_engine(create_database())
    upgrade(engine, target=11)
    with engine.begin() as conn:
        doc = conn.exec_driver_sql(
            "INSERT INTO documents (filename, pages_created_at, ocr_status) VALUES ('old.pdf', now(), 'completed') "
            "RETURNING id"
        ).scalar()
        page = conn.exec_driver_sql(
            "INSERT INTO task_queue_page (document_id, page_number, ocr_status, chunked_at) "
            "VALUES (%(d)s, 1, 'completed', now()) RETURNING id",
            {"d": doc},
        ).scalar()
        conn.exec_driver_sql(
            "INSERT INTO task_queue_chunk (page_id, document_id, chunk_id, chunk_index, content) "
            "VALUES (%(p)s, %(d)s, 'c0', 0, 'first words'), (%(p)s, %(d)s, 'c1', 1, NULL)",
            {"p": page, "d": doc},
        )
    upgrade(engine)
    assert_schema_file_describes(engine, from_schema_file, "upgrading a version-11 database that holds chunk text")
    claimed = TaskQueue(engine).claim(VECTOR_CHUNK, "migration-test", 5)
    assert sorted((c["chunk_id"], c["content"]) for c in claimed) == [("c0", "first words"), ("c1", None)]
    engine.dispose()


LEGACY_SCHEMA = """
CREATE TABLE documents (
    id UUID PRIMARY KEY DEFAULT gen_random_uuid(),
    filename VARCHAR(1000) NOT NULL,
    convert_status VARCHAR(20) DEFAULT 'pending',
    index_status VARCHAR(20) DEFAULT 'pending',
    ocr_details JSONB,
    indexing_details JSONB,
    created_at TIMESTAMP WITH TIME ZONE DEFAULT NOW(),
    updated_at TIMESTAMP WITH TIME ZONE DEFAULT NOW()
);
CREATE TABLE task_queue (
    id SERIAL PRIMARY KEY,
    document_id UUID REFERENCES documents(id),
    task_type VARCHAR(20),
    status VARCHAR(20),
    payload JSONB
);
"""


def test_legacy_database_migrates_its_progress(create_database, from_schema_file):
    engine = create_queue_engine(create_database())
    with engine.begin() as conn:
        conn.exec_driver_sql(LEGACY_SCHEMA)
        pages = {
            "pages": [
                {"page_number": 1, "page_file_path": "indexed/page_0001_nohf.md"},
                {"page_number": 2, "page_file_path": "indexed/page_0002_nohf.md"},
            ]
        }
        chunks = {
            "chunks": [
                {"page_number": 1, "chunk_index": 0, "chunk_id": "c-1-0", "content_hash": "h10"},
                {"page_number": 1, "chunk_index": 1, "chunk_id": "c-1-1", "content_hash": "h11"},
            ]
        }
        conn.exec_driver_sql(
            """INSERT INTO documents (filename, convert_status, index_status, ocr_details, indexing_details) VALUES
               ('Indexed Report.pdf', 'converted', 'indexed', %(p)s::jsonb, %(c)s::jsonb),
               ('converted.pdf', 'converted', 'pending', %(p1)s::jsonb, NULL),
               ('new.pdf', 'pending', 'pending', NULL, NULL)""",
            {
                "p": json.dumps(pages),
                "c": json.dumps(chunks),
                "p1": json.dumps({"pages": [{"page_number": 1, "page_file_path": "conv/page_0001_nohf.md"}]}),
            },
        )
        conn.exec_driver_sql("INSERT INTO task_queue (task_type, status) VALUES ('convert', 'done')")
    upgrade(engine)
    with engine.connect() as conn:
        docs = {
            r.filename: r
            for r in conn.exec_driver_sql(
                "SELECT filename, ocr_status, vector_index_status, graphrag_index_status, page_count, document_key "
                "FROM documents"
            ).all()
        }
        indexed_pages = conn.exec_driver_sql(
            """SELECT p.page_number, p.ocr_status, p.vector_status, p.graphrag_status, p.chunk_count
               FROM task_queue_page p
               JOIN documents d ON d.id = p.document_id WHERE d.filename = 'Indexed Report.pdf' ORDER BY 1"""
        ).all()
        chunk_rows = conn.exec_driver_sql(
            "SELECT chunk_id, vector_status, graphrag_status FROM task_queue_chunk ORDER BY 1"
        ).all()
        legacy_rows = conn.exec_driver_sql("SELECT count(*) FROM task_queue").scalar()
    assert docs["Indexed Report.pdf"][1:5] == ("completed", "completed", "completed", 2)
    assert docs["Indexed Report.pdf"].document_key.startswith("indexed-report-")
    assert docs["converted.pdf"][1:5] == ("completed", "pending", "pending", 1)
    assert docs["new.pdf"][1:4] == ("pending", "pending", "pending")
    assert [tuple(r) for r in indexed_pages] == [
        (1, "completed", "completed", "completed", 2),
        (2, "completed", "completed", "completed", 0),
    ]
    assert [tuple(r) for r in chunk_rows] == [("c-1-0", "completed", "completed"), ("c-1-1", "completed", "completed")]
    assert legacy_rows == 1  # the old table is kept (seed migration Phase 1)
    # and apart from the legacy columns/table, the schema is the one queue_db/schema.sql describes
    migrated, clean = schema_of(engine), schema_of(from_schema_file)
    legacy_columns = {"convert_status", "index_status", "ocr_details", "indexing_details"}
    migrated["columns"] = {c for c in migrated["columns"] if c[1] not in legacy_columns}
    migrated["constraints"] = {c for c in migrated["constraints"] if "task_queue_" not in c[1] or c[0] != "task_queue"}
    assert migrated["columns"] == clean["columns"]
    assert migrated["indexes"] == clean["indexes"]
    assert migrated["enum"] == clean["enum"] and migrated["functions"] == clean["functions"]
    assert {c[1] for c in migrated["constraints"]} == {c[1] for c in clean["constraints"]}
    engine.dispose()


def test_an_edited_applied_migration_is_refused(fresh):
    with fresh.begin() as conn:
        conn.exec_driver_sql("UPDATE docqueue_schema_version SET checksum = 'tampered' WHERE version = 1")
    with pytest.raises(RuntimeError, match="changed after it was applied"):
        upgrade(fresh)
