"""The recovery sensor against a real queue database and Dagster instance: a recovery run only when there is
something to recover (here a stale heartbeat), a skipped tick that says what it checked otherwise, one recovery
run at a time, and recovery runs that log sentences and store no output."""

from __future__ import annotations

import dagster as dg

from orchestration.schedules import RECOVERY_DUE_TAG
from queue_db.phases import VECTOR_CHUNK
from tests.integration.test_sensors import env, output_metadata, queue_run, tick  # noqa: F401 - env is a fixture
from tests.queue_support import build_document

NOTHING = (
    "nothing to recover: no held task's heartbeat is older than STALE_TASK_TIMEOUT=120 s (5 task kinds), no "
    "re-index request waits, no completed partition is due for retirement; embedded vector index: 0 point(s) "
    "written since the last index build; the index is rebuilt at DOCQUEUE_QDRANT_INDEX_TAIL=50000 points"
)


def _stale(queue, n: int) -> list[str]:
    """`n` vector chunk tasks held by a worker that died an hour ago."""
    held = [t["id"] for t in queue.claim(VECTOR_CHUNK, "dead-worker", n)]
    with queue.engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE task_queue_chunk SET vector_last_heartbeat = now() - interval '1 hour' "
            "WHERE id = ANY(%(ids)s::uuid[])",
            {"ids": held},
        )
    return held


def test_an_idle_queue_gets_no_recovery_run_and_the_tick_says_what_it_checked(env):  # noqa: F811
    defs, instance, queue = env
    build_document(queue, pages=1, chunks_per_page=2)
    queue.claim(VECTOR_CHUNK, "live-worker", 1)  # held, heartbeat fresh: not stale

    result = tick(defs, instance, "recovery_sensor")

    assert not result.run_requests
    assert result.skip_message == NOTHING


def test_a_stale_heartbeat_requests_one_recovery_run_which_releases_it(env):  # noqa: F811
    defs, instance, queue = env
    build_document(queue, pages=1, chunks_per_page=3)
    held = _stale(queue, 2)

    first = tick(defs, instance, "recovery_sensor")
    [request] = first.run_requests
    assert request.tags[RECOVERY_DUE_TAG] == "heartbeat stale (older than STALE_TASK_TIMEOUT=120 s): 2 vector_chunk"
    # while that run is queued, the next tick waits for it instead of piling up another
    run = queue_run(defs, instance, request, "recovery_job")
    assert tick(defs, instance, "recovery_sensor").skip_message.startswith("a recovery run is already queued")
    instance.report_run_canceled(run)

    result = defs.resolve_job_def("recovery_job").execute_in_process(instance=instance)

    assert result.success
    assert output_metadata(result, "recover_stale_tasks")["released_vector_chunk"] == 2
    with queue.engine.connect() as conn:
        statuses = conn.exec_driver_sql(
            "SELECT vector_status::text, vector_error_class FROM task_queue_chunk WHERE id = ANY(%(ids)s::uuid[])",
            {"ids": held},
        ).all()
    assert set(statuses) == {("pending", "worker_lost")}
    # nothing is stored: every maintenance op returns None
    assert not [e for e in result.all_events if e.event_type == dg.DagsterEventType.HANDLED_OUTPUT]
    messages = [
        e.message for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_OUTPUT or e.is_engine_event
    ] + [r.user_message for r in instance.all_logs(result.run_id)]
    assert any(
        "released 2 task(s) whose heartbeat was older than STALE_TASK_TIMEOUT=120 s: 2 vector_chunk" in m
        for m in messages
    ), messages
    assert any(
        m.startswith(
            "embedded vector index: 0 point(s) written since the last index build; the index is "
            "rebuilt at DOCQUEUE_QDRANT_INDEX_TAIL=50000 points"
        )
        for m in messages
    ), messages
    assert tick(defs, instance, "recovery_sensor").skip_message == NOTHING


def test_a_disabled_queue_skips_recovery(env, monkeypatch):  # noqa: F811
    from tests.integration.test_sensors import loaded

    _, instance, queue = env
    build_document(queue, pages=1, chunks_per_page=1)
    _stale(queue, 1)
    monkeypatch.setenv("TASK_QUEUE_ENABLED", "false")

    assert tick(loaded(), instance, "recovery_sensor").skip_message == (
        "TASK_QUEUE_ENABLED is false: the queue is left alone"
    )
