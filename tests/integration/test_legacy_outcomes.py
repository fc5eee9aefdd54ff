"""Every shape the legacy (Phase 2) migration leaves ends in a stated, actionable state, and no chunk without text
is ever embedded or extracted."""

from __future__ import annotations

import json

import pytest

from orchestration.assets.handlers import process_tasks
from queue_db.migrate import upgrade
from queue_db.phases import GRAPHRAG_CHUNK, OCR_DOCUMENT, VECTOR_CHUNK
from queue_db.queue import TaskQueue, create_queue_engine, make_worker_id
from tests.integration.test_migrations import LEGACY_SCHEMA

PAGES = {"pages": [{"page_number": 1, "page_file_path": "indexed/page_0001_nohf.md"}]}
CHUNKS = {"chunks": [{"page_number": 1, "chunk_index": 0, "chunk_id": "c-1-0", "content_hash": "h10"}]}


@pytest.fixture
def legacy(create_database, settings):
    engine = create_queue_engine(create_database())
    with engine.begin() as conn:
        conn.exec_driver_sql(LEGACY_SCHEMA)
        conn.exec_driver_sql(
            """INSERT INTO documents (filename, convert_status, index_status, ocr_details, indexing_details) VALUES
               ('indexed.pdf', 'converted', 'indexed', %(p)s::jsonb, %(c)s::jsonb),
               ('converted-without-details.pdf', 'converted', 'pending', NULL, NULL),
               ('waiting.pdf', 'pending', 'pending', NULL, NULL)""",
            {"p": json.dumps(PAGES), "c": json.dumps(CHUNKS)},
        )
    upgrade(engine)
    yield TaskQueue(engine, settings)
    engine.dispose()


@pytest.fixture
def pipeline(legacy, tmp_path):
    from orchestration.pipeline import Pipeline
    from queue_db.config import Settings
    from resources.embeddings import get_embedder
    from resources.extraction import ExtractionResource
    from resources.ocr_resource import OcrResource
    from resources.qdrant_edge import EdgeVectorStore
    from resources.storage import LocalStorage

    pipeline = Pipeline(
        legacy,
        storage=LocalStorage(tmp_path / "storage"),
        pdf=OcrResource.from_settings(Settings.from_env()).get_processor(),
        embedder=get_embedder(),
        extractor=ExtractionResource.from_settings(Settings.from_env()).get_extractor(),
        vector_store_factory=lambda model_id, dim: EdgeVectorStore(
            path=str(tmp_path / "qdrant"), model_id=model_id, dim=dim
        ),
    )
    yield pipeline
    pipeline.close()


def _document(queue: TaskQueue, filename: str) -> dict:
    with queue.engine.connect() as conn:
        return dict(
            conn.exec_driver_sql("SELECT * FROM documents WHERE filename = %(f)s", {"f": filename}).mappings().one()
        )


def test_a_document_converted_without_page_details_fails_with_what_to_do(legacy):
    document = _document(legacy, "converted-without-details.pdf")
    assert (document["ocr_status"], document["ocr_error_class"]) == ("failed", "legacy")
    assert "re-ingest the original file" in document["ocr_error"] and document["ocr_failed_at"] is not None
    assert legacy.claim(OCR_DOCUMENT, make_worker_id(), 10, only_ids=[str(document["id"])]) == []
    # an operator retry asks for the file, which the legacy schema never kept
    assert legacy.retry_failed(document_id=str(document["id"]))[OCR_DOCUMENT.name] == 1


def test_a_legacy_document_without_its_file_fails_once_saying_to_re_ingest(legacy, pipeline):
    worker = make_worker_id()
    waiting = str(_document(legacy, "waiting.pdf")["id"])
    [outcome] = pipeline.expand_documents(worker, legacy.claim(OCR_DOCUMENT, worker, 1, only_ids=[waiting]))
    assert not outcome.ok and not outcome.retryable and outcome.error_class == "missing_file"
    assert "re-ingest the original file" in outcome.error
    assert legacy.claim(OCR_DOCUMENT, worker, 1, only_ids=[waiting]) == [], "not retried: nothing would change"


@pytest.mark.parametrize("kind", [VECTOR_CHUNK, GRAPHRAG_CHUNK], ids=lambda k: k.name)
def test_a_legacy_chunk_re_queued_by_repair_is_never_embedded_or_extracted(legacy, pipeline, kind):
    [chunk] = legacy.chunks()
    assert chunk["content"] is None, "the legacy schema kept no chunk text"
    assert legacy.requeue(kind, [str(chunk["id"])], "repair: completed chunk had no output") == 1
    worker = make_worker_id()
    claimed = legacy.claim(kind, worker, 5)
    [outcome] = process_tasks(pipeline, kind, worker, claimed)
    assert not outcome.ok and not outcome.retryable and outcome.error_class == "legacy"
    assert "re-ingest its document" in outcome.error
    if kind is VECTOR_CHUNK:
        assert pipeline.vector_store.count() == 0, "an empty text was embedded"
    row = legacy.chunks()[0]
    assert (row[f"{kind.phase.value}_status"], row[f"{kind.phase.value}_error_class"]) == ("failed", "legacy")
