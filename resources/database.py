"""PostgreSQL: the queue's database as a Dagster resource (DOCQUEUE_DATABASE_URL, else the embedded server), and
`open_queue(settings)` for the entry points that use the queue without Dagster."""

from __future__ import annotations

import threading

import dagster as dg
import sqlalchemy as sa
from pydantic import Field

from queue_db.config import QueueSettings, Settings, secret_value
from queue_db.database_urls import database_url, embedded_url, normalize_url
from queue_db.migrate import pending_migrations
from queue_db.phases import PHASES
from queue_db.queue import TaskQueue, create_queue_engine
from queue_db.rollup_sql import missing_bubble_functions
from queue_db.transactions import with_retries

_engines: dict[str, sa.Engine] = {}
_lock = threading.Lock()


def shared_engine(url: str) -> sa.Engine:
    """One pooled engine per database per process."""
    url = normalize_url(url)
    with _lock:
        if url not in _engines:
            _engines[url] = create_queue_engine(url)
        return _engines[url]


class SchemaNotReady(RuntimeError):
    pass


def open_queue(settings: Settings) -> TaskQueue:
    """The task queue these settings name (DOCQUEUE_DATABASE_URL, else the embedded server of their home)."""
    return get_queue(QueueSettings.from_config(settings.queue), database_url(settings.database))


def get_queue(settings: QueueSettings, url: str) -> TaskQueue:
    """The task queue in the database at `url`, with the caller's queue settings; refused while the schema lacks
    migrations."""
    engine = shared_engine(url)
    # pooled connections are not pinged (create_queue_engine): after a server restart or a killed backend the first
    # use finds them dead and the pool discards them, so one more attempt goes on with a fresh one; a server with
    # no free connection slot is waited for (queue_db.transactions.CONNECTION_WAIT_S, or the sensor tick's bound)
    missing = with_retries(lambda: pending_migrations(engine), attempts=2)
    if missing:
        names = ", ".join(f"{m.version:04d}_{m.name}" for m in missing)
        raise SchemaNotReady(f"the queue database needs migrations ({names}): run `docqueue db upgrade`")

    def absent_functions() -> list[str]:
        with engine.connect() as conn:
            return missing_bubble_functions(conn, PHASES)

    absent = with_retries(absent_functions, attempts=2)
    if absent:
        raise SchemaNotReady(
            f"the queue database lacks this version's bubble-up functions ({', '.join(absent)}): "
            "run `docqueue db upgrade`"
        )
    return TaskQueue(engine, settings)


class DatabaseResource(dg.ConfigurableResource):
    """The task queue; the entry point fills the fields (`DatabaseResource.from_settings`). `url` empty: the embedded
    PostgreSQL under DOCQUEUE_HOME. A URL with a password goes in as `dg.EnvVar(...)` so it never appears in run
    config."""

    url: str = Field(default="", description="SQLAlchemy/libpq URL of the queue database; empty = embedded")
    home: str = Field(default=".docqueue", description="DOCQUEUE_HOME, whose embedded server serves an empty url")
    pg_port: int = Field(default=0, description="the embedded server's port; 0 = the one recorded in the home")
    poll_interval_s: float = QueueSettings.poll_interval_s
    heartbeat_interval_s: float = QueueSettings.heartbeat_interval_s
    stale_timeout_s: float = QueueSettings.stale_timeout_s
    max_retries: int = QueueSettings.max_retries
    retry_backoff_base_s: float = QueueSettings.retry_backoff_base_s
    retry_backoff_max_s: float = QueueSettings.retry_backoff_max_s

    @classmethod
    def from_settings(cls, settings: Settings) -> "DatabaseResource":
        queue = QueueSettings.from_config(settings.queue)
        return cls(
            url=dg.EnvVar("DOCQUEUE_DATABASE_URL") if secret_value(settings.database.database_url) else "",
            home=settings.database.home,
            pg_port=settings.database.pg_port,
            poll_interval_s=queue.poll_interval_s,
            heartbeat_interval_s=queue.heartbeat_interval_s,
            stale_timeout_s=queue.stale_timeout_s,
            max_retries=queue.max_retries,
            retry_backoff_base_s=queue.retry_backoff_base_s,
            retry_backoff_max_s=queue.retry_backoff_max_s,
        )

    def queue_settings(self) -> QueueSettings:
        return QueueSettings(
            poll_interval_s=self.poll_interval_s,
            heartbeat_interval_s=self.heartbeat_interval_s,
            stale_timeout_s=self.stale_timeout_s,
            max_retries=self.max_retries,
            retry_backoff_base_s=self.retry_backoff_base_s,
            retry_backoff_max_s=self.retry_backoff_max_s,
        )

    def get_queue(self) -> TaskQueue:
        url = self.url.get_value() if isinstance(self.url, dg.EnvVar) else self.url
        return get_queue(self.queue_settings(), url or embedded_url(self.home, self.pg_port))
