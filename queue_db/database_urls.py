"""Where the queue's database is: DOCQUEUE_DATABASE_URL, or the embedded server (started when needed)."""
from __future__ import annotations

from .config import DatabaseConfig, secret_value, settings
from .embedded_postgres import EmbeddedPostgres


def normalize_url(url: str) -> str:
    """SQLAlchemy URL with an explicit driver: plain postgresql:// would pick whatever driver SQLAlchemy defaults to."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def database_url() -> str:
    """DOCQUEUE_DATABASE_URL when set, otherwise the embedded server (started if needed)."""
    configured = secret_value(settings(DatabaseConfig).database_url)
    if configured:
        return normalize_url(configured)
    return EmbeddedPostgres().ensure_running()
