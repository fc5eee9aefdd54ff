"""Versions, deletion and re-indexing, end to end against the real stores (issue: other queue designs' features)."""

from __future__ import annotations

import dagster as dg
import pytest

from queue_db.lifecycle import hidden_from_search, reset_phase
from queue_db.phases import Level, Phase
from tests import pdf_factory as pf

V1 = [["# Beekeeping Notes", "The queen bee lays eggs in the wax comb while workers gather nectar from clover."]]
V2 = [["# Volcano Notes", "Molten lava erupted from the summit crater and ash drifted over the valley."]]


@pytest.fixture
def env(docqueue_env, tmp_path):
    from orchestration.code_location import build_definitions
    from queue_db.config import Settings as _Settings

    # built here, with this test's environment: the resources carry its home and stores
    defs = build_definitions(_Settings.from_env())
    from orchestration.environment import dagster_instance
    from queue_db.config import Settings
    from resources.database import open_queue
    from resources.embedding_resource import EmbeddingResource
    from resources.graph_stores import Neo4jResource
    from resources.storage_resource import StorageResource
    from resources.vector_resource import QdrantResource

    instance = dagster_instance(Settings.from_env())
    embedder = EmbeddingResource.from_settings(Settings.from_env()).get_embedder()
    stores = {
        "queue": open_queue(Settings.from_env()),
        "storage": StorageResource.from_settings(Settings.from_env()).get_storage(),
        "instance": instance,
        "defs": defs,
        "embedder": embedder,
        "qdrant": lambda: QdrantResource.from_settings(Settings.from_env()).get_store(embedder.model_id, embedder.dim),
        "graph": lambda: Neo4jResource.from_settings(Settings.from_env()).get_store(),
        "tmp": tmp_path,
    }
    yield stores
    instance.dispose()


def ingest(env, paths):
    from orchestration.intake import ingest_paths
    from orchestration.partitions import register_partitions

    results = ingest_paths(env["queue"], env["storage"], paths)
    register_partitions(env["instance"], env["queue"].engine, Level.DOCUMENT)
    return results


def run(env):
    from orchestration.runner import run_until_idle
    from queue_db.config import Settings

    return run_until_idle(
        env["defs"], env["instance"], env["queue"], settings=Settings.from_env(), until_idle=True, max_seconds=600
    )


def search_documents(env, text: str) -> list[str]:
    store = env["qdrant"]()
    try:
        hits = store.search(
            env["embedder"].embed_one(text), limit=5, exclude_document_ids=hidden_from_search(env["queue"])
        )
    finally:
        store.close()
    return [h.payload["document_id"] for h in hits]


def test_a_changed_file_is_a_new_version_that_replaces_the_old_once_indexed(env):
    path = pf.text_pdf(env["tmp"], "notes.pdf", V1)
    [first] = ingest(env, [path])
    assert first.status == "new"
    run(env)
    assert set(search_documents(env, "queen bee honey comb")) == {first.document_id}

    pf.text_pdf(env["tmp"], "notes.pdf", V2)  # same path, new content
    [second] = ingest(env, [path])
    assert second.status == "new-version" and second.document_id != first.document_id
    # until the new version is indexed, search shows only the old one (never both, never neither)
    assert hidden_from_search(env["queue"]) == [second.document_id]
    assert set(search_documents(env, "lava erupted from the crater")) == {first.document_id}

    run(env)
    queue = env["queue"]
    assert queue.document(first.document_id) is None, "the old version was not retired"
    assert set(search_documents(env, "lava erupted from the crater")) == {second.document_id}
    store = env["qdrant"]()
    try:
        assert store.count(first.document_id) == 0 and store.count(second.document_id) >= 1
    finally:
        store.close()
    graph = env["graph"]()
    try:
        assert not graph.chunk_ids_with_writes(first.document_id)
    finally:
        graph.close()
    assert first.document_key not in env["instance"].get_dynamic_partitions("documents")
    assert not [k for k in env["instance"].get_dynamic_partitions("pages") if k.startswith(first.document_key)]


def test_delete_removes_everything_but_shared_entities(env):
    from orchestration.store_cleanup import delete_everywhere

    shared = "Marie Curie worked in Paris."
    a = pf.text_pdf(env["tmp"], "a.pdf", [["# A", shared + " She studied radium with Pierre Curie."]])
    b = pf.text_pdf(env["tmp"], "b.pdf", [["# B", shared + " The Sorbonne honoured her."]])
    first, second = ingest(env, [a, b])
    run(env)
    queue = env["queue"]
    store, graph = env["qdrant"](), env["graph"]()
    try:
        before = store.count()
        doc = queue.document(first.document_id)
        removed = delete_everywhere(
            queue, doc, instance=env["instance"], storage=env["storage"], vector_store=store, graph_store=graph
        )
        assert removed["points"] >= 1 and removed["partitions"] >= 3
        assert queue.document(first.document_id) is None
        assert queue.chunks(document_id=first.document_id) == []
        assert store.count(first.document_id) == 0 and store.count() == before - removed["points"]
        assert not graph.chunk_ids_with_writes(first.document_id)
        paris = graph.entity("Paris")
        assert paris is not None, "an entity another document mentions must stay"
        assert {m["document_id"] for m in paris["mentions"]} == {second.document_id}
        assert not env["storage"].exists(doc["storage_key"])
        assert doc["document_key"] not in env["instance"].get_dynamic_partitions("documents")
        assert queue.document(second.document_id)["graphrag_index_status"] == "completed"
    finally:
        store.close()
        graph.close()


def test_reindex_keeps_ocr_and_never_duplicates(env):
    path = pf.text_pdf(
        env["tmp"],
        "r.pdf",
        [
            ["# Report", "Ada Lovelace met Charles Babbage in London."],
            ["## More", "The Analytical Engine was designed in England."],
        ],
    )
    [doc] = ingest(env, [path])
    run(env)
    queue = env["queue"]
    ocr_done = {p["id"]: p["ocr_completed_at"] for p in queue.pages(doc.document_id)}
    store, graph = env["qdrant"](), env["graph"]()
    try:
        points, counts = store.count(), graph.counts()
    finally:
        store.close()
        graph.close()
    reset = reset_phase(queue, Phase.VECTOR, doc.document_id)
    assert reset["chunks"] >= 2
    assert queue.document(doc.document_id)["vector_index_status"] == "pending"
    run(env)
    row = queue.document(doc.document_id)
    assert (row["vector_index_status"], row["graphrag_index_status"]) == ("completed", "completed")
    assert {p["id"]: p["ocr_completed_at"] for p in queue.pages(doc.document_id)} == ocr_done, "OCR was redone"
    store, graph = env["qdrant"](), env["graph"]()
    try:
        assert store.count() == points
        assert graph.counts() == counts and not graph.duplicate_entities()
    finally:
        store.close()
        graph.close()
    status = env["instance"].get_status_by_partition(
        dg.AssetKey("vector_chunk"),
        env["instance"].get_dynamic_partitions("chunks"),
        dg.DynamicPartitionsDefinition(name="chunks"),
    )
    assert set(status.values()) == {dg.AssetPartitionStatus.MATERIALIZED}
