"""A slow but alive worker is never robbed of its tasks, however long it works, as long as its heartbeat flows:
- CPU-heavy pure Python in the worker's own process (the Heartbeat thread gets the GIL at the switch interval);
- OCR in the PdfProcessor child process (the worker only waits on a pipe);
and a worker whose heartbeat stops (the process is frozen) loses its tasks after the stale timeout."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time

from queue_db.config import QueueSettings
from queue_db.phases import OCR_DOCUMENT, OCR_PAGE
from queue_db.queue import TaskQueue, make_worker_id
from tests import pdf_factory as pf
from tests.reliability.support import figures_line, status_of, wait_for

STALE_S = 2.0  # rel_env's STALE_TASK_TIMEOUT
# scanned pages OCRed in one claimed batch by the heartbeat test
SLOW_BATCH = 16


def _page_tasks(queue, pages: int) -> None:
    """A registered document expanded into `pages` OCR page tasks (no file needed: nothing is converted)."""
    digest = hashlib.sha256(os.urandom(16)).hexdigest()
    document, _ = queue.register_document(filename="slow.pdf", content_hash=digest, size_bytes=1)
    worker = make_worker_id("expand")
    assert queue.claim(OCR_DOCUMENT, worker, 1)
    assert queue.complete_document_expansion(worker, str(document["id"]), page_count=pages)


def _watch(queue, kind, claim: dict, until, interval_s: float = 0.2) -> int:
    """Run stale recovery every `interval_s` (far more often than the every-minute job) until `until()`; assert
    each time that the worker still owns every task: processing, or completed by it (the worker may finish between
    `until()` and the read). Returns how many recovery passes ran."""
    passes = 0
    while not until():
        queue.recover_stale()
        passes += 1
        with queue.engine.connect() as conn:
            rows = conn.exec_driver_sql(
                f"SELECT {kind.status}::text, {kind.col('worker_id')} FROM {kind.table} "
                "WHERE id = ANY(%(ids)s::uuid[])",
                {"ids": claim["ids"]},
            ).all()
        owned = {("processing", claim["worker"]), ("completed", claim["worker"])}
        assert rows and set(rows) <= owned, f"a live worker was robbed after {passes} passes: {rows}"
        time.sleep(interval_s)
    return passes


def test_busy_python_keeps_its_tasks_and_a_frozen_worker_loses_them(pipeline, zygote, tmp_path, say):
    queue = pipeline.queue
    _page_tasks(queue, 3)
    files = {name: str(tmp_path / f"busy-{name}") for name in ("claimed", "result")}
    busy_s = 4 * STALE_S
    busy = zygote.spawn("busy", tmp_path, target="tests.reliability.bodies:busy_holder", busy_s=busy_s, **files)
    claim = wait_for(
        lambda: os.path.exists(files["claimed"]) and json.loads(open(files["claimed"]).read()),
        60,
        what="the busy worker's claim",
    )
    passes = _watch(queue, OCR_PAGE, claim, lambda: os.path.exists(files["result"]))
    busy.finish(60)
    result = json.loads(open(files["result"]).read())
    assert result["busy_s"] >= busy_s and not result["lost"] and not result["rejected"]
    assert sorted(result["applied"]) == sorted(claim["ids"])
    # beats kept coming while the main thread never slept
    assert result["beats"] >= busy_s / 0.5 / 2, result

    # the same worker frozen (SIGSTOP: a paused VM, a stopped process): no heartbeat, so its tasks go back
    _page_tasks(queue, 2)
    files = {name: str(tmp_path / f"frozen-{name}") for name in ("claimed", "result")}
    frozen = zygote.spawn("frozen", tmp_path, target="tests.reliability.bodies:busy_holder", busy_s=60, **files)
    claim = wait_for(
        lambda: os.path.exists(files["claimed"]) and json.loads(open(files["claimed"]).read()),
        60,
        what="the frozen worker's claim",
    )
    os.kill(frozen.pid, signal.SIGSTOP)
    frozen_at = time.monotonic()
    wait_for(
        lambda: queue.recover_stale() and set(status_of(queue, OCR_PAGE, claim["ids"]).values()) == {"pending"},
        30,
        0.1,
        "the frozen worker's tasks to be released",
    )
    released_after = time.monotonic() - frozen_at
    frozen.kill()
    with queue.engine.connect() as conn:
        errors = {
            r[0]
            for r in conn.exec_driver_sql(
                "SELECT ocr_error_class || ': ' || ocr_error FROM task_queue_page WHERE id = ANY(%(ids)s::uuid[])",
                {"ids": claim["ids"]},
            ).all()
        }
    assert len(errors) == 1 and next(iter(errors)).startswith("worker_lost: worker lost: heartbeat stale since")
    say(
        figures_line(
            "busy worker",
            {
                "faults": 1,
                "tasks_recovered": len(claim["ids"]),
                "recovery_s_max": round(released_after, 1),
                "busy_s": round(result["busy_s"], 1),
                "beats": result["beats"],
                "recovery_passes_survived": passes,
                "robbed": 0,
            },
        )
    )


def test_ocr_in_the_child_process_keeps_the_heartbeat_flowing(pipeline, tmp_path, say, monkeypatch):
    from orchestration.assets import common
    from orchestration.assets.common import process_keys
    from orchestration.assets.handlers import handled_tasks, process_tasks
    from orchestration.pipeline import Pipeline as Work
    from queue_db.config import Settings
    from resources.ocr_resource import OcrResource

    # one batch of sixteen scanned pages (OCR model start-up included; claimed as one batch, not the usual four) must
    # outlast the stale timeout twice over even on a fast idle machine (0.4-1.2 s/page measured: one batch of four
    # was once too short); the margin of beats per timeout (6) keeps a loaded machine from starving a beat past it,
    # and the timeout itself (3 s) covers a stall of the heartbeat's write on a slow machine under the suite's load
    monkeypatch.setitem(common.CLAIM_BATCH, "ocr_page", SLOW_BATCH)
    settings = QueueSettings(heartbeat_interval_s=0.5, stale_timeout_s=3.0, max_retries=3)
    queue = TaskQueue(pipeline.queue.engine, settings)
    scans = [
        pf.scanned_pdf(tmp_path, f"scan-{i}.pdf", pf.SCANNED_TEXT + f" Log entry {i}.")[0] for i in range(SLOW_BATCH)
    ]
    ingested = pipeline.ingest(scans)
    work = Work(queue, storage=pipeline.storage, pdf=OcrResource.from_settings(Settings.from_env()).get_processor())
    stop = threading.Event()
    passes = [0]

    def recover_often():
        while not stop.wait(0.1):
            queue.recover_stale()
            passes[0] += 1

    try:
        expander = make_worker_id("expand")
        process_tasks(work, OCR_DOCUMENT, expander, queue.claim(OCR_DOCUMENT, expander, len(scans)))
        keys = [f"{r.document_key}/p0001" for r in ingested]
        recoverer = threading.Thread(target=recover_often, daemon=True)
        recoverer.start()
        report = process_keys(
            queue, handled_tasks(work, OCR_PAGE), OCR_PAGE, keys, make_worker_id("ocr"), override_retry_limit=False
        )
    finally:
        stop.set()
        work.close()
    assert sorted(report.completed) == sorted(keys) and not report.lost and not report.failed
    with queue.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT ocr_retry_count, ocr_method, EXTRACT(EPOCH FROM ocr_completed_at - ocr_started_at) "
            "FROM task_queue_page"
        ).all()
    assert {(r[0], r[1]) for r in rows} == {(0, "ocr:rapidocr")}
    longest = max(float(r[2]) for r in rows)
    assert longest >= 2 * settings.stale_timeout_s, f"the batch was too fast to prove anything ({longest:.1f} s)"
    say(
        figures_line(
            "OCR child process",
            {
                "pages": len(rows),
                "longest_hold_s": round(longest, 1),
                "stale_timeout_s": settings.stale_timeout_s,
                "recovery_passes_survived": passes[0],
            },
        )
    )
