"""Acting on the queue: `docqueue recover`, `retry`, `priority`, `delete`, `reindex` and `regroup`."""

from __future__ import annotations

import click

from orchestration.cli.context import document_or_fail, open_queue, phase_names, tenant_filter, tenant_option
from orchestration.cli.errors import EXIT_USAGE, CliError, service_errors
from orchestration.cli.output import emit
from orchestration.environment import dagster_instance
from queue_db.config import Settings
from queue_db.lifecycle import apply_reindex_requests, reset_phase
from queue_db.phases import Phase


@click.command()
@click.option("--stale-after", type=float, default=None, help="seconds without heartbeat (default STALE_TASK_TIMEOUT)")
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document on stdout")
@click.pass_obj
def recover(settings: Settings, stale_after: float | None, as_json: bool) -> None:
    """Release stale tasks (counting the attempt), re-index chunks whose re-index waited for them, and reconcile
    parents."""
    queue = open_queue(settings)
    by_kind = queue.recover_stale(stale_after)
    released = {"released": by_kind, "released_total": sum(by_kind.values())}
    reindexed = apply_reindex_requests(queue)
    corrections = queue.reconcile()
    payload = {**released, "reindexed_after_running": reindexed, "parents_corrected": len(corrections)}
    emit(
        as_json,
        payload,
        lambda: click.echo(
            f"released {released['released_total']} stale task(s) "
            f"({', '.join(f'{k}: {v}' for k, v in by_kind.items() if v) or 'none'}); "
            f"re-indexed {reindexed} chunk(s) that were running; corrected {len(corrections)} parent status(es)"
        ),
    )


@click.command()
@click.option(
    "--phase",
    type=click.Choice(phase_names()),
    default=None,
    help="only this phase's failed tasks (default: every phase)",
)
@click.argument("document", required=False)
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document on stdout")
@click.pass_obj
def retry(settings: Settings, phase: str | None, document: str | None, as_json: bool) -> None:
    """Put failed tasks back to pending with their retries reset."""
    queue = open_queue(settings)
    doc_id = str(document_or_fail(queue, document)["id"]) if document else None
    counts = queue.retry_failed(Phase(phase) if phase else None, doc_id)
    emit(
        as_json,
        {"retried": counts, "total": sum(counts.values())},
        lambda: click.echo(
            f"{sum(counts.values())} failed task(s) back to pending"
            + (f" ({', '.join(f'{k}: {v}' for k, v in counts.items() if v)})" if sum(counts.values()) else "")
        ),
    )


@click.command()
@click.argument("document")
@click.argument("priority", type=click.IntRange(0, 10))
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document")
@click.pass_obj
def priority(settings: Settings, document: str, priority: int, as_json: bool) -> None:
    """Set DOCUMENT's PRIORITY (0-10, higher is claimed first) and its unfinished pages' and chunks'."""
    queue = open_queue(settings)
    row = document_or_fail(queue, document)
    counts = queue.set_priority(str(row["id"]), priority)
    emit(
        as_json,
        {"document": row["document_key"], "priority": priority, **counts},
        lambda: click.echo(
            f"{row['document_key']}: priority {row['priority']} -> {priority} "
            f"({counts['pages']} unfinished page(s), {counts['chunks']} unfinished chunk(s))"
        ),
    )


@click.command()
@click.argument("document", required=False)
@tenant_option("without DOCUMENT: delete every document of this tenant, DOCQUEUE_DELETE_BATCH at a time")
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document on stdout")
@click.pass_obj
def delete(settings: Settings, document: str | None, tenant: str | None, as_json: bool) -> None:
    """Remove a document (or a whole tenant): rows, files, Qdrant points, graph nodes and mentions, Dagster
    partitions."""
    if document is None and tenant is None:
        raise CliError("give a DOCUMENT to delete, or --tenant T to delete every document of tenant T", EXIT_USAGE)
    tenant = tenant_filter(settings, tenant)
    queue = open_queue(settings)
    # imported here: deleting reaches Dagster's partitions and the stores (Dagster, qdrant-client, the Bolt driver),
    # seconds that this module's queue-only commands (recover, retry, priority) do not need
    from orchestration.store_cleanup import delete_everywhere, delete_tenant
    from orchestration.stores import opened_stores

    if document is None:
        with service_errors(), opened_stores(settings) as (store, graph):
            try:
                removed = delete_tenant(
                    queue,
                    tenant,
                    instance=dagster_instance(settings),
                    storage=_storage(settings),
                    vector_store=store,
                    graph_store=graph,
                    batch=settings.tenant.delete_batch,
                )
            except RuntimeError as exc:
                raise CliError(f"cannot delete tenant {tenant!r} now: {exc}") from None
        emit(
            as_json,
            {"tenant": tenant, **removed},
            lambda: click.echo(
                f"deleted tenant {tenant}: {removed['documents']} document(s), {removed['points']} point(s), "
                f"{removed['files']} file(s), {removed['partitions']} partition(s)"
            ),
        )
        return
    found = document_or_fail(queue, document, tenant)
    with service_errors(), opened_stores(settings) as (store, graph):
        try:
            removed = delete_everywhere(
                queue,
                found,
                instance=dagster_instance(settings),
                storage=_storage(settings),
                vector_store=store,
                graph_store=graph,
            )
        except RuntimeError as exc:
            raise CliError(f"cannot delete {found['document_key']} now: {exc}") from None
    payload = {"document": found["document_key"], "id": str(found["id"]), **removed}
    emit(
        as_json,
        payload,
        lambda: click.echo(
            f"deleted {found['document_key']}: {removed['points']} point(s), {removed['files']} file(s), "
            f"{removed['partitions']} partition(s)"
        ),
    )


def _storage(settings: Settings):
    # imported here, as in delete: the resources bring Dagster
    from resources.storage_resource import StorageResource

    return StorageResource.from_settings(settings).get_storage()


@click.command()
@click.option(
    "--phase",
    type=click.Choice(phase_names(rerunnable=True)),
    required=True,
    help="the first phase to run again; the later ones run again too",
)
@click.argument("document", required=False)
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document on stdout")
@click.pass_obj
def reindex(settings: Settings, phase: str, document: str | None, as_json: bool) -> None:
    """Re-run a phase and the ones after it, keeping OCR (e.g. after changing the embedding model)."""
    queue = open_queue(settings)
    doc_id = str(document_or_fail(queue, document)["id"]) if document else None
    upgraded = _upgrade_vector_shape(settings) if Phase(phase) is Phase.VECTOR else 0
    counts = reset_phase(queue, Phase(phase), doc_id)
    counts["points_upgraded"] = upgraded
    upgrade = f"; the vector collection now has sparse vectors ({upgraded} point(s) rewritten)" if upgraded else ""
    running = (
        (
            f"; {counts['running']} chunk(s) still running will be re-indexed once they finish (by the recovery "
            "job, or `docqueue recover`)"
        )
        if counts["running"]
        else ""
    )
    emit(
        as_json,
        {"phase": phase, **counts},
        lambda: click.echo(
            f"{counts['chunks']} chunk(s) of {counts['documents']} document(s) will be re-indexed"
            f" from the {phase} phase"
            f"{upgrade}{running}; run `docqueue run --until-idle`"
        ),
    )


@click.command()
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document on stdout")
@click.pass_obj
def regroup(settings: Settings, as_json: bool) -> None:
    """Sign again the documents an older docqueue signed for near-duplicate grouping, from their stored page texts."""
    # imported here: the signatures bring numpy, which the module's other commands do not need at start-up
    from orchestration.content_groups import sign_again

    queue = open_queue(settings)
    counts = sign_again(queue, _storage(settings), settings.near_duplicates)
    emit(
        as_json,
        counts,
        lambda: click.echo(
            f"{counts['signed']} document(s) signed again in the current format; "
            f"{counts['joined']} joined a content group"
        ),
    )


def _upgrade_vector_shape(settings: Settings) -> int:
    """A collection made before hybrid search gets its sparse vector now, with every point (not only this
    document's) rewritten from its stored text, so search is hybrid before the re-embedding is done."""
    # imported here, as in delete: the vector store brings qdrant-client and Dagster
    from orchestration.stores import embedding_model, open_vectors

    model_id, dim = embedding_model(settings.embedding)
    with service_errors():
        store = open_vectors(settings, model_id, dim)
        try:
            # a shape upgrade is the Qdrant adapters' own: another vector store has nothing to upgrade
            upgrade_shape = getattr(store, "upgrade_shape", None)
            return upgrade_shape() if upgrade_shape is not None else 0
        finally:
            store.close()


@click.command()
@click.option(
    "--vectors",
    is_flag=True,
    help="the embedded vector store: set aside the shards that cannot be read back, re-queue their chunks",
)
@click.option(
    "--graph",
    is_flag=True,
    help="the embedded graph database: set aside its folder if damaged, re-queue the GraphRAG step of what it held",
)
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document on stdout")
@click.pass_obj
def repair(settings: Settings, vectors: bool, graph: bool, as_json: bool) -> None:
    """Set aside a damaged store's files (kept, renamed) and re-queue what they held for `docqueue run`."""
    if not (vectors or graph):
        raise CliError("say what to repair: --vectors, --graph or both", EXIT_USAGE)
    if graph and settings.graph.uri:
        raise CliError(
            "only the embedded graph database (DOCQUEUE_NEO4J_URI unset) has files docqueue can repair; "
            "a Bolt server at DOCQUEUE_NEO4J_URI keeps its own",
            EXIT_USAGE,
        )
    queue = open_queue(settings)
    result: dict = {}
    with service_errors():
        if vectors:
            result.update(_repair_vectors(settings, queue))
        if graph:
            result.update(_repair_graph(settings, queue))
    said = []
    if vectors:
        damaged = "; ".join(f"{d['shard']} kept as {d['kept_as']}" for d in result["damaged_shards"])
        said.append(
            (f"damaged shard(s) set aside: {damaged}" if damaged else "no damaged shard")
            + f"; {result['requeued_vector_chunks']} completed chunk(s) without a point re-queued"
        )
    if graph:
        folder = result["damaged_folder"]
        said.append(
            (f"damaged graph database {folder['folder']} kept as {folder['kept_as']}" if folder else "no damage")
            + f" in the graph database; {result['requeued_graph_chunks']} completed chunk(s) without graph "
            "writes re-queued"
        )
    again = result.get("requeued_vector_chunks") or result.get("requeued_graph_chunks")
    emit(as_json, result, lambda: click.echo("; ".join(said) + ("; run `docqueue run --until-idle`" if again else "")))


def _repair_vectors(settings: Settings, queue) -> dict:
    # imported here, as in delete: the vector store brings Qdrant Edge and Dagster
    from orchestration.repair import repair_vectors
    from orchestration.stores import embedding_model, open_vectors
    from resources.qdrant_edge import EdgeVectorStore

    model_id, dim = embedding_model(settings.embedding)
    store = open_vectors(settings, model_id, dim)
    try:
        if not isinstance(store, EdgeVectorStore):
            raise CliError(
                "only the embedded vector store (DOCQUEUE_QDRANT_PATH) has shards docqueue can repair; "
                "a Qdrant server (DOCQUEUE_QDRANT_URL) keeps its own",
                EXIT_USAGE,
            )
        return repair_vectors(queue, store, settings.dagster.verify_page)
    finally:
        store.close()


def _repair_graph(settings: Settings, queue) -> dict:
    # imported here, as in delete: the graph store brings the Bolt driver and Dagster
    from orchestration.repair import repair_graph
    from orchestration.stores import open_graph
    from resources.bolt_server import BoltServer

    server = BoltServer.from_settings(settings)
    return repair_graph(queue, server, lambda: open_graph(settings), settings.dagster.verify_page)
