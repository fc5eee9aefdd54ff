"""A phase is one definition, on the Dagster side: the `summary` phase of test_fourth_phase.py (its PhaseSpec in a
registry) and one handler entry are all the definitions need. Built with them, the code location has the phase's
asset on the `chunks` partitions, its job and sensor, its roll-up; the sensor requests a ranged run for the ready
summary tasks, and the run materializes each of their partitions through the handler. Nothing in orchestration
names the phase.
"""

from __future__ import annotations

from typing import Sequence

import dagster as dg
import pytest

from orchestration.assets.handlers import HANDLERS, KindWork
from orchestration.code_location import build_definitions
from orchestration.partitions import register_partitions
from orchestration.planning import KIND_TAG, PHASE_TAG, RANGE_END_TAG, RANGE_START_TAG
from orchestration.task_outcomes import Outcome
from queue_db.config import Settings
from queue_db.keys import chunk_partition_key
from queue_db.migrate import upgrade
from queue_db.phases import GRAPHRAG_CHUNK, Level
from queue_db.queue import TaskQueue, make_worker_id
from queue_db.run_costs import run_costs
from tests.integration.test_fourth_phase import REGISTRY, SUMMARY, SUMMARY_CHUNK, _graph_indexed, summarize
from tests.integration.test_sensors import tick


def summarize_chunks(pipeline, worker_id: str, tasks: Sequence[dict]) -> list[Outcome]:
    """The trivial handler: each claimed chunk's summary completed through the queue (fenced)."""
    results = [summarize(task) for task in tasks]
    rejected = set(pipeline.queue.complete(SUMMARY_CHUNK, worker_id, results).rejected)
    return [
        Outcome(r["id"], True, rejected=r["id"] in rejected, metadata={"summary_chars": len(r["summary_text"])})
        for r in results
    ]


# the phase's handler entry: the only line of orchestration the phase adds
SUMMARY_HANDLERS = {**HANDLERS, SUMMARY.handler: {Level.CHUNK: KindWork(summarize_chunks)}}


@pytest.fixture
def summary_env(docqueue_env):
    """The docqueue environment's queue database upgraded for the four phases, its Dagster instance, and the
    definitions built with them."""
    from orchestration.environment import dagster_instance
    from resources.database import open_queue

    base = open_queue(Settings.from_env())
    upgrade(base.engine, phases=REGISTRY)
    queue = TaskQueue(base.engine, base.settings, phases=REGISTRY)
    defs = build_definitions(Settings.from_env(), phases=REGISTRY, handlers=SUMMARY_HANDLERS)
    instance = dagster_instance(Settings.from_env())
    yield defs, instance, queue
    instance.dispose()


def _materialized(instance, asset: str) -> set[str]:
    records = instance.fetch_materializations(dg.AssetKey(asset), limit=1000).records
    return {record.partition_key for record in records}


def test_the_spec_and_its_handler_make_the_phase_s_dagster_objects():
    defs = build_definitions(Settings.from_env(), phases=REGISTRY, handlers=SUMMARY_HANDLERS)
    dg.Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    node = graph.get(dg.AssetKey("summary_chunk"))
    assert node.partitions_def.name == "chunks" and node.group_name == "summary"
    assert node.tags["docqueue/phase"] == "summary" and node.pools == {"summary"}
    assert {p.to_user_string() for p in node.parent_keys} == {GRAPHRAG_CHUNK.name}
    assets = {key.to_user_string(): assets_def for assets_def in defs.assets for key in assets_def.keys}
    assert assets["summary_chunk"].op.tags["dagster-celery/queue"] == "summary"
    rollup = graph.get(dg.AssetKey("summary_document_rollup"))
    assert rollup.partitions_def.name == "documents"
    assert {p.to_user_string() for p in rollup.parent_keys} == {"summary_chunk"}
    assert defs.resolve_job_def("summary_chunk_job").tags["docqueue/phase"] == "summary"
    assert defs.resolve_job_def("rollup_summary_job")
    assert defs.get_sensor_def("summary_chunk_sensor").job_name == "summary_chunk_job"
    assert defs.get_sensor_def("rollup_summary_sensor").job_name == "rollup_summary_job"
    # the last phase's roll-up retires old versions: it moved to the summary phase's
    assert (
        "Old versions" in assets["summary_document_rollup"].descriptions_by_key[dg.AssetKey("summary_document_rollup")]
    )
    # the default definitions are untouched by the extra registry
    default = build_definitions(Settings.from_env())
    assert not default.resolve_asset_graph().has(dg.AssetKey("summary_chunk"))


def _keys(instance, request: dg.RunRequest) -> list[str]:
    chunks = dg.DynamicPartitionsDefinition(name="chunks")
    with dg.partition_loading_context(dynamic_partitions_store=instance):
        return chunks.get_partition_keys_in_range(
            dg.PartitionKeyRange(request.tags[RANGE_START_TAG], request.tags[RANGE_END_TAG])
        )


def _run(defs, instance, job: str, sensor: str, request: dg.RunRequest) -> bool:
    """The requested run, executed as the daemon launches it (tagged with its sensor)."""
    return (
        defs.resolve_job_def(job)
        .execute_in_process(instance=instance, tags={**request.tags, "dagster/sensor_name": sensor})
        .success
    )


def test_the_sensor_requests_ranged_runs_that_materialize_the_ready_summaries(summary_env):
    defs, instance, queue = summary_env
    doc = _graph_indexed(queue, pages=2, chunks_per_page=2, graph=3)  # one chunk still waits for GraphRAG
    with queue.engine.connect() as conn:
        ready = {
            chunk_partition_key(*r)
            for r in conn.exec_driver_sql(
                "SELECT d.document_key, p.page_number, c.chunk_index FROM task_queue_chunk c "
                "JOIN task_queue_page p ON p.id = c.page_id JOIN documents d ON d.id = c.document_id "
                "WHERE c.graphrag_status = 'completed'"
            )
        }

    requests = tick(defs, instance, "summary_chunk_sensor").run_requests

    assert requests and all(r.tags[KIND_TAG] == "summary_chunk" and r.tags[PHASE_TAG] == "summary" for r in requests)
    requested = [key for request in requests for key in _keys(instance, request)]
    assert sorted(requested) == sorted(ready) and len(ready) == 3
    for request in requests:
        assert _run(defs, instance, "summary_chunk_job", "summary_chunk_sensor", request)
    assert _materialized(instance, "summary_chunk") == set(requested)
    with queue.engine.connect() as conn:
        summarized = conn.exec_driver_sql(
            "SELECT count(*) FROM task_queue_chunk WHERE summary_status = 'completed' AND summary_text IS NOT NULL"
        ).scalar()
    assert summarized == 3
    # every run measured its cost for the planners: a row for the new kind, as for any other
    cost = run_costs(queue.engine)["summary_chunk"]
    assert cost.runs == len(requests) and cost.key_seconds > 0 and cost.overhead_seconds >= 0
    assert not tick(defs, instance, "summary_chunk_sensor").run_requests  # nothing ready is left
    assert not tick(defs, instance, "rollup_summary_sensor").run_requests  # the document's phase is open

    # the last chunk through GraphRAG, then through its summary: the document's phase rolls up
    worker = make_worker_id("graph")
    [last] = queue.claim(GRAPHRAG_CHUNK, worker, 1)
    queue.complete(GRAPHRAG_CHUNK, worker, [last["id"]])
    [request] = tick(defs, instance, "summary_chunk_sensor").run_requests
    assert _run(defs, instance, "summary_chunk_job", "summary_chunk_sensor", request)
    assert queue.document(str(doc["id"]))["summary_status"] == "completed"
    register_partitions(instance, queue.engine, Level.DOCUMENT)  # as the intake sensors do for a new document
    [rollup] = tick(defs, instance, "rollup_summary_sensor").run_requests
    assert _run(defs, instance, "rollup_summary_job", "rollup_summary_sensor", rollup)
    assert _materialized(instance, "summary_document_rollup") == {doc["document_key"]}
