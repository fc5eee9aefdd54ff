"""The nightly repair on the embedded Qdrant Edge store: verification, orphan removal and requeueing."""

from __future__ import annotations

from orchestration.maintenance import nightly
from queue_db.phases import VECTOR_CHUNK
from resources.ports import ChunkPoint
from resources.qdrant_edge import EdgeVectorStore
from tests.integration.test_qdrant import DIM, MODEL, random_points
from tests.queue_support import build_document


def test_nightly_deletes_orphan_points_and_requeues_chunks_without_one_on_edge(queue, tmp_path):
    document = build_document(queue, pages=1, chunks_per_page=3)
    store = EdgeVectorStore(path=str(tmp_path / "q"), model_id=MODEL, dim=DIM)
    worker = "nightly-test"
    tasks = queue.claim(VECTOR_CHUNK, worker, 3)
    stored = random_points(str(document["id"]), 2)
    store.upsert([ChunkPoint(t["chunk_id"], p.vector, p.payload) for t, p in zip(tasks[:2], stored)])
    store.upsert(random_points("deleted-document", 2))  # orphans: no queue row has these chunk ids
    queue.complete(VECTOR_CHUNK, worker, [{"id": t["id"]} for t in tasks])

    result = nightly(queue, None, vector_store=store)

    assert result["orphan_points_deleted"] == 2 and result["requeued_vector_chunks"] == 1
    assert result["verification"]["points"] == 4 and isinstance(result["vector_index_built"], bool)
    assert store.chunk_ids() == {t["chunk_id"] for t in tasks[:2]}
    again = nightly(queue, None, vector_store=store)["verification"]
    assert (again["points_without_chunk"], again["points"]) == (0, 2)
