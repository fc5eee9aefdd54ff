"""The worker processes of `docqueue run --workers N` (orchestration.workers.start_workers): forked from the run's
process or spawned as new interpreters, they report alike, and a worker that fails is one sentence either way."""

from __future__ import annotations

import pytest

from orchestration.workers import ForkedWorker, collect_workers, start_workers


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
