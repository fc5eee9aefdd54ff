"""Where the queue's database is: DOCQUEUE_DATABASE_URL, or the embedded server (started when needed)."""

from __future__ import annotations

from .config import DatabaseConfig, resolve_home, secret_value
from .embedded_postgres import EmbeddedPostgres


def normalize_url(url: str) -> str:
    """SQLAlchemy URL with an explicit driver: plain postgresql:// would pick whatever driver SQLAlchemy defaults to."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def libpq_url(url: str) -> str:
    """The same URL as libpq (psycopg, pg_dump) reads it: the driver part of a SQLAlchemy scheme (`+psycopg`)
    dropped; the inverse of normalize_url."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme.split('+', 1)[0]}{sep}{rest}" if sep else url


def embedded_postgres(database: DatabaseConfig) -> EmbeddedPostgres:
    """The embedded server of the home `database` names (DOCQUEUE_HOME, DOCQUEUE_PG_PORT)."""
    return embedded_server(database.home, database.pg_port)


def embedded_server(home: str, pg_port: int = 0) -> EmbeddedPostgres:
    """The embedded server under `home`; `pg_port` 0: the port recorded there."""
    return EmbeddedPostgres(resolve_home(home) / "postgres", pg_port or None)


def embedded_url(home: str, pg_port: int = 0) -> str:
    """The URL of the embedded server under `home` (started if needed)."""
    return embedded_server(home, pg_port).ensure_running()


def database_url(database: DatabaseConfig) -> str:
    """DOCQUEUE_DATABASE_URL when set, otherwise the embedded server (started if needed)."""
    configured = secret_value(database.database_url)
    if configured:
        return normalize_url(configured)
    return embedded_postgres(database).ensure_running()
