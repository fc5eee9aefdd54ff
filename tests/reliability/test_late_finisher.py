"""A late finisher after recovery: worker A claims chunks and freezes (SIGSTOP: a VM pause, a stopped process);
its heartbeat stops, recovery hands the chunks to worker B, B completes them; then A wakes up and finishes.
A's transitions are rejected and A writes nothing to Qdrant or the graph: B's result stands."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from orchestration.assets.handlers import process_tasks
from queue_db.phases import GRAPHRAG_CHUNK, OCR_DOCUMENT, OCR_PAGE, VECTOR_CHUNK, VECTOR_PAGE
from queue_db.queue import make_worker_id
from tests import pdf_factory as pf
from tests.reliability.support import Stores, figures_line, graph_duplicates, status_of, wait_for


def _advance(queue, pipeline, kinds) -> None:
    """Process every ready task of these kinds in this process (no Dagster: the setup is not under test)."""
    worker_id = make_worker_id("setup")
    for kind in kinds:
        while tasks := queue.claim(kind, worker_id, 100):
            outcomes = process_tasks(pipeline, kind, worker_id, tasks)
            assert all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok]


def _late_finisher_round(zygote, queue, pipeline, kind, tmp_path) -> dict:
    files = {name: str(tmp_path / f"{kind.name}-{name}") for name in ("claimed", "go", "result")}
    a = zygote.spawn(
        f"late-{kind.name}", tmp_path, target="tests.reliability.bodies:late_finisher", kind=kind.name, **files
    )
    claim = wait_for(
        lambda: os.path.exists(files["claimed"]) and json.loads(open(files["claimed"]).read()),
        120,
        what="worker A's claim",
    )
    assert claim["ids"], "worker A claimed nothing"
    os.kill(a.pid, signal.SIGSTOP)
    frozen_at = time.monotonic()
    wait_for(
        lambda: queue.recover_stale() and set(status_of(queue, kind, claim["ids"]).values()) == {"pending"},
        30,
        0.1,
        "A's tasks to be released",
    )
    released_after = time.monotonic() - frozen_at

    worker_b = make_worker_id("worker-b")
    taken = queue.claim(kind, worker_b, 1000)
    assert {t["id"] for t in taken} == set(claim["ids"])
    outcomes_b = process_tasks(pipeline, kind, worker_b, taken)
    assert all(o.ok and not o.rejected for o in outcomes_b)

    open(files["go"], "w").close()
    os.kill(a.pid, signal.SIGCONT)
    a.finish(120)
    result = json.loads(open(files["result"]).read())
    return {"claim": claim, "result": result, "worker_b": worker_b, "released_after_s": released_after}


@pytest.fixture(autouse=True)
def _shard_closed_between_writes(monkeypatch):
    # worker A is frozen right after its write: an embedded shard still open in its linger window would stay
    # locked until DOCQUEUE_QDRANT_LOCK_TIMEOUT, which is the lock's case, not the fence's this test is about
    monkeypatch.setenv("DOCQUEUE_QDRANT_LINGER", "0")


def test_a_late_finisher_is_rejected_and_the_new_owners_result_stands(pipeline, zygote, tmp_path, say):
    from orchestration.pipeline import Pipeline as Work
    from queue_db.config import Settings

    queue = pipeline.queue
    pipeline.ingest([pf.text_pdf(tmp_path, "report.pdf", [pf.DEMO_PAGE, pf.TWO_TOPICS["volcanoes"]])])
    work = Work.from_settings(queue, Settings.from_env())
    stores = Stores.open()
    try:
        _advance(queue, work, (OCR_DOCUMENT, OCR_PAGE, VECTOR_PAGE))
        rounds = {
            kind.name: _late_finisher_round(zygote, queue, work, kind, tmp_path)
            for kind in (VECTOR_CHUNK, GRAPHRAG_CHUNK)
        }
        chunks = queue.chunks()
        for kind in (VECTOR_CHUNK, GRAPHRAG_CHUNK):
            late = rounds[kind.name]
            assert late["result"]["writes"] == {"points": 0, "graph_chunks": 0}, late["result"]
            assert sorted(late["result"]["rejected"]) == sorted(late["claim"]["ids"])
            assert not late["result"]["applied"]
            # B owns the completed rows, and the lost attempt of A is counted
            phase = kind.phase.value
            assert {(c[f"{phase}_status"], c[f"{phase}_worker_id"], c[f"{phase}_retry_count"]) for c in chunks} == {
                ("completed", late["worker_b"], 1)
            }
        assert stores.vector.count() == len(chunks)
        assert stores.vector.chunk_ids() == {c["chunk_id"] for c in chunks}
        assert stores.graph.chunk_ids_with_writes() == {c["chunk_id"] for c in chunks}
        assert set(graph_duplicates(stores.graph).values()) == {0}
    finally:
        stores.close()
        work.close()
    say(
        figures_line(
            "late finisher",
            {
                "faults": 2,
                "tasks_recovered": sum(len(r["claim"]["ids"]) for r in rounds.values()),
                "recovery_s_max": round(max(r["released_after_s"] for r in rounds.values()), 1),
                "chunks": len(chunks),
                "late_transitions_rejected": sum(len(r["result"]["rejected"]) for r in rounds.values()),
                "late_store_writes": 0,
                "duplicates": 0,
                "tasks_lost": 0,
            },
        )
    )
