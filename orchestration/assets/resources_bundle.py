"""Builds the plain pipeline from the run's Dagster resources."""
from __future__ import annotations

from orchestration.work import Pipeline, _Lazy
from resources.database import DatabaseResource
from resources.embeddings import EmbeddingResource
from resources.extraction import ExtractionResource
from resources.neo4j import Neo4jResource
from resources.ocr import OcrResource
from resources.qdrant import QdrantResource
from resources.storage import StorageResource


def build_pipeline(database: DatabaseResource, storage: StorageResource, ocr: OcrResource | None = None,
                   embeddings: EmbeddingResource | None = None, qdrant: QdrantResource | None = None,
                   neo4j: Neo4jResource | None = None, extraction: ExtractionResource | None = None) -> Pipeline:
    queue = database.get_queue()
    return Pipeline(
        queue,
        storage=storage.get_storage(),
        pdf=ocr.get_processor() if ocr is not None else None,
        embedder=_Lazy(embeddings.get_embedder) if embeddings is not None else None,
        vector_store_factory=(lambda model_id, dim: qdrant.get_store(model_id, dim)) if qdrant is not None else None,
        graph_store=_Lazy(neo4j.get_store) if neo4j is not None else None,
        extractor=_Lazy(extraction.get_extractor) if extraction is not None else None,
    )
