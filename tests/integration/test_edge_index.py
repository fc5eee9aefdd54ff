"""The embedded store's index: quantized HNSW that finds what exact search finds, and older shards brought to it."""

from __future__ import annotations

import json

import numpy as np
import qdrant_edge as qe

from orchestration.schedules import RECOVERY_DUE_TAG
from processing.sparse import document_vector
from resources.ports import ChunkPoint
from resources.qdrant_edge import EdgeVectorStore
from resources.qdrant_edge_shard import HNSW_CONFIG, QUANTIZATION_CONFIG, SPARSE_CONFIG
from resources.vector_payload import point_id
from tests.integration.test_sensors import output_metadata, tick

MODEL, DIM = "index-test", 384
POINTS = 8_000  # 12 MB of vectors: above full_scan_threshold (10 MB), so searches go through the graph


def clustered(rng, n: int) -> np.ndarray:
    """Vectors around 200 centres, as embeddings of related texts lie, unit length."""
    centres = rng.standard_normal((200, DIM), dtype=np.float32)
    vectors = centres[rng.integers(0, 200, n)] + 0.5 * rng.standard_normal((n, DIM), dtype=np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def fill(store: EdgeVectorStore, vectors: np.ndarray) -> list[str]:
    ids = [f"chunk-{i}" for i in range(len(vectors))]
    store.upsert(
        [
            ChunkPoint(cid, v, {"document_id": f"doc-{i // 100}", "text": f"passage {i}"})
            for i, (cid, v) in enumerate(zip(ids, vectors))
        ]
    )
    return ids


def sparse_index_types(store: EdgeVectorStore) -> set[str]:
    """How the segments of the store's main shard keep their keyword index (Mmap: read from disk as searched)."""
    return {
        json.loads(segment.read_text())["config"]["sparse_vector_data"]["text"]["index"]["index_type"]
        for segment in store.folder.glob("segments/*/segment.json")
    }


def test_quantized_index_finds_what_exact_search_finds(tmp_path):
    rng = np.random.default_rng(3)
    vectors = clustered(rng, POINTS)
    store = EdgeVectorStore(path=str(tmp_path), model_id=MODEL, dim=DIM, linger_s=0)
    ids = fill(store, vectors)
    assert store.optimize() is True
    info = store.info()
    assert info["indexed_vectors"] >= POINTS, info  # dense and sparse both count

    config = json.loads((store.folder / "edge_config.json").read_text())
    assert config["hnsw_config"] == HNSW_CONFIG and config["quantization_config"] == QUANTIZATION_CONFIG
    assert config["sparse_vectors"]["text"] == SPARSE_CONFIG
    assert "Mmap" in sparse_index_types(store)

    found = total = 0
    for row in rng.integers(0, POINTS, 30):
        query = vectors[row] + 0.2 * rng.standard_normal(DIM).astype(np.float32)
        exact = {ids[i] for i in np.argsort(vectors @ query)[-5:]}
        found += len({hit.chunk_id for hit in store.search(query, limit=5)} & exact)
        total += 5
    assert found / total >= 0.9, found / total
    store.close()


def emptied_main_shard(tmp_path, seed: int) -> tuple[EdgeVectorStore, np.random.Generator]:
    """A closed store whose main shard exists and holds no point (the first merge of the tail makes it), and the
    random generator that made its point."""
    rng = np.random.default_rng(seed)
    store = EdgeVectorStore(path=str(tmp_path), model_id=MODEL, dim=DIM, linger_s=0)
    fill(store, clustered(rng, 1))  # the main shard is made by the first merge of the tail
    store.merge_tail()
    store.delete_chunks(["chunk-0"])
    store.close()
    return store, rng


def test_a_shard_with_older_index_settings_gets_todays_and_is_rebuilt_by_optimize(tmp_path):
    store, rng = emptied_main_shard(tmp_path, seed=4)
    # the shard as docqueue made it before: Qdrant's default index settings, nothing quantized
    config_file = store.folder / "edge_config.json"
    config = json.loads(config_file.read_text())
    for key in ("hnsw_config", "quantization_config"):
        config.pop(key)
    config["vectors"][""].pop("memory", None)
    config_file.write_text(json.dumps(config))
    shard = qe.EdgeShard.load(str(store.folder))
    vectors = clustered(rng, POINTS)
    shard.update(
        qe.UpdateOperation.upsert_points(
            [qe.Point(i, v.tolist(), {"document_id": "old"}) for i, v in enumerate(vectors)]
        )
    )
    shard.optimize()
    shard.close()
    segments = sorted(store.folder.glob("segments/*/segment.json"))
    assert all(
        json.loads(s.read_text())["config"]["vector_data"][""].get("quantization_config") is None for s in segments
    )

    assert store.count() == POINTS  # the first opening writes today's settings
    config = json.loads(config_file.read_text())
    assert config["hnsw_config"] == HNSW_CONFIG and config["quantization_config"] == QUANTIZATION_CONFIG
    assert store.optimize() is True  # the segments built with the old settings are rebuilt
    quantized = [
        json.loads(s.read_text())["config"]["vector_data"][""].get("quantization_config")
        for s in store.folder.glob("segments/*/segment.json")
    ]
    assert QUANTIZATION_CONFIG in quantized
    assert store.optimize() is False  # and stay built
    hits = store.search(vectors[7], limit=1)
    assert hits and hits[0].score > 0.99
    store.close()


def test_the_tail_is_indexed_once_enough_points_wait_and_segments_stop_growing(tmp_path):
    rng = np.random.default_rng(5)
    # the smallest DOCQUEUE_QDRANT_SEGMENT_POINTS allowed: two builds never merge
    store = EdgeVectorStore(path=str(tmp_path), model_id=MODEL, dim=DIM, linger_s=0, segment_points=10_000)
    first = clustered(rng, POINTS)
    fill(store, first)
    assert store.unindexed() == POINTS  # counted by the writers, read without opening the shard
    assert store.index_tail(POINTS + 1) is False and store.unindexed() == POINTS  # not enough wait yet
    assert store.index_tail(0) is False  # 0: the nightly run only
    assert store.index_tail(POINTS) is True and store.unindexed() == 0

    second = clustered(rng, POINTS)
    store.upsert(
        [
            ChunkPoint(f"later-{i}", v, {"document_id": "later", "text": f"later passage {i}"})
            for i, v in enumerate(second)
        ]
    )
    assert store.unindexed() == POINTS and store.index_tail(POINTS) is True
    info = store.info()
    # two builds of 8,000 points each: merged they would pass the 10,000-point cap, so they stay two segments
    assert info["points"] == 2 * POINTS and info["segments"] >= 3, info
    config = json.loads((store.folder / "edge_config.json").read_text())
    assert config["optimizers"]["max_segment_size"] == 10_000 * DIM * 4 // 1024
    assert {h.chunk_id for h in store.search(second[3], limit=1)} == {"later-3"}
    store.close()


def test_the_recovery_job_indexes_the_waiting_tail(docqueue_env, monkeypatch):
    from orchestration.code_location import build_definitions
    from orchestration.environment import dagster_instance
    from queue_db.config import Settings
    from resources.embedding_resource import EmbeddingResource
    from resources.vector_resource import QdrantResource

    embedder = EmbeddingResource.from_settings(Settings.from_env()).get_embedder()
    store = QdrantResource.from_settings(Settings.from_env()).get_store(embedder.model_id, embedder.dim)
    fill(store, clustered(np.random.default_rng(6), POINTS))
    store.close()
    monkeypatch.setenv("DOCQUEUE_QDRANT_INDEX_TAIL", str(POINTS))
    # built now, with this test's environment: the recovery job carries the tail threshold and the store's folder
    defs = build_definitions(Settings.from_env())
    instance = dagster_instance(Settings.from_env())
    try:
        requested = tick(defs, instance, "recovery_sensor").run_requests
        assert [r.tags[RECOVERY_DUE_TAG] for r in requested] == [
            f"embedded vector index: {POINTS} point(s) written since the last index build; the index is rebuilt at "
            f"DOCQUEUE_QDRANT_INDEX_TAIL={POINTS} points"
        ]
        result = defs.resolve_job_def("recovery_job").execute_in_process(instance=instance)
        assert result.success
        assert output_metadata(result, "index_vector_tail") == {"waiting": POINTS, "built": True, "index_tail": POINTS}
        assert "nothing to recover" in tick(defs, instance, "recovery_sensor").skip_message
    finally:
        instance.dispose()
    assert store.unindexed() == 0 and store.info()["indexed_vectors"] >= 2 * POINTS
    store.close()


def test_writes_go_to_the_tail_and_reads_see_both_shards_once(tmp_path):
    rng = np.random.default_rng(7)
    store = EdgeVectorStore(path=str(tmp_path), model_id=MODEL, dim=DIM, linger_s=0, lock_timeout_s=2)
    vectors = clustered(rng, 300)
    ids = fill(store, vectors)
    assert store.merge_tail() == 300 and not store.tail_folder.exists() and store.unindexed() == 0

    # a writer never opens the main shard: one held by a process that knows nothing of docqueue's locks
    # would make it fail with `Can't init WAL: WouldBlock`
    outsider = qe.EdgeShard.load(str(store.folder))
    try:
        again = [10, 11, 12]  # written again (a retried batch) before the tail is merged: in both shards now
        store.upsert(
            [ChunkPoint(ids[i], vectors[i], {"document_id": f"doc-{i // 100}", "text": f"passage {i}"}) for i in again]
        )
        store.upsert(
            [
                ChunkPoint(f"new-{i}", v, {"document_id": "doc-new", "text": f"new passage {i}"})
                for i, v in enumerate(clustered(rng, 20))
            ]
        )
        assert store.unindexed() == 23
    finally:
        outsider.close()

    assert store.count() == 320 and store.count("doc-0") == 100 and store.count("doc-new") == 20
    assert len(store.chunk_ids()) == 320
    paged = [chunk_id for page in store.chunk_id_pages(64) for chunk_id in page]
    assert len(paged) == 320 and set(paged) == store.chunk_ids()
    assert store.present_chunk_ids([ids[10], "new-3", "missing"]) == {ids[10], "new-3"}
    hits = store.search(vectors[11], limit=5)
    assert hits[0].chunk_id == ids[11] and len({h.chunk_id for h in hits}) == 5
    assert {h.chunk_id for h in store.search(text="new passage 4", mode="sparse", limit=3)} >= {"new-4"}
    assert store.info()["points"] == 320

    store.delete_document("doc-0")  # from both shards
    assert store.count() == 220 and not ({ids[10], ids[50]} & store.chunk_ids())
    store.optimize()  # merges the tail (300 points are too few to need a graph)
    assert store.count() == 220 and not store.tail_folder.exists() and store.unindexed() == 0
    assert {h.chunk_id for h in store.search(vectors[150], limit=1)} == {ids[150]}
    store.close()


def test_a_session_writes_on_after_its_tail_was_merged(tmp_path):
    """Seeding and migrations write in one session and build the index as they go: the tail dropped by the merge is
    made again under the lock the session still holds."""
    rng = np.random.default_rng(8)
    store = EdgeVectorStore(path=str(tmp_path), model_id=MODEL, dim=DIM, linger_s=0)
    with store.session():
        fill(store, clustered(rng, 50))
        assert store.merge_tail() == 50 and not store.tail_folder.exists()
        store.upsert([ChunkPoint("after", clustered(rng, 1)[0], {"document_id": "late", "text": "after the merge"})])
        assert store.tail_folder.exists() and store.count() == 51
    assert store.count("late") == 1
    store.close()


def payload_index_on_disk(store: EdgeVectorStore) -> dict[str, bool | None]:
    shard = qe.EdgeShard.load(str(store.folder))
    try:
        return {name: info.params and info.params.on_disk for name, info in shard.info().payload_schema.items()}
    finally:
        shard.close()


def test_payload_indexes_are_mapped_from_disk_and_older_ones_are_rebuilt_by_optimize(tmp_path):
    rng = np.random.default_rng(5)
    store = EdgeVectorStore(path=str(tmp_path), model_id=MODEL, dim=DIM, linger_s=0)
    fill(store, clustered(rng, 200))
    store.merge_tail()
    store.close()
    assert payload_index_on_disk(store) == {"document_id": True, "tenant_id": True}

    # the indexes as docqueue built them before: held in memory, read whole at every opening
    shard = qe.EdgeShard.load(str(store.folder))
    for name in ("document_id", "tenant_id"):
        shard.update(qe.UpdateOperation.delete_field_index(name))
        shard.update(qe.UpdateOperation.create_field_index(name, qe.PayloadSchemaType.Keyword))
    shard.close()
    assert payload_index_on_disk(store) == {"document_id": None, "tenant_id": None}
    assert store.count() == 200 and payload_index_on_disk(store)["document_id"] is None  # an opening keeps them
    assert store.optimize() is True
    assert payload_index_on_disk(store) == {"document_id": True, "tenant_id": True}
    store.delete_document("doc-1")  # the rebuilt index serves the filter
    assert store.count() == 100 and store.count("doc-0") == 100
    store.close()


def test_a_keyword_index_held_in_memory_is_mapped_from_disk_after_the_next_optimize(tmp_path):
    store, rng = emptied_main_shard(tmp_path, seed=6)
    # the shard as docqueue made it before: its segments' keyword index read into memory at every opening
    config_file = store.folder / "edge_config.json"
    config = json.loads(config_file.read_text())
    config["sparse_vectors"]["text"].pop("memory", None)
    config_file.write_text(json.dumps(config))
    shard = qe.EdgeShard.load(str(store.folder))
    vectors = clustered(rng, POINTS)
    points = []
    for i, vector in enumerate(vectors):
        text = f"harbour{i} crane{i % 7}"
        indices, values = document_vector(text)
        chunk = {"chunk_id": f"old-{i}", "document_id": f"doc-{i // 100}", "text": text}
        points.append(
            qe.Point(
                point_id(chunk["chunk_id"]), {"": vector.tolist(), "text": qe.SparseVector(indices, values)}, chunk
            )
        )
    shard.update(qe.UpdateOperation.upsert_points(points))
    shard.optimize()
    shard.close()
    assert "Mmap" not in sparse_index_types(store)

    assert store.count() == POINTS  # the first opening writes today's settings
    assert json.loads(config_file.read_text())["sparse_vectors"]["text"] == SPARSE_CONFIG
    assert store.optimize() is True  # the segments built with the index in memory are rebuilt
    assert "Mmap" in sparse_index_types(store) and sparse_index_types(store) <= {"Mmap", "MutableRam"}
    assert store.optimize() is False  # and stay built
    assert [hit.chunk_id for hit in store.search(None, limit=1, text="harbour2", mode="sparse")] == ["old-2"]
    store.close()
