"""Document-level roll-ups per phase: a document's phase is materialized once all its pages/chunks settled.

A completed phase is a materialization with the document's figures; a failed phase fails the partition with the
first failing child's error. Roll-ups are written when the queue says the phase reached a final status."""

import dagster as dg
from dagster import AssetExecutionContext, OpExecutionContext, SensorEvaluationContext

from queue_db.partition_keys import document_rollup, mark_rolled_up
from orchestration.assets.common import is_manual_run, log_materializations
from orchestration.cluster import celery_queue_tags
from orchestration.partitions import documents_partitions
from resources.database import DatabaseResource
from resources.embeddings import EmbeddingResource
from resources.neo4j import Neo4jResource
from resources.qdrant import QdrantResource
from resources.storage import StorageResource

PHASE_ASSETS = {"ocr": ("document_ocr", "ocr_page"), "vector": ("document_vector_index", "vector_chunk"),
                "graphrag": ("document_graphrag_index", "graphrag_chunk")}
ROLLUP_ASSET_BY_PHASE = {phase: name for phase, (name, _) in PHASE_ASSETS.items()}


BLOCKED_REASON = "blocked: it waits on an earlier task that failed for good (fix that one, then `docqueue retry`)"


def _materialize_rollups(context: AssetExecutionContext, queue, phase: str) -> None:
    keys = list(context.partition_keys)
    figures = document_rollup(queue.engine, phase, keys)
    completed = {k: f for k, f in figures.items() if f["status"] == "completed"}
    # a blocked phase (pending, waiting on a task that failed for good) ends like a failed one: it cannot finish
    failed = {k: f for k, f in figures.items() if f["status"] in ("failed", "blocked")}
    log_materializations(context, [dg.AssetMaterialization(
        asset_key=context.asset_key, partition=key,
        metadata={k: v for k, v in f.items() if k not in ("document_key", "id", "status", "error") and v is not None})
        for key, f in completed.items()])
    mark_rolled_up(queue.engine, phase, [f["id"] for f in (*completed.values(), *failed.values())])
    open_keys = [k for k in keys if k not in completed and k not in failed]
    if failed or (open_keys and is_manual_run(dict(context.run.tags))):
        lines = [f"- `{k}`: {f['error'] if f['status'] == 'failed' else BLOCKED_REASON}"
                 for k, f in list(failed.items())[:20]]
        lines += [f"- `{k}`: phase not finished ({figures.get(k, {}).get('status', 'unknown document')})"
                  for k in open_keys[:20]]
        raise dg.Failure(description=f"{len(failed)} document(s) failed the {phase} phase",
                         metadata={"errors": dg.MetadataValue.md("\n".join(lines))})


def _rollup_asset(phase: str, name: str, upstream: str):
    spec = dict(
        name=name, group_name=phase, partitions_def=documents_partitions,
        backfill_policy=dg.BackfillPolicy.single_run(), output_required=False, kinds={"postgres"},
        owners=["team:docqueue"], tags={"docqueue/phase": phase},
        pool=phase, op_tags=celery_queue_tags(phase),
        deps=[dg.AssetDep(upstream, partition_mapping=dg.AllPartitionMapping())],
        description=f"Per document: the {phase} phase rolled up from its children (seed bubble-up rule), with the "
                    "document's figures. Materialized when the phase completed; failed when it failed."
                    + (" Old versions of a document are removed here once their replacement is fully indexed."
                       if phase == "graphrag" else ""),
    )
    if phase != "graphrag":
        @dg.asset(**spec)
        def rollup(context: AssetExecutionContext, database: DatabaseResource):
            _materialize_rollups(context, database.get_queue(), phase)
            if False:  # pragma: no cover - generator, so output_required=False applies
                yield
        return rollup

    @dg.asset(**spec)
    def graphrag_rollup(context: AssetExecutionContext, database: DatabaseResource, storage: StorageResource,
                        embeddings: EmbeddingResource, qdrant: QdrantResource, neo4j: Neo4jResource):
        queue = database.get_queue()
        try:
            _materialize_rollups(context, queue, phase)
        finally:
            _retire_old_versions(context, queue, storage, embeddings, qdrant, neo4j)
        if False:  # pragma: no cover
            yield
    return graphrag_rollup


def _retire_old_versions(context, queue, storage, embeddings, qdrant, neo4j) -> None:
    from queue_db.lifecycle import superseded_ready_for_removal
    from orchestration.lifecycle import retire_superseded

    if not superseded_ready_for_removal(queue):
        return
    embedder = embeddings.get_embedder()
    store = qdrant.get_store(embedder.model_id, embedder.dim)
    graph = neo4j.get_store()
    try:
        retired = retire_superseded(queue, instance=context.instance, storage=storage.get_storage(),
                                    vector_store=store, graph_store=graph)
    finally:
        store.close()
        graph.close()
    if retired:
        context.log.info(f"retired {len(retired)} old version(s): {[r['document_key'] for r in retired]}")


rollup_assets = [_rollup_asset(phase, name, upstream) for phase, (name, upstream) in PHASE_ASSETS.items()]
