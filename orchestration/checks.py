"""Asset checks: nothing stuck in processing, parents agree with children, stores agree with the queue.

Each check sits on an asset of the phase specs: the queue's two on the first phase (its deepest kind's asset
and its roll-up), each store's on the deepest kind of the phase whose handler writes that store."""

from __future__ import annotations

from typing import Callable

import dagster as dg

from orchestration.assets.rollups import rollup_asset_name
from orchestration.verify import verify_stores
from queue_db.config import Settings
from queue_db.inspection import stuck_counts
from queue_db.phases import PhaseRegistry
from resources.database import DatabaseResource
from resources.embedding_resource import EmbeddingResource
from resources.graph_stores import Neo4jResource
from resources.vector_resource import QdrantResource

POOL = "maintenance"


def _no_task_stuck_in_processing(asset: str) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        pool=POOL,
        asset=asset,
        name="no_task_stuck_in_processing",
        blocking=False,
        description="No task of any kind is `processing` with a heartbeat older than the stale timeout.",
    )
    def no_task_stuck_in_processing(database: DatabaseResource) -> dg.AssetCheckResult:
        queue = database.get_queue()
        with queue.engine.connect() as conn:
            stuck = stuck_counts(conn, queue.settings.stale_timeout_s)
        return dg.AssetCheckResult(passed=sum(stuck.values()) == 0, metadata=stuck)

    return no_task_stuck_in_processing


def _parents_agree_with_children(asset: str) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        pool=POOL,
        asset=asset,
        name="parents_agree_with_children",
        blocking=False,
        description="Every page and document status equals the bubble-up rule over its children.",
    )
    def parents_agree_with_children(database: DatabaseResource) -> dg.AssetCheckResult:
        disagreeing = database.get_queue().disagreeing_parents()
        return dg.AssetCheckResult(passed=sum(disagreeing.values()) == 0, metadata=disagreeing)

    return parents_agree_with_children


def _vectors_agree_with_queue(asset: str, page_size: int) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        pool=POOL,
        asset=asset,
        name="vectors_agree_with_queue",
        blocking=False,
        description="Each completed vector chunk has exactly one Qdrant point and no point lacks a chunk "
        "(both streamed, DOCQUEUE_VERIFY_PAGE ids at a time).",
    )
    def vectors_agree_with_queue(
        database: DatabaseResource, embeddings: EmbeddingResource, qdrant: QdrantResource
    ) -> dg.AssetCheckResult:
        queue = database.get_queue()
        embedder = embeddings.get_embedder()
        store = qdrant.get_store(embedder.model_id, embedder.dim)
        try:
            store.ensure_collection()
            report = verify_stores(queue, vector_store=store, page_size=page_size)
        finally:
            store.close()
        missing, unknown = len(report.chunks_without_point), len(report.points_without_chunk)
        extra = unknown + report.points_of_unfinished_chunks
        return dg.AssetCheckResult(
            passed=missing == 0 and extra == 0,
            metadata={
                "completed_chunks": report.completed_vector_chunks,
                "points": report.points,
                "missing_points": missing,
                "points_not_completed": extra,
            },
        )

    return vectors_agree_with_queue


def _graph_agrees_with_queue(asset: str, page_size: int) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        pool=POOL,
        asset=asset,
        name="graph_agrees_with_queue",
        blocking=False,
        description="Each completed GraphRAG chunk has its graph writes; no duplicate entity nodes.",
    )
    def graph_agrees_with_queue(database: DatabaseResource, neo4j: Neo4jResource) -> dg.AssetCheckResult:
        queue = database.get_queue()
        graph = neo4j.get_store()
        try:
            report = verify_stores(queue, graph_store=graph, page_size=page_size)
        finally:
            graph.close()
        missing = len(report.chunks_without_graph)
        return dg.AssetCheckResult(
            passed=missing == 0 and not report.duplicate_entities,
            metadata={
                "completed_chunks": report.completed_graph_chunks,
                "chunks_with_writes": report.completed_graph_chunks - missing,
                "missing": missing,
                "duplicate_entities": len(report.duplicate_entities),
            },
        )

    return graph_agrees_with_queue


# the store each phase handler writes, checked against the queue on the phase's deepest kind
STORE_CHECKS: dict[str, Callable[[str, int], dg.AssetChecksDefinition]] = {
    "vector": _vectors_agree_with_queue,
    "graphrag": _graph_agrees_with_queue,
}


def phase_checks(settings: Settings, phases: PhaseRegistry) -> list[dg.AssetChecksDefinition]:
    first = phases.phases[0]
    page_size = settings.dagster.verify_page
    return [
        _no_task_stuck_in_processing(first.leaf.name),
        _parents_agree_with_children(rollup_asset_name(first)),
        *(STORE_CHECKS[spec.handler](spec.leaf.name, page_size) for spec in phases if spec.handler in STORE_CHECKS),
    ]


def checks_job() -> dg.UnresolvedAssetJobDefinition:
    """Every check, and nothing else: what the checks schedule runs (results show on each asset's Checks tab)."""
    return dg.define_asset_job(
        "asset_checks_job",
        selection=dg.AssetSelection.all_asset_checks(),
        tags={"docqueue/phase": "maintenance"},
        description="Evaluates every asset check: nothing stuck, parents agree with children, stores agree with the "
        "queue.",
    )
