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

from queue_db.config import default
from queue_db.service_config import VectorStoreConfig
from resources.folder_lock import local_folder
from resources.ports import VectorStoreError
from resources.qdrant_base import COLLECTION_PREFIX, LOCK_TIMEOUT_S, PreparedPoint, dense_of
from resources.qdrant_edge import EdgeVectorStore
from resources.qdrant_edge_shard import LOCAL_MODE_MARKER, local_mode_files
from resources.qdrant_server import open_local_client

MIGRATE_BATCH = default(VectorStoreConfig, "migrate_batch")
MIGRATED_FOLDER = "local-mode-migrated"


def migrate_local_mode(path: str | Path, batch: int = MIGRATE_BATCH, lock_timeout_s: float = LOCK_TIMEOUT_S) -> dict:
    """Copy the local-mode collections in the folder `path` (DOCQUEUE_QDRANT_PATH) into Edge shards, `batch`
    points at a time (DOCQUEUE_QDRANT_MIGRATE_BATCH); {} when there is nothing to migrate."""
    root = Path(path).expanduser().resolve()
    if not local_mode_files(root):
        return {}
    if batch < 1:
        raise ValueError(f"DOCQUEUE_QDRANT_MIGRATE_BATCH must be at least 1, got {batch}")
    copied: dict[str, int] = {}
    with local_folder(root, open_local_client).open(lock_timeout_s) as client:
        for description in client.get_collections().collections:
            name = description.name
            if not name.startswith(COLLECTION_PREFIX):
                continue  # not docqueue's: left in the moved local-mode files
            vectors = client.get_collection(name).config.params.vectors
            if not isinstance(vectors, qm.VectorParams):
                raise VectorStoreError(f"collection {name} uses named vectors; docqueue expects one vector")
            store = EdgeVectorStore(
                path=str(root),
                model_id=name[len(COLLECTION_PREFIX) :],
                dim=vectors.size,
                lock_timeout_s=lock_timeout_s,
                allow_local_mode_files=True,
            )
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
        raise VectorStoreError(
            f"migration of {name} stored {stored} of {total} points; run `docqueue db upgrade` again"
        )
    return total


def _move_aside(root: Path) -> None:
    target = root / MIGRATED_FOLDER
    target.mkdir(exist_ok=True)
    for entry in ("collection", LOCAL_MODE_MARKER):
        source = root / entry
        if source.exists():
            shutil.move(str(source), str(target / entry))
