"""Verification streams both sides a page at a time: with a page of two ids, inconsistencies planted on both sides
of page boundaries are all found, on both vector backends and the real Bolt graph, and the nightly run repairs
them with DOCQUEUE_VERIFY_PAGE set that small."""

from __future__ import annotations

import pytest

from orchestration.maintenance import nightly
from orchestration.verify import verify_stores
from processing.entities import ChunkGraph, Entity, Extraction
from queue_db.phases import GRAPHRAG_CHUNK, VECTOR_CHUNK
from resources.ports import ChunkPoint
from tests.integration.test_qdrant import BACKENDS, build_store, random_points
from tests.queue_support import build_document

PAGE = 2


def _recording_pages(store) -> list[int]:
    """Wraps the store's page reader so the test sees each page it handed out."""
    sizes: list[int] = []
    pages = store.chunk_id_pages

    def recorded(page_size):
        for page in pages(page_size):
            sizes.append(len(page))
            yield page

    store.chunk_id_pages = recorded
    return sizes


def _seed_vectors(queue, store, missing: set[int]) -> tuple[list[dict], list[str]]:
    """Seven completed chunks, with points for all but the `missing` indexes, and three orphan points."""
    document = build_document(queue, pages=1, chunks_per_page=7)
    tasks = sorted(queue.claim(VECTOR_CHUNK, "verify-test", 7), key=lambda t: t["id"])
    vectors = random_points(str(document["id"]), 7)
    store.upsert(
        [
            ChunkPoint(t["chunk_id"], p.vector, p.payload)
            for i, (t, p) in enumerate(zip(tasks, vectors))
            if i not in missing
        ]
    )
    orphans = random_points("deleted-document", 3, seed=1)
    store.upsert(orphans)
    queue.complete(VECTOR_CHUNK, "verify-test", [{"id": t["id"]} for t in tasks])
    return tasks, sorted(p.chunk_id for p in orphans)


@pytest.mark.parametrize("backend", BACKENDS)
def test_verify_finds_what_is_missing_on_either_side_of_page_boundaries(queue, tmp_path, backend):
    store = build_store(backend, tmp_path / "q")
    try:
        # rows are paged in id order: the first of a page, the last of the next one, and the very last row
        tasks, orphans = _seed_vectors(queue, store, missing={0, 3, 6})
        # a point whose chunk went back to work is not an inconsistency, but it is counted
        assert queue.requeue(VECTOR_CHUNK, [tasks[1]["id"]], "test: re-embed") == 1
        sizes = _recording_pages(store)

        report = verify_stores(queue, vector_store=store, page_size=PAGE)

        assert report.chunks_without_point == sorted(tasks[i]["id"] for i in (0, 3, 6))
        assert report.points_without_chunk == orphans
        assert (report.completed_vector_chunks, report.points, report.points_of_unfinished_chunks) == (6, 7, 1)
        assert max(sizes) == PAGE and sum(sizes) == 7, "the store is read a page at a time"
        # the same answer as one page holding everything
        whole = verify_stores(queue, vector_store=store, page_size=1000)
        assert whole.as_dict() == report.as_dict()
    finally:
        store.close()


def test_the_nightly_run_repairs_with_a_tiny_page(queue, tmp_path):
    store = build_store("edge", tmp_path / "q")
    try:
        tasks, orphans = _seed_vectors(queue, store, missing={2, 5})
        result = nightly(queue, None, vector_store=store, page_size=PAGE)
        assert (result["requeued_vector_chunks"], result["orphan_points_deleted"]) == (2, 3)
        assert store.present_chunk_ids(orphans) == set()
        again = nightly(queue, None, vector_store=store, page_size=PAGE)["verification"]
        assert (again["chunks_without_point"], again["points_without_chunk"], again["points"]) == (0, 0, 5)
    finally:
        store.close()


def test_verify_reads_the_graph_once_a_page_at_a_time(queue, graph_store):
    document = build_document(queue, pages=1, chunks_per_page=5)
    vector = queue.claim(VECTOR_CHUNK, "verify-test", 5)
    queue.complete(VECTOR_CHUNK, "verify-test", [{"id": t["id"]} for t in vector])
    tasks = sorted(queue.claim(GRAPHRAG_CHUNK, "verify-test", 5), key=lambda t: t["id"])
    written = [t for i, t in enumerate(tasks) if i not in (1, 4)]
    graph_store.write_chunks(
        [
            ChunkGraph(
                str(document["id"]),
                "report.pdf",
                1,
                t["chunk_id"],
                i,
                Extraction(entities=[Entity("Acme Corp", "ORG")]),
            )
            for i, t in enumerate(written)
        ]
    )
    queue.complete(GRAPHRAG_CHUNK, "verify-test", [{"id": t["id"]} for t in tasks])
    graph_store.write_chunks([ChunkGraph(str(document["id"]), "report.pdf", 1, "orphan-chunk", 9, Extraction())])
    read: list[int] = []
    pages = graph_store.chunk_mention_pages
    graph_store.chunk_mention_pages = lambda size: (read.append(len(page)) or page for page in pages(size))

    report = verify_stores(queue, graph_store=graph_store, page_size=PAGE)

    assert report.chunks_without_graph == sorted(str(tasks[i]["id"]) for i in (1, 4))
    assert report.completed_graph_chunks == 5 and report.duplicate_entities == []
    assert sum(read) == 4 and all(0 < n <= PAGE for n in read), "the graph is read once, a page at a time"
    in_order = [c for page in graph_store.chunk_id_pages(PAGE) for c in page]
    assert [c for page in pages(PAGE) for c, _ in page] == in_order
    # hex ids and one of another form ("orphan-chunk"), each exactly once, in id order
    assert in_order == sorted([*(t["chunk_id"] for t in written), "orphan-chunk"])
    assert verify_stores(queue, graph_store=graph_store, page_size=1000).as_dict() == report.as_dict()


def test_the_store_checks_evaluate_streamed_in_their_job(docqueue_env, monkeypatch):
    """The checks job, run as its schedule runs it: the vector check reports the chunk without a point that the
    paged verification finds, the graph check passes on an empty graph with no GraphRAG work completed."""
    from orchestration.code_location import build_definitions
    from orchestration.environment import dagster_instance
    from queue_db.config import Settings
    from resources.database import open_queue
    from resources.embedding_resource import EmbeddingResource
    from resources.vector_resource import QdrantResource

    monkeypatch.setenv("DOCQUEUE_VERIFY_PAGE", str(PAGE))
    defs = build_definitions(Settings.from_env())  # the code location as it loads with this environment
    queue = open_queue(Settings.from_env())
    embedder = EmbeddingResource.from_settings(Settings.from_env()).get_embedder()
    store = QdrantResource.from_settings(Settings.from_env()).get_store(embedder.model_id, embedder.dim)
    document = build_document(queue, pages=1, chunks_per_page=5)
    tasks = queue.claim(VECTOR_CHUNK, "check-test", 5)
    store.upsert(
        [
            ChunkPoint(
                t["chunk_id"],
                [1.0] * embedder.dim,
                {"document_id": str(document["id"]), "chunk_index": i, "page_number": 1},
            )
            for i, t in enumerate(tasks[1:])
        ]
    )
    store.close()
    queue.complete(VECTOR_CHUNK, "check-test", [{"id": t["id"]} for t in tasks])

    instance = dagster_instance(Settings.from_env())
    try:
        result = defs.resolve_job_def("asset_checks_job").execute_in_process(instance=instance)
    finally:
        instance.dispose()
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    vectors = evaluations["vectors_agree_with_queue"]
    assert not vectors.passed
    assert {k: v.value for k, v in vectors.metadata.items()} == {
        "completed_chunks": 5,
        "points": 4,
        "missing_points": 1,
        "points_not_completed": 0,
    }
    assert evaluations["graph_agrees_with_queue"].passed
