"""The vector store's contract, run on both backends with real storage and the real embedding model for search.

`edge` is the embedded default (Qdrant Edge shards). `client` is qdrant-client's local mode: no Qdrant
server can run here, and local mode speaks the same client API docqueue uses with a server, so it stands
in for server mode.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import qdrant_edge
from qdrant_client import QdrantClient

from processing.chunking import chunk_markdown
from queue_db.config import Settings
from resources.embeddings import get_embedder
from resources.folder_lock import QdrantStorageBusy, release_lingering
from resources.ports import ChunkPoint, VectorStore, VectorStoreError
from resources.qdrant_base import collection_name
from resources.qdrant_edge import EdgeVectorStore
from resources.qdrant_server import ClientVectorStore
from resources.vector_payload import point_id
from resources.vector_resource import QdrantResource
from resources.vector_stores import vector_store_settings

REPO = Path(__file__).resolve().parents[2]
MODEL = "all-MiniLM-L6-v2-int8"
DIM = 8


BACKENDS = ("edge", "client")


def build_store(backend: str, path: Path, dim: int = DIM, model_id: str = MODEL, **kwargs) -> VectorStore:
    if backend == "edge":
        return EdgeVectorStore(path=str(path), model_id=model_id, dim=dim, **kwargs)
    return ClientVectorStore(url=None, path=str(path), model_id=model_id, dim=dim, **kwargs)


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture
def store_at(backend):
    def build(path: Path, dim: int = DIM, model_id: str = MODEL, **kwargs) -> VectorStore:
        return build_store(backend, path, dim, model_id, **kwargs)

    return build


def random_points(document_id: str, count: int, *, seed: int = 0, prefix: str = "") -> list[ChunkPoint]:
    rng = np.random.default_rng(seed)
    return [
        ChunkPoint(
            chunk_id=f"{prefix}{document_id}-{index:04d}",
            vector=rng.normal(size=DIM).astype(np.float32),
            payload={
                "document_id": document_id,
                "filename": f"{document_id}.pdf",
                "page_number": 1,
                "chunk_index": index,
                "text": f"text {index}",
                "content_hash": "0" * 64,
            },
        )
        for index in range(count)
    ]


def test_point_ids_are_stable_uuid5_and_collections_are_named_per_model():
    assert point_id("abc") == point_id("abc") == str(uuid.UUID(point_id("abc")))
    assert uuid.UUID(point_id("abc")).version == 5
    assert point_id("abc") != point_id("abd")
    assert collection_name("all-MiniLM-L6-v2-int8") == "docqueue_chunks__all_minilm_l6_v2_int8"
    assert collection_name("BAAI/bge-small-en-v1.5") == "docqueue_chunks__baai_bge_small_en_v1_5"
    with pytest.raises(ValueError):
        point_id("")


def test_upserting_the_same_chunks_twice_does_not_duplicate(store_at, tmp_path):
    store = store_at(tmp_path / "q")
    points = random_points("doc-a", 30)
    assert store.upsert(points) == 30
    assert store.upsert(points) == 30
    assert store.count() == 30
    changed = [ChunkPoint(p.chunk_id, p.vector, {**p.payload, "text": "rewritten"}) for p in points[:3]]
    store.upsert(changed)
    assert store.count() == 30
    [hit] = store.search(points[0].vector, limit=1)
    assert hit.chunk_id == points[0].chunk_id
    assert hit.payload["text"] == "rewritten"
    assert hit.score == pytest.approx(1.0, abs=1e-5)


def test_data_survives_reopening_the_folder_from_a_new_store(store_at, tmp_path):
    store_at(tmp_path / "q").upsert(random_points("doc-a", 12))
    again = store_at(tmp_path / "q")
    assert again.count() == 12
    assert again.chunk_ids("doc-a") == {f"doc-a-{i:04d}" for i in range(12)}


def test_delete_by_document_and_by_chunk(store_at, tmp_path):
    store = store_at(tmp_path / "q")
    store.upsert(random_points("doc-a", 10) + random_points("doc-b", 7, seed=1))
    assert (store.count(), store.count("doc-a"), store.count("doc-b")) == (17, 10, 7)
    store.delete_document("doc-a")
    assert (store.count(), store.count("doc-a"), store.count("doc-b")) == (7, 0, 7)
    store.delete_chunks(["doc-b-0000", "doc-b-0001", "doc-b-0001", "never-stored"])
    assert store.chunk_ids() == {f"doc-b-{i:04d}" for i in range(2, 7)}
    store.delete_document("doc-missing")
    assert store.count() == 5


def test_reads_and_deletes_on_a_missing_collection_are_empty_not_errors(store_at, tmp_path):
    store = store_at(tmp_path / "q")
    assert store.count() == 0
    assert store.chunk_ids() == set()
    assert store.search(np.ones(DIM)) == []
    store.delete_document("x")
    store.delete_chunks(["y"])


def test_chunk_ids_pages_through_more_than_one_scroll_page(store_at, tmp_path):
    store = store_at(tmp_path / "q")
    store.scroll_page = 7
    store.upsert(random_points("doc-a", 40) + random_points("doc-b", 5, seed=1))
    assert store.chunk_ids("doc-a") == {f"doc-a-{i:04d}" for i in range(40)}
    assert len(store.chunk_ids()) == 45


def test_bad_points_and_mismatched_collections_are_refused(store_at, tmp_path):
    store = store_at(tmp_path / "q")
    good = random_points("doc-a", 1)[0]
    with pytest.raises(VectorStoreError, match="dims"):
        store.upsert([ChunkPoint("c1", [0.1, 0.2], good.payload)])
    with pytest.raises(VectorStoreError, match="document_id"):
        store.upsert([ChunkPoint("c1", good.vector, {"text": "no document"})])
    with pytest.raises(VectorStoreError, match="not finite"):
        store.upsert([ChunkPoint("c1", np.full(DIM, np.nan), good.payload)])
    with pytest.raises(VectorStoreError, match="dims"):
        store.search(np.ones(3))
    with pytest.raises(ValueError):
        store.search(np.ones(DIM), limit=0)
    store.ensure_collection()
    with pytest.raises(VectorStoreError, match="needs 16-d Cosine"):
        store_at(tmp_path / "q", dim=16).ensure_collection()


def test_threads_of_one_process_share_the_folder(store_at, tmp_path):
    errors = []

    def write(document_id: str, seed: int) -> None:
        try:
            store = store_at(tmp_path / "q", lock_timeout_s=60)
            for batch in range(5):
                store.upsert(random_points(document_id, 4, seed=seed + batch, prefix=f"b{batch}-"))
        except Exception as exc:  # surfaced below; a thread cannot fail the test itself
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(f"doc-{n}", n * 10)) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert store_at(tmp_path / "q").count() == 3 * 5 * 4


WRITER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from resources.ports import ChunkPoint
    from tests.integration.test_qdrant import build_store

    path, name, go_file, batches, backend = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    store = build_store(backend, path)
    while not os.path.exists(go_file):
        time.sleep(0.01)
    rng = np.random.default_rng(abs(hash(name)) % 1000)
    waits = 0
    for batch in range(batches):
        points = [ChunkPoint(f"{name}-{batch}-{i}", rng.normal(size=8), {"document_id": name, "text": "t"})
                  for i in range(3)]
        asked = time.monotonic()
        with store.session():
            waits += time.monotonic() - asked > 0.015
            store.upsert(points)
            assert store.count(name) == 3 * (batch + 1)
            time.sleep(0.02)  # hold the folder so that the other writer has to wait for it
        time.sleep(0.005)
    print("done", store.count(name), waits)
""")


def _spawn(args: list[str], env_extra: dict | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env_extra or {})}
    return subprocess.Popen(
        [sys.executable, *args], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_two_processes_alternately_writing_the_same_folder_lose_nothing(backend, store_at, tmp_path):
    folder, go_file, batches = tmp_path / "q", tmp_path / "go", 15
    writers = [
        _spawn(["-c", WRITER, str(folder), name, str(go_file), str(batches), backend]) for name in ("alpha", "beta")
    ]
    time.sleep(0.5)  # both import and wait at the start line, so they really contend
    go_file.touch()
    outputs = [writer.communicate(timeout=180) for writer in writers]
    waits = 0
    for writer, (stdout, stderr) in zip(writers, outputs):
        assert writer.returncode == 0, stderr
        done, written, waited = stdout.split()
        assert (done, int(written)) == ("done", batches * 3)
        waits += int(waited)
    assert waits > 0, "the writers never had to wait for each other, so the test proved nothing"
    store = store_at(folder)
    assert store.count() == 2 * batches * 3
    assert store.count("alpha") == store.count("beta") == batches * 3


HOLDER = textwrap.dedent("""
    import sys, time
    from tests.integration.test_qdrant import build_store
    store = build_store(sys.argv[3], sys.argv[1])
    with store.session():
        print("holding", flush=True)
        time.sleep(float(sys.argv[2]))
""")


def test_a_locked_folder_is_waited_for_then_reported_clearly(backend, store_at, tmp_path):
    folder = tmp_path / "q"
    holder = _spawn(["-c", HOLDER, str(folder), "4", backend])
    try:
        assert holder.stdout.readline().strip() == "holding"
        impatient = store_at(folder, lock_timeout_s=1)
        started = time.monotonic()
        with pytest.raises(QdrantStorageBusy, match="DOCQUEUE_QDRANT_LOCK_TIMEOUT"):
            impatient.count()
        assert 0.9 <= time.monotonic() - started < 3.5
        patient = store_at(folder, lock_timeout_s=30)
        started = time.monotonic()
        patient.upsert(random_points("doc-a", 2))  # waits for the holder to let go
        assert time.monotonic() - started > 0.5
        assert patient.count() == 2
    finally:
        holder.kill()
        holder.communicate()


LINGERER = textwrap.dedent("""
    import sys, time
    from tests.integration.test_qdrant import build_store, random_points
    store = build_store("edge", sys.argv[1], linger_s=60)
    store.upsert(random_points("doc-a", 3))
    store.upsert(random_points("doc-b", 2, seed=1))
    print("written", flush=True)
    time.sleep(60)
""")


def test_a_lingering_edge_writer_hands_the_shard_over_when_another_process_asks(tmp_path):
    folder = tmp_path / "q"
    holder = _spawn(["-c", LINGERER, str(folder)])
    try:
        assert holder.stdout.readline().strip() == "written"
        shard = folder / "edge" / (collection_name(MODEL) + ".tail")  # the shard writes go to
        with pytest.raises(Exception, match="WouldBlock"):  # the writer still holds it, idle, between "batches"
            qdrant_edge.EdgeShard.load(str(shard))
        started = time.monotonic()
        assert build_store("edge", folder, lock_timeout_s=20).count() == 5
        assert time.monotonic() - started < 3, "the reader waited for the writer's linger instead of asking"
    finally:
        holder.kill()
        holder.communicate()


def test_lock_timeout_comes_from_the_settings(backend, store_at, tmp_path, monkeypatch):
    monkeypatch.setenv("DOCQUEUE_QDRANT_LOCK_TIMEOUT", "0.3")
    store = store_at(tmp_path / "q", lock_timeout_s=vector_store_settings(Settings.from_env()).lock_timeout_s)
    assert store.lock_timeout_s == 0.3
    if backend == "edge":
        store.ensure_collection()
        release_lingering()
        outsider = qdrant_edge.EdgeShard.load(str(store.tail_folder))  # knows nothing of docqueue's lock
    else:
        outsider = QdrantClient(path=str(tmp_path / "q"))
    try:
        started = time.monotonic()
        with pytest.raises(QdrantStorageBusy, match="outside docqueue"):
            store.count()
        assert time.monotonic() - started < 3
    finally:
        outsider.close()
    assert store.count() == 0


def test_resource_builds_stores_from_the_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCQUEUE_QDRANT_URL", "")
    monkeypatch.setenv("DOCQUEUE_QDRANT_PATH", str(tmp_path / "from-env"))
    monkeypatch.setenv("DOCQUEUE_QDRANT_LOCK_TIMEOUT", "7")
    store = QdrantResource.from_settings(Settings.from_env()).get_store(MODEL, DIM)
    assert store.lock_timeout_s == 7
    assert isinstance(store, EdgeVectorStore)
    assert store.is_embedded and store.location == str((tmp_path / "from-env").resolve())
    assert store.collection == "docqueue_chunks__all_minilm_l6_v2_int8"
    monkeypatch.setenv("DOCQUEUE_QDRANT_URL", "https://user:hunter2@127.0.0.1:6333/")
    monkeypatch.setenv("DOCQUEUE_QDRANT_API_KEY", "sekrit-key")
    resource = QdrantResource.from_settings(Settings.from_env())
    # the secrets reach the resource as the names of their variables, so run config never shows them
    assert "hunter2" not in repr(resource) and "sekrit-key" not in repr(resource)
    remote = resource.get_store(MODEL, DIM)
    assert isinstance(remote, ClientVectorStore) and not remote.is_embedded
    assert "hunter2" not in repr(remote) and "sekrit-key" not in repr(remote)
    assert remote.location == "https://127.0.0.1:6333/"
    remote.close()


COOKING = """# Slow-cooked tomato sauce

Warm olive oil in a heavy pot and soften chopped onions and garlic over a low flame. Add crushed
San Marzano tomatoes, a pinch of salt and fresh basil leaves. Let the sauce simmer gently for two
hours, stirring now and then so it does not catch on the bottom of the pan.

## Serving

Toss the sauce with freshly boiled spaghetti, finish with grated parmesan cheese and serve at once.
Leftover sauce keeps for a week in the fridge or for months in the freezer.
"""

ASTRONOMY = """# Observing distant galaxies

Large reflecting telescopes collect faint light from galaxies millions of light years away. Long
exposures on cooled digital sensors reveal spiral arms, dust lanes and the bright cores where
supermassive black holes swallow gas and stars.

## Redshift

Spectrographs split the light into its colours; the shift of spectral lines towards red tells
astronomers how fast a galaxy is receding as the universe expands.
"""


def test_search_finds_the_document_a_phrase_comes_from(store_at, tmp_path):
    embedder = get_embedder(MODEL)
    store = store_at(tmp_path / "q", dim=embedder.dim)
    points = []
    for document_id, markdown in (("doc-cooking", COOKING), ("doc-astronomy", ASTRONOMY)):
        chunks = chunk_markdown(
            markdown, page_key=f"{document_id}:1", target_tokens=48, overlap_tokens=8, max_tokens=96
        )
        assert len(chunks) >= 2
        vectors = embedder.embed([chunk.text for chunk in chunks])
        points += [
            ChunkPoint(
                chunk.chunk_id,
                vector,
                {
                    "document_id": document_id,
                    "filename": f"{document_id}.pdf",
                    "page_number": 1,
                    "chunk_index": chunk.index,
                    "text": chunk.text,
                    "content_hash": chunk.content_hash,
                },
            )
            for chunk, vector in zip(chunks, vectors)
        ]
    assert store.upsert(points) == len(points)
    queries = {
        "doc-cooking": "simmer crushed tomatoes with basil",
        "doc-astronomy": "spectral lines shifted towards red",
    }
    for document_id, phrase in queries.items():
        hits = store.search(embedder.embed([phrase])[0], limit=3)
        assert hits[0].payload["document_id"] == document_id, (phrase, hits)
        assert hits[0].chunk_id in {p.chunk_id for p in points if p.payload["document_id"] == document_id}
        assert phrase.split()[-1] in hits[0].payload["text"]
        assert hits[0].score > 0.4
    only_cooking = store.search(embedder.embed(["galaxies"])[0], limit=5, document_id="doc-cooking")
    assert only_cooking and {hit.payload["document_id"] for hit in only_cooking} == {"doc-cooking"}


def test_sessions_nest_across_stores_of_one_folder(store_at, tmp_path):
    cooking = store_at(tmp_path / "q", model_id="model-one")
    other = store_at(tmp_path / "q", model_id="model-two", lock_timeout_s=2)
    with cooking.session():
        cooking.upsert(random_points("doc-a", 3))
        other.upsert(random_points("doc-b", 4))  # same folder, same thread: shares the open client
        with cooking.session():
            assert cooking.count() == 3
    assert (cooking.count(), other.count()) == (3, 4)


def test_vectors_reads_points_back_in_one_call_and_leaves_out_missing_ones(store_at, tmp_path):
    store = store_at(tmp_path / "q")
    assert store.vectors(["never-written"]) == {}  # no collection yet: empty, not an error
    points = random_points("doc", 3)
    store.upsert(points)
    read = store.vectors([points[0].chunk_id, points[2].chunk_id, "doc-missing", points[0].chunk_id])
    assert set(read) == {points[0].chunk_id, points[2].chunk_id}
    for point in (points[0], points[2]):
        # Edge stores cosine vectors normalised, local mode as given: the direction is what both keep
        vector = np.asarray(read[point.chunk_id].vector)
        assert np.allclose(vector / np.linalg.norm(vector), point.vector / np.linalg.norm(point.vector), atol=1e-6)
        assert read[point.chunk_id].payload == {**point.payload, "chunk_id": point.chunk_id}
    assert store.vectors([]) == {}


def test_a_search_for_some_payload_keys_ranks_alike_and_payloads_reads_the_rest(store_at, tmp_path):
    store = store_at(tmp_path / "q")
    points = random_points("doc-a", 6) + random_points("doc-b", 6, seed=1)
    store.upsert(points)
    query = points[3].vector
    whole = store.search(query, limit=8, text="text 3")
    light = store.search(query, limit=8, text="text 3", payload_keys=["document_id"])
    assert [(h.chunk_id, h.score) for h in light] == [(h.chunk_id, h.score) for h in whole]
    assert all(set(h.payload) == {"chunk_id", "document_id"} for h in light)
    # a second light search reads the documents the first read (the embedded store keeps them) alike
    again = store.search(query, limit=8, text="text 3", payload_keys=["document_id"])
    assert [(h.chunk_id, h.payload) for h in again] == [(h.chunk_id, h.payload) for h in light]
    read = store.payloads([light[0].chunk_id, "doc-missing", light[1].chunk_id])
    assert read == {h.chunk_id: h.payload for h in whole[:2]}
    assert store.payloads([]) == {}
