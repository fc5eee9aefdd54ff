"""Per-phase time limits: a batch over its limit fails its tasks as `timeout`, to be retried; validation errors
are not retried; error classes are stored and counted."""

from __future__ import annotations

import pytest

from queue_db.phases import VECTOR_CHUNK, VECTOR_PAGE
from queue_db.queue import make_worker_id
from queue_db.readmodels import error_classes
from tests.queue_support import build_document


def embed_timeout() -> float:
    from queue_db.config import Settings
    from resources.embedding_resource import EmbeddingResource

    return EmbeddingResource.from_settings(Settings.from_env()).timeout_s


@pytest.fixture
def pipeline(queue, tmp_path):
    from orchestration.pipeline import Pipeline
    from resources.embeddings import get_embedder
    from resources.qdrant_edge import EdgeVectorStore
    from resources.storage import LocalStorage

    embedder = get_embedder()
    return Pipeline(
        queue,
        storage=LocalStorage(tmp_path / "storage"),
        embedder=embedder,
        vector_store_factory=lambda model_id, dim: EdgeVectorStore(
            path=str(tmp_path / "qdrant"), model_id=model_id, dim=dim
        ),
    )


def test_an_embedding_batch_over_its_time_limit_fails_as_timeout_and_is_retried(queue, pipeline, monkeypatch, engine):
    build_document(queue, pages=1, chunks_per_page=3)
    monkeypatch.setenv("DOCQUEUE_EMBED_TIMEOUT", "0.0005")  # absurdly low
    pipeline.embed_timeout_s = embed_timeout()  # as an entry point hands it down
    worker = make_worker_id()
    outcomes = pipeline.embed_chunks(worker, queue.claim(VECTOR_CHUNK, worker, 3))
    assert [o.error_class for o in outcomes] == ["timeout"] * 3
    assert all(o.retryable and o.error.startswith("timeout: embedding batch took more than") for o in outcomes)
    rows = queue.chunks()
    assert {(r["vector_status"], r["vector_retry_count"], r["vector_error_class"]) for r in rows} == {
        ("failed", 1, "timeout")
    }
    counts = {(r.task_type, r.error_class): r.count for r in error_classes(engine).itertuples()}
    assert counts[("vector_chunks", "timeout")] == 3
    # back-off is 0 in the test settings: the next claim takes them again, and with a sane limit they complete
    monkeypatch.setenv("DOCQUEUE_EMBED_TIMEOUT", "300")
    pipeline.embed_timeout_s = embed_timeout()
    outcomes = pipeline.embed_chunks(worker, queue.claim(VECTOR_CHUNK, worker, 3))
    assert all(o.ok for o in outcomes) and {r["vector_status"] for r in queue.chunks()} == {"completed"}


def test_a_validation_error_is_not_retried(queue, pipeline, engine):
    from queue_db.queue import make_worker_id as worker_id
    from tests.queue_support import expand, ocr_all, register

    doc = register(queue)
    expand(queue, doc, 1)
    ocr_all(queue, doc)
    page = queue.pages(doc["id"])[0]
    # 2 MB of unbroken text: more than a page may chunk into (DOCQUEUE_MAX_CHUNKS_PER_PAGE x 400 tokens)
    pipeline.storage.put_text(page["page_file_path"], "x" * 2_000_000)
    worker = worker_id()
    [outcome] = pipeline.chunk_pages(worker, queue.claim(VECTOR_PAGE, worker, 1))
    assert not outcome.ok and outcome.error_class == "validation" and not outcome.retryable
    assert queue.claim(VECTOR_PAGE, worker, 1) == []
    assert queue.pages(doc["id"])[0]["vector_error_class"] == "validation"
