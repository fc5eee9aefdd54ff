"""What the commands start from besides the settings the group builds: the queue, and the checked arguments every
command shares. Dagster's storage and DAGSTER_HOME are prepared by the commands that use Dagster
(orchestration.environment), so `status`, `stats` and `ingest` load and do only what the queue needs."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import click

from orchestration.cli.errors import EXIT_USAGE, CliError, service_failures
from queue_db.config import QueueSettings, Settings
from queue_db.database_urls import database_url
from queue_db.direct_engine import DirectEngine
from queue_db.migrate import pending_migrations, upgrade
from queue_db.phases import Phase
from queue_db.queue import TaskQueue, create_queue_engine
from queue_db.tenants import checked_tenant
from queue_db.transactions import with_retries

if TYPE_CHECKING:
    import sqlalchemy as sa


def open_queue(settings: Settings, queue_url: str | None = None, *, direct: bool = False) -> TaskQueue:
    """The queue, with failures to reach the database turned into one actionable sentence; `queue_url`: where it is
    when the caller prepared the environment already, else DOCQUEUE_DATABASE_URL or the embedded server (started
    when needed). Built from queue_db alone: resources.database imports Dagster, a second of start-up that `status`
    and friends do not need. A server's database (DOCQUEUE_DATABASE_URL) is migrated by `docqueue db upgrade` only,
    when its owner decides.

    `direct`: on psycopg alone (queue_db.direct_engine), for a command that asks and ends without handing the queue
    to Dagster or the stores: SQLAlchemy's import is a third of such a command's start-up."""
    embedded = settings.database.database_url is None
    with service_failures():
        url = queue_url or database_url(settings.database)
        # the direct engine serves the part of SQLAlchemy's Engine the queue calls (queue_db.direct_engine)
        engine = cast("sa.Engine", DirectEngine(url)) if direct else create_queue_engine(url)
        # a server with every connection slot taken is waited for (one log line); any other failure to connect
        # is reported at once
        missing = with_retries(lambda: pending_migrations(engine), attempts=1)
        if missing and embedded:
            # the embedded database is docqueue's own: its first command creates the schema
            upgrade(engine)
            missing = []
    if missing:
        names = ", ".join(f"{m.version:04d}_{m.name}" for m in missing)
        raise CliError(f"the queue database needs migrations ({names}): run `docqueue db upgrade`")
    return TaskQueue(engine, QueueSettings.from_config(settings.queue))


def document_or_fail(queue: TaskQueue, ref: str, tenant: str | None = None) -> dict:
    document = queue.document(ref, tenant)
    if document is None:
        within = f" in tenant {tenant!r}" if tenant else ""
        raise CliError(
            f"no document {ref!r}{within}: use an id, a document key or a content hash from `docqueue status`"
        )
    return document


def tenant_option(what: str):
    return click.option("--tenant", metavar="T", default=None, help=f"{what} (queue_db/tenants.py)")


def tenant_or_default(settings: Settings, name: str | None) -> str:
    """The checked tenant; without --tenant, DOCQUEUE_DEFAULT_TENANT."""
    try:
        return checked_tenant(name, settings.tenant.default_tenant)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None


def tenant_filter(settings: Settings, name: str | None) -> str | None:
    """The checked tenant; None (every tenant) without --tenant."""
    return None if name is None else tenant_or_default(settings, name)


def phase_names(*, rerunnable: bool = False) -> list[str]:
    """The phases, in order, for --phase and the progress bars; `rerunnable`: those `reindex` may run again while
    keeping the first phase's output (OCR)."""
    phases = list(Phase)
    return [phase.value for phase in (phases[1:] if rerunnable else phases)]
