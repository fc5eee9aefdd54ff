"""What a run's process runs, when orchestration.run_launcher starts it forked from a process that has the code
location loaded.

Importing this module loads the code location (orchestration.definitions) and builds its repository, once, in the
launcher's template process; every run forked from it starts with both in memory instead of a new interpreter that
imports them again. The models are not loaded here: their runtimes start thread pools, which do not survive a fork.
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
from typing import Mapping

import dagster as dg
from dagster._core.events import EngineEventData
from dagster._grpc.impl import core_execute_run
from dagster._utils.hosted_user_process import recon_job_from_origin
from dagster._utils.interrupts import capture_interrupts

from orchestration.cluster import load_executor_code
from orchestration.dagster_pooled_storage import known_tables  # also loads the storages every run builds
from orchestration.definitions import defs, settings
from orchestration.loaded_heap import freeze_loaded
from orchestration.run_launcher import HOST_TAG, PID_TAG

# What every run's process would otherwise import for itself, each time, because the modules that use them import
# them late (so that light commands start fast): its instance's machinery (the storages' driver, the secrets
# loader, the compute log manager, the definitions-state storage's path library) and the stores' modules its
# resources open. Imported here once; none of them starts a thread or opens anything. A name a later Dagster moves
# is left to the runs (the exit event counts the modules a run loaded: tests/integration/test_run_launcher.py).
RUN_MODULES = (
    "dagster._core.instance.factory",
    "dagster._core.storage.legacy_storage",
    "dagster._core.storage.local_compute_log_manager",
    "dagster._core.storage.sqlite_storage",
    "dagster._core.secrets.env_file",
    "dagster._core.execution.plan.active",
    "dagster._core.executor.in_process",
    "dagster._core.system_config.composite_descent",
    "dagster._core.utility_ops",
    "dagster._core.workspace.autodiscovery",
    "dagster._utils.temp_file",
    "dagster._utils.test.definitions",
    "dotenv",
    "gzip",
    "importlib.resources.readers",
    "psycopg2.extras",
    "upath",
    "upath.implementations.local",
    "watchdog.observers.polling",
    "orchestration.compute_logs",
    "processing.fusion",
    "processing.sparse",
    "resources.page_cache",
    "resources.qdrant_edge",
    "resources.qdrant_edge_search",
    "resources.qdrant_edge_shard",
)
for _module in RUN_MODULES:
    try:
        importlib.import_module(_module)
    except ImportError:
        pass

# the repository is built once, before any fork, so that no run builds it again
defs.get_repository_def()
load_executor_code(settings.cluster)
freeze_loaded()


def execute_run(instance_ref, run_id: str, shape: Mapping[str, frozenset] | None = None) -> None:
    """Execute run `run_id` in this process, as Dagster's code server does in the process it starts for a run: the
    job is loaded from the run's own code origin, every outcome (a failure to load included) is written to the run
    storage, and an interrupt (SIGINT, the launcher's `terminate`) ends the run as canceled. The exit event gives the
    CPU seconds the process used (since the fork, or since the interpreter started when runs are spawned)."""
    loaded = len(sys.modules)
    with capture_interrupts():
        with known_tables(shape):  # the launcher's instance wrote this run to them, and learned `shape` of them
            instance = dg.DagsterInstance.from_ref(instance_ref)
        with instance:
            run = instance.get_run_by_id(run_id)
            if run is None or run.job_code_origin is None:
                return  # deleted before it started, or launched without a code origin: nothing this process can run
            # before the run is marked started: a re-execution inherits its parent's tags, this pid among them, and the
            # run monitoring reads a started run's pid to tell whether its process still runs
            instance.add_run_tags(run_id, {PID_TAG: str(os.getpid()), HOST_TAG: socket.gethostname()})
            instance.report_engine_event(
                f"Started process for run (pid: {os.getpid()}), forked with the code location loaded.",
                run,
                EngineEventData.in_process(os.getpid()),
            )
            try:
                for _ in core_execute_run(
                    recon_job_from_origin(run.job_code_origin), run, instance, inject_env_vars=False
                ):
                    pass
            except BaseException:  # noqa: BLE001 - core_execute_run has written the failure to the run's events
                pass
            finally:
                used = os.times()
                instance.report_engine_event(
                    f"Process for run exited (pid: {os.getpid()}, {used.user + used.system:.2f} CPU s, "
                    f"{len(sys.modules) - loaded} modules loaded by the run).",
                    run,
                )
