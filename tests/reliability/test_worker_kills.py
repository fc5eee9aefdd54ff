"""Workers SIGKILLed mid-task in each phase: their tasks go back after the stale timeout, are re-run, and the
stores end with exactly one point per chunk and no duplicate graph nodes or relationships."""

from __future__ import annotations

import time

import dagster as dg

from queue_db.phases import GRAPHRAG_CHUNK, OCR_PAGE, VECTOR_CHUNK
from tests import pdf_factory as pf
from tests.reliability.support import (
    Stores,
    document_statuses,
    figures_line,
    processing_ids,
    recover_after_kill,
    store_figures,
    wait_for,
)

ALL_COMPLETED = ("completed", "completed", "completed")


def _corpus(tmp):
    bees, volcanoes = pf.two_topic_pdfs(tmp)
    report = pf.text_pdf(
        tmp,
        "report.pdf",
        [
            pf.DEMO_PAGE,
            [
                "# Staff",
                "Ada Lovelace met Charles Babbage in London. Grace Hopper worked for the US Navy in Arlington.",
            ],
        ],
    )
    return [bees, volcanoes, report]


def test_a_worker_killed_in_each_phase_loses_nothing_and_duplicates_nothing(pipeline, zygote, tmp_path, say):
    pipeline.ingest(_corpus(tmp_path))
    queue = pipeline.queue
    recoveries = []
    for kind in (OCR_PAGE, VECTOR_CHUNK, GRAPHRAG_CHUNK):
        # its batches of the phase under test last at least half a second: long enough to be seen processing
        worker = zygote.spawn(f"kill-{kind.name}", tmp_path, slow_kinds=[kind.name], slow_s=0.5)
        held = wait_for(
            lambda: processing_ids(queue, kind) or (not worker.alive() and worker.finish()),
            180,
            0.02,
            f"{kind.name} tasks in processing",
        )
        assert isinstance(held, set), f"worker finished without being caught in {kind.name}: {held}"
        worker.kill()
        killed_at = time.monotonic()
        # the dead worker's tasks stay claimed until their heartbeat is stale: nobody else may take them early
        queue.recover_stale()
        assert processing_ids(queue, kind) >= held
        recoveries.append(recover_after_kill(queue, kind, held, killed_at))
    killed_runs = len(recoveries)

    report = pipeline.run_until_idle()  # the last worker: in this process
    assert set(document_statuses(queue).values()) == {ALL_COMPLETED}, document_statuses(queue)
    stores = Stores.open()
    try:
        first = store_figures(queue, stores)
        assert first["verify"]["consistent"], first["verify"]
        assert first["points"] == first["chunks"] > 0
        assert set(first["duplicates"].values()) == {0}, first["duplicates"]

        # the killed runs are failed in the instance (not left STARTED, which would block their ranges forever)
        stuck = pipeline.instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))
        assert not stuck, [r.run_id for r in stuck]
        dead = pipeline.instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE]))
        assert len([r for r in dead if "abandoned" in _failure_message(pipeline.instance, r.run_id)]) == killed_runs

        # re-running every completed chunk changes no count
        chunk_ids = [c["id"] for c in queue.chunks()]
        assert queue.requeue(VECTOR_CHUNK, chunk_ids, "reliability test: re-run everything") == len(chunk_ids)
        pipeline.run_until_idle()
        again = store_figures(queue, stores)
    finally:
        stores.close()
    assert again == first
    with queue.engine.connect() as conn:
        lost = conn.exec_driver_sql(
            "SELECT (SELECT count(*) FROM task_queue_page WHERE ocr_status <> 'completed')"
            " + (SELECT count(*) FROM task_queue_chunk WHERE vector_status <> 'completed'"
            "    OR graphrag_status <> 'completed')"
        ).scalar()
    assert lost == 0
    say(
        figures_line(
            "worker killed per phase",
            {
                "faults": killed_runs,
                "tasks_recovered": sum(r.tasks for r in recoveries),
                "recovery_s_max": round(max(r.seconds for r in recoveries), 1),
                "recovery_s": "/".join(f"{r.kind}:{r.seconds:.1f}" for r in recoveries),
                "chunks": first["chunks"],
                "points": first["points"],
                "duplicates": sum(first["duplicates"].values()),
                "tasks_lost": lost,
                "final_runs": report.runs,
            },
        )
    )


def _failure_message(instance, run_id: str) -> str:
    records = instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
    return " ".join(r.message or "" for r in records)
