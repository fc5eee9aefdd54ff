"""Move a folder written by qdrant-client's local mode into Qdrant Edge shards (`docqueue db upgrade`).

Every docqueue collection is copied with its point ids, vectors and payloads, scrolled in batches of
DOCQUEUE_QDRANT_MIGRATE_BATCH points (default 1000) so the copy holds one batch at a time beside
what local mode itself loads. Only then are the local-mode files (`meta.json`, `collection/`) moved
into `local-mode-migrated/`, so an interrupted migration simply runs again: upserts by id rewrite
the same points.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from qdrant_client.http import models as qm

from resources.qdrant import (
    COLLECTION_PREFIX,
    PreparedPoint,
    dense_of,
    VectorStoreError,
    _open_local_client,
    default_local_path,
    local_folder,
    lock_timeout_from_env,
)
from resources.qdrant_edge import LOCAL_MODE_MARKER, EdgeVectorStore, local_mode_files
from queue_db.config import VectorStoreConfig, settings

MIGRATED_FOLDER = "local-mode-migrated"


def migrate_local_mode(path: str | Path | None = None, batch: int | None = None) -> dict:
    """Copy local-mode collections into Edge shards; {} when there is nothing to migrate."""
    root = (Path(path).expanduser() if path else default_local_path()).resolve()
    if not local_mode_files(root):
        return {}
    batch = batch or settings(VectorStoreConfig).migrate_batch
    if batch < 1:
        raise ValueError(f"DOCQUEUE_QDRANT_MIGRATE_BATCH must be at least 1, got {batch}")
    copied: dict[str, int] = {}
    with local_folder(root, _open_local_client).open(lock_timeout_from_env()) as client:
        for description in client.get_collections().collections:
            name = description.name
            if not name.startswith(COLLECTION_PREFIX):
                continue  # not docqueue's: left in the moved local-mode files
            vectors = client.get_collection(name).config.params.vectors
            if not isinstance(vectors, qm.VectorParams):
                raise VectorStoreError(f"collection {name} uses named vectors; docqueue expects one vector")
            store = EdgeVectorStore(path=str(root), model_id=name[len(COLLECTION_PREFIX):], dim=vectors.size,
                                    allow_local_mode_files=True)
            copied[store.collection] = _copy(client, name, store, batch)
    _move_aside(root)
    return {"collections": copied, "points": sum(copied.values())}


def _copy(client, name: str, store: EdgeVectorStore, batch: int) -> int:
    total, offset = 0, None
    with store.session():
        while True:
            records, offset = client.scroll(name, limit=batch, offset=offset, with_payload=True, with_vectors=True)
            store.write_prepared([PreparedPoint(str(r.id), dense_of(r.vector), dict(r.payload or {})) for r in records])
            total += len(records)
            if offset is None:
                break
        stored = store.count()
    if stored < total:
        raise VectorStoreError(f"migration of {name} stored {stored} of {total} points; run `docqueue db upgrade` "
                               f"again")
    return total


def _move_aside(root: Path) -> None:
    target = root / MIGRATED_FOLDER
    target.mkdir(exist_ok=True)
    for entry in ("collection", LOCAL_MODE_MARKER):
        source = root / entry
        if source.exists():
            shutil.move(str(source), str(target / entry))
