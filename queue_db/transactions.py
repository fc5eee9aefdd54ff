"""Connections to the queue's database and the one rule for retrying a transaction: deadlocks, serialization
failures and dropped connections are transient, everything else is the caller's error."""

from __future__ import annotations

import time
from typing import Any, Callable, TypeVar

import psycopg
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError, OperationalError

from .config import QueueSettings
from .phases import PHASES, PhaseRegistry
from .retry_policy import RetryPolicy

_RETRYABLE_SQLSTATES = {"40P01", "40001"}  # deadlock detected, serialization failure
ATTEMPTS = 6
_FIRST_DELAY_S, _MAX_DELAY_S = 0.05, 2.0

T = TypeVar("T")


def create_queue_engine(url: str, pool_size: int = 5, max_overflow: int = 5) -> sa.Engine:
    from .database_urls import normalize_url

    # no pre-ping: it costs a round trip per checkout; a dead pooled connection raises on use instead, the
    # pool discards it, and the transition is retried on a fresh one (is_transient)
    return sa.create_engine(
        normalize_url(url), pool_size=pool_size, max_overflow=max_overflow, pool_pre_ping=False, pool_recycle=1800
    )


def is_transient(exc: BaseException) -> bool:
    """A failure that the same transaction, run again, can get past."""
    if isinstance(exc, DBAPIError):
        if getattr(getattr(exc, "orig", None), "sqlstate", None) in _RETRYABLE_SQLSTATES:
            return True
        # a restarted server or a dropped connection: the pool discards the connection, a new one is tried
        return isinstance(exc, OperationalError) or bool(getattr(exc, "connection_invalidated", False))
    if isinstance(exc, psycopg.Error):
        return getattr(exc, "sqlstate", None) in _RETRYABLE_SQLSTATES or isinstance(exc, psycopg.OperationalError)
    return False


def with_retries(attempt: Callable[[], T], attempts: int = ATTEMPTS) -> T:
    """Run `attempt` (one whole transaction) until it succeeds, retrying transient failures with a doubling
    pause (50 ms up to 2 s), `attempts` times at most; the last failure is raised."""
    delay = _FIRST_DELAY_S
    for number in range(1, attempts + 1):
        try:
            return attempt()
        except (DBAPIError, psycopg.Error) as exc:
            if number == attempts or not is_transient(exc):
                raise
            time.sleep(delay)
            delay = min(delay * 2, _MAX_DELAY_S)
    raise AssertionError("unreachable")


class QueueConnection:
    """The queue's engine, settings and phases, and the two ways it runs statements: in one transaction, or one
    statement per transaction (autocommit). Both retry transient failures.

    `settings` come from the entry point (None: the defaults); `phases` is the registry of phases the queue
    serves (None: PHASES), its default retry policy the one `settings` give (max_retries, back-off base and cap)."""

    def __init__(
        self, engine: sa.Engine | str, settings: QueueSettings | None = None, phases: PhaseRegistry | None = None
    ):
        if isinstance(engine, str):
            engine = create_queue_engine(engine)
        self.engine = engine
        self.settings = settings or QueueSettings()
        self.phases = (phases or PHASES).with_default_retry(default_retry_policy(self.settings))

    def _transaction(self, work: Callable[[sa.Connection], Any], attempts: int = ATTEMPTS) -> Any:
        def attempt() -> Any:
            with self.engine.begin() as conn:
                return work(conn)

        return with_retries(attempt, attempts)

    def _autocommit(self, work: Callable[[sa.Connection], Any], attempts: int = ATTEMPTS) -> Any:
        def attempt() -> Any:
            with self.engine.connect() as conn:
                return work(conn.execution_options(isolation_level="AUTOCOMMIT"))

        return with_retries(attempt, attempts)


def default_retry_policy(settings: QueueSettings) -> RetryPolicy:
    """The retry policy of every kind without its own: the queue settings' retries and back-off."""
    return RetryPolicy.from_settings(settings.max_retries, settings.retry_backoff_base_s, settings.retry_backoff_max_s)
