"""Partition retention against a real queue database and a real Dagster instance on PostgreSQL: completed pages
and chunks leave Dagster after the retention or beyond the max-completed count, a batch at a time, failed and
pending ones stay, the queue keeps every row, and a retired task put back to work gets its partition again."""

from __future__ import annotations

import re

import pytest

from orchestration.partitions import register_partitions, retire_partitions
from orchestration.schedules import RECOVERY_DUE_TAG
from queue_db.config import SettingsError, settings
from queue_db.partition_keys import TABLE
from queue_db.partition_retention import done_at_sql, live_completed, live_completed_sql
from queue_db.phases import VECTOR_CHUNK, Level
from queue_db.service_config import DagsterConfig
from tests.integration.test_sensors import output_metadata, tick
from tests.queue_support import build_document

DAY_S = 86400.0


@pytest.fixture
def env(docqueue_env):
    from orchestration.environment import dagster_instance
    from queue_db.config import Settings
    from resources.database import open_queue

    instance = dagster_instance(Settings.from_env())
    yield instance, open_queue(Settings.from_env())
    instance.dispose()


def _registered(instance, queue) -> dict[str, set[str]]:
    for level in (Level.DOCUMENT, Level.PAGE, Level.CHUNK):
        register_partitions(instance, queue.engine, level)
    return {name: set(instance.get_dynamic_partitions(name)) for name in ("pages", "chunks")}


def _chunks(queue) -> list[dict]:
    """Every chunk row with its key, in key order."""
    from queue_db.keys import chunk_partition_key

    with queue.engine.connect() as conn:
        rows = (
            conn.exec_driver_sql(
                """SELECT c.id::text AS id, d.document_key, p.page_number, c.chunk_index, c.partition_retired_at,
                      c.partition_block FROM task_queue_chunk c JOIN task_queue_page p ON p.id = c.page_id
               JOIN documents d ON d.id = c.document_id ORDER BY d.document_key, p.page_number, c.chunk_index"""
            )
            .mappings()
            .all()
        )
    return [{**r, "key": chunk_partition_key(r["document_key"], r["page_number"], r["chunk_index"])} for r in rows]


def _complete(queue, ids: list[str], days_ago: float, status: str = "completed") -> None:
    """Chunks (and then pages, as the roll-up leaves them) settled `days_ago` days ago, set-based."""
    with queue.engine.begin() as conn:
        conn.exec_driver_sql(
            """UPDATE task_queue_chunk SET vector_status = %(s)s::task_status, graphrag_status = %(s)s::task_status,
                      vector_completed_at = now() - make_interval(secs => %(ago)s),
                      graphrag_completed_at = now() - make_interval(secs => %(ago)s)
               WHERE id = ANY(%(ids)s::uuid[])""",
            {"s": status, "ago": days_ago * DAY_S, "ids": ids},
        )
        conn.exec_driver_sql(
            """UPDATE task_queue_page p SET vector_status = 'completed', graphrag_status = 'completed',
                      vector_completed_at = now() - make_interval(secs => %(ago)s),
                      graphrag_completed_at = now() - make_interval(secs => %(ago)s),
                      ocr_completed_at = now() - make_interval(secs => %(ago)s)
               WHERE NOT EXISTS (SELECT 1 FROM task_queue_chunk c WHERE c.page_id = p.id
                                 AND (c.vector_status <> 'completed' OR c.graphrag_status <> 'completed'))
                 AND p.vector_status <> 'completed'""",
            {"ago": days_ago * DAY_S},
        )


def test_completed_partitions_older_than_the_retention_leave_dagster_and_failed_ones_stay(env):
    instance, queue = env
    build_document(queue, pages=2, chunks_per_page=4, name="old.pdf")  # 8 chunks
    build_document(queue, pages=1, chunks_per_page=4, name="new.pdf")  # 4 chunks
    before = _registered(instance, queue)
    chunks = _chunks(queue)
    old, new = (
        [c for c in chunks if c["document_key"].startswith("old")],
        [c for c in chunks if c["document_key"].startswith("new")],
    )
    _complete(queue, [c["id"] for c in old[:6]], days_ago=10)
    _complete(queue, [c["id"] for c in old[6:7]], days_ago=10, status="failed")  # stays backfillable
    _complete(queue, [c["id"] for c in new], days_ago=1)
    assert len(before["chunks"]) == 12 and len(before["pages"]) == 3

    retired = retire_partitions(instance, queue.engine, retention_s=7 * DAY_S, max_completed=1000, batch=100)
    # the old document's first page (its four chunks completed); its second page has a failed and a pending chunk
    assert retired == {"pages": 1, "chunks": 6}
    live = set(instance.get_dynamic_partitions("chunks"))
    assert live == before["chunks"] - {c["key"] for c in old[:6]}
    assert {c["key"] for c in old[6:] + new} <= live
    after = {c["id"]: c for c in _chunks(queue)}
    assert len(after) == 12, "the queue keeps every row"
    assert all(after[c["id"]]["partition_retired_at"] is not None for c in old[:6])
    # idempotent: nothing left to retire
    assert retire_partitions(instance, queue.engine, retention_s=7 * DAY_S, max_completed=1000, batch=100) == {
        "pages": 0,
        "chunks": 0,
    }
    # with a shorter retention the new document's page and chunks, completed a day ago, go too
    assert retire_partitions(instance, queue.engine, retention_s=DAY_S / 2, max_completed=1000, batch=100) == {
        "pages": 1,
        "chunks": 4,
    }
    assert len(instance.get_dynamic_partitions("pages")) == 1


def test_beyond_the_max_completed_count_the_oldest_go_a_batch_at_a_time(env):
    instance, queue = env
    build_document(queue, pages=1, chunks_per_page=10)
    _registered(instance, queue)
    chunks = _chunks(queue)
    for age, chunk in enumerate(chunks):  # chunk 0 completed 0.1 day ago, chunk 9 one day ago
        _complete(queue, [chunk["id"]], days_ago=(age + 1) / 10)
    assert live_completed(queue.engine, Level.CHUNK) == 10

    first = retire_partitions(instance, queue.engine, retention_s=30 * DAY_S, max_completed=4, batch=4)
    assert first["chunks"] == 4  # the batch bounds one run
    second = retire_partitions(instance, queue.engine, retention_s=30 * DAY_S, max_completed=4, batch=4)
    assert second["chunks"] == 2
    assert set(instance.get_dynamic_partitions("chunks")) == {c["key"] for c in chunks[:4]}, "the newest stay"
    assert live_completed(queue.engine, Level.CHUNK) == 4


def test_a_retired_task_put_back_to_work_gets_its_partition_again(env):
    instance, queue = env
    build_document(queue, pages=1, chunks_per_page=3)
    _registered(instance, queue)
    chunks = _chunks(queue)
    _complete(queue, [c["id"] for c in chunks], days_ago=10)
    assert retire_partitions(instance, queue.engine, retention_s=DAY_S, max_completed=100, batch=100) == {
        "pages": 1,
        "chunks": 3,
    }
    assert instance.get_dynamic_partitions("chunks") == [] and instance.get_dynamic_partitions("pages") == []

    assert queue.requeue(VECTOR_CHUNK, [chunks[1]["id"]], "repair: completed chunk had no Qdrant point") == 1
    row = {c["id"]: c for c in _chunks(queue)}[chunks[1]["id"]]
    assert row["partition_retired_at"] is None and row["partition_block"] is None
    after = _registered(instance, queue)
    assert after["chunks"] == {chunks[1]["key"]}, "only the requeued chunk is registered again"
    assert len(after["pages"]) == 1, "its page is back at work too, so it is registered again"
    # the others stay retired, and nothing live is retired while it waits
    assert retire_partitions(instance, queue.engine, retention_s=DAY_S, max_completed=100, batch=100) == {
        "pages": 0,
        "chunks": 0,
    }


@pytest.mark.parametrize(
    "value, seconds", [("7d", 7 * DAY_S), ("36h", 36 * 3600.0), ("90m", 5400.0), ("3600", 3600.0), ("2w", 14 * DAY_S)]
)
def test_the_retention_reads_durations(monkeypatch, value, seconds):
    monkeypatch.setenv("DOCQUEUE_PARTITION_RETENTION", value)
    assert settings(DagsterConfig).partition_retention_s == seconds


@pytest.mark.parametrize("value", ["seven days", "-1d", "d"])
def test_a_bad_retention_is_one_sentence(monkeypatch, value):
    monkeypatch.setenv("DOCQUEUE_PARTITION_RETENTION", value)
    with pytest.raises(SettingsError) as raised:
        settings(DagsterConfig)
    message = str(raised.value)
    assert message.startswith("DOCQUEUE_PARTITION_RETENTION must be a duration") and "\n" not in message


def test_the_recovery_job_retires_with_the_settings(env, monkeypatch):
    """The recovery job's own op, run as the recovery sensor requests it, reads the three settings and reports per
    definition; the sensor requests that run because partitions are due, and skips once none is."""
    from orchestration.code_location import build_definitions
    from queue_db.config import Settings

    instance, queue = env
    build_document(queue, pages=1, chunks_per_page=3)
    _registered(instance, queue)
    _complete(queue, [c["id"] for c in _chunks(queue)], days_ago=2)
    monkeypatch.setenv("DOCQUEUE_PARTITION_RETENTION", "1d")
    monkeypatch.setenv("DOCQUEUE_PARTITION_RETIRE_BATCH", "2")

    defs = build_definitions(Settings.from_env())  # the code location as it loads with these settings
    due = tick(defs, instance, "recovery_sensor")
    assert [r.tags[RECOVERY_DUE_TAG] for r in due.run_requests] == [
        "completed partitions due for retirement: pages, chunks"
    ]
    result = defs.resolve_job_def("recovery_job").execute_in_process(instance=instance)

    assert result.success
    assert output_metadata(result, "retire_completed_partitions") == {"retired_pages": 1, "retired_chunks": 2}
    assert len(instance.get_dynamic_partitions("chunks")) == 1
    # the batch left one chunk older than the retention: the next tick asks again, so a backlog drains run by run
    assert [r.tags[RECOVERY_DUE_TAG] for r in tick(defs, instance, "recovery_sensor").run_requests] == [
        "completed partitions due for retirement: chunks"
    ]


@pytest.mark.parametrize("level, index", [(Level.PAGE, "idx_tqp_retirable"), (Level.CHUNK, "idx_tqc_retirable")])
def test_the_rule_generated_from_the_phases_is_the_retirable_index(env, level, index):
    """The retire queries stay on migration 0020's partial index only while the rule generated from the specs is
    its expression and predicate: PostgreSQL normalises both, through an index built from the rule."""
    _, queue = env

    def unaliased(sql: str) -> str:
        return re.sub(r"\bt\.", "", sql)

    with queue.engine.connect() as conn:
        conn.exec_driver_sql(
            f"CREATE INDEX generated_rule ON {TABLE[level]} (({unaliased(done_at_sql(level))})) "
            f"WHERE {unaliased(live_completed_sql(level))}"
        )
        definitions = dict(
            conn.exec_driver_sql(
                "SELECT indexname, indexdef FROM pg_indexes WHERE indexname IN (%(a)s, 'generated_rule')", {"a": index}
            ).all()
        )
        conn.rollback()
    assert definitions[index].replace(index, "X") == definitions["generated_rule"].replace("generated_rule", "X")
