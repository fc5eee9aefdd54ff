"""The worker processes of `docqueue run --workers N` (orchestration.workers.start_workers): forked from the run's
process or spawned as new interpreters, they report alike, and a worker that fails is one sentence either way."""

from __future__ import annotations

import pytest

from orchestration.workers import ForkedWorker, collect_workers, start_pdf_worker_for_ready_work, start_workers
from queue_db.config import Settings
from queue_db.phases import OCR_DOCUMENT, VECTOR_CHUNK
from resources.ocr_resource import OcrResource, close_shared_processors


@pytest.mark.parametrize("fork", [True, False], ids=["forked", "spawned"])
def test_workers_on_an_empty_queue_report_alike_and_leave(docqueue_env, fork):
    reports, errors = collect_workers(start_workers(2, until_idle=True, max_seconds=120, fork=fork))
    assert errors == []
    assert [(r["runs"], r["failed_runs"], r["forked"]) for r in reports] == [(0, 0, fork)] * 2


def test_a_forked_worker_that_fails_is_one_sentence_and_its_exit_code():
    child = ForkedWorker(["run", "--worker-index", "not-a-number"], show_logs=False)
    reports, errors = collect_workers([child])
    assert reports == [] and child.returncode == 2
    assert len(errors) == 1 and "Invalid value for '--worker-index'" in errors[0] and "Traceback" not in errors[0]


def test_a_worker_starts_its_pdf_worker_ahead_only_when_work_that_opens_it_is_ready(queue):
    settings = Settings.from_env()
    close_shared_processors()  # whatever an earlier test in this process left running
    processor = OcrResource.from_settings(settings).get_processor()  # the one the runs' resource shares
    try:
        assert not queue.any_ready([OCR_DOCUMENT, VECTOR_CHUNK])
        assert start_pdf_worker_for_ready_work(queue, settings) is False
        assert processor.worker_pid is None

        queue.register_document(filename="a.pdf", content_hash="a" * 64, size_bytes=10)
        assert queue.any_ready([OCR_DOCUMENT]) and not queue.any_ready([VECTOR_CHUNK])
        assert start_pdf_worker_for_ready_work(queue, settings) is True
        assert processor.worker_pid is not None  # started, not waited for
    finally:
        close_shared_processors()
