"""The run launcher of docqueue's instance (dagster.yaml): each run in a process forked from one that has the code
location loaded.

Dagster's default launcher asks the code server for each run, and the code server starts a new interpreter
(multiprocessing's spawn) that imports dagster, the code location and its libraries and builds the repository
before the run's first event: about 2.7 CPU s on a 2-core machine, for runs that carry a fraction of a second of
work each on text pages, and a cost paid by the daemon's machine for every run a sensor requests, whichever
executor runs the steps. This launcher keeps a template process (multiprocessing's forkserver) that has imported
orchestration.run_process, which loads the code location and builds the repository once, and forks each run from
it.

The template is started on the first launch, in the process that launches (the daemon), with that process's
environment, and lives as long as that process: a new version of docqueue's code reaches the runs when the daemon
restarts (`docqueue ui` restarts it with the webserver). `start_method: spawn` in dagster.yaml starts every run
from a new interpreter instead, as the code server does.

A run's process records its pid and host in the run's tags, so that whichever process is asked to terminate the
run (the webserver, for the UI's Terminate button) can interrupt it on the same host: the run ends as canceled; and
the daemon's run monitoring fails a run whose process is gone.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import socket
from typing import Any, Mapping

import dagster as dg
from dagster._core.launcher.base import CheckRunHealthResult, LaunchRunContext, RunLauncher, WorkerStatus
from dagster._serdes import ConfigurableClass
from dagster._serdes.config_class import ConfigurableClassData

from orchestration.dagster_schema_shape import learned_shape

PID_TAG, HOST_TAG = "docqueue/run_pid", "docqueue/run_host"
# the module a run's process imports before it is forked: the code location, its repository built
TEMPLATE_MODULE = "orchestration.run_process"
START_METHODS = ("forkserver", "spawn")


def _execute(instance_ref, run_id: str, shape: Mapping[str, frozenset] | None = None) -> None:
    """A run's process: its entry point, by name, so that the launcher itself never imports the code location."""
    importlib.import_module(TEMPLATE_MODULE).execute_run(instance_ref, run_id, shape)


class ForkedRunLauncher(RunLauncher, ConfigurableClass):
    def __init__(self, inst_data: ConfigurableClassData | None = None, start_method: str = "forkserver"):
        if start_method not in START_METHODS:
            raise ValueError(f"start_method must be one of {', '.join(START_METHODS)}, got {start_method!r}")
        self._inst_data, self.start_method = inst_data, start_method
        self._context: Any = None
        super().__init__()

    @property
    def inst_data(self) -> ConfigurableClassData | None:
        return self._inst_data

    @classmethod
    def config_type(cls) -> dict:
        return {"start_method": dg.Field(str, is_required=False, default_value="forkserver")}

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]
    ) -> "ForkedRunLauncher":
        return cls(inst_data=inst_data, start_method=config_value.get("start_method", "forkserver"))

    def _start_context(self):
        if self._context is None:
            context = multiprocessing.get_context(self.start_method)
            if self.start_method == "forkserver":
                context.set_forkserver_preload([TEMPLATE_MODULE])
            self._context = context
        return self._context

    def warm(self) -> None:
        """Start the template process now rather than at the first launch (a daemon pays this once); returns when it
        has loaded the code location, which it does before it forks anything."""
        process = self._start_context().Process(target=os.getpid, name="dagster-run-template-check")
        process.start()
        process.join()

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        # what this instance's storages learned of the schema, so that the run's storages need not ask again
        shape = learned_shape(self._instance)
        process = self._start_context().Process(
            target=_execute, args=(self._instance.get_ref(), run.run_id, shape), name=f"dagster-run-{run.run_id[:8]}"
        )
        process.start()
        # the run's process outlives this one: the launcher's exit neither waits for it nor ends it
        multiprocessing.process._children.discard(process)  # type: ignore[attr-defined]
        self._instance.add_run_tags(run.run_id, {PID_TAG: str(process.pid), HOST_TAG: socket.gethostname()})

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        """Whether a started run's process still runs, for the daemon's run monitoring (dagster.yaml): a run whose
        process died (killed, out of memory) is failed within `poll_interval_seconds` instead of staying STARTED,
        its range counted as in flight, until `max_runtime_seconds`. Only a process known to be gone is reported
        as failed; a run whose process this host cannot see counts as running, as without a check."""
        pid = _local_pid(run)
        if pid is None or _is_run_process(pid):
            return CheckRunHealthResult(WorkerStatus.RUNNING)
        return CheckRunHealthResult(WorkerStatus.FAILED, f"the run's process (pid {pid}) on this host is gone")

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return False
        pid = _local_pid(run)
        if pid is None or not _is_run_process(pid):
            return False
        self._instance.report_run_canceling(run)
        try:
            os.kill(pid, signal.SIGINT)
        except (ProcessLookupError, PermissionError):
            return False
        return True


def _local_pid(run: dg.DagsterRun) -> int | None:
    """The pid of the run's process, as its tags record it, when that process ran on this host."""
    pid, host = run.tags.get(PID_TAG), run.tags.get(HOST_TAG)
    return int(pid) if pid and pid.isdigit() and host == socket.gethostname() else None


def _is_run_process(pid: int) -> bool:
    """Whether `pid` is still a process multiprocessing started (a run's process ended and its pid reused by another
    program must not be interrupted); where /proc is missing, the pid alone decides."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return b"multiprocessing" in cmdline.read()
    except FileNotFoundError:
        return not os.path.isdir("/proc")
    except OSError:
        return False
