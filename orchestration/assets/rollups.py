"""Document-level roll-ups per phase: a document's phase is materialized once all its pages/chunks settled.

A completed phase is a materialization with the document's figures; a failed phase fails the partition with the
first failing child's error. Roll-ups are written when the queue says the phase reached a final status. One
roll-up asset per phase spec; the last phase's also removes old versions of a document once their replacement is
fully indexed. The OCR roll-up also places each completed document in its content group of near duplicates
(orchestration/content_groups.py) and shows the group in the materialization's metadata."""

from typing import Callable

import dagster as dg
from dagster import AssetExecutionContext

from orchestration.assets.common import (
    failure_headline,
    is_manual_run,
    log_failures,
    log_materializations,
    queue_of,
    tag_launched_run,
)
from orchestration.check_evaluations import CheckSpec, log_check_evaluations, phase_check_specs
from orchestration.cluster import celery_queue_tags
from orchestration.content_groups import GROUPING_PHASE, group_metadata, place_documents
from orchestration.partitions import documents_partitions
from orchestration.store_cleanup import retire_superseded
from queue_db.config import NearDuplicateConfig
from queue_db.lifecycle import superseded_ready_for_removal
from queue_db.partition_keys import document_rollup, mark_rolled_up
from queue_db.phases import PhaseRegistry, PhaseSpec

# what the last phase's roll-up opens to remove old versions everywhere
RETIRING_RESOURCES = ("storage", "embeddings", "qdrant", "neo4j")


def rollup_asset_name(spec: PhaseSpec) -> str:
    """Phase, level, step: `ocr_document_rollup` reads apart from the task asset `ocr_document` (the step that
    splits a document into its pages). Homes written under the former names carry their history over in
    `docqueue db upgrade` (orchestration/asset_renames.py)."""
    return f"{spec.name}_document_rollup"


def rollup_run_name(spec: PhaseSpec) -> str:
    """What the roll-up's job, sensor and planned runs are named after."""
    return f"rollup_{spec.name}"


BLOCKED_REASON = "blocked: it waits on an earlier task that failed for good (fix that one, then `docqueue retry`)"


def _materialize_rollups(
    context: AssetExecutionContext,
    queue,
    phase: PhaseSpec,
    phases: PhaseRegistry,
    checks: list[CheckSpec],
    grouped: Callable[[dict], dict] | None = None,
) -> None:
    """`checks`: the phase's checks, evaluated for the documents this roll-up wrote; `grouped`: given the completed
    documents' figures by key, what the roll-up adds to each one's metadata (the OCR roll-up places them in content
    groups and says where)."""
    keys = list(context.partition_keys)
    figures = document_rollup(queue.engine, phase, keys, phases=phases)
    completed = {k: f for k, f in figures.items() if f["status"] == "completed"}
    extra = grouped(completed) if grouped else {}
    # a blocked phase (pending, waiting on a task that failed for good) ends like a failed one: it cannot finish
    failed = {k: f for k, f in figures.items() if f["status"] in ("failed", "blocked")}
    log_materializations(
        context,
        [
            dg.AssetMaterialization(
                asset_key=context.asset_key,
                partition=key,
                metadata={
                    **{
                        k: v
                        for k, v in f.items()
                        if k not in ("document_key", "id", "status", "error") and v is not None
                    },
                    **extra.get(key, {}),
                },
            )
            for key, f in completed.items()
        ],
    )
    written = [f["id"] for f in (*completed.values(), *failed.values())]
    mark_rolled_up(queue.engine, phase, written, phases=phases)
    if written:
        # the phase's checks, for what changed: before the failure below ends the step
        log_check_evaluations(context, checks, written)
    open_keys = [k for k in keys if k not in completed and k not in failed]
    if failed or (open_keys and is_manual_run(dict(context.run.tags))):
        reasons = {k: _rollup_reason(f) for k, f in failed.items()}
        reasons.update(
            {
                k: (
                    "not_finished",
                    f"phase not finished ({figures.get(k, {}).get('status', 'unknown document')})",
                    True,
                )
                for k in open_keys
            }
        )
        log_failures(context, reasons)
        lines = [f"- `{k}`: {reason}" for k, (_, reason, _) in list(reasons.items())[:40]]
        counts = f"{len(failed)} document(s) failed the {phase.name} phase"
        raise dg.Failure(
            description=failure_headline({k: r for k, (_, r, _) in reasons.items()}, counts),
            metadata={"errors": dg.MetadataValue.md("\n".join(lines))},
            allow_retries=False,
        )


def _rollup_reason(figures: dict) -> tuple[str, str, bool]:
    """(error class, reason, retryable) of a failed or blocked phase; the class is the reason's own prefix
    ("empty: document has no pages" is `empty`)."""
    if figures["status"] == "blocked":
        return "blocked", BLOCKED_REASON, False
    reason = figures.get("error") or "failed"
    prefix = reason.split(":", 1)[0]
    return (prefix if prefix.isidentifier() else "failed"), reason, False


def rollup_asset(
    phases: PhaseRegistry, spec: PhaseSpec, last: bool, near_duplicates: NearDuplicateConfig | None = None
) -> dg.AssetsDefinition:
    """The phase's roll-up over its deepest kind; `last`: the last phase's, which also retires old versions; the
    OCR phase's places documents in content groups by `near_duplicates` (the settings' defaults when None)."""
    phase = spec.name
    grouping = phase == GROUPING_PHASE
    checks = [check for check in phase_check_specs(phases, rollup_asset_name) if check.phase is spec]

    @dg.asset(
        name=rollup_asset_name(spec),
        group_name=phase,
        partitions_def=documents_partitions,
        backfill_policy=dg.BackfillPolicy.single_run(),
        output_required=False,
        kinds={"postgres"},
        owners=["team:docqueue"],
        tags={"docqueue/phase": phase},
        pool=spec.pool,
        op_tags=celery_queue_tags(spec.celery_queue),
        deps=[dg.AssetDep(spec.leaf.name, partition_mapping=dg.AllPartitionMapping())],
        description=f"Per document: the {phase} phase rolled up from its children (seed bubble-up rule), with the "
        "document's figures. Materialized when the phase completed; failed when it failed."
        + (" Old versions of a document are removed here once their replacement is fully indexed." if last else "")
        + (
            " Each document joins its content group of near duplicates here (`content_group`, `copies`)."
            if grouping
            else ""
        ),
        required_resource_keys={
            "database",
            *(RETIRING_RESOURCES if last else ()),
            *(("storage",) if grouping else ()),
            *(name for check in checks for name in check.resources),
        },
    )
    def rollup(context: AssetExecutionContext):
        tag_launched_run(context, rollup_run_name(spec), phase, "document")
        resources = context.resources
        queue = queue_of(resources.database, phases)
        grouped = None
        if grouping:
            storage = resources.storage.get_storage()

            def grouped(completed: dict) -> dict:
                place_documents(queue, storage, list(completed.values()), near_duplicates)
                return group_metadata(queue, list(completed.values()))

        try:
            _materialize_rollups(context, queue, spec, phases, checks, grouped)
        finally:
            if last:
                _retire_old_versions(
                    context, queue, resources.storage, resources.embeddings, resources.qdrant, resources.neo4j
                )
        if False:  # pragma: no cover - generator, so output_required=False applies
            yield

    return rollup


def _retire_old_versions(context, queue, storage, embeddings, qdrant, neo4j) -> None:
    if not superseded_ready_for_removal(queue):
        return
    embedder = embeddings.get_embedder()
    store = qdrant.get_store(embedder.model_id, embedder.dim)
    graph = neo4j.get_store()
    try:
        retired = retire_superseded(
            queue, instance=context.instance, storage=storage.get_storage(), vector_store=store, graph_store=graph
        )
    finally:
        store.close()
        graph.close()
    if retired:
        context.log.info(f"retired {len(retired)} old version(s): {[r['document_key'] for r in retired]}")


def rollup_assets(
    phases: PhaseRegistry, near_duplicates: NearDuplicateConfig | None = None
) -> list[dg.AssetsDefinition]:
    last = phases.phases[-1]
    return [rollup_asset(phases, spec, spec is last, near_duplicates) for spec in phases]
