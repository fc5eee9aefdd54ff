"""Which vector store adapter a configuration opens (the Dagster resource that hands stores to assets is
resources/vector_resource.py, so that opening a store needs no Dagster).

`ADAPTERS` lists each adapter once: a test on the settings and a function that imports the adapter's class, whose
`from_settings(settings, model_id, dim)` opens it. The first whose test passes is opened, so the embedded store, which
needs nothing, comes last. Swapping the vector store is one new module implementing resources/ports.VectorStore plus
its line here and its importing function. An adapter's module is imported only when the adapter is chosen:
qdrant-client alone takes most of a second to import, which the embedded store's users (and `docqueue search` on
it) do not pay.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from queue_db.config import Settings, secret_value
from resources.ports import VectorStore, VectorStoreSettings


def _server_adapter() -> type[VectorStore]:
    from resources.qdrant_server import ClientVectorStore

    return ClientVectorStore


def _embedded_adapter() -> type[VectorStore]:
    from resources.qdrant_edge import EdgeVectorStore

    return EdgeVectorStore


# (does it apply to these settings, the adapter's class as imported when it is chosen)
ADAPTERS: tuple[tuple[Callable[[VectorStoreSettings], bool], Callable[[], type[VectorStore]]], ...] = (
    (lambda s: bool(s.url), _server_adapter),  # a Qdrant server at DOCQUEUE_QDRANT_URL
    (lambda s: True, _embedded_adapter),  # the embedded Qdrant Edge store in DOCQUEUE_QDRANT_PATH
)


def open_vector_store(settings: VectorStoreSettings, model_id: str, dim: int) -> VectorStore:
    """The store of `model_id`'s vectors, from the first adapter of ADAPTERS the settings choose."""
    for applies, adapter in ADAPTERS:
        if applies(settings):
            return adapter().from_settings(settings, model_id, dim)  # type: ignore[attr-defined]
    raise ValueError("no vector store adapter accepts these settings")


def vector_store_settings(settings: Settings) -> VectorStoreSettings:
    """The vector store's settings out of an entry point's `Settings` (the embedded folder defaults to
    `<DOCQUEUE_HOME>/qdrant`)."""
    vector = settings.vector
    return VectorStoreSettings(
        url=secret_value(vector.url),
        api_key=secret_value(vector.api_key),
        path=_embedded_path(settings),
        lock_timeout_s=vector.lock_timeout_s,
        request_timeout_s=vector.request_timeout_s,
        upsert_batch=vector.upsert_batch,
        hybrid_candidates=vector.hybrid_candidates,
        linger_s=vector.linger_s,
        segment_points=vector.segment_points,
        hnsw_ef=vector.hnsw_ef,
    )


def _embedded_path(settings: Settings) -> str:
    configured = settings.vector.path
    folder = Path(configured) if configured else Path(settings.database.home) / "qdrant"
    return str(folder.expanduser().resolve())
