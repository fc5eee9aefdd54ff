"""The embedder's Dagster resource, apart from resources/embeddings.py so that the embedder itself (a search, a
command) loads without Dagster."""

from __future__ import annotations

import dagster as dg

from queue_db.config import Settings, default
from queue_db.service_config import EmbeddingConfig
from resources.embeddings import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_BATCH_TOKENS,
    DEFAULT_MAX_WINDOWS,
    DEFAULT_MODEL,
    Embedder,
    get_embedder,
)


class EmbeddingResource(dg.ConfigurableResource):
    """Dagster handle on the embedder; the entry point fills the fields (`EmbeddingResource.from_settings`)."""

    model: str = DEFAULT_MODEL  # DOCQUEUE_EMBEDDING_MODEL
    batch_size: int = DEFAULT_BATCH_SIZE  # DOCQUEUE_EMBED_BATCH: texts per model run
    threads: int = default(EmbeddingConfig, "threads")  # DOCQUEUE_EMBED_THREADS: 0 = onnxruntime decides
    max_windows: int = DEFAULT_MAX_WINDOWS  # DOCQUEUE_EMBED_MAX_WINDOWS: windows of 254 tokens per text
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS  # DOCQUEUE_EMBED_BATCH_TOKENS: padded tokens per model run
    timeout_s: float = default(EmbeddingConfig, "timeout_s")  # DOCQUEUE_EMBED_TIMEOUT: seconds per batch
    dedup: bool = default(EmbeddingConfig, "dedup")  # DOCQUEUE_EMBEDDING_DEDUP: copy the vectors of equal texts

    @classmethod
    def from_settings(cls, settings: Settings) -> "EmbeddingResource":
        embedding = settings.embedding
        return cls(
            model=embedding.model,
            batch_size=embedding.batch_size,
            threads=embedding.threads,
            max_windows=embedding.max_windows,
            max_batch_tokens=embedding.batch_tokens,
            timeout_s=embedding.timeout_s,
            dedup=embedding.dedup,
        )

    def get_embedder(self) -> Embedder:
        return get_embedder(
            self.model,
            batch_size=self.batch_size,
            threads=self.threads,
            max_windows=self.max_windows,
            max_batch_tokens=self.max_batch_tokens,
        )
