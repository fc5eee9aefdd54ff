"""Phase 2, vector index: pages are chunked; chunks are embedded into Qdrant."""

import dagster as dg
from dagster import AssetExecutionContext, OpExecutionContext, SensorEvaluationContext

from queue_db.phases import VECTOR_CHUNK, VECTOR_PAGE, Level
from orchestration.cluster import celery_queue_tags
from orchestration.assets.common import materialize_range
from orchestration.pipeline import Pipeline
from orchestration.partitions import chunks_partitions, pages_partitions, register_partitions
from resources.database import DatabaseResource
from resources.embeddings import EmbeddingResource
from resources.qdrant import QdrantResource
from resources.storage import StorageResource

SINGLE_RUN = dg.BackfillPolicy.single_run()


@dg.asset(
    name="vector_page", group_name="vector", partitions_def=pages_partitions, backfill_policy=SINGLE_RUN,
    output_required=False, kinds={"python", "postgres"}, owners=["team:docqueue"], tags={"docqueue/phase": "vector"},
    pool="vector", op_tags=celery_queue_tags("vector"),
    deps=["ocr_page"],
    description="Chunks a page's markdown (headings, paragraphs, lists and tables respected; token budget with "
                "overlap; deterministic ids) and creates one vector task and one `chunks` partition per chunk.",
)
def vector_page(context: AssetExecutionContext, database: DatabaseResource, storage: StorageResource):
    pipeline = Pipeline.from_resources(database.get_queue(), storage)
    yield from materialize_range(
        context, VECTOR_PAGE, pipeline.queue, pipeline,
        after=lambda report: register_partitions(context.instance, pipeline.queue.engine, Level.CHUNK))


@dg.asset(
    name="vector_chunk", group_name="vector", partitions_def=chunks_partitions, backfill_policy=SINGLE_RUN,
    output_required=False, kinds={"onnx", "qdrant"}, owners=["team:docqueue"], tags={"docqueue/phase": "vector"},
    pool="vector", op_tags=celery_queue_tags("vector"),
    deps=[dg.AssetDep("vector_page", partition_mapping=dg.AllPartitionMapping())],
    description="Embeds a chunk with all-MiniLM-L6-v2 (int8 ONNX, 384 dims) and upserts it into Qdrant; the point "
                "id is uuid5(chunk_id), so a retry overwrites instead of duplicating.",
)
def vector_chunk(context: AssetExecutionContext, database: DatabaseResource, storage: StorageResource,
                 embeddings: EmbeddingResource, qdrant: QdrantResource):
    pipeline = Pipeline.from_resources(database.get_queue(), storage, embeddings=embeddings, qdrant=qdrant)
    try:
        yield from materialize_range(context, VECTOR_CHUNK, pipeline.queue, pipeline)
    finally:
        pipeline.close()


vector_assets = [vector_page, vector_chunk]
