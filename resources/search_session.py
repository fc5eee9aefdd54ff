"""A warm hybrid search for applications: the embedding model, the vector store and the queue's database kept open
between searches, so that a search costs the query's embedding, the store's two rankings and their fusion, not a
process start. `docqueue search` is one search through the same class.

What a session holds, and for how long:

- the embedding model (the process-wide one of resources/embeddings.get_embedder: loaded once, kept after
  `close()` for the next session of this process);
- a connection pool to the queue's database (two short reads per search, three when a search looks deeper: the
  document versions search must not show, queue_db.lifecycle.hidden_from_search, and the content groups of the
  hits' documents, resources/search_copies.py), closed by `close()` unless the caller handed in its engine;
- the graph's driver (resources/hit_entities.py), for the entities beside each hit: opened on the first search
  that reads the graph, closed by `close()`; a graph that does not answer leaves the hits without entities;
- the vector store. A Qdrant server's client stays connected until `close()`. The embedded store (Qdrant Edge) is
  single-process: each search takes the folder's lock file (resources/folder_lock.py) and opens the shards, and the
  session keeps them open for up to `keep_open_s` seconds of idleness afterwards (the store's own linger,
  DOCQUEUE_QDRANT_LINGER, when the process opened that folder before the session). A worker that wants to write
  touches the lock's `.wait` file and the session lets go within 50 ms, or right after the search in progress; its
  next search opens the shards again (tens of milliseconds, plus reading back from disk what Qdrant Edge evicted
  from the page cache as it closed them). So a session never keeps a run from writing for longer than one search,
  and sees every write that finished before its search took the lock.

A session is safe to share between threads (the embedder is, and the store serialises its operations).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from queue_db.config import QueueSettings, Settings
from queue_db.database_urls import database_url
from queue_db.lifecycle import hidden_from_search
from queue_db.queue import TaskQueue, create_queue_engine
from queue_db.tenants import checked_tenant
from resources.embeddings import get_embedder, load_runtime, model_spec
from resources.hit_entities import HitGraph
from resources.ports import SEARCH_MODES, MentionedEntity, RelatedEntity, SearchHits, VectorStore
from resources.search_copies import LIGHT_KEYS, also_in, collapsed_search
from resources.vector_stores import open_vector_store, vector_store_settings

if TYPE_CHECKING:
    import sqlalchemy as sa

# how long the embedded store's shards stay open after a search when nobody else asks for them: long enough for an
# application's next query, short enough to let go of the memory of an idle one
KEEP_OPEN_S = 60.0
# in the home: the model files hashed before (resources/verified_files.py), so a search's start-up reads the 23 MB
# model file once, as the model loads, instead of a second time to hash it
VERIFIED_RECORD = "verified_files.json"


@dataclass(frozen=True)
class Hit:
    """One chunk found: its fused score (rounded as `docqueue search --json` shows it) and where it is."""

    score: float
    document: str | None  # the file name
    document_key: str | None
    page: int | None
    chunk: int | None
    text: str | None
    # from the graph (resources/hit_entities.py): the entities the chunk mentions, at most
    # DOCQUEUE_SEARCH_ENTITIES_PER_HIT of `entities_total`, and with `graph=True` their strongest relations
    entities: list[MentionedEntity] = field(default_factory=list)
    entities_total: int = 0
    related: list[RelatedEntity] = field(default_factory=list)
    # near-duplicate documents of its content group the text is also in: how many, and the first keys
    also_in: int = 0
    also_in_keys: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SearchResult:
    """The hits of one search, best first; `mode` is the mode used and `notice` says why when it is not the one
    asked (a collection made before sparse vectors is searched dense only)."""

    query: str
    mode: str
    notice: str | None
    hits: list[Hit]
    graph_notice: str | None = None  # why the hits carry no entities when the graph did not answer

    def as_dict(self) -> dict[str, Any]:
        """Exactly what `docqueue search --json` prints."""
        return {
            "query": self.query,
            "mode": self.mode,
            "notice": self.notice,
            "hits": [asdict(hit) for hit in self.hits],
            "graph_notice": self.graph_notice,
        }


class SearchSession:
    """Hybrid search (embedding similarity and keyword matching, fused by rank) over one tenant's documents, kept
    warm between searches. Build it from the entry point's settings, use it as a context manager or call
    `close()`::

        with SearchSession(Settings.from_env()) as session:
            result = session.search("harbour storm damage", limit=5, tenant="acme")

    `engine`: the queue's database when the caller has it open already (the session then leaves it open);
    otherwise the session opens its own (DOCQUEUE_DATABASE_URL, or the embedded server, started when needed).
    """

    def __init__(self, settings: Settings, *, engine: sa.Engine | None = None, keep_open_s: float = KEEP_OPEN_S):
        self.default_tenant = settings.tenant.default_tenant
        self.graph = HitGraph(settings)
        embedding = settings.embedding
        spec = model_spec(embedding.model)  # an unknown model is said before anything is opened
        # the model loads in a thread while this one opens the database and the store. Only the building of its
        # session runs outside the GIL, so the runtime is imported here first: an import in the thread would take
        # turns on the GIL with the openings (and wait out the main shard's loading, which holds it), and only
        # then start the building that runs beside them
        load_runtime()
        loading = ThreadPoolExecutor(max_workers=1, thread_name_prefix="search-model")
        model = loading.submit(
            get_embedder,
            embedding.model,
            batch_size=embedding.batch_size,
            threads=embedding.threads,
            max_windows=embedding.max_windows,
            max_batch_tokens=embedding.batch_tokens,
            verified_record=_verified_record(settings),
        )
        loading.shutdown(wait=False)  # the one task runs on; its thread ends with it
        self.graph.prepare()  # the Bolt driver loads while the model does
        self._own_engine = engine is None
        engine = (
            engine
            if engine is not None
            else create_queue_engine(database_url(settings.database), pool_size=1, max_overflow=4)
        )
        self._engine = engine
        # a search's reads are one statement each, so they run outside a transaction: there psycopg keeps its
        # statements prepared from one search to the next (the group look-up is planned anew in a transaction,
        # which the pool rolls back at every return)
        self._queue = TaskQueue(
            engine.execution_options(isolation_level="AUTOCOMMIT"), QueueSettings.from_config(settings.queue)
        )
        store_settings = vector_store_settings(settings)
        self.store: VectorStore = open_vector_store(
            replace(store_settings, linger_s=max(store_settings.linger_s, keep_open_s)), spec.model_id, spec.dim
        )
        try:
            self.store.prepare_reads()
        finally:
            self.embedder = model.result()

    def search(
        self,
        query: str,
        limit: int = 5,
        *,
        tenant: str | None = None,
        mode: str = "hybrid",
        entities: bool = True,
        graph: bool = False,
        all_copies: bool = False,
    ) -> SearchResult:
        """The best `limit` chunks of `tenant`'s documents (default: DOCQUEUE_DEFAULT_TENANT) for `query`; `mode`
        hybrid (default), dense or sparse. Versions still being indexed, and old ones once replaced, are left out,
        as in `docqueue search`. Each hit carries the entities its chunk mentions (`entities=False`: none, the
        graph is not read) and, with `graph=True`, the entities most related to those (`docqueue search
        --graph`). A content group of near-duplicate documents gives one hit, which names the others
        (`also_in`); `all_copies` shows every copy's hit."""
        if mode not in SEARCH_MODES:
            raise ValueError(f"mode must be one of {', '.join(SEARCH_MODES)}, got {mode!r}")
        tenant = checked_tenant(tenant, self.default_tenant)
        vector = self.embedder.embed_one(query)
        hidden = hidden_from_search(self._queue)

        def ranked(n: int, keys: Sequence[str] | None = None, seen: Sequence[str] = ()) -> SearchHits:
            return self.store.search(
                vector,
                limit=n,
                text=query,
                mode=mode,
                exclude_document_ids=[*hidden, *seen],
                tenant=tenant,
                payload_keys=keys,
            )

        found, kept, groups = collapsed_search(
            ranked,
            self._queue.engine,
            limit,
            all_copies=all_copies,
            hidden=hidden,
            query=query,
            light=lambda n: ranked(n, LIGHT_KEYS),
            payloads=self.store.payloads,
            without=lambda n, seen: ranked(n, LIGHT_KEYS, seen),
        )
        hits = [
            Hit(
                score=round(h.score, 4),
                document=h.payload.get("filename"),
                document_key=h.payload.get("document_key"),
                page=h.payload.get("page_number"),
                chunk=h.payload.get("chunk_index"),
                text=h.payload.get("text"),
                **also_in(h, groups),
            )
            for h in kept
        ]
        graph_notice = None
        if entities:
            hits, graph_notice = self.graph.attach(hits, [h.chunk_id for h in kept], tenant, related=graph)
        return SearchResult(query=query, mode=found.mode, notice=found.notice, hits=hits, graph_notice=graph_notice)

    def close(self) -> None:
        """Let go of the store and, when the session opened it, the database pool. The model stays loaded."""
        try:
            self.store.close()
        finally:
            self.graph.close()
            if self._own_engine:
                self._engine.dispose()

    def __enter__(self) -> SearchSession:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _verified_record(settings: Settings) -> Path | None:
    """Where the home notes the model files hashed before; None when there is no home (a session on servers of
    its own, whose search should not make one)."""
    home = Path(settings.database.home).expanduser()
    return home / VERIFIED_RECORD if home.is_dir() else None
