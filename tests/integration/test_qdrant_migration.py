"""A folder written by qdrant-client's local mode moves into Qdrant Edge shards, on real storage both sides."""

from __future__ import annotations

import numpy as np
import pytest

from resources.ports import VectorStoreError
from resources.qdrant_edge import EdgeVectorStore
from resources.qdrant_migrate import MIGRATED_FOLDER, migrate_local_mode
from resources.qdrant_server import ClientVectorStore
from tests.integration.test_qdrant import DIM, MODEL, random_points


def test_local_mode_folder_is_refused_then_migrated_with_ids_vectors_and_payloads(tmp_path):
    folder = tmp_path / "q"
    old = ClientVectorStore(url=None, path=str(folder), model_id=MODEL, dim=DIM)
    points = random_points("doc-a", 23) + random_points("doc-b", 9, seed=1)
    old.upsert(points)
    other = ClientVectorStore(url=None, path=str(folder), model_id="other-model", dim=4)
    other.upsert([type(p)(p.chunk_id, np.arange(1, 5, dtype=np.float32), p.payload) for p in points[:5]])
    expected_hits = {p.chunk_id: old.search(p.vector, limit=3) for p in points[:4]}

    store = EdgeVectorStore(path=str(folder), model_id=MODEL, dim=DIM)
    with pytest.raises(VectorStoreError, match=r"run `docqueue db upgrade` to migrate it"):
        store.count()

    report = migrate_local_mode(folder, batch=7)  # 32 points in batches of 7: five scroll pages
    assert report == {
        "points": 37,
        "collections": {"docqueue_chunks__all_minilm_l6_v2_int8": 32, "docqueue_chunks__other_model": 5},
    }
    assert not (folder / "meta.json").exists() and (folder / MIGRATED_FOLDER / "meta.json").is_file()
    assert (store.count(), store.count("doc-a"), store.count("doc-b")) == (32, 23, 9)
    assert store.chunk_ids() == {p.chunk_id for p in points}
    for chunk_id, hits in expected_hits.items():
        moved = store.search(next(p.vector for p in points if p.chunk_id == chunk_id), limit=3)
        assert [h.chunk_id for h in moved] == [h.chunk_id for h in hits]
        assert [h.payload for h in moved] == [h.payload for h in hits]
        assert [h.score for h in moved] == pytest.approx([h.score for h in hits], abs=1e-5)
    assert EdgeVectorStore(path=str(folder), model_id="other-model", dim=4).count() == 5

    assert migrate_local_mode(folder) == {}  # nothing left to migrate: a second upgrade is a no-op
    assert store.count() == 32


def test_an_interrupted_migration_runs_again_without_duplicating(tmp_path, monkeypatch):
    folder = tmp_path / "q"
    ClientVectorStore(url=None, path=str(folder), model_id=MODEL, dim=DIM).upsert(random_points("doc-a", 12))
    import resources.qdrant_migrate as migrate

    def crash(root):
        raise OSError("disk full")

    monkeypatch.setattr(migrate, "_move_aside", crash)
    with pytest.raises(OSError):
        migrate_local_mode(folder, batch=5)
    monkeypatch.undo()
    assert migrate_local_mode(folder, batch=5)["points"] == 12
    assert EdgeVectorStore(path=str(folder), model_id=MODEL, dim=DIM).count() == 12


def test_a_folder_without_local_mode_files_needs_no_migration(tmp_path):
    assert migrate_local_mode(tmp_path / "empty") == {}
    store = EdgeVectorStore(path=str(tmp_path / "edge-only"), model_id=MODEL, dim=DIM)
    store.upsert(random_points("doc-a", 3))
    assert migrate_local_mode(tmp_path / "edge-only") == {}
    assert store.count() == 3
