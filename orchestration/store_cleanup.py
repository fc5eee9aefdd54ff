"""Deleting a document everywhere, and retiring old versions once their replacement is fully indexed."""

from __future__ import annotations

import logging

import dagster as dg

from orchestration.partitions import PARTITIONS_BY_LEVEL
from queue_db import lifecycle
from queue_db.config import TenantConfig, default
from queue_db.phases import Level
from queue_db.queue import TaskQueue
from queue_db.tenants import checked_tenant

log = logging.getLogger(__name__)
PARTITION_DEFS = {
    "documents": PARTITIONS_BY_LEVEL[Level.DOCUMENT].name,
    "pages": PARTITIONS_BY_LEVEL[Level.PAGE].name,
    "chunks": PARTITIONS_BY_LEVEL[Level.CHUNK].name,
}


def delete_everywhere(
    queue: TaskQueue,
    document: dict,
    *,
    instance: dg.DagsterInstance | None,
    storage,
    vector_store=None,
    graph_store=None,
) -> dict:
    """Remove a document's rows, files, Qdrant points, graph nodes/mentions (entities stay while other documents
    mention them) and its Dagster partitions. Outputs go first: if anything fails midway, the rows still say what
    to clean, and running it again finishes the job."""
    document_id = str(document["id"])
    keys = lifecycle.partition_keys_of(queue, document_id)
    removed = {"points": 0, "files": 0, "partitions": 0}
    if vector_store is not None:
        removed["points"] = vector_store.count(document_id)
        vector_store.delete_document(document_id)
    if graph_store is not None:
        graph_store.delete_document(document_id)
    if document.get("document_key"):
        removed["files"] += storage.delete_prefix(document["document_key"])
    if document.get("storage_key") and storage.exists(document["storage_key"]):
        removed["files"] += storage.delete_prefix(document["storage_key"])
    lifecycle.delete_rows(queue, document_id)
    if instance is not None:
        for level, partition_keys in keys.items():
            for key in partition_keys:
                instance.delete_dynamic_partition(PARTITION_DEFS[level], key)
            removed["partitions"] += len(partition_keys)
    return removed


class TenantBusy(RuntimeError):
    """The tenant has tasks running: deleting now would pull rows from under workers."""


def delete_tenant(
    queue: TaskQueue,
    tenant: str,
    *,
    instance: dg.DagsterInstance | None,
    storage,
    vector_store=None,
    graph_store=None,
    batch: int = default(TenantConfig, "delete_batch"),
) -> dict:
    """Remove every document of `tenant` everywhere (delete_everywhere, each), `batch` documents at a time
    (DOCQUEUE_DELETE_BATCH: the caller passes its setting). Refused while any of its tasks runs. Each document's rows
    go last, so an interrupted delete leaves only whole documents and running it again finishes the job; a tenant
    with nothing left is done."""
    tenant = checked_tenant(tenant)
    removed = {"documents": 0, "points": 0, "files": 0, "partitions": 0}
    while True:
        running = lifecycle.tenant_running_tasks(queue, tenant)
        if running:
            raise TenantBusy(
                f"{running} of its task(s) are running; wait for them or recover them first "
                f"({removed['documents']} document(s) deleted so far)"
            )
        documents = lifecycle.tenant_documents(queue, tenant, batch)
        if not documents:
            return removed
        for document in documents:
            for counter, n in delete_everywhere(
                queue, document, instance=instance, storage=storage, vector_store=vector_store, graph_store=graph_store
            ).items():
                removed[counter] += n
            removed["documents"] += 1
        log.info("tenant %s: %d document(s) deleted", tenant, removed["documents"])


def retire_superseded(queue: TaskQueue, *, instance, storage, vector_store=None, graph_store=None) -> list[dict]:
    """Remove old versions whose replacement completed every phase."""
    retired = []
    for old in lifecycle.superseded_ready_for_removal(queue):
        document = queue.document(old["id"])
        if document is None:
            continue
        try:
            delete_everywhere(
                queue, document, instance=instance, storage=storage, vector_store=vector_store, graph_store=graph_store
            )
            retired.append(old)
        except RuntimeError as exc:  # a task of the old version is still running: next time
            log.warning("old version %s not retired yet: %s", old["document_key"], exc)
    return retired
