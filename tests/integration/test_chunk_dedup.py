"""Identical chunk text is embedded once: the vector phase copies the stored vector of an already embedded chunk of
the same text (same model: the model's own collection) and embeds only the rest. Real PostgreSQL, the real model,
both vector store backends (`client` is qdrant-client's local mode standing in for a server, as in test_qdrant)."""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone

import numpy as np
import pytest

from orchestration.pipeline import Pipeline
from queue_db.config import Settings
from queue_db.embedding_reuse import vectors_reused_since
from queue_db.phases import VECTOR_CHUNK, VECTOR_PAGE
from queue_db.queue import make_worker_id
from resources.embedding_resource import EmbeddingResource
from resources.embeddings import get_embedder
from tests.integration.test_qdrant import BACKENDS, build_store
from tests.queue_support import expand, ocr_all, register

BOILERPLATE = "Confidential: this report is for internal use only and must not be shared outside the company."
SUMMARY = "Quarterly revenue grew by twelve percent, driven by the new subscription plans in Europe."


class CountingEmbedder:
    """The real embedder, counting the texts it is asked to embed."""

    def __init__(self):
        self.inner, self.texts = get_embedder(), []
        self.model_id, self.dim = self.inner.model_id, self.inner.dim

    def embed_covered(self, texts):
        self.texts += list(texts)
        return self.inner.embed_covered(texts)


def chunked_document(queue, name: str, texts: list[str]) -> list[dict]:
    """A document of one page whose chunks have these texts (hash = sha256 of the text, as chunking makes it)."""
    doc = register(queue, name)
    expand(queue, doc, 1)
    ocr_all(queue, doc)
    worker = make_worker_id("chunk")
    (page,) = queue.claim(VECTOR_PAGE, worker, 1, only_ids=[p["id"] for p in queue.pages(doc["id"])])
    assert queue.complete_chunking(
        worker,
        page["id"],
        [
            {"chunk_index": i, "content_hash": hashlib.sha256(t.encode()).hexdigest(), "content": t, "token_count": 9}
            for i, t in enumerate(texts)
        ],
    )
    with queue.engine.connect() as conn:
        ids = [
            r[0]
            for r in conn.exec_driver_sql(
                "SELECT id::text FROM task_queue_chunk WHERE document_id = %s ORDER BY chunk_index", (str(doc["id"]),)
            )
        ]
    return ids


@pytest.fixture(params=BACKENDS)
def setup(request, queue, tmp_path):
    store = build_store(request.param, tmp_path / "qdrant", dim=get_embedder().dim, model_id=get_embedder().model_id)
    embedder = CountingEmbedder()
    pipeline = Pipeline(queue, embedder=embedder, vector_store_factory=lambda model_id, dim: store)
    yield pipeline, store, embedder
    store.close()


def embed(queue, pipeline, ids: list[str]):
    worker = make_worker_id("vector")
    tasks = queue.claim(VECTOR_CHUNK, worker, len(ids), only_ids=ids)
    assert sorted(t["id"] for t in tasks) == sorted(ids)
    tasks.sort(key=lambda t: t["chunk_index"])
    return worker, tasks, pipeline.embed_chunks(worker, tasks)


def reused_from(queue, ids: list[str]) -> list[str | None]:
    with queue.engine.connect() as conn:
        rows = dict(
            conn.exec_driver_sql(
                "SELECT id::text, vector_reused_from FROM task_queue_chunk WHERE id = ANY(%s::uuid[])", (ids,)
            ).all()
        )
    return [rows[i] for i in ids]


def test_identical_chunks_are_embedded_once_and_share_the_vector(queue, setup):
    pipeline, store, embedder = setup
    started = datetime.now(timezone.utc)
    first = chunked_document(queue, "v1.md", [BOILERPLATE, SUMMARY, BOILERPLATE])
    second = chunked_document(queue, "v2.md", [BOILERPLATE, SUMMARY, "A new paragraph of the second version."])
    _, first_tasks, outcomes = embed(queue, pipeline, first)
    assert all(o.ok and not o.rejected for o in outcomes)
    assert embedder.texts == [BOILERPLATE, SUMMARY]  # the batch's own duplicate is embedded once
    _, second_tasks, outcomes = embed(queue, pipeline, second)
    assert all(o.ok and not o.rejected for o in outcomes)
    assert embedder.texts[2:] == ["A new paragraph of the second version."]
    assert [o.metadata["reused"] for o in outcomes] == [True, True, False]

    chunk_ids = [t["chunk_id"] for t in first_tasks + second_tasks]
    stored = store.vectors(chunk_ids)
    assert set(stored) == set(chunk_ids)  # a copied vector is still its own point
    boiler = [np.asarray(stored[c].vector) for c in (chunk_ids[0], chunk_ids[2], chunk_ids[3])]
    assert all(np.array_equal(boiler[0], v) for v in boiler[1:])
    assert np.array_equal(stored[chunk_ids[1]].vector, stored[chunk_ids[4]].vector)
    assert not np.allclose(stored[chunk_ids[0]].vector, stored[chunk_ids[5]].vector)
    assert stored[chunk_ids[2]].payload["vector_reused_from"] == chunk_ids[0]
    assert "vector_reused_from" not in stored[chunk_ids[0]].payload
    assert stored[chunk_ids[3]].payload["text"] == BOILERPLATE
    assert stored[chunk_ids[3]].payload["document_id"] == str(second_tasks[0]["document_id"])
    sources = reused_from(queue, second)
    assert sources[0] in (chunk_ids[0], chunk_ids[2]) and sources[1:] == [chunk_ids[1], None]
    assert stored[chunk_ids[3]].payload["vector_reused_from"] == sources[0]
    assert vectors_reused_since(queue.engine, started) == 3


def test_with_dedup_off_every_chunk_is_embedded(queue, setup, monkeypatch):
    pipeline, store, embedder = setup
    monkeypatch.setenv("DOCQUEUE_EMBEDDING_DEDUP", "false")
    pipeline.embed_dedup = EmbeddingResource.from_settings(Settings.from_env()).dedup  # as an entry point passes it
    first = chunked_document(queue, "v1.md", [BOILERPLATE, SUMMARY, BOILERPLATE])
    second = chunked_document(queue, "v2.md", [BOILERPLATE])
    embed(queue, pipeline, first)
    embed(queue, pipeline, second)
    assert embedder.texts == [BOILERPLATE, SUMMARY, BOILERPLATE, BOILERPLATE]
    assert reused_from(queue, first + second) == [None] * 4
    assert store.count() == 4


def test_a_source_point_missing_from_the_store_means_embedding_as_usual(queue, setup):
    pipeline, store, embedder = setup
    first = chunked_document(queue, "v1.md", [BOILERPLATE, SUMMARY])
    _, first_tasks, _ = embed(queue, pipeline, first)
    store.delete_chunks([first_tasks[0]["chunk_id"]])  # lost (a store restored from an older backup)
    second = chunked_document(queue, "v2.md", [BOILERPLATE, SUMMARY])
    _, second_tasks, outcomes = embed(queue, pipeline, second)
    assert all(o.ok for o in outcomes)
    assert embedder.texts == [BOILERPLATE, SUMMARY, BOILERPLATE]
    assert reused_from(queue, second) == [None, first_tasks[1]["chunk_id"]]
    assert store.vectors([second_tasks[0]["chunk_id"]])  # embedded and stored


def test_a_retried_batch_writes_the_same_points_once(queue, setup):
    pipeline, store, embedder = setup
    embed(queue, pipeline, chunked_document(queue, "v1.md", [BOILERPLATE, SUMMARY]))
    second = chunked_document(queue, "v2.md", [BOILERPLATE, SUMMARY, "Only in the second version."])
    worker = make_worker_id("vector")
    tasks = sorted(queue.claim(VECTOR_CHUNK, worker, 3, only_ids=second), key=lambda t: t["chunk_index"])
    pipeline._embed_batch(worker, tasks)  # the worker dies after writing the points, before settling them
    before = store.vectors([t["chunk_id"] for t in tasks])
    outcomes = pipeline.embed_chunks(worker, tasks)  # the retry
    assert all(o.ok and not o.rejected for o in outcomes)
    after = store.vectors([t["chunk_id"] for t in tasks])
    assert store.count() == 5
    assert all(
        np.array_equal(before[c].vector, after[c].vector) and before[c].payload == after[c].payload for c in before
    )
    assert reused_from(queue, second)[:2] == [
        after[tasks[0]["chunk_id"]].payload["vector_reused_from"],
        after[tasks[1]["chunk_id"]].payload["vector_reused_from"],
    ]
