"""Cluster mode: Dagster's Celery executor runs every step of every run on Celery workers on other machines.

Switched on by the settings, never by code: `DOCQUEUE_EXECUTOR=celery` with `DOCQUEUE_BROKER_URL` (Redis or
RabbitMQ) in the environment of the Dagster processes (webserver, daemon, code server: `docqueue ui` passes its
own). The daemon launches the sensors' ranged runs as usual; each run's one step is sent to the broker, on the
Celery queue its phase's spec names (`ocr`, `vector`, `graphrag`; `maintenance` for the schedules' jobs), and a
`docqueue worker` that serves that queue executes it. The workers and the Dagster machine share nothing but
PostgreSQL (queue and Dagster storage), the Bolt server, the vector store, the broker and the storage folder.
"""

from __future__ import annotations

import importlib
import socket
from typing import Iterable

from orchestration.environment import redact
from queue_db.config import Settings, secret_value
from queue_db.service_config import ClusterConfig

EXECUTOR_ENV, BROKER_ENV, BACKEND_ENV = "DOCQUEUE_EXECUTOR", "DOCQUEUE_BROKER_URL", "DOCQUEUE_CELERY_BACKEND"
# dagster-celery routes a step to the Celery queue named by this op tag
CELERY_QUEUE_TAG = "dagster-celery/queue"
# the recovery, reconciliation and checks steps; each phase's queue is named by its spec
MAINTENANCE_QUEUE = "maintenance"
# what a worker needs to reach; unset, each would quietly fall back to an embedded server on the worker itself
WORKER_REQUIRED_ENV = {
    "DOCQUEUE_DATABASE_URL": "the queue's PostgreSQL",
    "DOCQUEUE_DAGSTER_PG_URL": "Dagster's PostgreSQL storage",
    "DOCQUEUE_NEO4J_URI": "the Bolt server",
    "DOCQUEUE_STORAGE_DIR": "the shared storage folder",
}


class ClusterConfigError(ValueError):
    """A cluster setting that is missing or wrong, said in one sentence."""


def celery_queue_tags(queue: str) -> dict[str, str]:
    """Op tags of an asset or op whose step goes to the Celery queue `queue` (ignored in-process)."""
    return {CELERY_QUEUE_TAG: queue}


def worker_queues(phases) -> tuple[str, ...]:
    """The Celery queues a worker may serve: each phase's, in phase order, then maintenance."""
    return (*dict.fromkeys(spec.celery_queue for spec in phases), MAINTENANCE_QUEUE)


def executor_name(cluster: ClusterConfig) -> str:
    name = cluster.executor.strip().lower() or "in_process"
    if name not in ("in_process", "celery"):
        raise ClusterConfigError(f"{EXECUTOR_ENV} must be `celery` or unset, got {name!r}")
    return name


def broker_url(cluster: ClusterConfig) -> str:
    url = (secret_value(cluster.broker_url) or "").strip()
    if not url:
        raise ClusterConfigError(
            f"{EXECUTOR_ENV}=celery needs {BROKER_ENV} (redis://host:6379/0 or amqp://user:pass@host//)"
        )
    scheme = url.split("://", 1)[0].lower()
    if scheme not in ("redis", "rediss", "amqp", "amqps", "pyamqp"):
        raise ClusterConfigError(f"{BROKER_ENV} must be a redis:// or amqp:// URL, got a {scheme}:// one")
    return url


def backend_url(cluster: ClusterConfig, broker: str) -> str:
    """Where step results travel back: the broker itself (Redis) or RabbitMQ's reply queues (rpc://)."""
    configured = (secret_value(cluster.celery_backend) or "").strip()
    if configured:
        return configured
    return broker if broker.lower().startswith(("redis://", "rediss://")) else "rpc://"


def celery_settings(cluster: ClusterConfig) -> dict:
    """The Celery app settings the executor sends with and every worker consumes with (they must agree).

    A step is acknowledged only once it finished (acks_late): a worker machine that dies mid-step leaves its
    message unacknowledged, and the broker hands it to another worker (RabbitMQ when the connection drops,
    Redis after the visibility timeout). The step's queue tasks are fenced to their claimant, so the second
    delivery can never write over the first (see orchestration.assets.common)."""
    visibility = cluster.celery_visibility_timeout_s
    return {
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        # a worker takes one step at a time per slot: a prefetched step would wait behind a long one
        "worker_prefetch_multiplier": 1,
        "broker_connection_retry_on_startup": True,
        "result_expires": 86400,
        "broker_transport_options": {
            "visibility_timeout": visibility,
            # sweep for abandoned messages often enough that the visibility timeout is what counts
            "unacked_restore_interval": max(1, min(10, int(visibility // 4))),
            "unacked_restore_throttle": 1,
            "max_retries": 3,
            "interval_start": 0,
            "interval_step": 0.2,
            "interval_max": 0.5,
        },
    }


def executor_for(cluster: ClusterConfig):
    """The executor every job of the code location uses: the run's own process unless cluster mode is on. Dagster's
    default would start a new interpreter for each step of a launched run, which imports the code location and
    loads the models again, for steps that carry a fraction of a second of work on text pages."""
    if executor_name(cluster) != "celery":
        import dagster as dg

        return dg.in_process_executor
    try:
        from dagster_celery import celery_executor
    except ImportError:
        raise ClusterConfigError(
            f"{EXECUTOR_ENV}=celery needs the cluster extra: pip install -e '.[cluster]'"
        ) from None
    broker = broker_url(cluster)
    poll_results_every(cluster.celery_poll_interval_s)
    # the URLs stay environment references: a broker password never enters the definitions or a run's config
    backend = (
        {"env": BACKEND_ENV}
        if cluster.celery_backend is not None
        else ({"env": BROKER_ENV} if backend_url(cluster, broker) == broker else "rpc://")
    )
    return celery_executor.configured(
        {"broker": {"env": BROKER_ENV}, "backend": backend, "config_source": celery_settings(cluster)},
        name="docqueue_celery",
    )


# imported by Celery and kombu on a process's first send_task, so by every run's process but for this list
SEND_MODULES = (
    "celery.app.events",
    "celery.events.dispatcher",
    "celery.events.receiver",
    "encodings.idna",
    "kombu.mixins",
)


def load_executor_code(cluster: ClusterConfig) -> None:
    """Import what a run's process needs to send its step to the broker (Celery's app and worker modules, the
    broker's transport), in the template process runs are forked from (orchestration/run_process.py): imported in
    each run instead, it was about half a CPU second of every run. Nothing connects here."""
    if executor_name(cluster) != "celery":
        return
    import dagster_celery.tasks  # noqa: F401 - what the executor imports to submit a step (it loads dagster's CLI)
    from celery.app.backends import by_url
    from dagster_celery.make_app import make_app

    broker = broker_url(cluster)
    app = make_app({"broker": broker, "backend": backend_url(cluster, broker), "include": []})
    app.connection_for_write().transport  # noqa: B018 - resolving the transport class imports its module
    # finding the result backend's class scans every installed package's entry points; Celery keeps the answer
    # for the process, so found here, every run forked from this process finds it at once
    by_url(app.conf.result_backend, app.loader)
    # what sending a step imports on its first send (the task events' dispatcher, the host name's codec)
    for module in SEND_MODULES:
        importlib.import_module(module)


def poll_results_every(seconds: float) -> None:
    """How often a run checks whether its step's result came back (DOCQUEUE_CELERY_POLL_INTERVAL).

    dagster-celery sleeps a fixed second between checks, half a second on average added to each step, and steps
    here take 0.5-2.5 s (bench/scale_out.py's worker logs). Its loop reads the module's constant on every pass,
    so setting it is enough; a check is one GET on the result backend."""
    from dagster_celery import core_execution_loop

    core_execution_loop.TICK_SECONDS = seconds


def check_worker_environment(settings: Settings) -> None:
    """A worker's settings name every shared service (the settings the worker's steps are built with)."""
    configured = {
        "DOCQUEUE_DATABASE_URL": secret_value(settings.database.database_url),
        "DOCQUEUE_DAGSTER_PG_URL": secret_value(settings.database.dagster_pg_url),
        "DOCQUEUE_NEO4J_URI": settings.graph.uri,
        "DOCQUEUE_STORAGE_DIR": settings.storage.storage_dir,
    }
    missing = [f"{name} ({what})" for name, what in WORKER_REQUIRED_ENV.items() if not configured[name].strip()]
    if not (secret_value(settings.vector.url).strip() or settings.vector.path.strip()):
        missing.append("DOCQUEUE_QDRANT_URL or DOCQUEUE_QDRANT_PATH (the vector store)")
    if missing:
        raise ClusterConfigError(
            "a worker uses the cluster's shared services, never embedded ones: set " + ", ".join(missing)
        )


def check_broker(url: str, timeout_s: float = 10.0) -> None:
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=timeout_s) as connection:
            connection.ensure_connection(max_retries=1, timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001 - any failure to reach the broker is said in one sentence
        raise ClusterConfigError(
            f"cannot reach the broker at {_redact(url)} ({_first_line(exc)}); check {BROKER_ENV} / --broker"
        ) from None


def parse_queues(raw: str, known: Iterable[str]) -> list[str]:
    """`--queues`: a comma-separated list of `known` (worker_queues of the phases)."""
    known = tuple(known)
    queues = [q.strip() for q in raw.split(",") if q.strip()]
    unknown = [q for q in queues if q not in known]
    if unknown or not queues:
        raise ClusterConfigError(f"--queues takes a comma-separated list of {', '.join(known)}; got {raw!r}")
    return queues


def worker_argv(queues: Iterable[str], concurrency: int, name: str | None, loglevel: str = "INFO") -> list[str]:
    # prefork: a step that crashes its process (native code) takes only that slot down, and the slot is replaced
    return [
        "worker",
        f"--loglevel={loglevel}",
        f"--concurrency={concurrency}",
        f"--queues={','.join(queues)}",
        f"--hostname={name or 'docqueue@' + socket.gethostname()}",
        "--pool=prefork",
        "--without-mingle",
        "--without-gossip",
    ]


def _redact(url: str) -> str:
    return redact(url)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
