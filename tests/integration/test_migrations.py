"""Schema migrations: idempotent, a migrated database equals a fresh one, and the seed's legacy data migration."""
from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from queue_db.migrate import available_migrations, upgrade
from queue_db.queue import create_queue_engine

DOCQUEUE_TABLES = ("documents", "task_queue_page", "task_queue_chunk", "task_queue_chunk_text")


def schema_of(engine: sa.Engine) -> dict:
    """Catalog facts that define the schema: columns, indexes, constraints, types and functions."""
    with engine.connect() as conn:
        columns = conn.exec_driver_sql(
            """SELECT table_name, column_name, data_type, udt_name, is_nullable, column_default, character_maximum_length
               FROM information_schema.columns WHERE table_schema = 'public' AND table_name = ANY(%(t)s)""",
            {"t": list(DOCQUEUE_TABLES)}).all()
        indexes = conn.exec_driver_sql(
            "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' AND tablename = ANY(%(t)s)",
            {"t": list(DOCQUEUE_TABLES)}).all()
        constraints = conn.exec_driver_sql(
            """SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint
               WHERE conrelid::regclass::text = ANY(%(t)s)""", {"t": list(DOCQUEUE_TABLES)}).all()
        enum = conn.exec_driver_sql(
            "SELECT enumlabel FROM pg_enum e JOIN pg_type t ON t.oid = e.enumtypid WHERE t.typname = 'task_status' ORDER BY enumsortorder").all()
        functions = conn.exec_driver_sql(
            "SELECT proname, md5(prosrc) FROM pg_proc WHERE proname LIKE 'docqueue%%' ORDER BY proname").all()
    return {"columns": {tuple(map(str, c)) for c in columns}, "indexes": {tuple(i) for i in indexes},
            "constraints": {tuple(c) for c in constraints}, "enum": [e[0] for e in enum], "functions": list(functions)}


@pytest.fixture
def fresh(create_database):
    engine = create_queue_engine(create_database())
    upgrade(engine)
    yield engine
    engine.dispose()


def test_upgrade_is_idempotent_and_records_versions(fresh):
    assert upgrade(fresh) == []
    with fresh.connect() as conn:
        versions = [r[0] for r in conn.exec_driver_sql("SELECT version FROM docqueue_schema_version ORDER BY 1")]
    assert versions == [m.version for m in available_migrations()]


def test_seed_schema_is_present_verbatim(fresh):
    schema = schema_of(fresh)
    assert schema["enum"] == ["pending", "processing", "completed", "failed"]
    index_names = {i[1] for i in schema["indexes"]}
    for name in ("idx_tqp_ocr_status", "idx_tqp_vector_status", "idx_tqp_graphrag_status", "idx_tqp_document",
                 "idx_tqp_ocr_heartbeat", "idx_tqp_vector_heartbeat", "idx_tqp_graphrag_heartbeat",
                 "idx_tqc_vector_status", "idx_tqc_graphrag_status", "idx_tqc_page", "idx_tqc_document",
                 "idx_tqc_vector_heartbeat", "idx_tqc_graphrag_heartbeat"):
        assert name in index_names
    cols = {(c[0], c[1]) for c in schema["columns"]}
    for table, col in [("documents", "ocr_status"), ("documents", "vector_index_status"),
                       ("documents", "graphrag_index_status"), ("documents", "current_worker_id"),
                       ("documents", "last_heartbeat"), ("task_queue_page", "ocr_last_heartbeat"),
                       ("task_queue_page", "chunk_count"), ("task_queue_chunk", "chunk_content_hash"),
                       ("task_queue_chunk", "entities_extracted"), ("task_queue_chunk", "relationships_extracted")]:
        assert (table, col) in cols


def test_stepwise_upgrade_with_data_equals_fresh(create_database, fresh):
    engine = create_queue_engine(create_database())
    upgrade(engine, target=1)
    with engine.begin() as conn:  # data written by a version-1 deployment
        doc = conn.exec_driver_sql("INSERT INTO documents (filename) VALUES ('old.pdf') RETURNING id").scalar()
        conn.exec_driver_sql("INSERT INTO task_queue_page (document_id, page_number) VALUES (%(d)s, 1)", {"d": doc})
    upgrade(engine)
    assert schema_of(engine) == schema_of(fresh)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT document_key FROM documents").scalar().startswith("old-")
    engine.dispose()


def test_chunk_text_moves_off_the_queue_row(create_database, fresh):
    """Migration 0012: chunk text written by an earlier version moves to task_queue_chunk_text, and the claim
    still hands it to the worker."""
    from queue_db.queue import TaskQueue
    from queue_db.tasks import VECTOR_CHUNK

    engine = create_queue_engine(create_database())
    upgrade(engine, target=11)
    with engine.begin() as conn:
        doc = conn.exec_driver_sql(
            "INSERT INTO documents (filename, pages_created_at, ocr_status) VALUES ('old.pdf', now(), 'completed') "
            "RETURNING id").scalar()
        page = conn.exec_driver_sql(
            "INSERT INTO task_queue_page (document_id, page_number, ocr_status, chunked_at) "
            "VALUES (%(d)s, 1, 'completed', now()) RETURNING id", {"d": doc}).scalar()
        conn.exec_driver_sql(
            "INSERT INTO task_queue_chunk (page_id, document_id, chunk_id, chunk_index, content) "
            "VALUES (%(p)s, %(d)s, 'c0', 0, 'first words'), (%(p)s, %(d)s, 'c1', 1, NULL)", {"p": page, "d": doc})
    upgrade(engine)
    assert schema_of(engine) == schema_of(fresh)
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


def test_legacy_database_migrates_its_progress(create_database, fresh):
    engine = create_queue_engine(create_database())
    with engine.begin() as conn:
        conn.exec_driver_sql(LEGACY_SCHEMA)
        pages = {"pages": [{"page_number": 1, "page_file_path": "indexed/page_0001_nohf.md"},
                           {"page_number": 2, "page_file_path": "indexed/page_0002_nohf.md"}]}
        chunks = {"chunks": [{"page_number": 1, "chunk_index": 0, "chunk_id": "c-1-0", "content_hash": "h10"},
                             {"page_number": 1, "chunk_index": 1, "chunk_id": "c-1-1", "content_hash": "h11"}]}
        conn.exec_driver_sql(
            """INSERT INTO documents (filename, convert_status, index_status, ocr_details, indexing_details) VALUES
               ('Indexed Report.pdf', 'converted', 'indexed', %(p)s::jsonb, %(c)s::jsonb),
               ('converted.pdf', 'converted', 'pending', %(p1)s::jsonb, NULL),
               ('new.pdf', 'pending', 'pending', NULL, NULL)""",
            {"p": json.dumps(pages), "c": json.dumps(chunks),
             "p1": json.dumps({"pages": [{"page_number": 1, "page_file_path": "conv/page_0001_nohf.md"}]})})
        conn.exec_driver_sql("INSERT INTO task_queue (task_type, status) VALUES ('convert', 'done')")
    upgrade(engine)
    with engine.connect() as conn:
        docs = {r.filename: r for r in conn.exec_driver_sql(
            "SELECT filename, ocr_status, vector_index_status, graphrag_index_status, page_count, document_key "
            "FROM documents").all()}
        indexed_pages = conn.exec_driver_sql(
            """SELECT p.page_number, p.ocr_status, p.vector_status, p.graphrag_status, p.chunk_count FROM task_queue_page p
               JOIN documents d ON d.id = p.document_id WHERE d.filename = 'Indexed Report.pdf' ORDER BY 1""").all()
        chunk_rows = conn.exec_driver_sql("SELECT chunk_id, vector_status, graphrag_status FROM task_queue_chunk ORDER BY 1").all()
        legacy_rows = conn.exec_driver_sql("SELECT count(*) FROM task_queue").scalar()
    assert docs["Indexed Report.pdf"][1:5] == ("completed", "completed", "completed", 2)
    assert docs["Indexed Report.pdf"].document_key.startswith("indexed-report-")
    assert docs["converted.pdf"][1:5] == ("completed", "pending", "pending", 1)
    assert docs["new.pdf"][1:4] == ("pending", "pending", "pending")
    assert [tuple(r) for r in indexed_pages] == [(1, "completed", "completed", "completed", 2),
                                                 (2, "completed", "completed", "completed", 0)]
    assert [tuple(r) for r in chunk_rows] == [("c-1-0", "completed", "completed"), ("c-1-1", "completed", "completed")]
    assert legacy_rows == 1  # the old table is kept (seed migration Phase 1)
    # and apart from the legacy columns/table, the schema equals a fresh one
    migrated, clean = schema_of(engine), schema_of(fresh)
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
