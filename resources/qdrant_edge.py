"""The embedded vector store: Qdrant Edge, Qdrant's own engine running in this process.

One shard per collection in `<DOCQUEUE_QDRANT_PATH>/edge/<collection>/` (WAL, segments, HNSW and a
keyword indexes on document_id and tenant_id). Opening a shard maps its segments instead of reading every point
into Python, and indexed segments are searched through HNSW; only one process may hold a shard
(a second one fails with `Can't init WAL: WouldBlock`), so an operation takes the shard's lock
file and opens it, and the shard stays open for DOCQUEUE_QDRANT_LINGER seconds (2) of idleness
after it: a run's embedding batches share one opening, and a process that waits for the lock
asks the holder to let go, which it does within 50 ms or after its current operation.

Writes land in an appendable segment that is searched by brute force until `optimize()` builds its
HNSW index; no write triggers indexing by itself, so no embedding batch ever pays for it. Writers count the points
they add in `<collection>.unindexed` (no opening needed to read it), and the recovery schedule builds their index once
DOCQUEUE_QDRANT_INDEX_TAIL of them wait (`index_tail`), the nightly job whatever is left (see
orchestration/maintenance.py). Segments stop growing at DOCQUEUE_QDRANT_SEGMENT_POINTS, so one build never takes more
than that many points' time and memory, whatever the corpus holds.

Every shard made now has the sparse vector `text` (with Qdrant's IDF modifier) beside the unnamed
dense one; a shard cannot gain a vector once made, so `upgrade_shape()` copies an older shard's
points into a new one with both vectors, a page at a time, and swaps the folders.

A folder still holding qdrant-client's local-mode files (`meta.json`) is refused with one sentence
until `docqueue db upgrade` has migrated it (resources/qdrant_migrate.py).
"""
from __future__ import annotations

import json
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import qdrant_edge as qe

from queue_db.config import VectorStoreConfig, settings
from queue_db.tenants import BASE_TENANT
from resources.qdrant import (
    INDEXED_PAYLOAD,
    SPARSE_VECTOR,
    PreparedPoint,
    QdrantStorageBusy,
    SearchHits,
    StoredVector,
    VectorStore,
    VectorStoreError,
    default_local_path,
    dense_of,
    hits_from,
    linger_from_env,
    local_folder,
    open_waiting_for_outsiders,
    point_id,
    sparse_of,
)

EDGE_FOLDER = "edge"
LOCAL_MODE_MARKER = "meta.json"
_WAL_BUSY = "WouldBlock"


def local_mode_files(path: Path) -> bool:
    """True when `path` still holds a qdrant-client local-mode storage that needs migrating."""
    return (path / LOCAL_MODE_MARKER).is_file()


def shard_exists(folder: Path) -> bool:
    return (folder / "edge_config.json").is_file()


def persisted_config(folder: Path) -> dict:
    """The shard's edge_config.json, as the engine last wrote it."""
    return json.loads((folder / "edge_config.json").read_text())


def _current_config(folder: Path, config: qe.EdgeConfig, dim: int) -> qe.EdgeConfig | None:
    """`config` for a shard of today's shape whose index settings are older (the next optimize() rebuilds its
    segments with them); None for a shard of another shape, which _check_shape or upgrade_shape deal with."""
    persisted = persisted_config(folder)
    dense = (persisted.get("vectors") or {}).get("") or {}
    if (dense.get("size") != dim or dense.get("distance") != "Cosine"
            or SPARSE_VECTOR not in (persisted.get("sparse_vectors") or {})):
        return None
    current = {"hnsw_config": HNSW_CONFIG, "quantization_config": QUANTIZATION_CONFIG}
    if (all(persisted.get(key) == value for key, value in current.items())
            and (persisted.get("optimizers") or {}).get("max_segment_size") == max_segment_kb(dim)):
        return None  # nothing to change: the config on disk is left as it is
    return config


def _open_shard(config: qe.EdgeConfig, dim: int):
    def opener(folder: Path, deadline: float, timeout_s: float):
        def open_once():
            shard = (qe.EdgeShard.load(str(folder), _current_config(folder, config, dim)) if shard_exists(folder)
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


# How optimize() indexes a segment. Int8 scalar quantization (mapped and cached) with a graph of m=16 built
# with ef_construct=64 builds about 5x faster than Qdrant's float default (m=16, ef_construct=100) and searches about
# 4x faster at the same recall once a search visits DOCQUEUE_QDRANT_HNSW_EF candidates and rescores them on the
# original vectors. The original vectors stay on disk (mapped, read only to rescore a search's few candidates), so a
# million of them need not fit in memory; the quantized copy and the graph are mapped and kept cached.
HNSW = {"m": 16, "ef_construct": 64, "full_scan_threshold": 10_000}
QUANTILE = 0.99
OVERSAMPLING = 2.0
# the same settings as edge_config.json records them
HNSW_CONFIG = {**HNSW, "max_indexing_threads": 0}
QUANTIZATION_CONFIG = {"scalar": {"type": "int8", "quantile": QUANTILE, "memory": "cached"}}


def max_segment_kb(dim: int) -> int:
    """DOCQUEUE_QDRANT_SEGMENT_POINTS as Qdrant measures a segment: kilobytes of float32 vectors."""
    return settings(VectorStoreConfig).segment_points * dim * 4 // 1024


def edge_config(dim: int) -> qe.EdgeConfig:
    return qe.EdgeConfig(
        vectors=qe.EdgeVectorParams(size=dim, distance=qe.Distance.Cosine, memory=qe.Memory.Cold),
        sparse_vectors={SPARSE_VECTOR: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
        hnsw_config=qe.HnswIndexConfig(**HNSW),
        quantization_config=qe.ScalarQuantizationConfig(qe.ScalarType.Int8, quantile=QUANTILE,
                                                        memory=qe.Memory.Cached),
        optimizers=qe.EdgeOptimizersConfig(max_segment_size=max_segment_kb(dim)))


def dense_search_params() -> qe.SearchParams:
    return qe.SearchParams(hnsw_ef=settings(VectorStoreConfig).hnsw_ef,
                           quantization=qe.QuantizationSearchParams(rescore=True, oversampling=OVERSAMPLING))


def _point(point: PreparedPoint, sparse: bool) -> qe.Point:
    if not sparse:
        return qe.Point(point.id, point.vector, point.payload)
    indices, values = sparse_of(point)
    vectors: dict = {"": point.vector}
    if indices:  # a text without words gets no sparse vector
        vectors[SPARSE_VECTOR] = qe.SparseVector(indices, values)
    return qe.Point(point.id, vectors, point.payload)


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
        self._sparse = True
        self._gate = local_folder(self.folder, _open_shard(edge_config(dim), dim),
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
            # every time (one small file): another process may have upgraded the shard since this store last looked
            self._check_shape()
            yield shard

    def _check_shape(self) -> None:
        config = persisted_config(self.folder)
        vectors = config.get("vectors", {})
        self._sparse = SPARSE_VECTOR in (config.get("sparse_vectors") or {})
        if set(vectors) != {""}:
            raise VectorStoreError(f"collection {self.collection} uses named vectors; docqueue expects one vector")
        size, distance = vectors[""].get("size"), vectors[""].get("distance")
        if size != self.dim or distance != "Cosine":
            raise VectorStoreError(f"collection {self.collection} holds {size}-d {distance} vectors; "
                                   f"{self.model_id} needs {self.dim}-d Cosine")

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
            _write(shard, points, self._sparse, self.upsert_batch)
            # under the shard's lock, so writers never lose each other's counts
            self._set_unindexed(self.unindexed() + len(points))

    @property
    def _unindexed_file(self) -> Path:
        return self.folder.parent / f"{self.collection}.unindexed"

    def unindexed(self) -> int:
        """Points written since the last index build (retries count twice: an early build is harmless), read
        without opening the shard."""
        try:
            return int(self._unindexed_file.read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def _set_unindexed(self, n: int) -> None:
        spare = self._unindexed_file.with_suffix(".tmp")
        spare.write_text(str(n))
        spare.replace(self._unindexed_file)

    def index_tail(self, threshold: int) -> bool:
        if threshold <= 0 or self.unindexed() < threshold:
            return False
        return self.optimize()

    def has_sparse(self) -> bool:
        with self._existing() as shard:
            return shard is None or self._sparse

    def upgrade_shape(self) -> int:
        """Copy the points of a shard without the sparse vector into `<collection>.upgrade` with both vectors, then
        swap the folders, all under the shard's lock; a copy broken off half-way is begun again."""
        spare = self.folder.with_name(self.folder.name + ".upgrade")
        with self._existing() as shard:
            if shard is None or self._sparse:
                return 0
            shutil.rmtree(spare, ignore_errors=True)
            target = qe.EdgeShard.create(str(spare), edge_config(self.dim))
            try:
                for field_name in INDEXED_PAYLOAD:
                    target.update(qe.UpdateOperation.create_field_index(field_name, qe.PayloadSchemaType.Keyword))
                copied, offset = 0, None
                while True:
                    records, offset = shard.scroll(qe.ScrollRequest(offset=offset, limit=self.scroll_page,
                                                                    with_payload=True, with_vector=True))
                    points = [PreparedPoint(str(r.id), dense_of(r.vector), dict(r.payload or {}))
                              for r in records]
                    _write(target, points, True, self.upsert_batch)
                    copied += len(points)
                    if offset is None:
                        break
            finally:
                target.close()
            # the open shard goes first, so the folder can be swapped while the lock is still held
            self._gate.close_handle()
            retired = self.folder.with_name(self.folder.name + ".retired")
            shutil.rmtree(retired, ignore_errors=True)
            self.folder.rename(retired)
            spare.rename(self.folder)
            shutil.rmtree(retired, ignore_errors=True)
            return copied

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

    def _scroll_chunk_ids(self, offset, limit: int) -> tuple[list, object]:
        # the shard is taken per page, so runs waiting to write get their turn during a long verification
        with self._existing() as shard:
            if shard is None:
                return [], None
            return shard.scroll(qe.ScrollRequest(offset=offset, limit=limit, with_payload=["chunk_id"],
                                                 with_vector=False))

    def _retrieve(self, ids: list[str], with_payload, with_vectors: bool) -> list:
        with self._existing() as shard:
            if shard is None:
                return []
            return shard.retrieve(ids, with_payload, with_vectors)

    def _search(self, request, document_id, exclude_document_ids, tenant=None) -> SearchHits:
        condition = _search_filter(document_id, exclude_document_ids, tenant)
        notice = None
        with self._existing() as shard:
            if shard is None:
                return SearchHits(mode=request.mode)
            if not self._sparse:
                request, notice = self._dense_only(request)
            sparse = (qe.Query.Nearest(qe.SparseVector(*request.sparse), using=SPARSE_VECTOR)
                      if request.sparse is not None else None)

            dense_params = dense_search_params()

            def nearest(query, limit):
                params = None if query is sparse else dense_params
                return hits_from(shard.query(qe.QueryRequest(limit=limit, query=query, filter=condition,
                                                             with_payload=True, with_vector=False, params=params)))

            if request.mode == "hybrid":
                hits = self._fuse(nearest(sparse, request.candidates),
                                  nearest(qe.Query.Nearest(request.dense), request.candidates), request.limit)
            else:
                hits = nearest(sparse if request.mode == "sparse" else qe.Query.Nearest(request.dense), request.limit)
        return SearchHits(hits, mode=request.mode, notice=notice)

    def optimize(self) -> bool:
        """Merge segments and build their HNSW indexes, holding the shard until done (the nightly job, and the
        recovery schedule once DOCQUEUE_QDRANT_INDEX_TAIL points wait)."""
        with self._existing() as shard:
            if shard is None:
                return False
            built = bool(shard.optimize())
            self._set_unindexed(0)
            return built

    def info(self) -> dict:
        with self._existing() as shard:
            if shard is None:
                return {"points": 0, "segments": 0, "indexed_vectors": 0}
            info = shard.info()
            return {"points": info.points_count, "segments": info.segments_count,
                    "indexed_vectors": info.indexed_vectors_count}


def _write(shard, points: list[PreparedPoint], sparse: bool, batch: int) -> None:
    for start in range(0, len(points), batch):
        shard.update(qe.UpdateOperation.upsert_points([_point(p, sparse) for p in points[start:start + batch]]))


class _Nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc_info):
        return False
