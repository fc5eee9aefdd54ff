"""What the pipeline and the CLI need from each outside system, as Protocols; one adapter module implements each.

- VectorStore: resources/qdrant_edge.py (embedded) and resources/qdrant_server.py (a Qdrant server), chosen by
  resources/vector_stores.py. The point payload and its filters are resources/vector_payload.py.
- GraphStore: resources/bolt_graph.py (Neo4j 5 or any Bolt server).
- Embedder: resources/embeddings.py. Extractor: resources/extraction.py. FileStore: resources/storage.py.
- ObjectSource (where intake reads objects from): resources/s3_bucket.py (S3 and S3-compatible stores).

Operations one backend alone has (moving an older folder, upgrading a collection's shape, merging the embedded
tail) stay on that adapter; callers that need them hold the adapter, not the port.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from processing.entities import ChunkGraph, Extraction
from queue_db.config import default
from queue_db.service_config import VectorStoreConfig

SEARCH_MODES = ("hybrid", "dense", "sparse")
MAX_SEARCH_LIMIT = 1000


class VectorStoreError(RuntimeError):
    """The vector store is unusable as configured (wrong collection shape, bad input)."""


REPAIR_VECTORS = "docqueue repair --vectors"


class VectorStoreDamaged(VectorStoreError):
    """A shard of the embedded store whose files the engine cannot read back (a segment file truncated or deleted
    while nothing ran). The engine says so as an error, never by crashing the process: what it cannot load it
    refuses at opening, what it cannot read it refuses at the read. `folder` is the shard's folder."""

    def __init__(self, folder: Path | str, detail: str = ""):
        self.folder = str(folder)
        super().__init__(
            f"the vector store's shard {self.folder} is damaged{f' ({detail})' if detail else ''}; "
            f"`{REPAIR_VECTORS}` sets it aside and re-queues the chunks it held"
        )


REPAIR_GRAPH = "docqueue repair --graph"


class GraphStoreDamaged(RuntimeError):
    """The embedded Bolt server's database folder lost or cut a file while nothing ran. ArcadeDB does not refuse
    such a folder: it drops a type whose bucket file is gone, falls back to the previous schema when schema.json is
    cut, and reads a cut bucket as empty, so the loss is found from the folder's own files (resources/bolt_files.py)
    and from the queue's completed chunks the graph no longer holds. `folder` is the database folder."""

    def __init__(self, folder: Path | str, detail: str = ""):
        self.folder = str(folder)
        super().__init__(
            f"the graph database folder {self.folder} is damaged{f' ({detail})' if detail else ''}; "
            f"`{REPAIR_GRAPH}` sets it aside and re-queues the chunks it held"
        )


class CredentialsRefused(RuntimeError):
    """A service refused docqueue's user, password or key. Asking again cannot help, and each attempt is one more
    failed login toward the service locking the account."""


@dataclass
class ChunkPoint:
    """A chunk as written: its id, dense vector and payload (resources/vector_payload.chunk_payload)."""

    chunk_id: str
    vector: Any  # a sequence of floats or a 1-d numpy array
    payload: dict = field(default_factory=dict)


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


@dataclass(frozen=True)
class StoredVector:
    """A point as read back: its vector and payload (what the vector phase copies for an identical chunk)."""

    vector: list[float]
    payload: dict


@dataclass(frozen=True)
class VectorStoreSettings:
    """Everything a vector store adapter may be configured with, built once by resources/vector_stores.py from the
    entry point's settings; each adapter's `from_settings(settings, model_id, dim)` takes what it uses."""

    url: str = field(default="", repr=False)  # may carry credentials
    api_key: str = field(default="", repr=False)
    path: str = ""  # the embedded store's folder
    lock_timeout_s: float = default(VectorStoreConfig, "lock_timeout_s")
    request_timeout_s: float = default(VectorStoreConfig, "request_timeout_s")
    upsert_batch: int = default(VectorStoreConfig, "upsert_batch")
    hybrid_candidates: int = default(VectorStoreConfig, "hybrid_candidates")
    linger_s: float = default(VectorStoreConfig, "linger_s")
    segment_points: int = default(VectorStoreConfig, "segment_points")
    hnsw_ef: int = default(VectorStoreConfig, "hnsw_ef")


@runtime_checkable
class VectorStore(Protocol):
    """Chunk vectors of one embedding model; every adapter passes tests/integration/test_qdrant.py."""

    model_id: str
    dim: int
    location: str  # where the store is, fit for messages (no credentials)

    @property
    def is_embedded(self) -> bool:
        """True when the store lives in a folder that one process at a time may open."""

    def session(self) -> AbstractContextManager[Any]:
        """Keep embedded storage open across several operations (no-op for a server)."""

    def ensure_collection(self) -> None:
        """Make the model's storage if missing; refuse one of another shape."""

    def upsert(self, points: Sequence[ChunkPoint]) -> int:
        """Write points (retries overwrite, never duplicate); returns how many distinct chunks were written."""

    def delete_chunks(self, chunk_ids: Iterable[str]) -> None: ...

    def delete_document(self, document_id: str) -> None: ...

    def count(self, document_id: str | None = None) -> int: ...

    def chunk_ids(self, document_id: str | None = None) -> set[str]:
        """Every stored chunk_id (of one document); for verification."""

    def chunk_id_pages(self, page_size: int) -> Iterator[list[str]]:
        """Every stored chunk_id, `page_size` at a time, without holding the store in memory."""

    def present_chunk_ids(self, chunk_ids: Sequence[str]) -> set[str]:
        """Those of `chunk_ids` that have a point."""

    def vectors(self, chunk_ids: Sequence[str]) -> dict[str, StoredVector]:
        """The stored vectors and payloads of these chunks; a chunk without a point is absent."""

    def payloads(self, chunk_ids: Sequence[str]) -> dict[str, dict]:
        """The payloads of these chunks, by chunk id; a chunk without a point is absent."""

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
        """Hits for the dense `vector` and/or the `text`, mode one of SEARCH_MODES (hybrid when not given), within
        resources/vector_payload.search_filter(document_id, exclude_document_ids, tenant); each hit's payload
        holds only `payload_keys` (and `chunk_id`) when they are given."""

    def prepare_reads(self) -> None:
        """Open now what searches read, so that the first search does not pay for it (a search session does this
        while its model loads)."""

    def optimize(self) -> bool:
        """Build pending indexes now; True when something was built."""

    def unindexed(self) -> int:
        """Points written since the last index build (0 for a store that indexes by itself)."""

    def index_tail(self, threshold: int) -> bool:
        """Build the index of recent writes once `threshold` of them wait (0: never); True when something was built."""

    def close(self) -> None:
        """Release clients and folders kept open between operations."""

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc_info: object) -> None: ...


class GraphStoreUnavailable(RuntimeError):
    """The graph server did not answer a read (down, unreachable, refused our credentials); one sentence."""


@dataclass(frozen=True)
class MentionedEntity:
    """An entity a chunk mentions, as a search hit shows it."""

    name: str
    type: str


@dataclass(frozen=True)
class RelatedEntity:
    """An entity related to one a chunk mentions: `entity` (the mentioned one's name) -[relation, weight]- `name`;
    `direction` "out" when the relation points from `entity` to `name`."""

    entity: str
    name: str
    type: str
    relation: str
    weight: int
    direction: str


@dataclass(frozen=True)
class ChunkEntities:
    """What the graph knows of one chunk: at most the bound asked of its entities (by name), how many it mentions in
    all, and, when asked, the strongest relations of those entities to others."""

    entities: list[MentionedEntity]
    total: int
    related: list[RelatedEntity] = field(default_factory=list)


@runtime_checkable
class GraphStore(Protocol):
    """The knowledge graph: documents, pages, chunks, their entities and relations."""

    def ensure_schema(self) -> None: ...

    def write_chunks(self, chunks: list[ChunkGraph]) -> tuple[int, int]:
        """Write (or replace) the chunks' contributions; returns (entities, relations) written."""

    def delete_chunks(self, chunk_ids: Iterable[str]) -> None: ...

    def delete_document(self, document_id: str) -> None: ...

    def chunk_ids_with_writes(self, document_id: str | None = None) -> set[str]: ...

    def chunk_id_pages(self, page_size: int) -> Iterator[list[str]]: ...

    def chunk_mention_pages(self, page_size: int) -> Iterator[list[tuple[str, int]]]:
        """(chunk id, the entity keys its MENTIONS edges stand for), in chunk_id_pages' pages."""
        ...

    def duplicate_entities(self) -> list[str]: ...

    def entity(self, name: str, limit: int = 100, tenant: str = ...) -> dict | None: ...

    def chunk_entities(
        self, chunk_ids: Sequence[str], per_chunk: int, related_per_chunk: int = 0, tenant: str = ...
    ) -> dict[str, ChunkEntities]:
        """The entities of these chunks of `tenant`, `per_chunk` at most each, in one read; with `related_per_chunk`
        also their strongest relations to entities the chunk does not show, in one more. A chunk the graph does not
        hold is absent. Raises GraphStoreUnavailable when the server does not answer."""

    def counts(self) -> dict: ...

    def ping(self) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc_info: object) -> None: ...


@runtime_checkable
class Embedder(Protocol):
    """One embedding model: unit-length float32 vectors of `dim` dimensions."""

    model_id: str
    dim: int

    def embed(self, texts: Sequence[str]) -> Any:
        """A (texts, dim) array, one unit row per text."""

    def embed_covered(self, texts: Sequence[str]) -> Any:
        """The vectors with each text's token count and how many of them its vector covers
        (resources/embeddings.Embedded)."""

    def embed_one(self, text: str) -> Any: ...


@runtime_checkable
class Extractor(Protocol):
    name: str

    def extract(self, texts: list[str]) -> list[Extraction]:
        """One Extraction per text, in order."""


@runtime_checkable
class FileStore(Protocol):
    """The storage folder: uploaded files and page markdown under slash-separated keys."""

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def put_text(self, key: str, text: str) -> None: ...

    def put_file(self, key: str, src_path: Path | str) -> None: ...

    def get_bytes(self, key: str) -> bytes: ...

    def get_text(self, key: str) -> str: ...

    def exists(self, key: str) -> bool: ...

    def local_path(self, key: str) -> Path: ...

    def list(self, prefix: str = "") -> list[str]: ...

    def delete_prefix(self, prefix: str) -> int: ...


@runtime_checkable
class ObjectSource(Protocol):
    """Objects intake registers as documents: listed under one place, each downloaded at the version listed."""

    @property
    def url(self) -> str:
        """Where the objects are, fit for messages (no credentials)."""

    def address(self, key: str) -> str:
        """One object's address, its documents' source path (`s3://bucket/key`)."""

    def list_objects(self, max_listed: int) -> list[Any]:
        """Every object (key, etag, size, last_modified); refuses past `max_listed` rather than list a part."""

    def download(self, obj: Any, path: Path, limit: int) -> str:
        """Write the object to `path`: "ok", "gone" (changed or deleted since listed) or "too_large"."""
