"""The embedded vector store: Qdrant Edge, Qdrant's own engine running in this process.

One shard per collection in `<DOCQUEUE_QDRANT_PATH>/edge/<collection>/` (WAL, segments, HNSW and a
keyword indexes on document_id and tenant_id). Opening a shard maps its segments instead of reading every point
into Python, and indexed segments are searched through HNSW; only one process may hold a shard
(a second one fails with `Can't init WAL: WouldBlock`), so an operation takes the shard's lock
file and opens it, and the shard stays open for DOCQUEUE_QDRANT_LINGER seconds (2) of idleness
after it: a run's embedding batches share one opening, and a process that waits for the lock
asks the holder to let go, which it does within 50 ms or after its current operation.

Writes land in an appendable segment that is searched by brute force until `optimize()` builds its
HNSW index; no write triggers indexing by itself, so the nightly job builds the indexes (see
orchestration/maintenance.py) and no embedding batch ever pays for it.

A folder still holding qdrant-client's local-mode files (`meta.json`) is refused with one sentence
until `docqueue db upgrade` has migrated it (resources/qdrant_migrate.py).
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import qdrant_edge as qe

from queue_db.tenants import BASE_TENANT
from resources.qdrant import (
    INDEXED_PAYLOAD,
    PreparedPoint,
    QdrantStorageBusy,
    SearchHit,
    StoredVector,
    VectorStore,
    VectorStoreError,
    default_local_path,
    hits_from,
    linger_from_env,
    local_folder,
    open_waiting_for_outsiders,
    point_id,
    stored_vectors,
)

EDGE_FOLDER = "edge"
LOCAL_MODE_MARKER = "meta.json"
_WAL_BUSY = "WouldBlock"


def local_mode_files(path: Path) -> bool:
    """True when `path` still holds a qdrant-client local-mode storage that needs migrating."""
    return (path / LOCAL_MODE_MARKER).is_file()


def shard_exists(folder: Path) -> bool:
    return (folder / "edge_config.json").is_file()


def _open_shard(config: qe.EdgeConfig):
    def opener(folder: Path, deadline: float, timeout_s: float):
        def open_once():
            shard = (qe.EdgeShard.load(str(folder)) if shard_exists(folder)
                     else qe.EdgeShard.create(str(folder), config))
            # a shard created before tenants lacks the tenant_id index: it is built once, on the first opening
            indexed = shard.info().payload_schema
            for field_name in INDEXED_PAYLOAD:
                if field_name not in indexed:
                    shard.update(qe.UpdateOperation.create_field_index(field_name, qe.PayloadSchemaType.Keyword))
            return shard

        try:
            return open_waiting_for_outsiders(open_once, lambda exc: _WAL_BUSY in str(exc), folder, deadline,
                                              timeout_s)
        except QdrantStorageBusy:
            raise
        except Exception as exc:  # the bindings raise plain Exception with the engine's message
            raise VectorStoreError(f"cannot open the Qdrant Edge shard {folder}: "
                                   f"{(str(exc).strip().splitlines() or [type(exc).__name__])[0]}") from None
    return opener


def _document_filter(document_id: str) -> qe.Filter:
    return qe.Filter(must=[qe.FieldCondition(key="document_id", match=qe.MatchValue(document_id))])


def _search_filter(document_id: str | None, exclude_document_ids: list[str], tenant: str | None) -> qe.Filter | None:
    """What a search keeps: one document's points, never the excluded documents', only one tenant's."""
    must: list = [qe.FieldCondition(key="document_id", match=qe.MatchValue(document_id))] if document_id else []
    if tenant is not None:
        same_tenant = qe.FieldCondition(key="tenant_id", match=qe.MatchValue(tenant))
        # points written before tenants carry no tenant_id: they are the base tenant's
        must.append(qe.Filter(should=[same_tenant, qe.IsEmptyCondition("tenant_id")])
                    if tenant == BASE_TENANT else same_tenant)
    # versions being replaced (or not yet complete) stay out of the results
    must_not = ([qe.FieldCondition(key="document_id", match=qe.MatchAny(exclude_document_ids))]
                if exclude_document_ids else None)
    return qe.Filter(must=must or None, must_not=must_not) if (must or must_not) else None


class EdgeVectorStore(VectorStore):
    is_embedded = True

    def __init__(self, *, path: str | None, model_id: str, dim: int, lock_timeout_s: float | None = None,
                 upsert_batch: int | None = None, allow_local_mode_files: bool = False,
                 linger_s: float | None = None):
        super().__init__(model_id=model_id, dim=dim, lock_timeout_s=lock_timeout_s, upsert_batch=upsert_batch)
        self._refuse_local_mode = not allow_local_mode_files  # only the migration writes beside them
        self.root = (Path(path).expanduser() if path else default_local_path()).resolve()
        self.location = str(self.root)
        self.folder = self.root / EDGE_FOLDER / self.collection
        self._shape_checked = False
        config = qe.EdgeConfig(vectors=qe.EdgeVectorParams(size=dim, distance=qe.Distance.Cosine))
        self._gate = local_folder(self.folder, _open_shard(config),
                                  lock_path=self.folder.parent / f"{self.collection}.lock",
                                  linger_s=linger_from_env() if linger_s is None else linger_s)

    # ----------------------------------------------------------------- connections

    @contextmanager
    def session(self) -> Iterator["EdgeVectorStore"]:
        with self._shard():
            yield self

    @contextmanager
    def _shard(self):
        if self._refuse_local_mode and local_mode_files(self.root):
            raise VectorStoreError(f"the embedded Qdrant folder {self.root} still holds the old local-mode "
                                   f"storage; run `docqueue db upgrade` to migrate it")
        with self._gate.open(self.lock_timeout_s) as shard:
            if not self._shape_checked:
                self._check_shape()
            yield shard

    def _check_shape(self) -> None:
        vectors = json.loads((self.folder / "edge_config.json").read_text()).get("vectors", {})
        if set(vectors) != {""}:
            raise VectorStoreError(f"collection {self.collection} uses named vectors; docqueue expects one vector")
        size, distance = vectors[""].get("size"), vectors[""].get("distance")
        if size != self.dim or distance != "Cosine":
            raise VectorStoreError(f"collection {self.collection} holds {size}-d {distance} vectors; "
                                   f"{self.model_id} needs {self.dim}-d Cosine")
        self._shape_checked = True

    def _existing(self):
        """The open shard, or None when the collection was never written (reads stay empty, create nothing)."""
        if not shard_exists(self.folder) and not (self._refuse_local_mode and local_mode_files(self.root)):
            return _Nothing()
        return self._shard()

    def ensure_collection(self) -> None:
        with self._shard():
            pass

    def close(self) -> None:
        """Let go of a shard kept open between operations (a run's end, a CLI command's end)."""
        self._gate.release()

    # ----------------------------------------------------------------- writes

    def write_prepared(self, points: list[PreparedPoint]) -> None:
        if not points:
            return
        with self._shard() as shard:
            for start in range(0, len(points), self.upsert_batch):
                shard.update(qe.UpdateOperation.upsert_points(
                    [qe.Point(p.id, p.vector, p.payload) for p in points[start:start + self.upsert_batch]]))

    def delete_chunks(self, chunk_ids: Iterable[str]) -> None:
        ids = [point_id(chunk_id) for chunk_id in dict.fromkeys(chunk_ids)]
        if not ids:
            return
        with self._existing() as shard:
            if shard is None:
                return
            for start in range(0, len(ids), self.upsert_batch):
                shard.update(qe.UpdateOperation.delete_points(ids[start:start + self.upsert_batch]))

    def delete_document(self, document_id: str) -> None:
        with self._existing() as shard:
            if shard is not None:
                shard.update(qe.UpdateOperation.delete_points_by_filter(_document_filter(str(document_id))))

    # ----------------------------------------------------------------- reads

    def count(self, document_id: str | None = None) -> int:
        with self._existing() as shard:
            if shard is None:
                return 0
            condition = _document_filter(str(document_id)) if document_id is not None else None
            return shard.count(qe.CountRequest(exact=True, filter=condition))

    def chunk_ids(self, document_id: str | None = None) -> set[str]:
        found: set[str] = set()
        with self._existing() as shard:
            if shard is None:
                return found
            condition = _document_filter(str(document_id)) if document_id is not None else None
            offset = None
            while True:
                records, offset = shard.scroll(qe.ScrollRequest(offset=offset, limit=self.scroll_page,
                                                                filter=condition, with_payload=["chunk_id"],
                                                                with_vector=False))
                found.update(record.payload["chunk_id"] for record in records if record.payload)
                if offset is None:
                    return found

    def chunk_id_pages(self, page_size: int) -> Iterator[list[str]]:
        offset = None
        while True:
            # the shard is taken per page, so runs waiting to write get their turn during a long verification
            with self._existing() as shard:
                if shard is None:
                    return
                records, offset = shard.scroll(qe.ScrollRequest(offset=offset, limit=page_size,
                                                                with_payload=["chunk_id"], with_vector=False))
            page = [record.payload["chunk_id"] for record in records if record.payload]
            if page:
                yield page
            if offset is None:
                return

    def present_chunk_ids(self, chunk_ids: Sequence[str]) -> set[str]:
        if not chunk_ids:
            return set()
        with self._existing() as shard:
            if shard is None:
                return set()
            records = shard.retrieve([point_id(c) for c in chunk_ids], ["chunk_id"], False)
        return {record.payload["chunk_id"] for record in records if record.payload}

    def vectors(self, chunk_ids: Sequence[str]) -> dict[str, StoredVector]:
        ids = [point_id(chunk_id) for chunk_id in dict.fromkeys(chunk_ids)]
        if not ids:
            return {}
        with self._existing() as shard:
            if shard is None:
                return {}
            return stored_vectors(shard.retrieve(ids, True, True))

    def _search(self, query, limit, document_id, exclude_document_ids, tenant=None) -> list[SearchHit]:
        condition = _search_filter(document_id, exclude_document_ids, tenant)
        with self._existing() as shard:
            if shard is None:
                return []
            points = shard.query(qe.QueryRequest(limit=limit, query=qe.Query.Nearest(query), filter=condition,
                                                 with_payload=True, with_vector=False))
        return hits_from(points)

    def optimize(self) -> bool:
        """Merge segments and build their HNSW indexes, holding the shard until done (the nightly job)."""
        with self._existing() as shard:
            return bool(shard is not None and shard.optimize())

    def info(self) -> dict:
        with self._existing() as shard:
            if shard is None:
                return {"points": 0, "segments": 0, "indexed_vectors": 0}
            info = shard.info()
            return {"points": info.points_count, "segments": info.segments_count,
                    "indexed_vectors": info.indexed_vectors_count}


class _Nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc_info):
        return False
