"""The graph beside search hits: the entities each hit's chunk mentions and, when asked, the entities most related
to those, read through the graph port (resources/ports.GraphStore.chunk_entities) in one bounded query per search,
and one more for the related ones.

Search works without the graph. The graph is opened on the first search that wants it, and only when it is there:
a Bolt server at DOCQUEUE_NEO4J_URI, or the embedded one when it runs. A search never starts the embedded server
(a JVM: seconds), so a home whose server is stopped shows hits without entities and one sentence saying so; a home
that never wrote a graph shows them without a word. The Bolt driver is imported only by a session that will read a
graph, in the background while the model loads (`prepare`), never by `docqueue search`'s start-up
(tests/unit/test_cli_imports.py). A server that does not answer is left alone for RETRY_AFTER_S, so a warm session
never waits on it search after search.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from threading import Lock, Thread
from typing import TypeVar

from queue_db.config import Settings
from resources.bolt_server import BoltServer
from resources.ports import ChunkEntities, GraphStore, GraphStoreUnavailable

# how long a session leaves a graph server that did not answer before it asks again
RETRY_AFTER_S = 30.0

HitT = TypeVar("HitT")


class HitGraph:
    """The graph as search hits read it, opened lazily from the entry point's settings; safe to share between
    threads. `close()` lets go of the driver."""

    def __init__(self, settings: Settings):
        graph = settings.graph
        self.per_hit = graph.search_entities
        self.related_per_hit = graph.search_related
        self._settings = settings
        self._store: GraphStore | None = None
        self._quiet_until = 0.0
        self._notice: str | None = None
        self._lock = Lock()

    def prepare(self) -> None:
        """Load the Bolt driver in the background when this session will read a graph: its import (about a third of a
        second) then overlaps the model's loading instead of following the first search."""
        if self.per_hit <= 0:
            return
        if self._settings.graph.uri or BoltServer.from_settings(self._settings).ever_started:
            Thread(target=_load_driver, name="docqueue-graph-import", daemon=True).start()

    def lookup(
        self, chunk_ids: Sequence[str], tenant: str, *, related: bool = False
    ) -> tuple[dict[str, ChunkEntities], str | None]:
        """Per chunk id, what the graph knows of it (a chunk the GraphRAG phase has not reached is absent), and one
        sentence when the graph was wanted but did not answer."""
        if self.per_hit <= 0 or not chunk_ids:
            return {}, None
        with self._lock:  # the opening and the pause after a failure; the reads themselves run in parallel
            if time.monotonic() < self._quiet_until:
                return {}, self._notice
            try:
                store = self._opened()
            except GraphStoreUnavailable as exc:
                return {}, self._unreachable(str(exc))
        if store is None:
            return {}, None
        try:
            return store.chunk_entities(
                chunk_ids, self.per_hit, self.related_per_hit if related else 0, tenant=tenant
            ), None
        except GraphStoreUnavailable as exc:
            with self._lock:
                return {}, self._unreachable(str(exc))

    def attach(
        self, hits: list[HitT], chunk_ids: Sequence[str], tenant: str, *, related: bool = False
    ) -> tuple[list[HitT], str | None]:
        """`hits` (dataclasses with `entities`, `entities_total` and `related` fields, in the order of `chunk_ids`)
        with what the graph knows of their chunks, and the sentence of `lookup` when the graph did not answer."""
        found, notice = self.lookup(chunk_ids, tenant, related=related)
        return [
            replace(hit, entities=known.entities, entities_total=known.total, related=known.related)
            if (known := found.get(chunk_id)) is not None
            else hit
            for hit, chunk_id in zip(hits, chunk_ids, strict=True)
        ], notice

    def _opened(self) -> GraphStore | None:
        """The store, opened on first use; None when there is no graph to read."""
        if self._store is not None:
            return self._store
        graph = self._settings.graph
        if graph.uri:
            password = graph.password.get_secret_value() if graph.password is not None else ""
            connection = (graph.uri, graph.user, password, graph.database or None)
        else:
            server = BoltServer.from_settings(self._settings)
            if not server.ever_started:
                return None  # no graph was ever written in this home
            if not server.is_running():
                raise GraphStoreUnavailable("the embedded graph server is not running (`docqueue run` starts it)")
            connection = (server.uri, server.user, server.password, server.database)
        self._store = _load_driver()(*connection, tx_timeout_s=max(graph.cli_retry_s, 0.1))
        return self._store

    def _unreachable(self, reason: str) -> str:
        self._quiet_until = time.monotonic() + RETRY_AFTER_S
        self._notice = f"Entities are not shown: {reason}."
        return self._notice

    def close(self) -> None:
        with self._lock:
            store, self._store = self._store, None
        if store is not None:
            store.close()


def _load_driver() -> type[GraphStore]:
    # imported here: the Bolt driver is for the searches that read the graph only
    from resources.bolt_graph import GraphStore as BoltGraphStore

    return BoltGraphStore
