"""`docqueue run`'s work (its worker processes and progress bars; its options are orchestration.cli.run_command's)
and `docqueue worker` (a cluster's Celery worker)."""

from __future__ import annotations

import json
import os
import sys
import time

import click

from orchestration.celery_worker import celery_app, preload_definitions
from orchestration.cli.context import open_queue, phase_names
from orchestration.cli.errors import EXIT_TASKS_FAILED, EXIT_USAGE, CliError, service_errors
from orchestration.cli.output import emit
from orchestration.cluster import (
    ClusterConfigError,
    check_broker,
    check_worker_environment,
    parse_queues,
    worker_argv,
    worker_queues,
)
from orchestration.environment import dagster_instance, enable_event_batches
from orchestration.stores import opened_stores
from orchestration.workers import collect_workers, run_worker, start_workers
from queue_db.config import Settings
from queue_db.embedding_reuse import vectors_reused_since
from queue_db.outcomes import task_outcomes
from queue_db.phases import PHASES
from queue_db.readmodels import phase_progress
from resources.folder_lock import release_lingering


def run_workers(
    settings: Settings,
    *,
    until_idle: bool,
    workers: int,
    max_seconds: float | None,
    max_docs: int | None,
    log_level: str | None,
    worker_index: int | None,
    worker_group: int,
    as_json: bool,
) -> None:
    """`docqueue run` (orchestration.cli.run_command has its options) once its arguments are checked: as the
    parent, the stores checked, the workers started and watched, every task summarised; as a worker
    (`worker_index`), its share of the runs."""
    if log_level is not None:
        # imported here: orchestration.runner loads the definitions' assets (seconds of Dagster), which the
        # parent of the worker processes needs only for --log-level
        from orchestration.runner import apply_log_level

        apply_log_level(log_level)
    queue = open_queue(settings)
    if worker_index is not None:  # a child of `run --workers N`
        report = run_worker(
            queue, until_idle, worker_index, workers, max_seconds, worker_group, max_docs, log_level, settings=settings
        )
        click.echo(json.dumps(report))
        return
    dagster_instance(settings).dispose()
    check_stores(settings)
    started, started_at = time.monotonic(), _database_now(queue)
    # the workers may be forks of this process: none may inherit a connection of its pool or the embedded vector
    # folder check_stores opened (released now rather than at the end of its linger, which a worker would wait out)
    queue.engine.dispose()
    release_lingering()
    children = start_workers(
        workers,
        until_idle=until_idle,
        max_seconds=max_seconds,
        extra_args=[
            *(["--max-docs", str(max_docs)] if max_docs is not None else []),
            *(["--log-level", log_level] if log_level is not None else []),
        ],
        show_logs=log_level is not None,
    )
    show_progress = sys.stdout.isatty() and not as_json
    _watch_progress(queue, children, show_progress)
    reports, errors = collect_workers(children)
    if errors:
        raise CliError(f"a worker failed: {errors[0]}")
    # --max-docs: the summary and the exit code are those documents', as its help says
    documents = None if max_docs is None else [d for r in reports for d in r.get("documents", [])]
    outcomes = task_outcomes(queue.engine, documents=documents)
    payload = {
        "runs": sum(r["runs"] for r in reports),
        "failed_runs": sum(r["failed_runs"] for r in reports),
        "seconds": round(time.monotonic() - started, 1),
        # how the workers started: forked from this process (it has imported what they run) or spawned
        "workers": {"count": len(reports), "forked": all(r.get("forked", False) for r in reports)},
        "progress": phase_progress(queue.engine, documents=documents),
        "vectors_reused": vectors_reused_since(queue.engine, started_at),
        "summary": outcomes.as_dict(),
    }
    if documents is not None:
        payload["documents"] = documents
    emit(
        as_json,
        payload,
        lambda: click.echo(
            f"{payload['runs']} run(s), {payload['failed_runs']} with failed tasks, in {payload['seconds']} s"
            + (f" over {len(payload['documents'])} document(s)" if max_docs is not None else "")
            + f", {payload['vectors_reused']} vector(s) copied from identical chunks; "
            + ", ".join(
                f"{phase}: {p['completed']}/{p['total']} completed, {p['failed']} failed"
                for phase, p in payload["progress"].items()
            )
            + f"\nsummary: {outcomes.sentence()}"
        ),
    )
    if not outcomes.clean:
        raise CliError(
            f"{outcomes.failed_total} task(s) failed and {outcomes.blocked} wait behind failed ones"
            + (
                f" ({outcomes.blocked_documents} document(s) have a phase with no work left that is not complete)"
                if outcomes.blocked_documents
                else ""
            )
            + ": `docqueue status` shows them, `docqueue retry` re-queues them",
            EXIT_TASKS_FAILED,
        )


def _database_now(queue):
    """The database's clock: the reused vectors of this run are those completed since (workers' clocks may differ)."""
    with queue.engine.connect() as conn:
        return conn.exec_driver_sql("SELECT now()").scalar()


def check_stores(settings: Settings) -> None:
    """Reach Qdrant and the graph before any work starts: an unreachable one is one sentence now, instead of every
    task failing and backing off."""
    with service_errors(), opened_stores(settings) as (store, graph):
        store.ensure_collection()
        graph.ping()


PROGRESS_REFRESH_S = 0.5  # the bars' refresh on a small queue
PROGRESS_COUNT_SHARE = 0.05  # of the database's time, at most, that counting for the bars may take


def progress_refresh_s(count_s: float) -> float:
    """Seconds until the bars are counted again, after a count that took `count_s`: the counts read whole tables,
    so on a large queue they are taken less often rather than competing with the workers (at a million chunks, a
    count of 0.3 s means a refresh every 6 s)."""
    return max(PROGRESS_REFRESH_S, count_s / PROGRESS_COUNT_SHARE)


def wait_for_children(children, seconds: float) -> None:
    until = time.monotonic() + seconds
    while time.monotonic() < until and any(child.poll() is None for child in children):
        time.sleep(min(0.2, max(until - time.monotonic(), 0)))


def _watch_progress(queue, children, show: bool) -> None:
    if not show:
        for child in children:
            child.wait()
        return
    # rich's progress bars are imported here: only a terminal without --json shows them
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description:>9}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as bars:
        tasks = {phase: bars.add_task(phase, total=1) for phase in phase_names()}
        while any(child.poll() is None for child in children):
            counted = time.monotonic()
            for phase, p in phase_progress(queue.engine).items():
                bars.update(tasks[phase], total=max(p["total"], 1), completed=p["completed"] + p["failed"])
            wait_for_children(children, progress_refresh_s(time.monotonic() - counted))
        for phase, p in phase_progress(queue.engine).items():
            bars.update(tasks[phase], total=max(p["total"], 1), completed=p["completed"] + p["failed"])


@click.command()
@click.option(
    "--broker",
    envvar="DOCQUEUE_BROKER_URL",
    default="",
    show_envvar=True,
    help="the Celery broker: redis://host:6379/0 or amqp://user:pass@host//",
)
@click.option(
    "--queues",
    default=",".join(worker_queues(PHASES)),
    show_default=True,
    help="the phases whose steps this machine runs (comma-separated)",
)
@click.option(
    "--concurrency",
    type=click.IntRange(1, 256),
    default=1,
    show_default=True,
    help="steps at once on this machine (one per core suits OCR and embedding)",
)
@click.option("--name", default=None, help="the worker's name in Celery (default docqueue@<hostname>)")
@click.pass_obj
def worker(settings: Settings, broker: str, queues: str, concurrency: int, name: str | None) -> None:
    """A cluster worker: runs the steps Dagster's Celery executor sends (DOCQUEUE_EXECUTOR=celery)."""
    if not broker.strip():
        raise CliError("a worker needs the broker: --broker URL or DOCQUEUE_BROKER_URL", EXIT_USAGE)
    try:
        check_worker_environment(settings)
        chosen = parse_queues(queues, worker_queues(PHASES))
        check_broker(broker)
    except ClusterConfigError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    # exported, not only passed on: the definitions this worker loads build the same executor as the Dagster
    # machine's from them
    os.environ["DOCQUEUE_BROKER_URL"], os.environ["DOCQUEUE_EXECUTOR"] = broker, "celery"
    enable_event_batches()
    preload_definitions()
    # dagster-celery's own queue carries any step without a phase tag
    celery_app(settings.cluster, broker).worker_main(worker_argv([*chosen, "dagster"], concurrency, name))
