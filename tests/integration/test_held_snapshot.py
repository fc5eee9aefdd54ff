"""A session holding an old snapshot open (idle in transaction) must not make each claim, completion or heartbeat
cost more as tasks flow: none of the index entries of the tasks claimed or completed since can be marked dead, so a
statement that walks them (a claim from the claim index's head, a fence answered from the heartbeat index) costs
in proportion to the work done since the snapshot began. Counted in buffers (auto_explain), not in time."""

from __future__ import annotations

import dataclasses
import json

import psycopg
import pytest

from queue_db.phases import VECTOR_CHUNK
from queue_db.queue import TaskQueue, create_queue_engine, make_worker_id
from tests.queue_support import BUFFER_PLANS, bulk_seed, load_auto_explain

BATCH = 50
EARLY, LATE = 1_000, 12_000  # tasks settled under the snapshot when each sample is taken


def _buffers(node: dict, table: str) -> int:
    """Buffers of the plan's scans of `table` (with what runs under them: the claim's gate on the page table)."""
    own = node.get("Relation Name") == table and "Scan" in node["Node Type"]
    total = node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0) if own else 0
    return total + (0 if own else sum(_buffers(child, table) for child in node.get("Plans", [])))


@pytest.fixture
def traced_queue(database_url, settings):
    """A queue on one connection whose statements auto_explain reports (buffers, as JSON) to `plans`."""
    engine = create_queue_engine(database_url, pool_size=1, max_overflow=0)
    bulk_seed(engine, 15, 10, 100)
    raw = engine.raw_connection()
    pg = raw.driver_connection
    plans: list[dict] = []
    load_auto_explain(pg, *BUFFER_PLANS, on_skip=lambda: (raw.close(), engine.dispose()))
    pg.commit()

    def keep(diagnostic) -> None:
        message = diagnostic.message_primary or ""
        if "{" in message:
            plans.append(json.loads(message[message.index("{") :]))

    pg.add_notice_handler(keep)
    raw.close()
    # every claim after the first starts after the cursor: the claims from the head come in their own test below
    queue = TaskQueue(engine, dataclasses.replace(settings, claim_rescan_s=3600.0))
    yield queue, plans
    engine.dispose()


def _sample(queue: TaskQueue, plans: list[dict], worker: str, held: list[str]) -> tuple[list[str], dict[str, int]]:
    """Five settles (complete the batch in hand, claim the next) and a heartbeat: the most buffers each kind of
    statement spent scanning the chunk table."""
    plans.clear()
    for _ in range(5):
        queue.heartbeat(VECTOR_CHUNK, worker, held)
        held = [r["id"] for r in queue.settle(VECTOR_CHUNK, worker, completed=held, claim=BATCH).claimed]
    costs = {"claim": 0, "complete": 0, "heartbeat": 0}
    for plan in plans:
        text = plan.get("Query Text", "")
        what = (
            "claim"
            if "SKIP LOCKED" in text
            else "complete"
            if "jsonb_to_recordset" in text
            else "heartbeat"
            if "WITH mine AS" in text
            else None
        )
        if what:
            costs[what] = max(costs[what], _buffers(plan["Plan"], VECTOR_CHUNK.table))
    assert all(costs.values()), f"auto_explain showed no {[k for k, v in costs.items() if not v]}"
    return held, costs


def _settle_until(queue: TaskQueue, worker: str, held: list[str], done: int, target: int) -> tuple[list[str], int]:
    while done < target:
        result = queue.settle(VECTOR_CHUNK, worker, completed=held, claim=BATCH)
        done += len(result.completed.applied)
        held = [r["id"] for r in result.claimed]
        assert held, "the queue ran dry"
    return held, done


def test_hot_path_costs_no_more_as_tasks_flow_under_a_held_snapshot(traced_queue, database_url):
    queue, plans = traced_queue
    holder = psycopg.connect(database_url)
    holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    holder.execute("SELECT count(*) FROM documents").fetchone()  # the snapshot is taken here, then kept
    try:
        worker = make_worker_id("snapshot-test")
        held, done = _settle_until(queue, worker, [], 0, EARLY)
        held, early = _sample(queue, plans, worker, held)
        held, done = _settle_until(queue, worker, held, done, LATE)
        held, late = _sample(queue, plans, worker, held)
        # the snapshot was held throughout: every row version claimed or completed since it began is still there
        assert holder.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    finally:
        holder.rollback()
        holder.close()
    # 11,000 more tasks behind the snapshot: a statement that walked them would spend hundreds of buffers more
    # (a claim from the head visits a page per ~30 of them; a fence read from the heartbeat index one per ~10)
    for what in early:
        assert late[what] <= 1.5 * early[what] + 50, f"{what}: {early[what]} buffers at first, {late[what]} later"
