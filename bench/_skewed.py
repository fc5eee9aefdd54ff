"""A queue process whose wall clock is wrong: bench/faults.py row 8 starts it under libfaketime (FAKETIME="+600" or
"-600", FAKETIME_DONT_FAKE_MONOTONIC=1), as a process of its own, since a preloaded library takes effect only when a
program starts, never in a forked child.

  python bench/_skewed.py '{"mode": "worker" | "recover" | "backoff" | "sensors", "url": ..., "settings": {...}, ...}'

It prints one JSON line as soon as it is ready (its wall clock against the database's, its monotonic clock), waits
for a line on standard input to begin, works until the line "stop" (or the end of its input) comes ("recover",
"worker") or once ("backoff"; "sensors": bench/_skewed_sensors.py), and ends with one JSON line {"report": ...}.
"""

from __future__ import annotations

import threading
import time

_EVENT_SLEEP = threading.Event()


def _sleep(seconds: float) -> None:
    # libfaketime 0.9.10, when it leaves the monotonic clock alone, answers the absolute monotonic clock_nanosleep
    # that time.sleep makes with EINVAL; a wait on an Event (sem_clockwait, which it does not intercept) keeps the
    # real duration. Set before the queue's modules load, so their time.sleep is this one.
    _EVENT_SLEEP.wait(max(0.0, seconds))


time.sleep = _sleep

import dataclasses  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import psycopg  # noqa: E402

from bench import _fault_kit as kit  # noqa: E402
from queue_db.config import QueueSettings  # noqa: E402
from queue_db.phases import VECTOR_CHUNK  # noqa: E402
from queue_db.queue import TaskQueue, create_queue_engine, make_worker_id  # noqa: E402


def wall_skew_s(url: str) -> float:
    """This process's wall clock less the database's, seconds (the round trip's share is milliseconds)."""
    with psycopg.connect(url, autocommit=True) as conn:
        before = time.time()
        database = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0]
        after = time.time()
    return round((before + after) / 2 - database, 3)


def _emit(line: dict) -> None:
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def _stop_on_line(stop: threading.Event) -> None:
    for line in sys.stdin:
        if line.strip() == "stop":
            break
    stop.set()


def recover_loop(url: str, settings: QueueSettings, stop: threading.Event, interval_s: float) -> dict:
    """The recovery job, again and again. Beside what it released, it counts the held tasks it would have
    released had it judged staleness by its own clock: the steals a process clock would make."""
    queue = TaskQueue(create_queue_engine(kit.with_app(url, "faults-skewed-recovery"), pool_size=1), settings)
    released = calls = would_release = 0
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            while not stop.is_set():
                released += sum(queue.recover_stale().values())
                calls += 1
                by_own_clock = conn.execute(
                    f"SELECT count(*) FROM {VECTOR_CHUNK.table} t WHERE {VECTOR_CHUNK.held_sql('t')} "
                    f"AND t.{VECTOR_CHUNK.col('last_heartbeat')} < to_timestamp(%s)",
                    (time.time() - settings.stale_timeout_s,),
                ).fetchone()[0]
                would_release = max(would_release, int(by_own_clock))
                stop.wait(interval_s)
    finally:
        queue.engine.dispose()
    return {"released": released, "calls": calls, "would_release_by_own_clock": would_release}


def backoff(url: str, settings: QueueSettings, ids: list[str]) -> dict:
    """Claim `ids` and fail them, retryable: the back-off they get is the database's business."""
    queue = TaskQueue(create_queue_engine(url, pool_size=1), settings)
    worker = make_worker_id("faults-skewed-backoff")
    try:
        claimed = [row["id"] for row in queue.claim(VECTOR_CHUNK, worker, len(ids), only_ids=ids)]
        failed = queue.fail(
            VECTOR_CHUNK, worker, [{"id": i, "error": "a retryable failure", "retryable": True} for i in claimed]
        )
    finally:
        queue.engine.dispose()
    return {"claimed": len(claimed), "failed": failed.applied, "process_time": time.time()}


def main(spec: dict) -> dict:
    url, settings = spec["url"], QueueSettings(**spec["settings"])
    _emit({"ready": True, "wall_skew_s": wall_skew_s(url), "monotonic": time.monotonic(), "wall": time.time()})
    if not sys.stdin.readline():  # the parent went away before the start
        return {}
    stop = threading.Event()
    threading.Thread(target=_stop_on_line, args=(stop,), daemon=True).start()
    mode = spec["mode"]
    if mode == "worker":
        report = kit.worker_loop(url, spec["app"], spec["batch"], stop, settings, work_s=spec["work_s"])
        result = dataclasses.asdict(dataclasses.replace(report, ledger=None))
    elif mode == "recover":
        result = recover_loop(url, settings, stop, spec["interval_s"])
    elif mode == "backoff":
        result = backoff(url, settings, spec["ids"])
    elif mode == "sensors":
        from bench._skewed_sensors import evaluate  # Dagster loads only in this mode

        result = evaluate(spec)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    # the clock once more at the end: the skew held for the whole run
    return {**result, "wall_skew_s_at_end": wall_skew_s(url)}


if __name__ == "__main__":
    _emit({"report": main(json.loads(sys.argv[1]))})
