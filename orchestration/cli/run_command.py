"""`docqueue run`: its options, and the start of the services a run waits for while the run's code loads.

A run's code (Dagster, the definitions, the stores' drivers) takes about a second to import, and the embedded Bolt
server about as long to start on a home where it is not running. This module imports neither: the command starts
the server first, without waiting, then loads orchestration.cli.running, which waits for what is left of the start
before any worker begins (an unreachable store is still one sentence before any work)."""

from __future__ import annotations

import click

from orchestration.cli.errors import EXIT_FAILURE, EXIT_TASKS_FAILED, EXIT_USAGE, CliError, service_errors
from queue_db.config import QueueConfig, Settings
from resources.bolt_server import BoltServer

RUN_EXIT_CODES = (
    f"Exit codes: 0 every task completed (or is still open); {EXIT_TASKS_FAILED} tasks ended failed or "
    f"wait behind failed ones (`docqueue status` shows them, `docqueue retry` re-queues them); "
    f"{EXIT_FAILURE} a service is unreachable or a worker failed; {EXIT_USAGE} bad arguments."
)


@click.command(epilog=RUN_EXIT_CODES)
@click.option("--until-idle", is_flag=True, help="exit once no ready work remains")
@click.option(
    "--workers",
    type=click.IntRange(1, 16),
    default=1,
    show_default=True,
    help="worker processes, each taking its share of the ready work",
)
@click.option("--max-seconds", type=float, default=None, help="stop after this long even if work remains")
@click.option(
    "--max-docs",
    type=click.IntRange(1, 1000),
    default=None,
    help="work only on the N most urgent unfinished documents (priority, then oldest), through every "
    "phase, then exit; one worker; the summary and the exit code cover those documents only",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default=None,
    help="log records of this level and above to stderr, the runs' Dagster logs included",
)
@click.option("--worker-index", type=int, default=None, hidden=True)
@click.option("--worker-group", type=int, default=0, hidden=True)
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON document on stdout")
@click.pass_obj
def run(settings: Settings, **options) -> None:
    """Process ready work through the Dagster definitions (recorded in the Dagster instance), then summarise
    every task: completed, failed by error class, blocked behind a failed earlier phase, open."""
    # the options go on as they came: their types are orchestration.cli.running.run_workers's parameters
    if options["max_docs"] is not None and options["workers"] > 1:
        raise CliError("--max-docs runs in one worker: drop --workers or --max-docs", EXIT_USAGE)
    if not settings.queue.enabled:
        click.echo(f"docqueue: {QueueConfig.disabled_reason} (nothing was run)", err=True)
        return
    if options["worker_index"] is None and not settings.graph.uri:
        with service_errors():
            BoltServer.from_settings(settings).launch()
    # imported once the server is starting: the import is the start-up the server's start overlaps
    from orchestration.cli.running import run_workers

    run_workers(settings, **options)
