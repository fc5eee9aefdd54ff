"""Deleting a document everywhere, and retiring old versions once their replacement is fully indexed."""
from __future__ import annotations

import logging

import dagster as dg

from queue_db import lifecycle
from queue_db.queue import TaskQueue
from orchestration.partitions import PARTITIONS_BY_LEVEL
from queue_db.tasks import Level

log = logging.getLogger(__name__)
PARTITION_DEFS = {"documents": PARTITIONS_BY_LEVEL[Level.DOCUMENT].name, "pages": PARTITIONS_BY_LEVEL[Level.PAGE].name,
                  "chunks": PARTITIONS_BY_LEVEL[Level.CHUNK].name}


def delete_everywhere(queue: TaskQueue, document: dict, *, instance: dg.DagsterInstance | None, storage,
                      vector_store=None, graph_store=None) -> dict:
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


def retire_superseded(queue: TaskQueue, *, instance, storage, vector_store=None, graph_store=None) -> list[dict]:
    """Remove old versions whose replacement completed every phase."""
    retired = []
    for old in lifecycle.superseded_ready_for_removal(queue):
        document = queue.document(old["id"])
        if document is None:
            continue
        try:
            delete_everywhere(queue, document, instance=instance, storage=storage, vector_store=vector_store,
                              graph_store=graph_store)
            retired.append(old)
        except RuntimeError as exc:  # a task of the old version is still running: next time
            log.warning("old version %s not retired yet: %s", old["document_key"], exc)
    return retired
