"""The Celery app of a cluster worker (`docqueue worker`), and loading the code location before Celery forks.

`docqueue worker` is the worker's entry point: it builds the settings and hands their cluster group here. The
steps a worker executes load the code location itself (orchestration.definitions, which builds its settings from
the environment the worker passes on), exactly as a run on the Dagster machine does.
"""

from __future__ import annotations

from orchestration.cluster import backend_url, celery_settings
from queue_db.service_config import ClusterConfig


def preload_definitions() -> None:
    """Import the code location in the worker's parent, before Celery forks its pool, so that each prefork child
    starts with dagster, the assets and the resources' modules loaded instead of importing them in its first
    step (seconds of a 2-core machine, per child and per replacement of a child). Imported here, when called:
    the code location builds its settings from the environment the command has just completed."""
    import orchestration.definitions  # noqa: F401


def celery_app(cluster: ClusterConfig, broker: str):
    """The Celery app of a worker: dagster-celery's, with the same settings the executor sends with."""
    from dagster_celery.config import DEFAULT_CONFIG
    from dagster_celery.make_app import make_app

    from orchestration.celery_steps import create_step_task

    app = make_app(
        {
            "broker": broker,
            "backend": backend_url(cluster, broker),
            "include": [],
            "config_source": {**DEFAULT_CONFIG, **celery_settings(cluster)},
        }
    )
    # dagster-celery declares only its own queue; the phase queues are made on first use
    app.conf.task_create_missing_queues = True
    create_step_task(app)  # dagster-celery's step task, keeping the instance and the job between steps
    return app
