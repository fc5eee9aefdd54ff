"""PostgreSQL: the queue's database as a Dagster resource (DOCQUEUE_DATABASE_URL, else the embedded server)."""
from __future__ import annotations

import threading

import dagster as dg
import sqlalchemy as sa
from pydantic import Field

from queue_db.config import DatabaseConfig, QueueSettings, settings
from queue_db.migrate import pending_migrations
from queue_db.queue import TaskQueue, create_queue_engine
from queue_db.database_urls import database_url, normalize_url

_engines: dict[str, sa.Engine] = {}
_lock = threading.Lock()


def shared_engine(url: str | None = None) -> sa.Engine:
    """One pooled engine per database per process."""
    url = normalize_url(url) if url else database_url(settings(DatabaseConfig))
    with _lock:
        if url not in _engines:
            _engines[url] = create_queue_engine(url)
        return _engines[url]


class SchemaNotReady(RuntimeError):
    pass


def get_queue(url: str | None = None, settings: QueueSettings | None = None) -> TaskQueue:
    engine = shared_engine(url)
    try:
        missing = pending_migrations(engine)
    except sa.exc.DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
        # pooled connections are not pinged (create_queue_engine): after a server restart the first use finds
        # them dead and the pool discards them all, so this sensor tick or run goes on with a fresh one
        missing = pending_migrations(engine)
    if missing:
        names = ", ".join(f"{m.version:04d}_{m.name}" for m in missing)
        raise SchemaNotReady(f"the queue database needs migrations ({names}): run `docqueue db upgrade`")
    return TaskQueue(engine, settings or QueueSettings.from_env())


class DatabaseResource(dg.ConfigurableResource):
    """The task queue. `url` empty: DOCQUEUE_DATABASE_URL, else the embedded PostgreSQL under DOCQUEUE_HOME.
    Pass a URL with a password as `dg.EnvVar(...)` so it never appears in run config."""

    url: str = Field(default="", description="SQLAlchemy/libpq URL of the queue database; empty = environment/embedded")

    def get_queue(self) -> TaskQueue:
        return get_queue(self.url or None)
