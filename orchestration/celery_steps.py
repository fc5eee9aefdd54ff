"""The Celery task that executes a run's steps on a cluster worker: dagster-celery's, with what a worker process
can keep between steps kept.

dagster-celery's own task (`dagster_celery.tasks.create_task`) builds a Dagster instance from the step's instance
reference and reconstructs the job from its pointer for every step, and never closes that instance: each step
of a text page paid three new storages, their connection pools and their first connections, and left them behind.
Here each worker process keeps one instance per instance reference and one reconstructed job per pointer, and
closes the instances when the process exits. The execution plan is still made per step: it depends on the run's
config and on the steps already done (`known_state`). Everything else is dagster-celery 0.29's task as it is.
"""

from __future__ import annotations

import atexit
import json
import threading
import time

from dagster import DagsterInstance
from dagster import _check as check
from dagster._core.definitions.reconstruct import ReconstructableJob
from dagster._core.events import EngineEventData
from dagster._core.execution.api import create_execution_plan, execute_plan_iterator
from dagster._grpc.types import ExecuteStepArgs
from dagster._serdes import serialize_value, unpack_value
from dagster_celery.config import TASK_EXECUTE_PLAN_NAME
from dagster_celery.core_execution_loop import DELEGATE_MARKER
from dagster_celery.executor import CeleryExecutor

from orchestration.assets.common import mark_step_handed

_instances: dict[str, DagsterInstance] = {}
_jobs: dict[str, ReconstructableJob] = {}
_lock = threading.Lock()
# a worker serves one Dagster deployment: more references than this mean something rotates them, and the oldest
# instance is closed rather than kept
MAX_INSTANCES = 4


def step_instance(instance_ref) -> DagsterInstance:
    """This process's instance for `instance_ref`, made on first use."""
    key = serialize_value(instance_ref)
    with _lock:
        instance = _instances.get(key)
        if instance is None:
            if len(_instances) >= MAX_INSTANCES:
                _instances.pop(next(iter(_instances))).dispose()
            instance = _instances[key] = DagsterInstance.from_ref(instance_ref)
        return instance


def step_job(executable_dict: dict) -> ReconstructableJob:
    """This process's reconstructed job for the pointer `executable_dict`."""
    key = json.dumps(executable_dict, sort_keys=True, default=str)
    with _lock:
        job = _jobs.get(key)
        if job is None:
            job = _jobs[key] = ReconstructableJob.from_dict(executable_dict)
        return job


@atexit.register
def _close_instances() -> None:
    for instance in list(_instances.values()):
        try:
            instance.dispose()
        except Exception:  # noqa: BLE001  (a process on its way out: nothing left to tell)
            pass
    _instances.clear()


def create_step_task(celery_app, **task_kwargs):
    """Register the step task under dagster-celery's name, so that its executor's messages reach it."""

    @celery_app.task(bind=True, name=TASK_EXECUTE_PLAN_NAME, **task_kwargs)
    def _execute_plan(self, execute_step_args_packed, executable_dict):
        mark_step_handed(time.time())
        try:
            return _execute(self, execute_step_args_packed, executable_dict)
        finally:
            mark_step_handed(None)

    def _execute(self, execute_step_args_packed, executable_dict):
        execute_step_args = unpack_value(
            check.dict_param(execute_step_args_packed, "execute_step_args_packed"), as_type=ExecuteStepArgs
        )
        check.dict_param(executable_dict, "executable_dict")
        instance = step_instance(execute_step_args.instance_ref)
        recon_job = step_job(executable_dict)
        dagster_run = instance.get_run_by_id(execute_step_args.run_id)
        check.invariant(dagster_run, f"Could not load run {execute_step_args.run_id}")
        step_keys_str = ", ".join(execute_step_args.step_keys_to_execute or [])
        execution_plan = create_execution_plan(
            recon_job,
            dagster_run.run_config,
            step_keys_to_execute=execute_step_args.step_keys_to_execute,
            known_state=execute_step_args.known_state,
        )
        engine_event = instance.report_engine_event(
            f"Executing steps {step_keys_str} in celery worker",
            dagster_run,
            EngineEventData(
                {"step_keys": step_keys_str, "Celery worker": self.request.hostname}, marker_end=DELEGATE_MARKER
            ),
            CeleryExecutor,
            step_key=execution_plan.step_handle_for_single_step_plans().to_key(),
        )
        events = [engine_event]
        for step_event in execute_plan_iterator(
            execution_plan=execution_plan,
            job=recon_job,
            dagster_run=dagster_run,
            instance=instance,
            retry_mode=execute_step_args.retry_mode,
            run_config=dagster_run.run_config,
        ):
            events.append(step_event)
        return [serialize_value(event) for event in events]

    return _execute_plan
