"""Phase 3, GraphRAG index: entities and relationships of each chunk, merged into the Bolt graph."""

import dagster as dg
from dagster import AssetExecutionContext, OpExecutionContext, SensorEvaluationContext

from queue_db.phases import GRAPHRAG_CHUNK
from orchestration.cluster import celery_queue_tags
from orchestration.assets.common import materialize_range
from orchestration.pipeline import Pipeline
from orchestration.partitions import chunks_partitions
from resources.database import DatabaseResource
from resources.extraction import ExtractionResource
from resources.neo4j import Neo4jResource
from resources.storage import StorageResource


@dg.asset(
    name="graphrag_chunk", group_name="graphrag", partitions_def=chunks_partitions,
    backfill_policy=dg.BackfillPolicy.single_run(), output_required=False, kinds={"spacy", "neo4j"},
    owners=["team:docqueue"], tags={"docqueue/phase": "graphrag"},
    pool="graphrag", op_tags=celery_queue_tags("graphrag"), deps=["vector_chunk"],
    description="Extracts entities and relationships from a chunk (spaCy offline, or an OpenAI-compatible LLM) and "
                "MERGEs them into the graph: Document-Page-Chunk-MENTIONS-Entity, Entity-RELATED_TO-Entity. "
                "Re-running a chunk changes nothing.",
)
def graphrag_chunk(context: AssetExecutionContext, database: DatabaseResource, storage: StorageResource,
                   neo4j: Neo4jResource, extraction: ExtractionResource):
    pipeline = Pipeline.from_resources(database.get_queue(), storage, neo4j=neo4j, extraction=extraction)
    yield from materialize_range(context, GRAPHRAG_CHUNK, pipeline.queue, pipeline)


graphrag_assets = [graphrag_chunk]
