"""What the two Qdrant adapters share: collection naming, point preparation, the search request and its checks.

Every point carries two vectors: the embedding model's dense vector (the collection's unnamed default vector) and a
sparse BM25-style vector named `text`, computed from the payload's text by processing/sparse.py, whose IDF Qdrant
applies (`Modifier.IDF`). `search()` is hybrid by default: both rankings, `hybrid_candidates` deep each
(DOCQUEUE_QDRANT_HYBRID_CANDIDATES), fused by processing/fusion.py. A collection made before sparse vectors existed
is still read (dense only, with a notice) until `docqueue reindex --phase vector` upgrades it (`upgrade_shape`).

`QdrantStore` implements resources/ports.VectorStore over a few primitives each adapter provides (write, scroll,
retrieve, search, shape checks); its values come from its constructor, never from the environment.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Self

import numpy as np

from processing.fusion import fuse_hybrid
from processing.sparse import document_vector, query_vector
from queue_db.config import default
from queue_db.service_config import VectorStoreConfig
from resources.ports import (
    MAX_SEARCH_LIMIT,
    SEARCH_MODES,
    ChunkPoint,
    SearchHit,
    SearchHits,
    StoredVector,
    VectorStoreError,
)
from resources.vector_payload import PointFilter, point_id, search_filter, stored_payload

COLLECTION_PREFIX = "docqueue_chunks__"
SCROLL_PAGE = 1000
SPARSE_VECTOR = "text"  # the sparse vector's name; the dense one stays the unnamed default
OLD_SHAPE_NOTICE = (
    "collection {collection} predates hybrid search, so this search used dense vectors only; run "
    "`docqueue reindex --phase vector` to upgrade it"
)
LOCK_TIMEOUT_S = default(VectorStoreConfig, "lock_timeout_s")
UPSERT_BATCH = default(VectorStoreConfig, "upsert_batch")
HYBRID_CANDIDATES = default(VectorStoreConfig, "hybrid_candidates")


def collection_name(model_id: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "_", model_id.lower()).strip("_")
    if not slug:
        raise ValueError(f"model id {model_id!r} has no letters or digits to name a collection after")
    return COLLECTION_PREFIX + slug


@dataclass
class SearchQuery:
    """What a backend runs: the dense query and/or the sparse one, the mode, and the candidates per side."""

    mode: str
    dense: list[float] | None
    sparse: tuple[list[int], list[float]] | None
    limit: int
    candidates: int
    # the payload keys each hit carries (None: the whole payload); `chunk_id` is always among them
    payload_keys: list[str] | None = None

    @property
    def with_payload(self) -> bool | list[str]:
        return True if self.payload_keys is None else sorted({*self.payload_keys, "chunk_id"})


@dataclass
class PreparedPoint:
    """A validated point: uuid5 id, float vector and the payload with chunk_id and a string document_id."""

    id: str
    vector: list[float]
    payload: dict


def sparse_of(point: PreparedPoint) -> tuple[list[int], list[float]]:
    """The sparse vector of a point, from its payload's text (empty when it has none)."""
    return document_vector(str(point.payload.get("text") or ""))


def dense_of(vector) -> list[float]:
    """The dense vector of a stored record, whether it was read as the only vector or among named ones."""
    return list(vector.get("", []) if isinstance(vector, dict) else vector)


def stored_vectors(records) -> dict[str, StoredVector]:
    return {
        r.payload["chunk_id"]: StoredVector(dense_of(r.vector), dict(r.payload))
        for r in records
        if r.payload and r.payload.get("chunk_id") and r.vector is not None
    }


class QdrantStore(abc.ABC):
    """resources/ports.VectorStore over a Qdrant engine; every adapter passes tests/integration/test_qdrant.py."""

    location: str = ""

    def __init__(
        self,
        *,
        model_id: str,
        dim: int,
        lock_timeout_s: float = LOCK_TIMEOUT_S,
        upsert_batch: int = UPSERT_BATCH,
        hybrid_candidates: int = HYBRID_CANDIDATES,
    ):
        if dim < 1:
            raise ValueError(f"dim must be positive, got {dim}")
        self.model_id = model_id
        self.dim = dim
        self.collection = collection_name(model_id)
        self.lock_timeout_s = float(lock_timeout_s)
        self.upsert_batch = upsert_batch
        if self.upsert_batch < 1:
            raise ValueError(f"upsert batch must be at least 1, got {self.upsert_batch}")
        self.hybrid_candidates = hybrid_candidates
        self.scroll_page = SCROLL_PAGE

    def __repr__(self) -> str:
        return f"{type(self).__name__}(collection={self.collection!r}, location={self.location!r})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    @abc.abstractmethod
    def is_embedded(self) -> bool:
        """True when the store lives in a folder that one process at a time may open."""

    @abc.abstractmethod
    def session(self):
        """Context manager keeping embedded storage open across several operations (no-op for a server)."""

    @abc.abstractmethod
    def ensure_collection(self) -> None:
        """Create the model's collection if missing; refuse one of another shape."""

    def upsert(self, points: Sequence[ChunkPoint]) -> int:
        """Write points (retries overwrite, never duplicate); returns how many distinct chunks were written."""
        prepared = {}
        for point in points:
            item = self._prepare(point)
            prepared[item.id] = item
        if not prepared:
            return 0
        self.write_prepared(list(prepared.values()))
        return len(prepared)

    @abc.abstractmethod
    def write_prepared(self, points: list[PreparedPoint]) -> None:
        """Upsert points already validated (or copied as they were), in batches of at most `upsert_batch`."""

    @abc.abstractmethod
    def delete_chunks(self, chunk_ids: Iterable[str]) -> None: ...

    @abc.abstractmethod
    def delete_document(self, document_id: str) -> None: ...

    @abc.abstractmethod
    def count(self, document_id: str | None = None) -> int: ...

    @abc.abstractmethod
    def chunk_ids(self, document_id: str | None = None) -> set[str]:
        """Every stored chunk_id (of one document), read page by page; for verification."""

    def chunk_id_pages(self, page_size: int) -> Iterator[list[str]]:
        """Every stored chunk_id, `page_size` at a time in point-id order (keyset pagination): verification
        streams the store without holding it in memory, and an embedded shard is taken for one page at a time."""
        offset = None
        while True:
            records, offset = self._scroll_chunk_ids(offset, page_size)
            page = [record.payload["chunk_id"] for record in records if record.payload]
            if page:
                yield page
            if offset is None:
                return

    def present_chunk_ids(self, chunk_ids: Sequence[str]) -> set[str]:
        """Those of `chunk_ids` that have a point (one lookup by point id per call)."""
        if not chunk_ids:
            return set()
        records = self._retrieve([point_id(c) for c in chunk_ids], ["chunk_id"], False)
        return {record.payload["chunk_id"] for record in records if record.payload}

    def vectors(self, chunk_ids: Sequence[str]) -> dict[str, StoredVector]:
        """The stored vectors and payloads of these chunks, in one call; a chunk without a point is absent."""
        ids = [point_id(chunk_id) for chunk_id in dict.fromkeys(chunk_ids)]
        if not ids:
            return {}
        return stored_vectors(self._retrieve(ids, True, True))

    def payloads(self, chunk_ids: Sequence[str]) -> dict[str, dict]:
        """The payloads of these chunks, in one call; a chunk without a point is absent."""
        ids = [point_id(chunk_id) for chunk_id in dict.fromkeys(chunk_ids)]
        if not ids:
            return {}
        return {r.payload["chunk_id"]: dict(r.payload) for r in self._retrieve(ids, True, False) if r.payload}

    @abc.abstractmethod
    def _scroll_chunk_ids(self, offset, limit: int) -> tuple[list, object]:
        """One page of points with their chunk_id payload, and the offset of the next (None after the last, or
        when the collection does not exist)."""

    @abc.abstractmethod
    def _retrieve(self, ids: list[str], with_payload, with_vectors: bool) -> list:
        """The points of these ids that exist (none when the collection does not)."""

    def search(
        self,
        vector=None,
        limit: int = 5,
        *,
        text: str | None = None,
        mode: str | None = None,
        document_id: str | None = None,
        exclude_document_ids: Sequence[str] = (),
        tenant: str | None = None,
        payload_keys: Sequence[str] | None = None,
    ) -> SearchHits:
        """Hits for the dense `vector` and/or the `text`: mode hybrid (default; dense alone when no text is given),
        dense or sparse; `tenant` keeps only that tenant's (points written before tenants count as `default`'s).
        `payload_keys`: the payload keys the hits carry (and `chunk_id`), for a deep look that needs no text."""
        if not 1 <= limit <= MAX_SEARCH_LIMIT:
            raise ValueError(f"limit must be between 1 and {MAX_SEARCH_LIMIT}, got {limit}")
        mode = mode or "hybrid"
        if mode not in SEARCH_MODES:
            raise ValueError(f"search mode must be one of {', '.join(SEARCH_MODES)}, got {mode!r}")
        if mode == "hybrid" and text is None:
            mode = "dense"
        dense = None
        if mode != "sparse":
            if vector is None:
                raise ValueError(f"a {mode} search needs a query vector")
            query = np.asarray(vector, dtype=np.float32).reshape(-1)
            if query.shape[0] != self.dim:
                raise VectorStoreError(f"query vector has {query.shape[0]} dims, expected {self.dim}")
            dense = query.tolist()
        sparse = None
        if mode != "dense":
            if text is None:
                raise ValueError("a sparse search needs the query text")
            sparse = query_vector(text)
            if not sparse[0]:  # nothing but stopwords and punctuation: no term to match
                if mode == "sparse":
                    return SearchHits(mode=mode)
                mode, sparse = "dense", None
        keys = None if payload_keys is None else list(payload_keys)
        request = SearchQuery(mode, dense, sparse, limit, max(limit, self.hybrid_candidates), keys)
        return self._search(request, search_filter(document_id, exclude_document_ids, tenant))

    @abc.abstractmethod
    def _search(self, request: SearchQuery, keep: PointFilter | None) -> SearchHits:
        """Run `request`; on a collection without the sparse vector, dense only, with OLD_SHAPE_NOTICE."""

    @abc.abstractmethod
    def has_sparse(self) -> bool:
        """True when the collection stores the sparse vector (or does not exist yet, and will)."""

    @abc.abstractmethod
    def upgrade_shape(self) -> int:
        """Give a collection made before sparse vectors the sparse vector `text`, rewriting its points with both
        vectors, a page at a time; returns the points rewritten (0 when there was nothing to upgrade)."""

    @staticmethod
    def _fuse(sparse_hits: list[SearchHit], dense_hits: list[SearchHit], limit: int) -> list[SearchHit]:
        """Hybrid hits: processing/fusion.py's rule over both candidate lists."""
        by_id = {hit.chunk_id: hit for hit in dense_hits}
        by_id.update((hit.chunk_id, hit) for hit in sparse_hits)
        fused = fuse_hybrid([h.chunk_id for h in sparse_hits], [h.chunk_id for h in dense_hits], limit)
        return [SearchHit(score=score, chunk_id=chunk_id, payload=by_id[chunk_id].payload) for chunk_id, score in fused]

    def _dense_only(self, request: SearchQuery) -> tuple[SearchQuery, str | None]:
        """The request a collection without the sparse vector can run, and the notice saying so."""
        if request.mode == "dense":
            return request, None
        if request.dense is None:
            raise VectorStoreError(
                OLD_SHAPE_NOTICE.format(collection=self.collection).replace(
                    "so this search used dense vectors only", "so it has no sparse vectors"
                )
            )
        notice = OLD_SHAPE_NOTICE.format(collection=self.collection)
        return replace(request, mode="dense", sparse=None), notice

    def prepare_reads(self) -> None:
        """Nothing to open ahead: a server's client connects on its first request."""

    def optimize(self) -> bool:
        """Build pending indexes now; True when something was built. Servers index in the background."""
        return False

    def unindexed(self) -> int:
        """Points written since the last index build; a server keeps no such count (it indexes by itself)."""
        return 0

    def index_tail(self, threshold: int) -> bool:
        """Build the index of the points written since the last build once there are `threshold` of them (0: never);
        True when something was built. Servers index in the background."""
        return False

    def close(self) -> None:
        """Release network clients; embedded folders are released after every operation anyway."""

    def _prepare(self, point: ChunkPoint) -> PreparedPoint:
        vector = np.asarray(point.vector, dtype=np.float32).reshape(-1)
        if vector.shape[0] != self.dim:
            raise VectorStoreError(f"chunk {point.chunk_id}: vector has {vector.shape[0]} dims, expected {self.dim}")
        if not np.isfinite(vector).all() or not vector.any():
            raise VectorStoreError(f"chunk {point.chunk_id}: vector is zero or not finite")
        payload = stored_payload(point)
        return PreparedPoint(point_id(point.chunk_id), vector.tolist(), payload)


def hits_from(points) -> list[SearchHit]:
    return [
        SearchHit(
            score=float(point.score),
            chunk_id=str((point.payload or {}).get("chunk_id", "")),
            payload=dict(point.payload or {}),
        )
        for point in points
    ]
