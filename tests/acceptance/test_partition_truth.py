"""One ranged run over 500 chunk partitions, one of whose rows is corrupt: the Dagster instance must say exactly
what the queue says -- 499 partitions materialized, 1 failed -- and the queue row carries the error and the count
of the attempt. Per-partition truth inside a ranged run is what lets a person backfill exactly what failed."""

from __future__ import annotations

import dagster as dg
import pytest

from queue_db.phases import VECTOR_CHUNK, Level
from tests.queue_support import bulk_seed

PAGES, CHUNKS_PER_PAGE = 5, 100


@pytest.fixture
def truth_env(docqueue_env):
    from orchestration.code_location import build_definitions
    from queue_db.config import Settings as _Settings

    # built here, with this test's environment: the resources carry its home and stores
    defs = build_definitions(_Settings.from_env())
    from orchestration.environment import dagster_instance
    from queue_db.config import Settings
    from resources.database import open_queue

    instance = dagster_instance(Settings.from_env())
    yield defs, instance, open_queue(Settings.from_env())
    instance.dispose()


def partition_status(instance, asset: str, partitions_name: str) -> dict[str, str]:
    """What the UI shows per partition: the instance's partition status."""
    keys = instance.get_dynamic_partitions(partitions_name)
    statuses = (
        instance.get_status_by_partition(dg.AssetKey(asset), keys, dg.DynamicPartitionsDefinition(name=partitions_name))
        or {}
    )
    names = {
        dg.AssetPartitionStatus.MATERIALIZED: "materialized",
        dg.AssetPartitionStatus.FAILED: "failed",
        dg.AssetPartitionStatus.IN_PROGRESS: "in progress",
    }
    return {key: names.get(statuses.get(key), "missing") for key in keys}


def test_one_failing_chunk_in_a_ranged_run_is_the_only_failed_partition(truth_env, monkeypatch):
    from orchestration.partitions import register_partitions
    from orchestration.planning import plan_runs
    from orchestration.runner import execute

    defs, instance, queue = truth_env
    # per-key events are stored in batches (one multi-row INSERT each), not one by one
    batches: list[tuple[str, int]] = []
    storage = instance.event_log_storage
    store_event_batch = storage.store_event_batch

    def counted(events):
        batches.append((events[0].get_dagster_event().event_type_value, len(events)))
        return store_event_batch(events)

    monkeypatch.setattr(storage, "store_event_batch", counted)
    bulk_seed(queue.engine, documents=1, pages_per_document=PAGES, chunks_per_page=CHUNKS_PER_PAGE)
    assert register_partitions(instance, queue.engine, Level.CHUNK) == PAGES * CHUNKS_PER_PAGE
    keys = instance.get_dynamic_partitions("chunks")
    bad_key = keys[len(keys) // 2]
    # a corrupt row: an empty chunk id cannot name a vector point, so the vector store refuses that one chunk
    with queue.engine.begin() as conn:
        bad_id = conn.exec_driver_sql(
            "UPDATE task_queue_chunk SET chunk_id = '' WHERE partition_pos = %(pos)s RETURNING id::text",
            {"pos": len(keys) // 2},
        ).scalar()

    planned = plan_runs(queue.engine, VECTOR_CHUNK, max_keys=len(keys))
    assert len(planned) == 1 and planned[0].size == len(keys)
    assert not execute(defs, instance, planned[0]), "a run with a failed task fails"

    assert ("ASSET_MATERIALIZATION_PLANNED", len(keys)) in batches, batches
    assert ("ASSET_MATERIALIZATION", len(keys) - 1) in batches, batches

    statuses = partition_status(instance, "vector_chunk", "chunks")
    assert sum(1 for s in statuses.values() if s == "materialized") == len(keys) - 1
    assert [k for k, s in statuses.items() if s == "failed"] == [bad_key]

    with queue.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            """SELECT id::text, vector_status::text, vector_retry_count, vector_error, vector_error_class
               FROM task_queue_chunk"""
        ).all()
    by_status = {}
    for row in rows:
        by_status.setdefault(row[1], []).append(row)
    assert len(by_status["completed"]) == len(keys) - 1 and [r[0] for r in by_status["failed"]] == [bad_id]
    _, _, retries, error, error_class = by_status["failed"][0]
    assert retries == 1 and "chunk_id" in error and error_class
    assert all(r[2] == 0 for r in by_status["completed"]), "no innocent chunk spent a retry"

    from queue_db.config import Settings
    from resources.embedding_resource import EmbeddingResource
    from resources.vector_resource import QdrantResource

    embedder = EmbeddingResource.from_settings(Settings.from_env()).get_embedder()
    store = QdrantResource.from_settings(Settings.from_env()).get_store(embedder.model_id, embedder.dim)
    try:
        assert len(store.chunk_ids()) == len(keys) - 1
    finally:
        store.close()


def test_a_failed_document_partition_carries_its_error_class_and_reason(truth_env, tmp_path):
    """A real ocr_document run over an encrypted PDF (no password) and a PDF without pages: each failed partition's
    own event (an observation on that partition) holds its error class and one-sentence reason, the step fails
    with a `Failure` whose headline names the documents and their reasons, and the run is not worth retrying."""
    from orchestration.intake import ingest_file
    from orchestration.partitions import register_partitions
    from orchestration.planning import plan_runs
    from orchestration.runner import execute
    from queue_db.config import Settings
    from queue_db.phases import OCR_DOCUMENT
    from resources.storage_resource import StorageResource
    from tests import pdf_factory as pf

    defs, instance, queue = truth_env
    storage = StorageResource.from_settings(Settings.from_env()).get_storage()
    empty = tmp_path / "no-pages.pdf"
    empty.write_bytes(pf.raw_pdf([b"<</Type/Catalog/Pages 2 0 R>>", b"<</Type/Pages/Kids[]/Count 0>>"]))
    locked = pf.encrypted_pdf(tmp_path, "locked.pdf", "secret")
    keys = {}
    for path in (empty, locked):
        result = ingest_file(queue, storage, path)
        assert result.status == "new", result
        keys[path.name] = result.document_key
    register_partitions(instance, queue.engine, Level.DOCUMENT)
    [planned] = plan_runs(queue.engine, OCR_DOCUMENT, max_keys=10)

    assert not execute(defs, instance, planned)

    expected = {keys["no-pages.pdf"]: "empty", keys["locked.pdf"]: "encrypted"}
    statuses = partition_status(instance, "ocr_document", "documents")
    assert statuses == {key: "failed" for key in expected}
    for key, error_class in expected.items():
        [record] = instance.fetch_observations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("ocr_document"), asset_partitions=[key]), limit=5
        ).records
        metadata = {k: v.value for k, v in record.asset_observation.metadata.items()}
        assert metadata["status"] == "failed" and metadata["error_class"] == error_class, metadata
        assert metadata["reason"].startswith(f"{error_class}: ") and "\n" not in metadata["reason"], metadata
        assert metadata["retryable"] is False
        assert metadata["reason"] == queue.document(key)["ocr_error"]  # the queue's own sentence
    [run] = instance.get_runs(filters=dg.RunsFilter(job_name="ocr_document_job"))
    [failure] = [
        e.dagster_event
        for e in instance.all_logs(run.run_id)
        if e.dagster_event and e.dagster_event.event_type == dg.DagsterEventType.STEP_FAILURE
    ]
    data = failure.step_failure_data
    assert data.error.cls_name == "Failure"
    headline = data.user_failure_data.description
    for key in expected:
        assert f"{key}: {expected[key]}: " in headline, headline
    assert headline.endswith("(2 of 2 ocr_document tasks failed)"), headline
