"""The workers of `docqueue run --workers N`: N processes, each running the Dagster definitions over its share of
the registration blocks, leaving together once nothing is left anywhere."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Sequence

from orchestration.code_location import build_definitions
from orchestration.environment import dagster_instance
from orchestration.loaded_heap import freeze_loaded
from orchestration.runner import run_until_idle
from queue_db.config import Settings
from queue_db.inspection import waiting_work
from queue_db.partition_keys import rollup_candidates
from queue_db.phases import PHASES, PhaseRegistry
from queue_db.run_scope import most_urgent_unfinished


def start_workers(
    workers: int,
    *,
    until_idle: bool,
    max_seconds: float | None,
    extra_args: Sequence[str] = (),
    show_logs: bool = False,
) -> list[subprocess.Popen]:
    """Start the worker processes of one `run --workers N`, each a `docqueue run --worker-index I`. `show_logs`
    (`--log-level`): their stderr, where their logs go, is this process's own."""
    group = secrets.randbelow(2**31 - 1) + 1
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestration.cli",
                "run",
                "--worker-index",
                str(i),
                "--workers",
                str(workers),
                "--worker-group",
                str(group),
            ]
            + (["--until-idle"] if until_idle else [])
            + (["--max-seconds", str(max_seconds)] if max_seconds else [])
            + list(extra_args),
            stdout=subprocess.PIPE,
            stderr=None if show_logs else subprocess.PIPE,
            text=True,
        )
        for i in range(workers)
    ]


def collect_workers(children: list[subprocess.Popen]) -> tuple[list[dict], list[str]]:
    """Each worker's report, and the one-sentence error of each worker that failed."""
    reports, errors = [], []
    for child in children:
        out, err = child.communicate()
        if child.returncode != 0:
            last = err.strip().splitlines()[-1] if err and err.strip() else f"worker exited {child.returncode}"
            errors.append(last.removeprefix("docqueue: "))
        else:
            reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports, errors


SIBLING_POLL_S = 2.0
STUCK_CHECKS = 15  # idle checks in a row with the same work left and no sibling busy: nobody can plan it


def run_worker(
    queue,
    until_idle: bool,
    index: int,
    workers: int,
    max_seconds: float | None,
    group: int,
    max_docs: int | None = None,
    log_level: str | None = None,
    *,
    settings: Settings,
    phases: PhaseRegistry = PHASES,
) -> dict:
    """One of `run --workers N`. The workers split the registration blocks, so a worker whose share is idle may
    not leave while a sibling can still create work in that share (the sibling's chunks, pages and roll-ups
    land in any block): with --until-idle it leaves only once no sibling is busy and nothing is left anywhere.
    The runs execute the definitions built from `settings` and `phases`."""
    defs = build_definitions(settings, phases)
    instance = dagster_instance(settings)
    freeze_loaded()
    started = time.monotonic()
    totals = {"runs": 0, "failed_runs": 0}
    # --max-docs runs in one worker, which chooses the documents as it starts
    documents = None if max_docs is None else most_urgent_unfinished(queue.engine, max_docs)
    if documents is not None:
        totals["documents"] = documents

    def remaining() -> float | None:
        return None if max_seconds is None else max_seconds - (time.monotonic() - started)

    def one_pass() -> None:
        report = run_until_idle(
            defs,
            instance,
            queue,
            settings=settings,
            phases=phases,
            until_idle=until_idle,
            worker_index=index,
            workers=workers,
            max_seconds=remaining(),
            documents=documents,
            log_level=log_level,
        )
        totals["runs"] += report.runs
        totals["failed_runs"] += report.failed_runs

    if workers == 1 or not until_idle:
        one_pass()
    else:
        with Siblings(queue.engine, group, index, workers) as siblings:
            last_left, unchanged = None, 0
            while remaining() is None or remaining() > 0:
                with siblings.busy():
                    one_pass()
                if siblings.any_busy():
                    last_left, unchanged = None, 0
                else:
                    left = work_left(queue, phases)
                    waiting = "processing" in left or "retry_waiting" in left
                    unchanged = unchanged + 1 if left == last_left and not waiting else 0
                    if not left or unchanged >= STUCK_CHECKS:
                        break
                    last_left = left
                time.sleep(SIBLING_POLL_S)
    return {**totals, "seconds": round(time.monotonic() - started, 1)}


class Siblings:
    """The workers of one `run --workers N` (`group`): each holds a PostgreSQL advisory lock (group, index) while
    it works. A dead worker's lock goes with its connection, so gone counts as idle."""

    def __init__(self, engine, group: int, index: int, workers: int):
        self.engine, self.group, self.index, self.workers = engine, group, index, workers

    def __enter__(self) -> "Siblings":
        self.conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        return self

    def __exit__(self, *exc) -> None:
        self.conn.close()

    def _call(self, function: str, index: int):
        return self.conn.exec_driver_sql(
            f"SELECT {function}(%(g)s::int4, %(i)s::int4)", {"g": self.group, "i": index}
        ).scalar()

    @contextmanager
    def busy(self):
        self._call("pg_advisory_lock", self.index)
        try:
            yield
        finally:
            self._call("pg_advisory_unlock", self.index)

    def any_busy(self) -> bool:
        for other in range(self.workers):
            if other == self.index:
                continue
            if not self._call("pg_try_advisory_lock", other):
                return True
            self._call("pg_advisory_unlock", other)
        return False


def work_left(queue, phases: PhaseRegistry = PHASES) -> dict:
    """What is still to do anywhere (not only in this worker's share); empty when the queue has settled.
    Ready rows are counted whether or not a run was already planned for them, so planned-but-unclaimed work
    is never mistaken for none."""
    waiting = waiting_work(queue.engine)
    left = {f"ready_{kind}": n for kind, n in queue.ready_counts().items() if n}
    left.update(
        {f"rollup_{spec.name}": 1 for spec in phases if rollup_candidates(queue.engine, spec, 1, phases=phases)}
    )
    if waiting["processing"]:
        left["processing"] = waiting["processing"]
    if waiting["next_retry_in_s"] is not None:
        left["retry_waiting"] = 1
    return left
