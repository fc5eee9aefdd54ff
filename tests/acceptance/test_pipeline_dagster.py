"""End to end through the Dagster definitions, in-process against a real instance: PDFs in, vectors and graph
out, and the instance's partition statuses tell exactly which tasks completed and which failed."""

from __future__ import annotations

import dagster as dg
import pytest

from queue_db.phases import Level
from tests import pdf_factory as pf


@pytest.fixture
def pipeline_env(docqueue_env, tmp_path):
    from orchestration.code_location import build_definitions
    from queue_db.config import Settings as _Settings

    # built here, with this test's environment: the resources carry its home and stores
    defs = build_definitions(_Settings.from_env())
    from orchestration.environment import dagster_instance
    from queue_db.config import Settings
    from resources.database import open_queue
    from resources.storage_resource import StorageResource

    instance = dagster_instance(Settings.from_env())
    queue = open_queue(Settings.from_env())
    storage = StorageResource.from_settings(Settings.from_env()).get_storage()
    yield defs, instance, queue, storage, tmp_path
    instance.dispose()


def _ingest(queue, storage, instance, paths):
    from orchestration.intake import ingest_paths
    from orchestration.partitions import register_partitions

    results = ingest_paths(queue, storage, paths)
    register_partitions(instance, queue.engine, Level.DOCUMENT)
    return results


def _status(instance, asset: str, partitions_def_name: str) -> dict[str, str]:
    """What the UI shows per partition: the instance's partition status (materialized / failed / missing)."""
    keys = instance.get_dynamic_partitions(partitions_def_name)
    statuses = (
        instance.get_status_by_partition(
            dg.AssetKey(asset), keys, dg.DynamicPartitionsDefinition(name=partitions_def_name)
        )
        or {}
    )
    names = {
        dg.AssetPartitionStatus.MATERIALIZED: "materialized",
        dg.AssetPartitionStatus.FAILED: "failed",
        dg.AssetPartitionStatus.IN_PROGRESS: "in progress",
    }
    return {k: names.get(statuses.get(k), "missing") for k in keys}


def test_documents_flow_through_every_phase_and_partitions_tell_the_truth(pipeline_env):
    from orchestration.runner import run_until_idle
    from orchestration.verify import verify_stores
    from queue_db.config import Settings
    from resources.graph_stores import Neo4jResource

    defs, instance, queue, storage, tmp = pipeline_env
    good = pf.text_pdf(
        tmp,
        "report.pdf",
        [
            ["# Annual Report", "Ada Lovelace founded the Analytical Society in London."],
            ["## Finance", "Revenue grew in Paris and Berlin."],
        ],
    )
    broken = pf.truncated_pdf(tmp)
    results = _ingest(queue, storage, instance, [good, broken])
    assert {r.status for r in results} == {"new"}

    report = run_until_idle(defs, instance, queue, settings=Settings.from_env(), until_idle=True, max_seconds=600)
    assert report.runs >= 5
    # what the UI shows of a CLI run: who launched it, and the tags a person reads (range, kind, phase, process),
    # plus one internal tag each for planning and for the runner
    import dagster as dg

    for run in instance.get_runs(filters=dg.RunsFilter(tags={"docqueue/kind": "ocr_page"})):
        ours = {k for k in run.tags if not k.startswith("dagster/") and not k.startswith(".dagster/")}
        assert ours == {
            "docqueue/kind",
            "docqueue/phase",
            "docqueue/range",
            "docqueue/process",
            "docqueue/span",
            "docqueue/runner",
            "user",
        }, run.tags
        assert run.tags["docqueue/range"].endswith(("page)", "pages)")), run.tags
        assert run.tags["user"].endswith("(docqueue run)")

    good_doc = queue.document(results[0].document_id)
    assert (good_doc["ocr_status"], good_doc["vector_index_status"], good_doc["graphrag_index_status"]) == (
        "completed",
        "completed",
        "completed",
    )
    pages = _status(instance, "ocr_page", "pages")
    good_pages = {k: v for k, v in pages.items() if k.startswith(good_doc["document_key"])}
    assert good_pages and set(good_pages.values()) == {"materialized"}
    chunks = _status(instance, "vector_chunk", "chunks")
    assert chunks and set(chunks.values()) == {"materialized"}
    assert set(_status(instance, "graphrag_chunk", "chunks").values()) == {"materialized"}
    assert _status(instance, "graphrag_document_rollup", "documents")[good_doc["document_key"]] == "materialized"

    broken_doc = queue.document(results[1].document_id)
    assert broken_doc["ocr_status"] == "failed" and broken_doc["ocr_error"]
    broken_pages = {k: v for k, v in pages.items() if k.startswith(broken_doc["document_key"])}
    failed_tasks = {
        f"{broken_doc['document_key']}/p{p['page_number']:04d}"
        for p in queue.pages(broken_doc["id"])
        if p["ocr_status"] == "failed"
    }
    if broken_pages:  # a truncated file may open (with some pages) or not at all
        assert {k for k, v in broken_pages.items() if v == "failed"} == failed_tasks
    else:
        assert _status(instance, "ocr_document", "documents")[broken_doc["document_key"]] == "failed"

    graph = Neo4jResource.from_settings(Settings.from_env()).get_store()
    try:
        from queue_db.config import Settings
        from resources.embedding_resource import EmbeddingResource
        from resources.vector_resource import QdrantResource

        embedder = EmbeddingResource.from_settings(Settings.from_env()).get_embedder()
        store = QdrantResource.from_settings(Settings.from_env()).get_store(embedder.model_id, embedder.dim)
        try:
            verification = verify_stores(queue, store, graph)
        finally:
            store.close()
        assert verification.consistent, verification.as_dict()
        assert graph.entity("ada lovelace") is not None
    finally:
        graph.close()
