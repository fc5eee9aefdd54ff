"""The claim cursor (queue_db.claim_cursor): a queue object's claims start after the last task it claimed, go round
from the head when the rows after it run short, and start at the head again at most claim_rescan_s apart."""

from __future__ import annotations

import dataclasses
import time

import pytest

from queue_db.phases import VECTOR_CHUNK
from queue_db.queue import TaskQueue, make_worker_id
from tests.queue_support import bulk_seed


@pytest.fixture
def seeded(engine):
    bulk_seed(engine, 1, 2, 10)  # 20 chunks waiting for their vectors
    return engine


def _queue(engine, settings, rescan_s: float) -> TaskQueue:
    return TaskQueue(engine, dataclasses.replace(settings, claim_rescan_s=rescan_s))


def _ids(rows: list[dict]) -> set[str]:
    return {row["id"] for row in rows}


def _in_claim_order(engine) -> list[str]:
    with engine.connect() as conn:
        return [
            str(r[0])
            for r in conn.exec_driver_sql(
                f"SELECT t.id FROM task_queue_chunk t ORDER BY {VECTOR_CHUNK.claim_order_sql('t')}"
            )
        ]


def _set(engine, sql: str, ids: list[str]) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(f"UPDATE task_queue_chunk SET {sql} WHERE id = ANY(%(ids)s::uuid[])", {"ids": ids})


def test_claims_follow_the_claim_order_and_return_no_claim_key(seeded, settings):
    queue, worker = _queue(seeded, settings, 3600.0), make_worker_id("cursor")
    order = _in_claim_order(seeded)
    first, second = queue.claim(VECTOR_CHUNK, worker, 5), queue.claim(VECTOR_CHUNK, worker, 5)
    assert _ids(first) == set(order[:5]) and _ids(second) == set(order[5:10])
    assert all("claim_key" not in row for row in first + second)


def test_a_claim_after_the_cursor_goes_round_to_the_head_when_the_rows_after_it_run_short(seeded, settings):
    queue, worker = _queue(seeded, settings, 3600.0), make_worker_id("cursor")
    order = _in_claim_order(seeded)
    first = queue.claim(VECTOR_CHUNK, worker, 5)
    assert queue.complete(VECTOR_CHUNK, worker, sorted(_ids(first))).applied
    _set(seeded, "vector_status = 'pending'", order[1:3])  # two tasks before the cursor are claimable again
    rest = queue.claim(VECTOR_CHUNK, worker, 50)
    assert _ids(rest) == set(order[5:]) | set(order[1:3]), "every claimable row is in one of the two laps"
    assert len(rest) == 17
    assert queue.claim(VECTOR_CHUNK, worker, 50) == []


def test_a_task_that_came_before_the_cursor_waits_at_most_claim_rescan_s(seeded, settings):
    queue, worker = _queue(seeded, settings, 0.5), make_worker_id("cursor")
    order = _in_claim_order(seeded)
    queue.claim(VECTOR_CHUNK, worker, 5)
    _set(seeded, "priority = 5", [order[-1]])  # now first in the claim order, before the cursor
    assert _ids(queue.claim(VECTOR_CHUNK, worker, 1)) == {order[5]}, "the next claim goes on after the cursor"
    time.sleep(0.6)
    assert _ids(queue.claim(VECTOR_CHUNK, worker, 1)) == {order[-1]}, "a claim from the head takes it"
    # another queue object (another worker's process) has no cursor: its first claim starts at the head
    _set(seeded, "priority = 6", [order[-2]])
    assert _ids(_queue(seeded, settings, 0.5).claim(VECTOR_CHUNK, make_worker_id("other"), 1)) == {order[-2]}


def test_a_task_failed_by_a_settle_is_claimed_first_by_its_claim(seeded, settings):
    queue, worker = _queue(seeded, settings, 3600.0), make_worker_id("cursor")  # the fixture has no back-off
    held = sorted(_ids(queue.claim(VECTOR_CHUNK, worker, 5)))
    settled = queue.settle(
        VECTOR_CHUNK, worker, completed=held[1:], failed=[{"id": held[0], "error": "flaky"}], claim=1
    )
    assert _ids(settled.claimed) == {held[0]}, "failed rows sort first"
    queue.fail(VECTOR_CHUNK, worker, [{"id": held[0], "error": "flaky again"}])
    assert _ids(queue.claim(VECTOR_CHUNK, worker, 1)) == {held[0]}


def test_claims_of_given_ids_neither_use_nor_move_the_cursor(seeded, settings):
    queue, worker = _queue(seeded, settings, 3600.0), make_worker_id("cursor")
    order = _in_claim_order(seeded)
    queue.claim(VECTOR_CHUNK, worker, 5)
    assert _ids(queue.claim(VECTOR_CHUNK, worker, 5, only_ids=order[15:])) == set(order[15:])
    assert _ids(queue.claim(VECTOR_CHUNK, worker, 5)) == set(order[5:10])
