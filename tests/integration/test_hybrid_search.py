"""Hybrid search (dense + sparse, fused by rank) on both vector backends, with real storage and the real embedder.

`edge` is the embedded Qdrant Edge store; `client` is qdrant-client's local mode, standing in for a server (same
client API, same query with prefetches and RRF fusion).
"""

from __future__ import annotations

import json

import pytest
import qdrant_edge as qe
from click.testing import CliRunner

from resources.embeddings import get_embedder
from resources.ports import ChunkPoint, SearchHits
from resources.qdrant_base import OLD_SHAPE_NOTICE, PreparedPoint
from tests.integration.test_qdrant import MODEL, backend, build_store, store_at  # noqa: F401 (fixtures)

# a chunk each; every target has near-duplicates that differ in a word or a number only
TARGETS = [
    "Inspector Halvorsen measured 412 millimetres of rain at the Brekke weather station during the October storm.",
    "The ferry Kystvakt left Ålesund harbour at dawn carrying 37 crates of salted cod for the Bergen market.",
    "Gearbox model TX-9 overheats when the oil pump runs below 800 revolutions for longer than ten minutes.",
]
SWAPS = [
    ("412", "417"),
    ("Halvorsen", "Haraldsen"),
    ("October", "November"),
    ("37", "73"),
    ("Kystvakt", "Kystlys"),
    ("dawn", "dusk"),
    ("TX-9", "TX-6"),
    ("800", "900"),
    ("ten", "twelve"),
]
FILLER = "The log book records the entry in the usual way, and the clerk signs it before the evening."


def corpus() -> list[tuple[str, str]]:
    chunks = []
    for t, sentence in enumerate(TARGETS):
        chunks.append((f"target-{t}", f"{sentence} {FILLER}"))
        for s, (old, new) in enumerate(swap for swap in SWAPS if swap[0] in sentence):
            chunks.append((f"near-{t}-{s}", f"{sentence.replace(old, new)} {FILLER}"))
    return chunks


@pytest.fixture(scope="module")
def embedder():
    return get_embedder(MODEL)


def points_of(embedder, chunks, document_id="doc-1") -> list[ChunkPoint]:
    vectors = embedder.embed([text for _, text in chunks])
    return [
        ChunkPoint(
            chunk_id,
            vector,
            {"document_id": document_id, "filename": "log.pdf", "page_number": i + 1, "chunk_index": i, "text": text},
        )
        for i, ((chunk_id, text), vector) in enumerate(zip(chunks, vectors))
    ]


def test_a_verbatim_sentence_ranks_its_chunk_first_among_near_duplicates(store_at, embedder, tmp_path):
    store = store_at(tmp_path / "q", dim=embedder.dim)
    points = points_of(embedder, corpus())
    assert store.upsert(points) == len(points)
    assert store.upsert(points) == len(points) and store.count() == len(points)  # re-upsert: no duplicates
    for t, sentence in enumerate(TARGETS):
        vector = embedder.embed_one(sentence)
        hybrid = store.search(vector, limit=5, text=sentence)
        assert isinstance(hybrid, SearchHits) and hybrid.mode == "hybrid" and hybrid.notice is None
        assert hybrid[0].chunk_id == f"target-{t}", [h.chunk_id for h in hybrid]
        sparse = store.search(vector, limit=5, text=sentence, mode="sparse")
        assert sparse.mode == "sparse" and sparse[0].chunk_id == f"target-{t}"
        dense = store.search(vector, limit=5, text=sentence, mode="dense")
        assert dense.mode == "dense" and {h.chunk_id for h in dense} <= {c for c, _ in corpus()}
    # a rare keyword alone is found by its words, and filters apply to both sides of the fusion
    keyword = store.search(embedder.embed_one("Kystlys"), limit=1, text="Kystlys")
    assert keyword[0].payload["text"].count("Kystlys") == 1
    assert store.search(embedder.embed_one("ferry"), text="ferry", exclude_document_ids=["doc-1"]) == []
    # nothing but stopwords: the sparse side has no term, so hybrid is dense alone
    assert store.search(embedder.embed_one("the of and"), text="the of and").mode == "dense"
    assert store.search(None, text="the of and", mode="sparse") == []


def write_old_collection(backend, path, points, dim):
    """A collection as docqueue made it before hybrid search: the dense vector only."""
    store = build_store(backend, path, dim=dim)
    prepared = [
        PreparedPoint(store._prepare(p).id, [float(x) for x in p.vector], {**p.payload, "chunk_id": p.chunk_id})
        for p in points
    ]
    if backend == "edge":
        shard = qe.EdgeShard.create(
            str(store.folder), qe.EdgeConfig(vectors=qe.EdgeVectorParams(size=dim, distance=qe.Distance.Cosine))
        )
        shard.update(qe.UpdateOperation.upsert_points([qe.Point(p.id, p.vector, p.payload) for p in prepared]))
        shard.close()
    else:
        from qdrant_client import QdrantClient
        from qdrant_client.http import models as qm

        client = QdrantClient(path=str(path))
        client.create_collection(
            store.collection, vectors_config=qm.VectorParams(size=dim, distance=qm.Distance.COSINE)
        )
        client.upsert(store.collection, [qm.PointStruct(id=p.id, vector=p.vector, payload=p.payload) for p in prepared])
        client.close()


def test_an_old_collection_says_so_until_upgraded_then_searches_hybrid(backend, embedder, tmp_path):
    points = points_of(embedder, corpus())
    write_old_collection(backend, tmp_path / "q", points, embedder.dim)
    store = build_store(backend, tmp_path / "q", dim=embedder.dim)
    sentence = TARGETS[1]
    vector = embedder.embed_one(sentence)
    old = store.search(vector, limit=3, text=sentence)
    assert old.mode == "dense" and old.notice == OLD_SHAPE_NOTICE.format(collection=store.collection)
    assert "docqueue reindex --phase vector" in old.notice and len(old) == 3
    assert not store.has_sparse()
    store.upsert(points[:2])  # writes keep working on the old shape, dense only
    assert store.upgrade_shape() == len(points)
    assert store.has_sparse() and store.upgrade_shape() == 0  # idempotent
    store.close()
    reopened = build_store(backend, tmp_path / "q", dim=embedder.dim)
    assert reopened.count() == len(points) and reopened.chunk_ids() == {p.chunk_id for p in points}
    upgraded = reopened.search(vector, limit=3, text=sentence)
    assert upgraded.notice is None and upgraded.mode == "hybrid" and upgraded[0].chunk_id == "target-1"
    assert reopened.search(vector, limit=3, text=sentence, mode="sparse")[0].chunk_id == "target-1"
    reopened.close()


def test_search_command_is_hybrid_by_default_with_dense_and_sparse_for_comparison(monkeypatch):
    from orchestration import cli
    from orchestration.cli import search
    from resources.search_session import SearchResult

    calls = []

    class Session:
        def __init__(self, settings, *, engine):
            pass

        def search(self, query, limit, *, tenant, mode, graph=False, all_copies=False):
            calls.append(mode)
            return SearchResult(query=query, mode=mode, notice=None, hits=[])

        def close(self):
            pass

    monkeypatch.setattr(search, "open_queue", lambda settings, **options: type("Queue", (), {"engine": None})())
    monkeypatch.setattr(search, "SearchSession", Session)
    runner = CliRunner()
    for flags, mode in (([], "hybrid"), (["--dense"], "dense"), (["--sparse"], "sparse")):
        result = runner.invoke(cli.main, ["search", "ferry", "--json", *flags])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["mode"] == mode and calls[-1] == mode
    both = runner.invoke(cli.main, ["search", "ferry", "--dense", "--sparse"])
    assert both.exit_code == 2 and "--dense and --sparse exclude each other" in both.output
    assert "Traceback" not in both.output
