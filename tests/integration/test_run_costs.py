"""What runs cost, recorded per kind and read back by the planners (queue_db.run_costs, orchestration.planning)."""

from __future__ import annotations

import pytest

from orchestration.planning import RunSizing, plan_runs
from queue_db.phases import VECTOR_CHUNK
from queue_db.run_costs import NEWEST_WEIGHT, record_run_cost, run_costs
from tests.queue_support import bulk_seed


def test_a_kinds_figures_are_one_row_that_follows_its_runs(engine):
    assert run_costs(engine) == {}
    record_run_cost(engine, "ocr_page", keys=10, work_s=20.0, overhead_s=1.0)
    record_run_cost(engine, "ocr_page", keys=0, work_s=5.0, overhead_s=9.0)  # measures nothing: not recorded
    [cost] = run_costs(engine).values()
    assert (cost.key_seconds, cost.overhead_seconds, cost.runs) == (2.0, 1.0, 1)
    record_run_cost(engine, "ocr_page", keys=4, work_s=0.4, overhead_s=0.2)
    record_run_cost(engine, "vector_chunk", keys=100, work_s=2.0, overhead_s=0.3)
    costs = run_costs(engine)
    w = NEWEST_WEIGHT
    assert costs["ocr_page"].key_seconds == pytest.approx(2.0 * (1 - w) + 0.1 * w)
    assert costs["ocr_page"].overhead_seconds == pytest.approx(1.0 * (1 - w) + 0.2 * w)
    assert costs["ocr_page"].runs == 2
    assert costs["vector_chunk"].key_seconds == pytest.approx(0.02)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM run_costs").scalar() == 2


def test_planned_runs_take_the_size_the_measured_cost_asks_for(engine):
    bulk_seed(engine, 1, 1, 400)  # 400 ready chunks of one page, one registration block
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE task_queue_chunk SET partition_block = 1, partition_pos = chunk_index, "
            "created_at = timestamp '2026-01-01' + chunk_index * interval '1 s'"
        )
    unsized = plan_runs(engine, VECTOR_CHUNK, max_keys=1000, max_runs=10)
    assert [r.size for r in unsized] == [400]
    record_run_cost(engine, VECTOR_CHUNK.name, keys=10, work_s=10.0, overhead_s=0.5)  # 1 s a key
    sizing = RunSizing(run_costs(engine)[VECTOR_CHUNK.name], overhead_share=0.05)
    assert [r.size for r in plan_runs(engine, VECTOR_CHUNK, max_keys=1000, max_runs=3, sizing=sizing)] == [10] * 3
    # four slots and 400 keys ready: four runs of 100 rather than one of 400 (sized at 600 for 10 ms a key and the
    # least fixed cost, 0.3 s)
    record_run_cost(engine, "graphrag_chunk", keys=100, work_s=1.0, overhead_s=0.05)
    cheap = RunSizing(run_costs(engine)["graphrag_chunk"], overhead_share=0.05, slots=4)
    runs = plan_runs(engine, VECTOR_CHUNK, max_keys=1000, max_runs=10, sizing=cheap)
    assert [(r.start_pos, r.end_pos) for r in runs] == [(0, 99), (100, 199), (200, 299), (300, 399)]
    # two of the four slots taken by runs in flight: the rest is spread over the two left
    runs = plan_runs(
        engine, VECTOR_CHUNK, max_keys=1000, max_runs=10, sizing=cheap, in_flight={1: [(0, 99), (100, 199)]}
    )
    assert [(r.start_pos, r.end_pos) for r in runs] == [(200, 299), (300, 399)]


def test_a_pools_slots_are_its_limit_within_the_run_queues():
    from dagster._core.test_utils import instance_for_test

    from orchestration.planning import pool_slots

    overrides = {
        "concurrency": {"pools": {"granularity": "run", "default_limit": 1}, "runs": {"max_concurrent_runs": 3}}
    }
    with instance_for_test(overrides=overrides) as instance:
        assert pool_slots(instance, "vector") == 1  # the instance's default for pools
        instance.event_log_storage.set_concurrency_slots("vector", 4)
        assert pool_slots(instance, "vector") == 3  # no more than the run queue lets go at once
        instance.event_log_storage.set_concurrency_slots("vector", 2)
        assert pool_slots(instance, "vector") == 2
