"""The workers of `docqueue run --workers N`: N processes, each running the Dagster definitions over its share of
the registration blocks, leaving together once nothing is left anywhere."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from contextlib import contextmanager
from typing import Sequence, Union

from orchestration.assets.handlers import HANDLERS, kind_work
from orchestration.code_location import build_definitions
from orchestration.environment import dagster_instance
from orchestration.loaded_heap import freeze_loaded
from orchestration.runner import run_until_idle
from queue_db.config import Settings
from queue_db.inspection import outlook
from queue_db.partition_keys import rollup_candidates
from queue_db.phases import PHASES, PhaseRegistry
from queue_db.progress_signal import News, ProgressListener, announce
from queue_db.run_scope import most_urgent_unfinished
from resources.folder_lock import release_lingering
from resources.ocr_resource import OcrResource, close_shared_processors


def start_workers(
    workers: int,
    *,
    until_idle: bool,
    max_seconds: float | None,
    extra_args: Sequence[str] = (),
    show_logs: bool = False,
    fork: bool | None = None,
) -> list[WorkerProcess]:
    """Start the worker processes of one `run --workers N`, each running `docqueue run --worker-index I`. `show_logs`
    (`--log-level`): their stderr, where their logs go, is this process's own. `fork` (default: where the
    platform forks safely, see can_fork): each worker is a fork of this process, which has imported the code a
    worker runs, rather than a new interpreter that imports it again."""
    group = secrets.randbelow(2**31 - 1) + 1
    fork = can_fork() if fork is None else fork
    argvs = [
        ["run", "--worker-index", str(i), "--workers", str(workers), "--worker-group", str(group)]
        + (["--until-idle"] if until_idle else [])
        + (["--max-seconds", str(max_seconds)] if max_seconds else [])
        + list(extra_args)
        for i in range(workers)
    ]
    if fork:
        return [ForkedWorker(argv, show_logs) for argv in argvs]
    return [
        subprocess.Popen(
            [sys.executable, "-m", "orchestration.cli", *argv],
            stdout=subprocess.PIPE,
            stderr=None if show_logs else subprocess.PIPE,
            text=True,
        )
        for argv in argvs
    ]


def can_fork(wait_s: float = 0.5) -> bool:
    """Whether this process may fork its workers: on Linux, and with no thread besides the main one (a fork copies
    only the thread that forks; a lock another thread held would stay locked in the child forever). Threads still
    ending (an embedded store's linger timer, once its folder is released) get `wait_s` to end."""
    if not sys.platform.startswith("linux"):
        return False
    deadline = time.monotonic() + wait_s
    for thread in threading.enumerate():
        if thread is not threading.main_thread():
            thread.join(max(deadline - time.monotonic(), 0.0))
    return threading.active_count() == 1


class ForkedWorker:
    """A worker forked from `docqueue run`'s own process, which has imported everything a worker imports
    (Dagster, the definitions' modules, the stores' drivers): the child skips an interpreter's start and those
    imports, seconds of each worker's start-up. It runs the same command line as a spawned worker
    (`run --worker-index I ...`, through the CLI's own error handling) and answers as a subprocess.Popen does:
    poll, wait, communicate and returncode, its stdout and stderr kept in unnamed files so that neither can fill a
    pipe while the parent waits. Nothing of the parent's is used by the child: the parent holds no connection
    and no Python thread when it forks (cli.running closes them first), and the child opens its own. Native pools
    that exist by then (numpy's OpenBLAS threads) restart themselves in a child through their own fork handlers;
    the models, whose runtimes' pools do not, load in each child after the fork."""

    def __init__(self, argv: list[str], show_logs: bool):
        self.args = argv
        self.returncode: int | None = None
        self._out = tempfile.TemporaryFile()
        self._err = None if show_logs else tempfile.TemporaryFile()
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:
            self._run_child()  # never returns

    def _run_child(self) -> None:
        global FORKED
        FORKED = True
        code = 1
        try:
            os.dup2(self._out.fileno(), 1)
            sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # whatever sys.stdout was, fd 1 it is now
            if self._err is not None:
                os.dup2(self._err.fileno(), 2)
                sys.stderr = open(2, "w", encoding="utf-8", closefd=False, buffering=1)
            from orchestration.cli import main

            try:
                main(self.args, prog_name="docqueue")
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # noqa: BLE001  (the child must end here, never in its parent's code)
            traceback.print_exc()
        finally:
            try:
                # what an interpreter's exit does through finalizers and atexit: PDF workers stopped and waited for,
                # embedded vector folders closed
                close_shared_processors()
                release_lingering()
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def communicate(self) -> tuple[str, str | None]:
        self.wait()
        return _read(self._out), None if self._err is None else _read(self._err)

    def kill(self) -> None:
        if self.returncode is None:
            os.kill(self.pid, signal.SIGKILL)


def _read(file) -> str:
    file.seek(0)
    text = file.read().decode("utf-8", "replace")
    file.close()
    return text


WorkerProcess = Union[ForkedWorker, "subprocess.Popen[str]"]


def collect_workers(children: Sequence[WorkerProcess]) -> tuple[list[dict], list[str]]:
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


# whether this process is a ForkedWorker (its report says so)
FORKED = False
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
    start_pdf_worker_for_ready_work(queue, settings, phases)
    freeze_loaded()
    started = time.monotonic()
    totals = {"runs": 0, "failed_runs": 0}
    # --max-docs runs in one worker, which chooses the documents as it starts
    documents = None if max_docs is None else most_urgent_unfinished(queue.engine, max_docs)
    if documents is not None:
        totals["documents"] = documents

    def remaining() -> float | None:
        return None if max_seconds is None else max_seconds - (time.monotonic() - started)

    def one_pass(listener: ProgressListener | None = None) -> None:
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
            listener=listener,
        )
        totals["runs"] += report.runs
        totals["failed_runs"] += report.failed_runs

    if workers == 1 or not until_idle:
        one_pass()
    else:
        with Siblings(queue.engine, group, index, workers) as siblings, ProgressListener(queue.engine) as listener:
            wait = SiblingWait(siblings, listener, queue, phases)
            while remaining() is None or remaining() > 0:
                with siblings.busy():
                    one_pass(listener)
                announce(queue.engine, News.IDLE)  # siblings waiting for this one to go idle look again now
                if wait.until_work_may_be_here():
                    break
    return {**totals, "seconds": round(time.monotonic() - started, 1), "forked": FORKED}


def start_pdf_worker_for_ready_work(queue, settings: Settings, phases: PhaseRegistry = PHASES) -> bool:
    """Start this process's PDF worker, without waiting for it, when a task whose work opens it (the "ocr" resource)
    is ready: its start (an interpreter and PyMuPDF, 0.2-0.3 s) then goes on beside the planning and launch of the
    first run instead of after that run's first claim. True when one was started."""
    kinds = [kind for spec in phases for kind in spec.kinds if "ocr" in kind_work(HANDLERS, spec, kind).resources]
    if not queue.any_ready(kinds):
        return False
    OcrResource.from_settings(settings).get_processor().start()
    return True


class SiblingWait:
    """Where a worker of `run --workers N` waits between its passes: until a sibling's run ended (it may have made
    work in this worker's share) or SIBLING_POLL_S passed. A sibling going idle is a reason to look whether every
    worker is idle and nothing is left anywhere, never for a pass of its own, so idle workers do not wake each
    other in turn."""

    def __init__(self, siblings: "Siblings", listener: ProgressListener, queue, phases: PhaseRegistry):
        self.siblings, self.listener, self.queue, self.phases = siblings, listener, queue, phases
        self.last_left: dict | None = None
        self.unchanged = 0

    def until_work_may_be_here(self) -> bool:
        """Wait; True when the worker should leave: no sibling busy and nothing left, or the same work left for
        STUCK_CHECKS checks in a row that nobody plans."""
        while True:
            if self.siblings.any_busy():
                self.last_left, self.unchanged = None, 0
            else:
                left = work_left(self.queue, self.phases)
                waiting = "processing" in left or "retry_waiting" in left
                self.unchanged = self.unchanged + 1 if left == self.last_left and not waiting else 0
                if not left or self.unchanged >= STUCK_CHECKS:
                    return True
                self.last_left = left
            if self.listener.wait(SIBLING_POLL_S) is not News.IDLE:
                return False


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
    now = outlook(queue.engine, phases.kinds, count_ready=True)
    left = {f"ready_{kind}": n for kind, n in now.ready.items() if n}
    left.update(
        {f"rollup_{spec.name}": 1 for spec in phases if rollup_candidates(queue.engine, spec, 1, phases=phases)}
    )
    if now.held:
        left["processing"] = now.held
    if now.next_retry_in_s is not None:
        left["retry_waiting"] = 1
    return left
