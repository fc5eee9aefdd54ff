"""The vector store's Dagster resource, apart from resources/vector_stores.py so that opening a store (a search, a
command) needs no Dagster."""

from __future__ import annotations

import dataclasses

import dagster as dg

from queue_db.config import Settings, default
from queue_db.service_config import VectorStoreConfig
from resources.ports import VectorStore, VectorStoreSettings
from resources.vector_stores import open_vector_store, vector_store_settings


def _resolved(value):
    """A field's value; a `dg.EnvVar` is resolved the way Dagster resolves it in a run, for use outside one."""
    return value.get_value() if isinstance(value, dg.EnvVar) else value


# the store's settings a resource carries as they are (the URL and the API key go in as environment references);
# tests/unit/test_store_ports.py keeps the resource's fields equal to VectorStoreSettings'
PLAIN_FIELDS = tuple(f.name for f in dataclasses.fields(VectorStoreSettings) if f.name not in ("url", "api_key"))


class QdrantResource(dg.ConfigurableResource):
    """Dagster handle on the vector store; the entry point fills the fields (`QdrantResource.from_settings`).

    The URL and the API key are passed as `dg.EnvVar(...)`, never as literals, so they stay out of run config.
    """

    url: str | None = None  # DOCQUEUE_QDRANT_URL; empty -> embedded Qdrant Edge storage in `path`
    api_key: str | None = None  # DOCQUEUE_QDRANT_API_KEY
    path: str = ""  # DOCQUEUE_QDRANT_PATH, else <DOCQUEUE_HOME>/qdrant
    lock_timeout_s: float = default(VectorStoreConfig, "lock_timeout_s")
    request_timeout_s: float = default(VectorStoreConfig, "request_timeout_s")
    upsert_batch: int = default(VectorStoreConfig, "upsert_batch")
    hybrid_candidates: int = default(VectorStoreConfig, "hybrid_candidates")
    linger_s: float = default(VectorStoreConfig, "linger_s")
    segment_points: int = default(VectorStoreConfig, "segment_points")
    hnsw_ef: int = default(VectorStoreConfig, "hnsw_ef")

    @classmethod
    def from_settings(cls, settings: Settings) -> QdrantResource:
        """The resource an entry point builds once from its settings; secrets go in as `dg.EnvVar`s."""
        built = vector_store_settings(settings)
        return cls(
            url=dg.EnvVar("DOCQUEUE_QDRANT_URL") if built.url else None,
            api_key=dg.EnvVar("DOCQUEUE_QDRANT_API_KEY") if built.api_key else None,
            **{name: getattr(built, name) for name in PLAIN_FIELDS},
        )

    def store_settings(self) -> VectorStoreSettings:
        url, api_key = _resolved(self.url) or "", _resolved(self.api_key) or ""
        if not url and not self.path:
            raise ValueError(
                "QdrantResource has neither a url nor a path: build it with QdrantResource.from_settings(settings)"
            )
        return VectorStoreSettings(url=url, api_key=api_key, **{name: getattr(self, name) for name in PLAIN_FIELDS})

    def get_store(self, model_id: str, dim: int) -> VectorStore:
        return open_vector_store(self.store_settings(), model_id, dim)
