"""Asset checks: nothing stuck in processing, parents agree with children, stores agree with the queue."""

import dagster as dg

from queue_db.inspection import stuck_counts
from orchestration.verify import verify_stores
from resources.database import DatabaseResource
from resources.embeddings import EmbeddingResource
from resources.neo4j import Neo4jResource
from resources.qdrant import QdrantResource

@dg.asset_check(pool="maintenance", asset="ocr_page", name="no_task_stuck_in_processing", blocking=False,
                description="No task of any kind is `processing` with a heartbeat older than the stale timeout.")
def no_task_stuck_in_processing(database: DatabaseResource) -> dg.AssetCheckResult:
    queue = database.get_queue()
    with queue.engine.connect() as conn:
        stuck = stuck_counts(conn, queue.settings.stale_timeout_s)
    return dg.AssetCheckResult(passed=sum(stuck.values()) == 0, metadata=stuck)


@dg.asset_check(pool="maintenance", asset="document_ocr", name="parents_agree_with_children", blocking=False,
                description="Every page and document status equals the bubble-up rule over its children.")
def parents_agree_with_children(database: DatabaseResource) -> dg.AssetCheckResult:
    disagreeing = database.get_queue().disagreeing_parents()
    return dg.AssetCheckResult(passed=sum(disagreeing.values()) == 0, metadata=disagreeing)


@dg.asset_check(pool="maintenance", asset="vector_chunk", name="vectors_agree_with_queue", blocking=False,
                description="Each completed vector chunk has exactly one Qdrant point and no point lacks a chunk "
                            "(both streamed, DOCQUEUE_VERIFY_PAGE ids at a time).")
def vectors_agree_with_queue(database: DatabaseResource, embeddings: EmbeddingResource,
                             qdrant: QdrantResource) -> dg.AssetCheckResult:
    queue = database.get_queue()
    embedder = embeddings.get_embedder()
    store = qdrant.get_store(embedder.model_id, embedder.dim)
    try:
        store.ensure_collection()
        report = verify_stores(queue, vector_store=store)
    finally:
        store.close()
    missing, unknown = len(report.chunks_without_point), len(report.points_without_chunk)
    extra = unknown + report.points_of_unfinished_chunks
    return dg.AssetCheckResult(passed=missing == 0 and extra == 0, metadata={
        "completed_chunks": report.completed_vector_chunks, "points": report.points, "missing_points": missing,
        "points_not_completed": extra})


@dg.asset_check(pool="maintenance", asset="graphrag_chunk", name="graph_agrees_with_queue", blocking=False,
                description="Each completed GraphRAG chunk has its graph writes; no duplicate entity nodes.")
def graph_agrees_with_queue(database: DatabaseResource, neo4j: Neo4jResource) -> dg.AssetCheckResult:
    queue = database.get_queue()
    graph = neo4j.get_store()
    try:
        report = verify_stores(queue, graph_store=graph)
    finally:
        graph.close()
    missing = len(report.chunks_without_graph)
    return dg.AssetCheckResult(passed=missing == 0 and not report.duplicate_entities, metadata={
        "completed_chunks": report.completed_graph_chunks,
        "chunks_with_writes": report.completed_graph_chunks - missing, "missing": missing,
        "duplicate_entities": len(report.duplicate_entities)})


all_checks = [no_task_stuck_in_processing, parents_agree_with_children, vectors_agree_with_queue,
              graph_agrees_with_queue]

# every check, and nothing else: what the checks schedule runs (results show on each asset's Checks tab)
checks_job = dg.define_asset_job(
    "asset_checks_job", selection=dg.AssetSelection.all_asset_checks(), tags={"docqueue/phase": "maintenance"},
    description="Evaluates every asset check: nothing stuck, parents agree with children, stores agree with the "
                "queue.")
