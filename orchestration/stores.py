"""Opening the embedder, the vector store and the graph store from the settings, for the `docqueue` commands and
the demo (the Dagster assets get theirs as resources)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from queue_db.config import Settings
from queue_db.service_config import EmbeddingConfig
from resources.bolt_graph import GraphStore
from resources.embeddings import MODELS, Embedder, get_embedder
from resources.graph_stores import Neo4jResource
from resources.ports import VectorStore
from resources.vector_stores import open_vector_store, vector_store_settings


class UnknownEmbeddingModel(ValueError):
    """DOCQUEUE_EMBEDDING_MODEL names no model docqueue knows."""


def embedding_model(embedding: EmbeddingConfig) -> tuple[str, int]:
    """Id and dimension of the configured embedding model, without loading it (a collection needs no more)."""
    if embedding.model not in MODELS:
        raise UnknownEmbeddingModel(
            f"unknown embedding model {embedding.model!r} in DOCQUEUE_EMBEDDING_MODEL; known: {', '.join(MODELS)}"
        )
    return embedding.model, MODELS[embedding.model].dim


def open_embedder(embedding: EmbeddingConfig) -> Embedder:
    """The process-wide embedder of the configured model (loaded on first use)."""
    return get_embedder(
        embedding.model,
        batch_size=embedding.batch_size,
        threads=embedding.threads,
        max_windows=embedding.max_windows,
        max_batch_tokens=embedding.batch_tokens,
    )


def open_vectors(settings: Settings, model_id: str, dim: int) -> VectorStore:
    """The configured Qdrant's collection of this model: a server's when DOCQUEUE_QDRANT_URL is set, else the
    embedded store's. The caller closes it."""
    return open_vector_store(vector_store_settings(settings), model_id, dim)


def open_graph(settings: Settings) -> GraphStore:
    """The graph store with a short retry budget: a person waiting at a prompt wants to hear that the Bolt server is
    unreachable within seconds (DOCQUEUE_CLI_GRAPH_RETRY_S, default 5), not after the workers' 30. The caller
    closes it."""
    graph = settings.graph
    connection = Neo4jResource.from_settings(settings).connection()
    return GraphStore(
        *connection,
        batch_size=graph.batch_size,
        conflict_retries=graph.conflict_retries,
        tx_timeout_s=max(graph.cli_retry_s, 0.1),
    )


@contextmanager
def opened_stores(settings: Settings) -> Iterator[tuple[VectorStore, GraphStore]]:
    """The vector store of the configured embedding model and the graph store, closed on exit."""
    model_id, dim = embedding_model(settings.embedding)
    store = open_vectors(settings, model_id, dim)
    try:
        graph = open_graph(settings)
        try:
            yield store, graph
        finally:
            graph.close()
    finally:
        store.close()
