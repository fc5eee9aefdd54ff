"""Chunk vectors in Qdrant: one collection per embedding model, one point per chunk.

Point ids are uuid5(docqueue namespace, chunk_id), so re-running a chunk overwrites its point
instead of adding a second one. The payload carries the chunk_id too, because Qdrant only
accepts unsigned integers and UUIDs as ids.

Every point carries two vectors: the embedding model's dense vector (the collection's unnamed
default vector) and a sparse BM25-style vector named `text`, computed from the payload's text by
processing/sparse.py, whose IDF Qdrant applies (`Modifier.IDF`). `search()` is hybrid by default:
both rankings, DOCQUEUE_QDRANT_HYBRID_CANDIDATES deep each, fused by reciprocal rank (Qdrant's RRF
fusion, done by processing/fusion.py because neither backend weighs or orders ties the
same way). A collection made before sparse vectors existed is still read
(dense only, with a notice) until `docqueue reindex --phase vector` upgrades it.

`VectorStore` is the contract every backend keeps (writes, deletes, counts, search, verification
reads, index building). Two backends implement it:
- `ClientVectorStore` (`url` set): qdrant-client against a Qdrant server, one HTTP client per
  store, safe to share between threads and processes. Given a `path` instead it drives
  qdrant-client's local mode, which docqueue keeps only to migrate folders written by earlier
  versions and to run the contract tests on the client API used with servers.
- `EdgeVectorStore` (resources/qdrant_edge.py, the embedded default): Qdrant Edge in-process
  shards with a WAL, segments and HNSW indexes.

Embedded storage is single-process, so every embedded store opens its folder only for the
length of one operation (or of a ``with store.session():`` block) under a docqueue lock file.
A waiter retries until DOCQUEUE_QDRANT_LOCK_TIMEOUT and then raises QdrantStorageBusy.
"""
from __future__ import annotations

import abc
import atexit
import math
import os
import random
import re
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence
from urllib.parse import urlsplit

import dagster as dg
import numpy as np
from qdrant_client import QdrantClient
from qdrant_client.http import models as qm
from qdrant_client.http.exceptions import UnexpectedResponse

from processing.fusion import fuse_hybrid
from processing.sparse import document_vector, query_vector
from queue_db.config import VectorStoreConfig, docqueue_home, secret_value, settings
from queue_db.tenants import BASE_TENANT

# fixed forever: changing it would orphan every stored point
DOCQUEUE_POINT_NAMESPACE = uuid.UUID("6f1d5c0e-3b7a-5a49-9c1e-0d0c0e0a7e21")
COLLECTION_PREFIX = "docqueue_chunks__"
LOCK_FILE_NAME = ".docqueue.lock"
LINGER_TICK_S = 0.05
SCROLL_PAGE = 1000
MAX_SEARCH_LIMIT = 1000
REQUIRED_PAYLOAD = ("document_id",)
SPARSE_VECTOR = "text"  # the sparse vector's name; the dense one stays the unnamed default
SEARCH_MODES = ("hybrid", "dense", "sparse")
OLD_SHAPE_NOTICE = ("collection {collection} predates hybrid search, so this search used dense vectors only; run "
                    "`docqueue reindex --phase vector` to upgrade it")
# keyword payload indexes: deleting a document filters on document_id, a tenant's search on tenant_id
INDEXED_PAYLOAD = ("document_id", "tenant_id")


class VectorStoreError(RuntimeError):
    """The vector store is unusable as configured (wrong collection shape, bad input)."""


class QdrantStorageBusy(TimeoutError):
    """Another process kept the embedded Qdrant folder longer than the lock timeout."""


def point_id(chunk_id: str) -> str:
    if not chunk_id:
        raise ValueError("chunk_id must be a non-empty string")
    return str(uuid.uuid5(DOCQUEUE_POINT_NAMESPACE, chunk_id))


def collection_name(model_id: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "_", model_id.lower()).strip("_")
    if not slug:
        raise ValueError(f"model id {model_id!r} has no letters or digits to name a collection after")
    return COLLECTION_PREFIX + slug


@dataclass
class ChunkPoint:
    chunk_id: str
    vector: list[float] | np.ndarray
    payload: dict = field(default_factory=dict)  # document_id, filename, page_number, chunk_index, text, content_hash


@dataclass
class SearchHit:
    score: float
    chunk_id: str
    payload: dict


class SearchHits(list):
    """Hits, best first, with the mode that produced them and a one-sentence `notice` when it is not the one asked."""

    def __init__(self, hits=(), *, mode: str = "dense", notice: str | None = None):
        super().__init__(hits)
        self.mode = mode
        self.notice = notice


@dataclass
class SearchQuery:
    """What a backend runs: the dense query and/or the sparse one, the mode, and the candidates per side."""
    mode: str
    dense: list[float] | None
    sparse: tuple[list[int], list[float]] | None
    limit: int
    candidates: int


def sparse_of(point: "PreparedPoint") -> tuple[list[int], list[float]]:
    """The sparse vector of a point, from its payload's text (empty when it has none)."""
    return document_vector(str(point.payload.get("text") or ""))


# --------------------------------------------------------------------------- settings


def lock_timeout_from_env() -> float:
    return settings(VectorStoreConfig).lock_timeout_s


def linger_from_env() -> float:
    return settings(VectorStoreConfig).linger_s


def default_local_path() -> Path:
    configured = settings(VectorStoreConfig).path
    return Path(configured).expanduser() if configured else docqueue_home() / "qdrant"


def _safe_location(url: str) -> str:
    """The URL without credentials or query, fit for messages and logs."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}" if parts.scheme else "<qdrant url>"


# --------------------------------------------------------------------------- embedded folder access


def _acquire_lock_file(lock_path: Path, deadline: float, timeout_s: float):
    import portalocker  # imported late: it probes for writable folders on import

    handle = open(lock_path, "a+")
    delay = 0.01
    while True:
        try:
            portalocker.lock(handle, portalocker.LockFlags.EXCLUSIVE | portalocker.LockFlags.NON_BLOCKING)
            return handle
        except portalocker.exceptions.LockException:
            _ask_for_turn(lock_path)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                handle.close()
                raise QdrantStorageBusy(
                    f"embedded Qdrant storage {lock_path.parent} stayed locked by another process for "
                    f"{timeout_s:g}s (DOCQUEUE_QDRANT_LOCK_TIMEOUT); set DOCQUEUE_QDRANT_URL to a Qdrant "
                    f"server for concurrent access") from None
            # jitter keeps two waiters from polling in lockstep
            time.sleep(min(remaining, delay * random.uniform(0.5, 1.5)))
            delay = min(delay * 2, 0.2)


def _release_lock_file(handle) -> None:
    import portalocker

    try:
        portalocker.unlock(handle)
    finally:
        handle.close()


def _wait_file(lock_path: Path) -> Path:
    return lock_path.with_name(lock_path.name + ".wait")


def _ask_for_turn(lock_path: Path) -> None:
    """Tell a holder that keeps the folder open between operations that another process is waiting."""
    try:
        _wait_file(lock_path).touch()
    except OSError:
        pass  # the holder then lets go when its linger ends instead


def _asked_since(lock_path: Path, since_ns: int) -> bool:
    try:
        return _wait_file(lock_path).stat().st_mtime_ns >= since_ns
    except OSError:
        return False


class _LocalFolder:
    """Per-process gate to one embedded storage folder, shared by every store that uses it.

    The RLock serialises threads (and lets a session nest operations); the lock file
    serialises processes. The handle (a local-mode client or an Edge shard, anything with
    close()) is opened by the first operation and, with `linger_s` > 0, kept after the last
    one for up to `linger_s` seconds of idleness, so a run's consecutive writes share one
    opening; a process waiting for the lock touches `<lock>.wait`, and a lingering holder
    lets go within LINGER_TICK_S of that (or right after its current operation).
    """

    def __init__(self, folder: Path, lock_path: Path, opener, linger_s: float = 0.0):
        self.folder = folder
        self.lock_path = lock_path
        self.linger_s = linger_s
        self._opener = opener  # (folder, deadline, timeout_s) -> handle
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._gate = threading.RLock()
        self._depth = 0
        self._handle = None
        self._lock_handle = None
        self._opened_ns = 0
        self._idle_since = 0.0
        self._ticking = False

    @contextmanager
    def open(self, timeout_s: float):
        if self._pid != os.getpid():
            # a forked child shares the parent's open handle and lock: it must not use or close them
            self._reset()
        deadline = time.monotonic() + timeout_s
        if not self._gate.acquire(timeout=max(timeout_s, 0)):
            raise QdrantStorageBusy(
                f"embedded Qdrant storage {self.folder} stayed busy in this process for {timeout_s:g}s "
                f"(DOCQUEUE_QDRANT_LOCK_TIMEOUT)")
        try:
            if self._handle is None:
                if self._lock_handle is None:
                    self._connect(deadline, timeout_s)
                else:  # closed under the lock (close_handle: its folder swapped or dropped) and wanted again
                    self._handle = self._opener(self.folder, deadline, timeout_s)
            self._depth += 1
            try:
                yield self._handle
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self._idle()
        finally:
            self._gate.release()

    def _connect(self, deadline: float, timeout_s: float) -> None:
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_handle = _acquire_lock_file(self.lock_path, deadline, timeout_s)
        self._opened_ns = time.time_ns()
        try:
            self._handle = self._opener(self.folder, deadline, timeout_s)
        except BaseException:
            _release_lock_file(self._lock_handle)
            self._lock_handle = None
            raise

    def _idle(self) -> None:
        if self.linger_s <= 0 or self._handle is None or _asked_since(self.lock_path, self._opened_ns):
            self._disconnect()
            return
        self._idle_since = time.monotonic()
        if not self._ticking:
            self._ticking = True
            self._schedule()

    def _schedule(self) -> None:
        timer = threading.Timer(min(LINGER_TICK_S, self.linger_s), self._tick)
        timer.daemon = True
        timer.start()

    def _tick(self) -> None:
        with self._gate:
            if self._handle is None or self._pid != os.getpid():
                self._ticking = False
                return
            if self._depth == 0 and (time.monotonic() - self._idle_since >= self.linger_s
                                     or _asked_since(self.lock_path, self._opened_ns)):
                self._disconnect()
                self._ticking = False
                return
            self._schedule()

    def close_handle(self) -> None:
        """Close the open handle while keeping the lock file (to swap the folder under it); the next operation
        opens the folder again."""
        with self._gate:
            if self._handle is not None:
                try:
                    self._handle.close()
                finally:
                    self._handle = None

    def release(self) -> None:
        """Close a lingering handle now (at exit, or before handing the folder to another process)."""
        if self._pid != os.getpid():
            return
        with self._gate:
            if self._depth == 0 and self._handle is not None:
                self._disconnect()

    def _disconnect(self) -> None:
        try:
            if self._handle is not None:
                self._handle.close()
        finally:
            self._handle = None
            if self._lock_handle is not None:
                _release_lock_file(self._lock_handle)
                self._lock_handle = None


_FOLDERS: dict[str, _LocalFolder] = {}
_FOLDERS_LOCK = threading.Lock()


def local_folder(folder: Path, opener, lock_path: Path | None = None, linger_s: float = 0.0) -> _LocalFolder:
    """The process-wide gate of one embedded folder; the lock file sits in it unless `lock_path` says otherwise."""
    folder = Path(folder).expanduser().resolve()
    lock = Path(lock_path).expanduser().resolve() if lock_path else folder / LOCK_FILE_NAME
    with _FOLDERS_LOCK:
        if str(lock) not in _FOLDERS:
            _FOLDERS[str(lock)] = _LocalFolder(folder, lock, opener, linger_s)
        return _FOLDERS[str(lock)]


def release_lingering() -> None:
    """Close every folder this process keeps open between operations."""
    with _FOLDERS_LOCK:
        folders = list(_FOLDERS.values())
    for gate in folders:
        gate.release()


atexit.register(release_lingering)


def _forget_folders_after_fork() -> None:
    # a forked child must not inherit a parent's half-held gate or open handle
    global _FOLDERS_LOCK
    _FOLDERS.clear()
    _FOLDERS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_folders_after_fork)


# --------------------------------------------------------------------------- the contract


@dataclass(frozen=True)
class StoredVector:
    """A point as read back: its vector and payload (what the vector phase copies for an identical chunk)."""
    vector: list[float]
    payload: dict


def stored_vectors(records) -> dict[str, StoredVector]:
    return {r.payload["chunk_id"]: StoredVector(dense_of(r.vector), dict(r.payload))
            for r in records if r.payload and r.payload.get("chunk_id") and r.vector is not None}


@dataclass
class PreparedPoint:
    """A validated point: uuid5 id, float vector and the payload with chunk_id and a string document_id."""
    id: str
    vector: list[float]
    payload: dict


class VectorStore(abc.ABC):
    """What docqueue needs from a vector store; every backend passes tests/integration/test_qdrant.py."""

    location: str = ""

    def __init__(self, *, model_id: str, dim: int, lock_timeout_s: float | None = None,
                 upsert_batch: int | None = None):
        if dim < 1:
            raise ValueError(f"dim must be positive, got {dim}")
        self.model_id = model_id
        self.dim = dim
        self.collection = collection_name(model_id)
        env = settings(VectorStoreConfig)
        self.lock_timeout_s = env.lock_timeout_s if lock_timeout_s is None else float(lock_timeout_s)
        self.upsert_batch = upsert_batch or env.upsert_batch
        if self.upsert_batch < 1:
            raise ValueError(f"upsert batch must be at least 1, got {self.upsert_batch}")
        self.scroll_page = SCROLL_PAGE

    def __repr__(self) -> str:
        return f"{type(self).__name__}(collection={self.collection!r}, location={self.location!r})"

    def __enter__(self) -> "VectorStore":
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

    def vectors(self, chunk_ids: Sequence[str]) -> dict[str, "StoredVector"]:
        """The stored vectors and payloads of these chunks, in one call; a chunk without a point is absent."""
        ids = [point_id(chunk_id) for chunk_id in dict.fromkeys(chunk_ids)]
        if not ids:
            return {}
        return stored_vectors(self._retrieve(ids, True, True))

    @abc.abstractmethod
    def _scroll_chunk_ids(self, offset, limit: int) -> tuple[list, object]:
        """One page of points with their chunk_id payload, and the offset of the next (None after the last, or
        when the collection does not exist)."""

    @abc.abstractmethod
    def _retrieve(self, ids: list[str], with_payload, with_vectors: bool) -> list:
        """The points of these ids that exist (none when the collection does not)."""

    def search(self, vector=None, limit: int = 5, *, text: str | None = None, mode: str | None = None,
               document_id: str | None = None, exclude_document_ids: Sequence[str] = (),
               tenant: str | None = None) -> SearchHits:
        """Hits for the dense `vector` and/or the `text`: mode hybrid (default; dense alone when no text is given),
        dense or sparse; `tenant` keeps only that tenant's (points written before tenants count as `default`'s)."""
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
        request = SearchQuery(mode, dense, sparse, limit,
                              max(limit, settings(VectorStoreConfig).hybrid_candidates))
        return self._search(request, None if document_id is None else str(document_id),
                            [str(d) for d in exclude_document_ids], tenant)

    @abc.abstractmethod
    def _search(self, request: SearchQuery, document_id: str | None,
                exclude_document_ids: list[str], tenant: str | None = None) -> SearchHits:
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
        return [SearchHit(score=score, chunk_id=chunk_id, payload=by_id[chunk_id].payload)
                for chunk_id, score in fused]

    def _dense_only(self, request: SearchQuery) -> tuple[SearchQuery, str | None]:
        """The request a collection without the sparse vector can run, and the notice saying so."""
        if request.mode == "dense":
            return request, None
        if request.dense is None:
            raise VectorStoreError(OLD_SHAPE_NOTICE.format(collection=self.collection)
                                   .replace("so this search used dense vectors only", "so it has no sparse vectors"))
        notice = OLD_SHAPE_NOTICE.format(collection=self.collection)
        return SearchQuery("dense", request.dense, None, request.limit, request.candidates), notice

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
        missing = [key for key in REQUIRED_PAYLOAD if not point.payload.get(key)]
        if missing:
            raise VectorStoreError(f"chunk {point.chunk_id}: payload lacks {missing}")
        payload = {**point.payload, "chunk_id": point.chunk_id}
        payload["document_id"] = str(payload["document_id"])
        return PreparedPoint(point_id(point.chunk_id), vector.tolist(), payload)


def hits_from(points) -> list[SearchHit]:
    return [SearchHit(score=float(point.score), chunk_id=str((point.payload or {}).get("chunk_id", "")),
                      payload=dict(point.payload or {})) for point in points]


# --------------------------------------------------------------------------- qdrant-client backend


def open_waiting_for_outsiders(open_once, busy, folder: Path, deadline: float, timeout_s: float):
    """Call `open_once` until it stops failing with an error `busy` recognises: a holder of the folder that does
    not take docqueue's lock file."""
    delay = 0.05
    while True:
        try:
            return open_once()
        except Exception as exc:
            if not busy(exc):
                raise
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise QdrantStorageBusy(
                    f"embedded Qdrant storage {folder} is held by a client outside docqueue for more than "
                    f"{timeout_s:g}s (DOCQUEUE_QDRANT_LOCK_TIMEOUT)") from None
            time.sleep(min(remaining, delay))
            delay = min(delay * 2, 0.5)


def _open_local_client(folder: Path, deadline: float, timeout_s: float) -> QdrantClient:
    folder.mkdir(parents=True, exist_ok=True)
    return open_waiting_for_outsiders(
        lambda: QdrantClient(path=str(folder)),
        lambda exc: isinstance(exc, RuntimeError) and "already accessed" in str(exc), folder, deadline, timeout_s)


class ClientVectorStore(VectorStore):
    """qdrant-client: a server at `url`, or local mode in the folder `path` (migration and tests only)."""

    def __init__(self, *, url: str | None, path: str | None = None, api_key: str | None = None, model_id: str,
                 dim: int, lock_timeout_s: float | None = None, request_timeout_s: float | None = None,
                 upsert_batch: int | None = None):
        super().__init__(model_id=model_id, dim=dim, lock_timeout_s=lock_timeout_s, upsert_batch=upsert_batch)
        self._remote: QdrantClient | None = None
        self._local: _LocalFolder | None = None
        self._ensured = False
        self._sparse: bool | None = None  # whether the collection has the sparse vector, once looked at
        if url:
            timeout = request_timeout_s or settings(VectorStoreConfig).request_timeout_s
            self.location = _safe_location(url)
            # no version probe here: building a store must not do network I/O
            self._remote = QdrantClient(url=url, api_key=api_key or None, timeout=max(1, math.ceil(timeout)),
                                        check_compatibility=False)
        else:
            folder = Path(path).expanduser() if path else default_local_path()
            self.location = str(folder)
            self._local = local_folder(folder, _open_local_client)

    @property
    def is_embedded(self) -> bool:
        return self._local is not None

    @contextmanager
    def session(self) -> Iterator["ClientVectorStore"]:
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
        client.create_collection(name, vectors_config=qm.VectorParams(size=self.dim, distance=qm.Distance.COSINE),
                                 sparse_vectors_config={SPARSE_VECTOR: qm.SparseVectorParams(modifier=qm.Modifier.IDF)})

    def _check_shape(self, client: QdrantClient) -> None:
        params = client.get_collection(self.collection).config.params
        vectors = params.vectors
        self._sparse = SPARSE_VECTOR in (params.sparse_vectors or {})
        if not isinstance(vectors, qm.VectorParams):
            raise VectorStoreError(f"collection {self.collection} uses named vectors; docqueue expects one vector")
        if vectors.size != self.dim or vectors.distance != qm.Distance.COSINE:
            raise VectorStoreError(
                f"collection {self.collection} holds {vectors.size}-d {vectors.distance.value} vectors; "
                f"{self.model_id} needs {self.dim}-d Cosine")

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
            client.upsert(name, points=[qm.PointStruct(id=p.id, vector=_vectors(p) if sparse else p.vector,
                                                       payload=p.payload)
                                        for p in points[start:start + self.upsert_batch]], wait=True)

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
            records, offset = client.scroll(source, limit=self.scroll_page, offset=offset, with_payload=True,
                                            with_vectors=True)
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
                selector = qm.PointIdsList(points=ids[start:start + self.upsert_batch])
                client.delete(self.collection, points_selector=selector, wait=True)

    def delete_document(self, document_id: str) -> None:
        with self._client() as client:
            if not self._exists(client):
                return
            selector = qm.FilterSelector(filter=_document_filter(document_id))
            client.delete(self.collection, points_selector=selector, wait=True)

    def count(self, document_id: str | None = None) -> int:
        with self._client() as client:
            if not self._exists(client):
                return 0
            condition = _document_filter(document_id) if document_id is not None else None
            return client.count(self.collection, count_filter=condition, exact=True).count

    def chunk_ids(self, document_id: str | None = None) -> set[str]:
        found: set[str] = set()
        with self._client() as client:
            if not self._exists(client):
                return found
            condition = _document_filter(document_id) if document_id is not None else None
            offset = None
            while True:
                records, offset = client.scroll(self.collection, scroll_filter=condition, limit=self.scroll_page,
                                                offset=offset, with_payload=["chunk_id"], with_vectors=False)
                found.update(record.payload["chunk_id"] for record in records if record.payload)
                if offset is None:
                    return found

    def _scroll_chunk_ids(self, offset, limit: int) -> tuple[list, object]:
        with self._client() as client:
            if not self._exists(client):
                return [], None
            return client.scroll(self.collection, limit=limit, offset=offset, with_payload=["chunk_id"],
                                 with_vectors=False)

    def _retrieve(self, ids: list[str], with_payload, with_vectors: bool) -> list:
        with self._client() as client:
            if not self._exists(client):
                return []
            return client.retrieve(self.collection, ids=ids, with_payload=with_payload, with_vectors=with_vectors)

    def _search(self, request, document_id, exclude_document_ids, tenant=None) -> SearchHits:
        notice = None
        with self._client() as client:
            if not self._exists(client):
                return SearchHits(mode=request.mode)
            if self._sparse is None:
                self._check_shape(client)
            if not self._sparse:
                request, notice = self._dense_only(request)
            condition = _search_filter(document_id, exclude_document_ids, tenant)
            sparse = (qm.SparseVector(indices=request.sparse[0], values=request.sparse[1])
                      if request.sparse is not None else None)

            def nearest(query, using, limit):
                return hits_from(client.query_points(self.collection, query=query, using=using, limit=limit,
                                                     query_filter=condition, with_payload=True,
                                                     with_vectors=False).points)

            if request.mode == "hybrid":
                hits = self._fuse(nearest(sparse, SPARSE_VECTOR, request.candidates),
                                  nearest(request.dense, None, request.candidates), request.limit)
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


def dense_of(vector) -> list[float]:
    """The dense vector of a stored record, whether it was read as the only vector or among named ones."""
    return list(vector.get("", []) if isinstance(vector, dict) else vector)


def _document_filter(document_id: str) -> qm.Filter:
    return qm.Filter(must=[qm.FieldCondition(key="document_id", match=qm.MatchValue(value=str(document_id)))])


def _search_filter(document_id: str | None, exclude_document_ids: list[str], tenant: str | None) -> qm.Filter | None:
    """What a search keeps: one document's points, never the excluded documents', only one tenant's."""
    must: list = [qm.FieldCondition(key="document_id", match=qm.MatchValue(value=document_id))] if document_id else []
    if tenant is not None:
        same_tenant = qm.FieldCondition(key="tenant_id", match=qm.MatchValue(value=tenant))
        # points written before tenants carry no tenant_id: they are the base tenant's
        must.append(qm.Filter(should=[same_tenant, qm.IsEmptyCondition(is_empty=qm.PayloadField(key="tenant_id"))])
                    if tenant == BASE_TENANT else same_tenant)
    # versions being replaced (or not yet complete) stay out of the results
    must_not = ([qm.FieldCondition(key="document_id", match=qm.MatchAny(any=exclude_document_ids))]
                if exclude_document_ids else None)
    return qm.Filter(must=must or None, must_not=must_not) if (must or must_not) else None


# --------------------------------------------------------------------------- Dagster


class QdrantResource(dg.ConfigurableResource):
    """Dagster handle on Qdrant; unset fields fall back to the DOCQUEUE_* environment.

    Pass the API key as `dg.EnvVar("DOCQUEUE_QDRANT_API_KEY")` or leave it unset: a literal
    key would be shown in Dagster's run config.
    """

    url: str | None = None  # DOCQUEUE_QDRANT_URL; empty -> embedded Qdrant Edge storage
    api_key: str | None = None  # DOCQUEUE_QDRANT_API_KEY
    path: str | None = None  # DOCQUEUE_QDRANT_PATH, default docqueue_home()/qdrant
    lock_timeout_s: float | None = None  # DOCQUEUE_QDRANT_LOCK_TIMEOUT, default 120
    request_timeout_s: float | None = None  # DOCQUEUE_QDRANT_TIMEOUT, default 30 (server mode)

    def get_store(self, model_id: str, dim: int) -> VectorStore:
        env = settings(VectorStoreConfig)
        url = self.url if self.url is not None else secret_value(env.url)
        api_key = self.api_key if self.api_key is not None else secret_value(env.api_key)
        return open_vector_store(url=url or None, path=self.path, api_key=api_key or None, model_id=model_id,
                                 dim=dim, lock_timeout_s=self.lock_timeout_s,
                                 request_timeout_s=self.request_timeout_s)


def open_vector_store(*, url: str | None, path: str | None, api_key: str | None, model_id: str, dim: int,
                      lock_timeout_s: float | None = None, request_timeout_s: float | None = None) -> VectorStore:
    """A server's store when `url` is set, else the embedded Qdrant Edge store in `path`."""
    if url:
        return ClientVectorStore(url=url, api_key=api_key, model_id=model_id, dim=dim,
                                 lock_timeout_s=lock_timeout_s, request_timeout_s=request_timeout_s)
    from resources.qdrant_edge import EdgeVectorStore

    return EdgeVectorStore(path=path, model_id=model_id, dim=dim, lock_timeout_s=lock_timeout_s)
