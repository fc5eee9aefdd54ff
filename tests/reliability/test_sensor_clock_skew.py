"""The fault matrix's row 8 on the Dagster side: the code location's sensors and schedules, and the recovery and
nightly reconciliation runs they request, evaluated as the daemon evaluates them in a process whose wall clock runs
ten minutes ahead, then in one ten minutes behind (under libfaketime, bench/_skewed_sensors.py), each followed by
a tick of a process with a right clock. The queue holds, each round: live tasks whose holder heartbeats (held by a
worker of a queued Dagster run), tasks of a worker that went silent five minutes ago, tasks of a canceled run,
failed tasks whose back-off ends five minutes from now and some whose back-off ended five minutes ago, pending
tasks, chunk partitions completed five minutes before and after the retention's cut-off, a new inbox file and a
new S3 object. Every time is the database's: the skewed processes request exactly the ready work, release only
the silent and the dead run's tasks, retire only the partitions past the cut-off, and the state they leave behind
(queued runs, the inbox's memory, the S3 cursor) makes the right-clocked process neither repeat nor skip work.
Judged by the skewed process's own clock, the same rows would have gone the other way (`by_own_clock`)."""

from __future__ import annotations

import threading
import uuid

import dagster as dg
import pytest

from orchestration.jobs import job_name
from queue_db.keys import chunk_partition_key
from queue_db.phases import VECTOR_CHUNK
from tests.queue_support import build_document
from tests.reliability.support import figures_line

SKEW_S = 600
STALE_S = 20.0  # the holders beat every 0.5 s: forty beats of margin on a loaded machine, far inside the skew
RETENTION_S = 3600.0
MARGIN_S = 300  # how far each planted time stands from its cut-off, by the database's clock: half the skew
SETS = {"pending": 3, "due": 2, "backoff": 2, "live": 3, "silent": 2, "dead": 2, "old": 2, "recent": 2}
VECTOR_SENSOR = "vector_chunk_sensor"


@pytest.fixture
def libfaketime():
    from bench._fault_kit import LIBFAKETIME_GLOB, libfaketime

    path = libfaketime()
    if path is None:
        pytest.skip(f"no libfaketime at {LIBFAKETIME_GLOB}: install Debian's `libfaketime` package")
    return path


@pytest.fixture
def skew_env(rel_env, monkeypatch, tmp_path, s3_endpoint):
    import boto3

    bucket = f"docqueue-{uuid.uuid4().hex[:12]}"
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for name, value in {
        "STALE_TASK_TIMEOUT": str(STALE_S),
        "DOCQUEUE_PARTITION_RETENTION": str(int(RETENTION_S)),
        "DOCQUEUE_INBOX": str(inbox),
        "AWS_ACCESS_KEY_ID": "docqueue-test",
        "AWS_SECRET_ACCESS_KEY": "docqueue-test-secret",
        "AWS_REGION": "us-east-1",
        "DOCQUEUE_S3_URL": s3_endpoint,
        "DOCQUEUE_S3_BUCKET": bucket,
        "DOCQUEUE_S3_PREFIX": "inbox/",
        # objects older than the cursor's newest LastModified less this are taken as handled: a cursor stamped with
        # a clock 600 s ahead would skip the next nine minutes of objects
        "DOCQUEUE_S3_LOOKBACK": "60",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=bucket)
    return rel_env, inbox, lambda key, body: client.put_object(Bucket=bucket, Key=f"inbox/{key}", Body=body)


class Holders:
    """Workers that stay alive: each beats its tasks every 0.5 s (the database stamps the beat) and notes any task
    it no longer owns, which would be a task stolen from a live worker."""

    def __init__(self, queue):
        self.queue, self.held = queue, {}
        self.lost: dict[str, set[str]] = {}
        self.beats = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()

    def hold(self, worker: str, ids: list[str]) -> None:
        claimed = {t["id"] for t in self.queue.claim(VECTOR_CHUNK, worker, len(ids), only_ids=ids)}
        assert claimed == set(ids), (worker, ids)
        self.held.setdefault(worker, set()).update(ids)

    def _beat(self) -> None:
        while not self._stop.wait(0.5):
            for worker, ids in list(self.held.items()):
                owned = self.queue.heartbeat(VECTOR_CHUNK, worker, list(ids))
                self.lost.setdefault(worker, set()).update(set(ids) - owned)
                self.held[worker] = owned
                self.beats += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class Scene:
    """The queue, the Dagster instance and the runs a test round plants."""

    def __init__(self, put_object, inbox):
        from orchestration.code_location import build_definitions, build_resources
        from orchestration.environment import dagster_instance
        from queue_db.config import Settings
        from resources.database import open_queue

        settings = Settings.from_env()
        self.defs, self.resources = build_definitions(settings), build_resources(settings)
        self.instance, self.queue = dagster_instance(settings), open_queue(settings)
        self.put_object, self.inbox = put_object, inbox
        self.live_run = self.run(job_name("vector_chunk"))  # queued: alive, as far as the nightly run can tell
        self.holders = Holders(self.queue)
        self.rounds = 0

    def run(self, job: str) -> str:
        from bench._skewed_sensors import queue_run

        return queue_run(self.defs, self.instance, dg.RunRequest(), job)

    def plant(self) -> dict[str, list[str]]:
        """One document's chunks in every state the round checks, by the database's clock."""
        self.rounds += 1
        doc = build_document(self.queue, pages=1, chunks_per_page=sum(SETS.values()), name=f"r{self.rounds}.pdf")
        with self.queue.engine.connect() as conn:
            ids = [
                r[0]
                for r in conn.exec_driver_sql(
                    "SELECT id::text FROM task_queue_chunk WHERE document_id = %(d)s ORDER BY chunk_index",
                    {"d": str(doc["id"])},
                )
            ]
        sets, at = {}, 0
        for name, n in SETS.items():
            sets[name], at = ids[at : at + n], at + n
        self.holders.hold(f"run:{self.live_run}:live", sets["live"])
        dead_run = self.run(job_name("vector_chunk"))
        self.holders.hold(f"run:{dead_run}:gone", sets["dead"])  # beating, but its run has ended
        self.instance.report_run_canceled(self.instance.get_run_by_id(dead_run))
        self.queue.claim(VECTOR_CHUNK, "silent-worker", len(sets["silent"]), only_ids=sets["silent"])
        failing = self.queue.claim(VECTOR_CHUNK, "failing-worker", 4, only_ids=sets["due"] + sets["backoff"])
        failed = self.queue.fail(
            VECTOR_CHUNK, "failing-worker", [{"id": t["id"], "error": "retryable", "retryable": True} for t in failing]
        )
        assert len(failed.applied) == 4
        with self.queue.engine.begin() as conn:
            sql = conn.exec_driver_sql
            sql(
                "UPDATE task_queue_chunk SET vector_last_heartbeat = now() - make_interval(secs => %(m)s) "
                "WHERE id = ANY(%(ids)s::uuid[])",
                {"m": MARGIN_S, "ids": sets["silent"]},
            )
            for name, sign in (("due", -1), ("backoff", 1)):
                sql(
                    "UPDATE task_queue_chunk SET vector_next_attempt_at = now() + make_interval(secs => %(s)s) "
                    "WHERE id = ANY(%(ids)s::uuid[])",
                    {"s": sign * MARGIN_S, "ids": sets[name]},
                )
            for name, ago in (("old", RETENTION_S + MARGIN_S), ("recent", RETENTION_S - MARGIN_S)):
                sql(
                    """UPDATE task_queue_chunk SET vector_status = 'completed', graphrag_status = 'completed',
                              vector_completed_at = now() - make_interval(secs => %(ago)s),
                              graphrag_completed_at = now() - make_interval(secs => %(ago)s)
                       WHERE id = ANY(%(ids)s::uuid[])""",
                    {"ago": ago, "ids": sets[name]},
                )
        (self.inbox / f"note-{self.rounds}.txt").write_text(f"A note of round {self.rounds} about clocks.\n")
        self.put_object(f"letter-{self.rounds}.txt", f"A letter of round {self.rounds} about clocks.\n".encode())
        return sets

    def run_for(self, request: dg.RunRequest) -> str:
        """The run the daemon queues for a vector_chunk request: in flight for every later tick."""
        from bench._skewed_sensors import queue_run

        return queue_run(self.defs, self.instance, request, job_name("vector_chunk"))

    def tick(self, name: str, cursor: str | None = None):
        from bench._skewed_sensors import tick

        return tick(self.defs, self.instance, self.resources, name, cursor)

    def requested(self, requests: list[dict]) -> set[str]:
        """The chunk ids the vector_chunk runs of these requests' tags cover."""
        from orchestration.planning import parse_span

        spans = [parse_span(tags) for tags in requests]
        with self.queue.engine.connect() as conn:
            return {
                r[0]
                for block, start, end in spans
                for r in conn.exec_driver_sql(
                    "SELECT id::text FROM task_queue_chunk WHERE partition_block = %(b)s "
                    "AND partition_pos BETWEEN %(s)s AND %(e)s",
                    {"b": block, "s": start, "e": end},
                )
            }

    def rows(self, ids: list[str]) -> dict[str, dict]:
        with self.queue.engine.connect() as conn:
            rows = conn.exec_driver_sql(
                """SELECT c.id::text AS id, c.vector_status::text AS status, c.vector_worker_id AS worker,
                          c.vector_error_class AS error_class, c.vector_next_attempt_at > now() AS backing_off,
                          c.partition_retired_at IS NOT NULL AS retired, d.document_key, p.page_number, c.chunk_index
                   FROM task_queue_chunk c JOIN task_queue_page p ON p.id = c.page_id
                   JOIN documents d ON d.id = c.document_id WHERE c.id = ANY(%(ids)s::uuid[])""",
                {"ids": ids},
            ).mappings()
            return {r["id"]: dict(r) for r in rows}

    def close(self) -> None:
        self.holders.stop()
        self.instance.dispose()


def _skewed_pass(skew_s: int, home, cursor: str | None) -> dict:
    """The sensors, schedules and the runs they drive, once, in a process whose clock is `skew_s` off."""
    import os

    import sqlalchemy as sa

    from bench._fault_kit import SkewedProcess

    # the driver's own form of the queue database's address (the process reads its clock with psycopg)
    url = sa.make_url(os.environ["DOCQUEUE_DATABASE_URL"]).set(drivername="postgresql")
    spec = {
        "mode": "sensors",
        "url": url.render_as_string(hide_password=False),
        "settings": {},
        "cursors": {"s3_intake_sensor": cursor},
        "queue_runs_of": [VECTOR_SENSOR],
        "nightly": True,
    }
    process = SkewedProcess(skew_s, spec, home)
    ready = process.wait_ready()
    process.go()
    report = process.finish(timeout_s=240)
    assert "errors" not in report, report
    return {**report, "wall_skew_s": ready["wall_skew_s"]}


def _check_skewed(scene: Scene, sets: dict[str, list[str]], report: dict, skew_s: int) -> None:
    # the fault took: the process's wall clock, and Dagster's time stamps with it, were the skew off the database's
    assert abs(report["wall_skew_s"] - skew_s) < 5 and abs(report["wall_skew_s_at_end"] - skew_s) < 5, report
    assert abs(report["dagster_clock_skew_s"] - skew_s) < 5, report
    ticks = report["ticks"]
    # ready work requested: the pending tasks and the failed ones whose back-off ended, by the database's clock;
    # not the live, the silent, the dead run's (all still held at the tick) nor those still backing off
    assert scene.requested(ticks[VECTOR_SENSOR]["requests"]) == set(sets["pending"] + sets["due"]), ticks[VECTOR_SENSOR]
    # the recovery sensor saw the silent worker's tasks stale and the old partitions due, nothing else
    [recovery_request] = ticks["recovery_sensor"]["requests"]
    due = recovery_request["docqueue/recovery_due"]
    assert f"STALE_TASK_TIMEOUT={STALE_S:g} s): {len(sets['silent'])} vector_chunk" in due, due
    assert "completed partitions due for retirement: chunks" in due, due
    recovery = report["recovery"]
    assert recovery["success"], recovery
    assert recovery["recover_stale_tasks"]["released_total"] == len(sets["silent"]), recovery
    assert recovery["retire_completed_partitions"]["retired_chunks"] == len(sets["old"]), recovery
    nightly = report["nightly"]
    assert nightly["tasks_released"] == len(sets["dead"]) and nightly["dead_run_workers"] == 1, nightly
    assert all(s["requests"] == 1 for s in report["schedules"].values()), report["schedules"]
    assert "1 new" in ticks["inbox_sensor"]["skip"], ticks["inbox_sensor"]
    assert " 1 new," in ticks["s3_intake_sensor"]["skip"], ticks["s3_intake_sensor"]

    rows = scene.rows([i for ids in sets.values() for i in ids])
    live_worker = f"run:{scene.live_run}:live"
    assert {rows[i]["worker"] for i in sets["live"]} == {live_worker}, rows  # no live task released
    assert all(rows[i]["status"] == "failed" and rows[i]["backing_off"] for i in sets["backoff"]), rows
    assert all(rows[i]["status"] == "pending" for i in sets["silent"] + sets["dead"]), rows
    assert {rows[i]["error_class"] for i in sets["silent"] + sets["dead"]} == {"worker_lost"}, rows
    assert all(rows[i]["retired"] for i in sets["old"]) and not any(rows[i]["retired"] for i in sets["recent"]), rows
    live_keys = set(scene.instance.get_dynamic_partitions("chunks"))
    keys = {
        i: chunk_partition_key(rows[i]["document_key"], rows[i]["page_number"], rows[i]["chunk_index"]) for i in rows
    }
    assert not {keys[i] for i in sets["old"]} & live_keys and {keys[i] for i in sets["recent"]} <= live_keys

    # and it has teeth: judged by the process's own clock, the same rows would have gone the other way
    own = {name: set(ids) for name, ids in report["by_own_clock"].items()}
    if skew_s > 0:  # a clock ahead: live tasks stale, back-offs over, recent partitions past the retention
        assert set(sets["live"]) <= own["stale"] and set(sets["backoff"]) <= own["due"], own
        assert set(sets["recent"]) <= own["retirable"], own
    else:  # a clock behind: the silent worker fresh, ended back-offs still running, old partitions kept
        assert not set(sets["silent"]) & own["stale"] and not set(sets["due"]) & own["due"], own
        assert not set(sets["old"]) & own["retirable"], own


def _check_normal_after(scene: Scene, sets, report: dict, put_object, skew_s: int) -> str:
    """A right-clocked process's ticks over what the skewed one left: no work requested twice (the skewed tick's
    runs are in flight), the work the skewed runs released requested now, nothing left to recover, the inbox's
    files known, and the S3 cursor the skewed tick wrote neither skips nor repeats an object. Returns the cursor."""
    vector = scene.tick(VECTOR_SENSOR)
    for request in vector.run_requests:
        scene.run_for(request)
    assert scene.requested([dict(r.tags) for r in vector.run_requests]) == set(sets["silent"] + sets["dead"])
    recovery = scene.tick("recovery_sensor")
    assert not recovery.run_requests and recovery.skip_message.startswith("nothing to recover"), recovery
    inbox = scene.tick("inbox_sensor")
    assert f"{scene.rounds} unchanged, 0 new" in inbox.skip_message, inbox.skip_message
    put_object(f"after-{skew_s:+d}.txt", f"Written after the {skew_s:+d} s process's tick.\n".encode())
    s3 = scene.tick("s3_intake_sensor", report["ticks"]["s3_intake_sensor"]["cursor"])
    assert " 1 new," in s3.skip_message and " 0 duplicate" in s3.skip_message, s3.skip_message
    return s3.cursor


def test_sensors_and_their_runs_in_a_process_ten_minutes_off_judge_by_the_database_clock(
    skew_env, libfaketime, tmp_path, say
):
    _, inbox, put_object = skew_env
    scene = Scene(put_object, inbox)
    cursor, figures = None, {}
    try:
        for skew_s in (SKEW_S, -SKEW_S):
            sets = scene.plant()
            report = _skewed_pass(skew_s, tmp_path / "skewed", cursor)
            _check_skewed(scene, sets, report, skew_s)
            cursor = _check_normal_after(scene, sets, report, put_object, skew_s)
            figures[f"{skew_s:+d}"] = {k: len(v) for k, v in report["by_own_clock"].items()}
        # the live holder kept every task it held through both rounds, and can still complete them
        live_worker = f"run:{scene.live_run}:live"
        assert not scene.holders.lost.get(live_worker) and scene.holders.beats > 0
        held = sorted(scene.holders.held[live_worker])
        assert len(held) == 2 * SETS["live"]
        assert sorted(scene.queue.complete(VECTOR_CHUNK, live_worker, held).applied) == held
    finally:
        scene.close()
    say(
        figures_line(
            "sensor clock skew",
            {
                "faults": 2,
                "skew_s": SKEW_S,
                "live_released": 0,
                "by_own_clock_ahead": figures[f"+{SKEW_S}"],
                "by_own_clock_behind": figures[f"-{SKEW_S}"],
            },
        )
    )
