"""Run planning against a real queue: a planning round reads only as many ready tasks as its runs can hold, yet
ranges already in flight and other runners' blocks never crowd out the runs it should plan."""

from __future__ import annotations

import dagster as dg

from orchestration.planning import (
    KIND_TAG,
    SPAN_TAG,
    RunSizing,
    candidate_limit,
    in_flight_by_name,
    in_flight_positions,
    plan_help_run,
    plan_runs,
)
from queue_db.keys import chunk_partition_key
from queue_db.partition_keys import BlockShare
from queue_db.phases import VECTOR_CHUNK
from queue_db.run_costs import RunCost
from tests.queue_support import bulk_seed


def _seed(engine) -> None:
    """400 pending chunks of four one-page documents: documents 1-2 in registration block 10 (positions 0-199),
    3-4 in block 11; block 10 is the more urgent, and within a block the claim order is the position order."""
    bulk_seed(engine, 4, 1, 100)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            """UPDATE task_queue_chunk c
               SET partition_block = CASE WHEN d.rn <= 2 THEN 10 ELSE 11 END,
                   partition_pos = ((d.rn - 1) %% 2) * 100 + c.chunk_index,
                   priority = CASE WHEN d.rn <= 2 THEN 5 ELSE 0 END,
                   created_at = timestamp '2026-01-01' + (((d.rn - 1) %% 2) * 100 + c.chunk_index) * interval '1 s'
               FROM (SELECT id, row_number() OVER (ORDER BY document_key) AS rn FROM documents) d
               WHERE c.document_id = d.id"""
        )


def _key(engine, block: int, pos: int) -> str:
    with engine.connect() as conn:
        row = conn.exec_driver_sql(
            """SELECT d.document_key, p.page_number, c.chunk_index FROM task_queue_chunk c
               JOIN documents d ON d.id = c.document_id JOIN task_queue_page p ON p.id = c.page_id
               WHERE c.partition_block = %(b)s AND c.partition_pos = %(p)s""",
            {"b": block, "p": pos},
        ).one()
    return chunk_partition_key(*row)


def test_candidate_limit_is_full_runs_plus_what_ranges_in_flight_may_cover():
    assert candidate_limit(10, 1000, None) == 10_000
    assert candidate_limit(4, 50, {10: [(0, 149), (300, 309)], 11: [(5, 5)]}) == 200 + 150 + 10 + 1


def test_each_runner_plans_its_own_blocks_though_another_runners_are_more_urgent(engine):
    _seed(engine)  # blocks without a recorded size (registered before migration 0029) go whole to one runner
    # one run of 50 reads 50 candidates: the 50 most urgent of all are block 10's, so the runner sharing the odd
    # blocks finds its own only because the share is applied by the query
    [odd] = plan_runs(engine, VECTOR_CHUNK, max_keys=50, max_runs=1, share=BlockShare(2, 1))
    [even] = plan_runs(engine, VECTOR_CHUNK, max_keys=50, max_runs=1, share=BlockShare(2, 0))
    assert (odd.block, odd.start_pos, odd.end_pos, odd.size) == (11, 0, 49, 50)
    assert (even.block, even.start_pos, even.end_pos, even.size) == (10, 0, 49, 50)
    assert (odd.start_key, odd.end_key) == (_key(engine, 11, 0), _key(engine, 11, 49))


def test_runners_split_a_block_whose_size_is_recorded_into_contiguous_shares(engine):
    _seed(engine)
    with engine.begin() as conn:  # what record_block writes when it registers a block
        conn.exec_driver_sql("INSERT INTO partition_blocks (block, size) VALUES (10, 200), (11, 200)")
    # both runners plan from the most urgent block, each from its own half of it, not one runner from each block
    even = plan_runs(engine, VECTOR_CHUNK, max_keys=50, max_runs=3, share=BlockShare(2, 0))
    odd = plan_runs(engine, VECTOR_CHUNK, max_keys=50, max_runs=3, share=BlockShare(2, 1))
    assert [(r.block, r.start_pos, r.end_pos) for r in even] == [(10, 0, 49), (10, 50, 99), (11, 100, 149)]
    assert [(r.block, r.start_pos, r.end_pos) for r in odd] == [(10, 100, 149), (10, 150, 199), (11, 0, 49)]
    # a block too small to split (under 2 x a quarter of a 50-key run) goes whole to one runner, by its id
    three = [BlockShare(3, i) for i in range(3)]
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE partition_blocks SET size = 1")
        conn.exec_driver_sql("UPDATE task_queue_chunk SET partition_pos = 0 WHERE partition_pos > 0")
    owners = [[bool(plan_runs(engine, VECTOR_CHUNK, max_keys=50, max_runs=2, share=s)) for s in three]]
    assert owners == [[False, True, True]]  # block 10 % 3 = 1, block 11 % 3 = 2


def test_ranges_in_flight_do_not_crowd_out_the_runs_a_tick_asks_for(engine):
    _seed(engine)
    in_flight = {10: [(0, 149)]}  # the 150 most urgent tasks are covered by a queued run
    runs = plan_runs(engine, VECTOR_CHUNK, max_keys=50, max_runs=2, in_flight=in_flight)
    assert [(r.block, r.start_pos, r.end_pos) for r in runs] == [(10, 150, 199), (11, 0, 49)]
    assert [(r.start_key, r.end_key) for r in runs] == [
        (_key(engine, 10, 150), _key(engine, 10, 199)),
        (_key(engine, 11, 0), _key(engine, 11, 49)),
    ]


def test_help_takes_the_second_half_of_the_unclaimed_tasks_of_the_range_with_most(engine):
    _seed(engine)
    with engine.begin() as conn:  # the sibling's run over block 10's positions 0-149 has claimed 0-49
        conn.exec_driver_sql(
            "UPDATE task_queue_chunk SET vector_status = 'processing', vector_worker_id = 'run:sibling:w', "
            "vector_last_heartbeat = now() WHERE partition_block = 10 AND partition_pos < 50"
        )
    in_flight = {10: [(0, 149)], 11: [(0, 19)]}
    run = plan_help_run(engine, VECTOR_CHUNK, in_flight, max_keys=1000, least=10)
    assert (run.block, run.start_pos, run.end_pos, run.size) == (10, 100, 149, 50)
    assert (run.start_key, run.end_key) == (_key(engine, 10, 100), _key(engine, 10, 149))
    # at most a run's keys; nothing worth a run; nothing in flight
    assert (plan_help_run(engine, VECTOR_CHUNK, in_flight, max_keys=20, least=10).start_pos) == 130
    assert plan_help_run(engine, VECTOR_CHUNK, in_flight, max_keys=1000, least=51) is None
    assert plan_help_run(engine, VECTOR_CHUNK, {}, max_keys=1000, least=1) is None


def test_a_measured_kind_splits_a_block_whose_shares_each_pay_for_a_run(engine):
    """Unmeasured, a block is split only when each share holds a quarter of a full run (1,000 chunk keys: 250);
    measured, when each share's work pays a run's fixed cost (0.3 s at 10 ms a key: 30 keys)."""
    _seed(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO partition_blocks (block, size) VALUES (10, 200), (11, 200)")
    shares = [BlockShare(2, 0), BlockShare(2, 1)]
    unmeasured = [plan_runs(engine, VECTOR_CHUNK, max_keys=1000, max_runs=3, share=s) for s in shares]
    assert [[(r.block, r.start_pos, r.end_pos) for r in runs] for runs in unmeasured] == [
        [(10, 0, 199)],
        [(11, 0, 199)],
    ]
    sizing = RunSizing(RunCost(key_seconds=0.01, overhead_seconds=0.3), overhead_share=0.05)
    measured = [plan_runs(engine, VECTOR_CHUNK, max_keys=1000, max_runs=3, share=s, sizing=sizing) for s in shares]
    assert [[(r.block, r.start_pos, r.end_pos) for r in runs] for runs in measured] == [
        [(10, 0, 99), (11, 100, 199)],
        [(10, 100, 199), (11, 0, 99)],
    ]


def test_the_runs_in_flight_of_every_kind_are_read_at_once():
    """plan_next reads every kind's and roll-up's runs in flight in one query of the run storage, grouped as each
    kind's own read groups them; ended runs, runs of names not asked for, and runs without a span are left out."""
    with dg.DagsterInstance.ephemeral() as instance:
        runs = [
            ("vector_chunk", "10:0-49", dg.DagsterRunStatus.STARTED),
            ("vector_chunk", "10:50-99", dg.DagsterRunStatus.NOT_STARTED),
            ("vector_chunk", "11:0-9", dg.DagsterRunStatus.SUCCESS),
            ("rollup_vector", "3:0-19", dg.DagsterRunStatus.STARTING),
            ("graphrag_chunk", "10:0-49", dg.DagsterRunStatus.STARTED),
            ("ocr_page", None, dg.DagsterRunStatus.STARTED),
        ]
        for name, span, status in runs:
            tags = {KIND_TAG: name, **({SPAN_TAG: span} if span else {})}
            instance.add_run(dg.DagsterRun(job_name=f"{name}_job", status=status, tags=tags))
        found = in_flight_by_name(instance, ["vector_chunk", "rollup_vector", "ocr_page", "vector_page"])
        assert _sorted(found) == {"vector_chunk": {10: [(0, 49), (50, 99)]}, "rollup_vector": {3: [(0, 19)]}}
        for name in ("vector_chunk", "rollup_vector", "ocr_page", "vector_page", "graphrag_chunk"):
            by_itself = _sorted({name: in_flight_positions(instance, name)})[name]
            assert by_itself == ({10: [(0, 49)]} if name == "graphrag_chunk" else _sorted(found).get(name, {}))


def _sorted(by_name: dict) -> dict:
    return {name: {block: sorted(ranges) for block, ranges in blocks.items()} for name, blocks in by_name.items()}
