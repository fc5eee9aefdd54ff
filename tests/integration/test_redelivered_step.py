"""A step delivered a second time (the Celery broker re-delivers the step of a worker machine that died, or, with
Redis, of one that outlived the visibility timeout) against the real queue: it waits for the tasks an earlier
delivery of the same run holds, takes them over only once their heartbeat is stale, and never takes over a live
holder's tasks."""

from __future__ import annotations

import threading
import time

from orchestration.assets.common import process_keys
from orchestration.task_outcomes import Outcome
from queue_db.phases import VECTOR_CHUNK
from queue_db.queue import make_worker_id
from tests.acceptance.test_daemon_backfill import chunk_rows
from tests.queue_support import build_document


class CompletingWork:
    """Stands in for orchestration.pipeline.Pipeline: completes what it is given through the real queue."""

    def __init__(self, queue):
        self.queue, self.seen = queue, []

    def process(self, kind, worker_id, tasks):
        ids = [str(t["id"]) for t in tasks]
        self.seen += ids
        rejected = set(self.queue.complete(kind, worker_id, ids).rejected)
        return [Outcome(i, True, rejected=i in rejected) for i in ids]


def _retries(queue, ids) -> dict[str, int]:
    with queue.engine.connect() as conn:
        return {
            r[0]: r[1]
            for r in conn.exec_driver_sql(
                "SELECT id::text, COALESCE(vector_retry_count, 0) FROM task_queue_chunk WHERE id::text = ANY(%(i)s)",
                {"i": list(ids)},
            ).all()
        }


def test_a_dead_earlier_delivery_is_waited_out_then_its_tasks_are_taken_over(queue):
    build_document(queue, pages=2, chunks_per_page=3)
    rows = chunk_rows(queue)
    keys, key_of = [r[1] for r in rows], {r[0]: r[1] for r in rows}
    dead = queue.claim(VECTOR_CHUNK, "run:11111111-2222-3333-4444-555555555555:other-host:1:deadbeef", 3)
    dead_ids = {str(t["id"]) for t in dead}
    work = CompletingWork(queue)
    started = time.monotonic()
    report = process_keys(
        queue,
        work,
        VECTOR_CHUNK,
        keys,
        make_worker_id("run:11111111-2222-3333-4444-555555555555"),
        override_retry_limit=False,
        run_prefix="run:11111111-2222-3333-4444-555555555555:",
    )
    waited = time.monotonic() - started
    assert sorted(report.completed) == sorted(keys) and not report.taken_elsewhere, report
    assert waited >= queue.settings.stale_timeout_s * 0.9, "the dead holder's tasks went stale before the takeover"
    assert _retries(queue, dead_ids) == {i: 1 for i in dead_ids}, "the lost attempt is counted"
    assert sorted(work.seen) == sorted(key_of), "each task processed once by this delivery"


def test_without_the_run_prefix_the_held_tasks_are_left_to_recovery(queue):
    build_document(queue, pages=1, chunks_per_page=3)
    keys = [r[1] for r in chunk_rows(queue)]
    queue.claim(VECTOR_CHUNK, "run:11111111-2222-3333-4444-555555555555:other-host:1:deadbeef", 2)
    report = process_keys(
        queue, CompletingWork(queue), VECTOR_CHUNK, keys, make_worker_id("plain"), override_retry_limit=False
    )
    assert len(report.completed) == 1 and len(report.taken_elsewhere) == 2


def test_a_live_earlier_delivery_keeps_its_tasks_and_finishes_them(queue):
    build_document(queue, pages=1, chunks_per_page=4)
    rows = chunk_rows(queue)
    keys = [r[1] for r in rows]
    holder = "run:aaaaaaaa-2222-3333-4444-555555555555:other-host:2:alive000"
    live = [str(t["id"]) for t in queue.claim(VECTOR_CHUNK, holder, 2)]
    stop = threading.Event()

    def first_delivery():
        # heartbeats past the stale timeout, then completes: slow, but alive
        deadline = time.monotonic() + 2 * queue.settings.stale_timeout_s
        while time.monotonic() < deadline and not stop.is_set():
            queue.heartbeat(VECTOR_CHUNK, holder, live)
            time.sleep(queue.settings.heartbeat_interval_s)
        queue.complete(VECTOR_CHUNK, holder, live)

    thread = threading.Thread(target=first_delivery, daemon=True)
    thread.start()
    work = CompletingWork(queue)
    try:
        report = process_keys(
            queue,
            work,
            VECTOR_CHUNK,
            keys,
            make_worker_id("run:aaaaaaaa-2222-3333-4444-555555555555"),
            override_retry_limit=False,
            run_prefix="run:aaaaaaaa-2222-3333-4444-555555555555:",
        )
    finally:
        stop.set()
        thread.join(10)
    assert not set(live) & set(work.seen), "a live holder's tasks are never taken over"
    key_of = {r[0]: r[1] for r in rows}
    assert sorted(report.already_completed) == sorted(key_of[i] for i in live)
    assert len(report.completed) == 2 and not report.taken_elsewhere
    assert _retries(queue, live) == {i: 0 for i in live}
