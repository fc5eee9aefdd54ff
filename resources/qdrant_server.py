"""The vector store on a Qdrant server, through qdrant-client: one HTTP client per store, safe to share between
threads and processes.

Given a `path` instead of a `url` it drives qdrant-client's local mode, which docqueue keeps only to migrate folders
written by earlier versions (resources/qdrant_migrate.py) and to run the contract tests on the client API used with
servers; that folder is opened under resources/folder_lock.py like the embedded store's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from qdrant_client import QdrantClient
from qdrant_client.http import models as qm
from qdrant_client.http.exceptions import UnexpectedResponse

from queue_db.config import default
from queue_db.service_config import VectorStoreConfig
from resources.folder_lock import LocalFolder, local_folder, open_waiting_for_outsiders
from resources.ports import SearchHits, VectorStoreError, VectorStoreSettings
from resources.qdrant_base import (
    HYBRID_CANDIDATES,
    LOCK_TIMEOUT_S,
    SPARSE_VECTOR,
    UPSERT_BATCH,
    PreparedPoint,
    QdrantStore,
    dense_of,
    hits_from,
    sparse_of,
)
from resources.vector_payload import INDEXED_PAYLOAD, PointFilter, document_filter, point_id

REQUEST_TIMEOUT_S = default(VectorStoreConfig, "request_timeout_s")


def _safe_location(url: str) -> str:
    """The URL without credentials or query, fit for messages and logs."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}" if parts.scheme else "<qdrant url>"


def open_local_client(folder: Path, deadline: float, timeout_s: float) -> QdrantClient:
    folder.mkdir(parents=True, exist_ok=True)
    return open_waiting_for_outsiders(
        lambda: QdrantClient(path=str(folder)),
        lambda exc: isinstance(exc, RuntimeError) and "already accessed" in str(exc),
        folder,
        deadline,
        timeout_s,
    )


class ClientVectorStore(QdrantStore):
    """qdrant-client: a server at `url`, or local mode in the folder `path` (migration and tests only)."""

    def __init__(
        self,
        *,
        url: str | None,
        path: str | None = None,
        api_key: str | None = None,
        model_id: str,
        dim: int,
        lock_timeout_s: float = LOCK_TIMEOUT_S,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        upsert_batch: int = UPSERT_BATCH,
        hybrid_candidates: int = HYBRID_CANDIDATES,
    ):
        super().__init__(
            model_id=model_id,
            dim=dim,
            lock_timeout_s=lock_timeout_s,
            upsert_batch=upsert_batch,
            hybrid_candidates=hybrid_candidates,
        )
        self._remote: QdrantClient | None = None
        self._local: LocalFolder | None = None
        self._ensured = False
        self._sparse: bool | None = None  # whether the collection has the sparse vector, once looked at
        if url:
            self.location = _safe_location(url)
            # no version probe here: building a store must not do network I/O
            self._remote = QdrantClient(
                url=url,
                api_key=api_key or None,
                timeout=max(1, math.ceil(request_timeout_s or REQUEST_TIMEOUT_S)),
                check_compatibility=False,
            )
        elif path:
            folder = Path(path).expanduser()
            self.location = str(folder)
            self._local = local_folder(folder, open_local_client)
        else:
            raise ValueError("a Qdrant client store needs a server url or a local-mode folder path")

    @classmethod
    def from_settings(cls, settings: VectorStoreSettings, model_id: str, dim: int) -> ClientVectorStore:
        """The store on the server at `settings.url`."""
        return cls(
            url=settings.url,
            api_key=settings.api_key or None,
            model_id=model_id,
            dim=dim,
            lock_timeout_s=settings.lock_timeout_s,
            request_timeout_s=settings.request_timeout_s,
            upsert_batch=settings.upsert_batch,
            hybrid_candidates=settings.hybrid_candidates,
        )

    @property
    def is_embedded(self) -> bool:
        return self._local is not None

    @contextmanager
    def session(self) -> Iterator[ClientVectorStore]:
        if self._local is None:
            yield self
            return
        with self._local.open(self.lock_timeout_s):
            yield self

    @contextmanager
    def _client(self) -> Iterator[QdrantClient]:
        if self._remote is not None:
            yield self._remote
            return
        with self._local.open(self.lock_timeout_s) as client:
            yield client

    def close(self) -> None:
        if self._remote is not None:
            self._remote.close()
            self._remote = None
            self._ensured = False
            self._sparse = None

    def ensure_collection(self) -> None:
        with self._client() as client:
            self._ensure(client)

    def _ensure(self, client: QdrantClient) -> None:
        if self._ensured and self._remote is not None:
            return
        if not client.collection_exists(self.collection):
            try:
                self._create(client, self.collection)
            except UnexpectedResponse as exc:
                if exc.status_code != 409:  # another worker created it first
                    raise
        self._check_shape(client)
        if self._remote is not None:
            # local mode ignores payload indexes (and warns), so only a server gets one
            for field_name in INDEXED_PAYLOAD:
                client.create_payload_index(self.collection, field_name, qm.PayloadSchemaType.KEYWORD, wait=True)
        self._ensured = True

    def _create(self, client: QdrantClient, name: str) -> None:
        client.create_collection(
            name,
            vectors_config=qm.VectorParams(size=self.dim, distance=qm.Distance.COSINE),
            sparse_vectors_config={SPARSE_VECTOR: qm.SparseVectorParams(modifier=qm.Modifier.IDF)},
        )

    def _check_shape(self, client: QdrantClient) -> None:
        params = client.get_collection(self.collection).config.params
        vectors = params.vectors
        self._sparse = SPARSE_VECTOR in (params.sparse_vectors or {})
        if not isinstance(vectors, qm.VectorParams):
            raise VectorStoreError(f"collection {self.collection} uses named vectors; docqueue expects one vector")
        if vectors.size != self.dim or vectors.distance != qm.Distance.COSINE:
            raise VectorStoreError(
                f"collection {self.collection} holds {vectors.size}-d {vectors.distance.value} vectors; "
                f"{self.model_id} needs {self.dim}-d Cosine"
            )

    def _exists(self, client: QdrantClient) -> bool:
        return (self._ensured and self._remote is not None) or client.collection_exists(self.collection)

    def write_prepared(self, points: list[PreparedPoint]) -> None:
        if not points:
            return
        with self._client() as client:
            self._ensure(client)
            self._write(client, self.collection, points, self._sparse)

    def _write(self, client: QdrantClient, name: str, points: list[PreparedPoint], sparse: bool) -> None:
        for start in range(0, len(points), self.upsert_batch):
            client.upsert(
                name,
                points=[
                    qm.PointStruct(id=p.id, vector=_vectors(p) if sparse else p.vector, payload=p.payload)
                    for p in points[start : start + self.upsert_batch]
                ],
                wait=True,
            )

    def has_sparse(self) -> bool:
        with self._client() as client:
            if not client.collection_exists(self.collection):
                return True
            self._check_shape(client)
            return bool(self._sparse)

    def upgrade_shape(self) -> int:
        """Qdrant cannot add a vector to an existing collection: the points move to `<collection>__upgrade`, the
        collection is made again with both vectors, and they move back. A run broken off half-way resumes."""
        spare = self.collection + "__upgrade"
        with self._client() as client:
            if client.collection_exists(self.collection):
                self._check_shape(client)
                if self._sparse:
                    return 0
                if client.collection_exists(spare):
                    client.delete_collection(spare)  # an earlier attempt broke off before the collection went
                self._create(client, spare)
                self._copy(client, self.collection, spare)
                client.delete_collection(self.collection)
            elif not client.collection_exists(spare):
                return 0
            self._ensured = False
            self._ensure(client)
            moved = self._copy(client, spare, self.collection)
            client.delete_collection(spare)
            return moved

    def _copy(self, client: QdrantClient, source: str, target: str) -> int:
        copied, offset = 0, None
        while True:
            records, offset = client.scroll(
                source, limit=self.scroll_page, offset=offset, with_payload=True, with_vectors=True
            )
            points = [PreparedPoint(str(r.id), dense_of(r.vector), dict(r.payload or {})) for r in records]
            self._write(client, target, points, True)
            copied += len(points)
            if offset is None:
                return copied

    def delete_chunks(self, chunk_ids: Iterable[str]) -> None:
        ids = [point_id(chunk_id) for chunk_id in dict.fromkeys(chunk_ids)]
        if not ids:
            return
        with self._client() as client:
            if not self._exists(client):
                return
            for start in range(0, len(ids), self.upsert_batch):
                selector = qm.PointIdsList(points=ids[start : start + self.upsert_batch])
                client.delete(self.collection, points_selector=selector, wait=True)

    def delete_document(self, document_id: str) -> None:
        with self._client() as client:
            if not self._exists(client):
                return
            selector = qm.FilterSelector(filter=_condition(document_filter(document_id)))
            client.delete(self.collection, points_selector=selector, wait=True)

    def count(self, document_id: str | None = None) -> int:
        with self._client() as client:
            if not self._exists(client):
                return 0
            condition = _condition(document_filter(document_id)) if document_id is not None else None
            return client.count(self.collection, count_filter=condition, exact=True).count

    def chunk_ids(self, document_id: str | None = None) -> set[str]:
        found: set[str] = set()
        with self._client() as client:
            if not self._exists(client):
                return found
            condition = _condition(document_filter(document_id)) if document_id is not None else None
            offset = None
            while True:
                records, offset = client.scroll(
                    self.collection,
                    scroll_filter=condition,
                    limit=self.scroll_page,
                    offset=offset,
                    with_payload=["chunk_id"],
                    with_vectors=False,
                )
                found.update(record.payload["chunk_id"] for record in records if record.payload)
                if offset is None:
                    return found

    def _scroll_chunk_ids(self, offset, limit: int) -> tuple[list, object]:
        with self._client() as client:
            if not self._exists(client):
                return [], None
            return client.scroll(
                self.collection, limit=limit, offset=offset, with_payload=["chunk_id"], with_vectors=False
            )

    def _retrieve(self, ids: list[str], with_payload, with_vectors: bool) -> list:
        with self._client() as client:
            if not self._exists(client):
                return []
            return client.retrieve(self.collection, ids=ids, with_payload=with_payload, with_vectors=with_vectors)

    def _search(self, request, keep) -> SearchHits:
        notice = None
        with self._client() as client:
            if not self._exists(client):
                return SearchHits(mode=request.mode)
            if self._sparse is None:
                self._check_shape(client)
            if not self._sparse:
                request, notice = self._dense_only(request)
            condition = _condition(keep)
            sparse = (
                qm.SparseVector(indices=request.sparse[0], values=request.sparse[1])
                if request.sparse is not None
                else None
            )

            def nearest(query, using, limit):
                return hits_from(
                    client.query_points(
                        self.collection,
                        query=query,
                        using=using,
                        limit=limit,
                        query_filter=condition,
                        with_payload=request.with_payload,
                        with_vectors=False,
                    ).points
                )

            if request.mode == "hybrid":
                hits = self._fuse(
                    nearest(sparse, SPARSE_VECTOR, request.candidates),
                    nearest(request.dense, None, request.candidates),
                    request.limit,
                )
            elif request.mode == "sparse":
                hits = nearest(sparse, SPARSE_VECTOR, request.limit)
            else:
                hits = nearest(request.dense, None, request.limit)
        return SearchHits(hits, mode=request.mode, notice=notice)


def _vectors(point: PreparedPoint) -> dict:
    """Both vectors of a point, the sparse one left out when its text has no words."""
    indices, values = sparse_of(point)
    vectors: dict = {"": point.vector}
    if indices:
        vectors[SPARSE_VECTOR] = qm.SparseVector(indices=indices, values=values)
    return vectors


def _condition(keep: PointFilter | None) -> qm.Filter | None:
    """resources/vector_payload.PointFilter in qdrant-client's terms."""
    if keep is None:
        return None
    must: list = (
        [qm.FieldCondition(key="document_id", match=qm.MatchValue(value=keep.document_id))]
        if keep.document_id is not None
        else []
    )
    if keep.tenant is not None:
        same_tenant = qm.FieldCondition(key="tenant_id", match=qm.MatchValue(value=keep.tenant))
        must.append(
            qm.Filter(should=[same_tenant, qm.IsEmptyCondition(is_empty=qm.PayloadField(key="tenant_id"))])
            if keep.untagged_are_tenants
            else same_tenant
        )
    must_not = (
        [qm.FieldCondition(key="document_id", match=qm.MatchAny(any=list(keep.exclude_document_ids)))]
        if keep.exclude_document_ids
        else None
    )
    return qm.Filter(must=must or None, must_not=must_not) if (must or must_not) else None
