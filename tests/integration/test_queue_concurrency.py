"""8 worker processes drain 20,000 chunk tasks: each completed exactly once, parents completed."""

from __future__ import annotations

import multiprocessing as mp
from collections import Counter

from queue_db.config import QueueSettings
from queue_db.phases import VECTOR_CHUNK
from queue_db.queue import TaskQueue, create_queue_engine, make_worker_id
from tests.queue_support import bulk_seed

WORKERS = 8
DOCUMENTS, PAGES, CHUNKS = 20, 10, 100  # 20,000 chunk tasks


def _drain(url: str, batch: int, out) -> None:
    engine = create_queue_engine(url, pool_size=1, max_overflow=1)
    queue = TaskQueue(engine, QueueSettings(retry_backoff_base_s=0))
    worker = make_worker_id("drain")
    claimed, applied = [], []
    empty_in_a_row = 0
    while empty_in_a_row < 3:
        tasks = queue.claim(VECTOR_CHUNK, worker, batch)
        if not tasks:
            empty_in_a_row += 1
            continue
        empty_in_a_row = 0
        ids = [t["id"] for t in tasks]
        claimed.extend(ids)
        result = queue.complete(VECTOR_CHUNK, worker, ids)
        applied.extend(result.applied)
        assert not result.rejected, result.rejected
    engine.dispose()
    out.put((worker, claimed, applied))


def test_eight_processes_complete_each_task_exactly_once(database_url, engine, queue):
    bulk_seed(engine, DOCUMENTS, PAGES, CHUNKS)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_drain, args=(database_url, 25, out)) for _ in range(WORKERS)]
    for p in procs:
        p.start()
    results = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    claimed = Counter(i for _, ids, _ in results for i in ids)
    applied = Counter(i for _, _, ids in results for i in ids)
    total = DOCUMENTS * PAGES * CHUNKS
    assert len(claimed) == total and max(claimed.values()) == 1, "a task was claimed twice"
    assert len(applied) == total and max(applied.values()) == 1
    assert sum(1 for _, ids, _ in results if ids) >= 2, "the work was not actually shared"
    _assert_vector_phase_completed_everywhere(engine, queue)


def _assert_vector_phase_completed_everywhere(engine, queue) -> None:
    """Every chunk, page and document completed the vector phase, and the roll-ups agree with their children."""
    with engine.connect() as conn:
        assert (
            conn.exec_driver_sql("SELECT count(*) FROM task_queue_chunk WHERE vector_status <> 'completed'").scalar()
            == 0
        )
        assert (
            conn.exec_driver_sql("SELECT count(*) FROM task_queue_page WHERE vector_status <> 'completed'").scalar()
            == 0
        )
        assert (
            conn.exec_driver_sql("SELECT count(*) FROM documents WHERE vector_index_status <> 'completed'").scalar()
            == 0
        )
    assert queue.reconcile() == []


def _drain_settling(url: str, batch: int, out) -> None:
    """A worker loop on TaskQueue.settle: each call settles the last batch (completing most of it, failing every
    seventh task on its first attempt) and claims the next one, in one transaction."""
    engine = create_queue_engine(url, pool_size=1, max_overflow=1)
    queue = TaskQueue(engine, QueueSettings(retry_backoff_base_s=0))
    worker = make_worker_id("settle")
    claimed, applied, failed = [], [], []
    held: list[dict] = []
    empty_in_a_row = 0
    while empty_in_a_row < 3:
        first_try_unlucky = [t for t in held if t["vector_retry_count"] == 0 and int(t["id"][-8:], 16) % 7 == 0]
        done = [t["id"] for t in held if t not in first_try_unlucky]
        result = queue.settle(
            VECTOR_CHUNK,
            worker,
            completed=done,
            claim=batch,
            failed=[{"id": t["id"], "error": "unlucky"} for t in first_try_unlucky],
        )
        assert not result.completed.rejected and not result.failed.rejected
        applied.extend(result.completed.applied)
        failed.extend(result.failed.applied)
        held = result.claimed
        claimed.extend(t["id"] for t in held)
        empty_in_a_row = 0 if held else empty_in_a_row + 1
    engine.dispose()
    out.put((worker, claimed, applied, failed))


def _deadlocks(engine) -> int:
    with engine.connect() as conn:
        return conn.exec_driver_sql(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        ).scalar()


def test_workers_settling_and_claiming_in_one_transaction_lose_nothing_and_never_deadlock(database_url, engine, queue):
    bulk_seed(engine, DOCUMENTS // 2, PAGES, CHUNKS)
    deadlocks_before = _deadlocks(engine)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_drain_settling, args=(database_url, 25, out)) for _ in range(WORKERS)]
    for p in procs:
        p.start()
    results = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    total = DOCUMENTS // 2 * PAGES * CHUNKS
    applied = Counter(i for _, _, ids, _ in results for i in ids)
    failed = Counter(i for _, _, _, ids in results for i in ids)
    claimed = Counter(i for _, ids, _, _ in results for i in ids)
    assert len(applied) == total and max(applied.values()) == 1, "a task was completed twice or never"
    assert failed and max(failed.values()) == 1, "every unlucky task failed once, then was retried"
    assert all(claimed[i] == 1 + failed[i] for i in claimed), "a task was claimed more often than it was attempted"
    assert sum(1 for _, ids, _, _ in results if ids) >= 2, "the work was not actually shared"
    _assert_vector_phase_completed_everywhere(engine, queue)
    assert _deadlocks(engine) == deadlocks_before, "parents must be locked in one order (pages, then documents)"
