"""Connections to the queue's database and the one rule for retrying a transaction: deadlocks, serialization
failures and dropped connections are transient, everything else is the caller's error."""

from __future__ import annotations

import logging
import sys
import time
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Callable, Iterator, TypeVar

import psycopg

from .config import QueueSettings
from .phases import PHASES, PhaseRegistry
from .retry_policy import RetryPolicy

if TYPE_CHECKING:
    import sqlalchemy as sa

_RETRYABLE_SQLSTATES = {"40P01", "40001"}  # deadlock detected, serialization failure
# the server refuses a new connection while every slot is taken (max_connections): the refusal comes at connect
# time, before any SQLSTATE reaches psycopg, so its text is what tells it apart
_CONNECTION_LIMIT_TEXTS = ("too many clients", "remaining connection slots are reserved", "too many connections")
ATTEMPTS = 6
_FIRST_DELAY_S, _MAX_DELAY_S = 0.05, 2.0
# how long a transaction waits for a free connection slot; a client holding every slot for a minute is an
# incident an operator fixes, not a reason for a worker to drop its tasks
CONNECTION_WAIT_S = 300.0

log = logging.getLogger(__name__)
# when every wait for a slot in this context ends (connection_wait): a sensor tick has less time than a run
_wait_deadline: ContextVar[float | None] = ContextVar("docqueue_connection_wait_deadline", default=None)


class _LostPipelineSync(logging.Filter):
    """psycopg logs the failed closing sync of a pipeline whose connection died while the block's own error is
    raised; that error is the one with_retries handles (the transaction again, on a fresh connection), so the
    line would only repeat it, with an object's address, once or twice per lost connection of the hot path."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (
            record.msg == "error ignored terminating %r: %s"
            and len(args) == 2
            and isinstance(args[0], psycopg.Pipeline)
            and isinstance(args[1], psycopg.OperationalError)
        )


logging.getLogger("psycopg").addFilter(_LostPipelineSync())

T = TypeVar("T")


def create_queue_engine(url: str, pool_size: int = 5, max_overflow: int = 5) -> sa.Engine:
    """A pooled SQLAlchemy engine: what every long-running process uses (queue_db.direct_engine serves the commands
    that start, ask and end)."""
    import sqlalchemy as sa

    from .database_urls import normalize_url

    # no pre-ping: it costs a round trip per checkout; a dead pooled connection raises on use instead, the
    # pool discards it, and the transition is retried on a fresh one (is_transient). No hstore lookup: the schema
    # has no hstore column, and the dialect would query pg_type for it on every process's first connection.
    return sa.create_engine(
        normalize_url(url),
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=False,
        pool_recycle=1800,
        use_native_hstore=False,
    )


def sqlalchemy_error(name: str) -> tuple[type[BaseException], ...]:
    """SQLAlchemy's exception class `name` (of sqlalchemy.exc) once SQLAlchemy is loaded, else none: a process that
    never loads it (queue_db.direct_engine) cannot meet its exceptions, and need not import it to tell them apart."""
    cls = getattr(sys.modules.get("sqlalchemy.exc"), name, None)
    return (cls,) if cls is not None else ()


def is_database_error(exc: BaseException) -> bool:
    """An error of the database or its driver, as psycopg raises it or SQLAlchemy wraps it."""
    return isinstance(exc, (psycopg.Error, *sqlalchemy_error("DBAPIError")))


def is_integrity_error(exc: BaseException) -> bool:
    """A constraint refused the statement (a unique key taken, a foreign key gone)."""
    return isinstance(exc, (psycopg.IntegrityError, *sqlalchemy_error("IntegrityError")))


def is_transient(exc: BaseException) -> bool:
    """A failure that the same transaction, run again, can get past."""
    if isinstance(exc, sqlalchemy_error("DBAPIError")):
        if getattr(getattr(exc, "orig", None), "sqlstate", None) in _RETRYABLE_SQLSTATES:
            return True
        # a restarted server or a dropped connection: the pool discards the connection, a new one is tried
        return isinstance(exc, sqlalchemy_error("OperationalError")) or bool(
            getattr(exc, "connection_invalidated", False)
        )
    if isinstance(exc, psycopg.Error):
        return getattr(exc, "sqlstate", None) in _RETRYABLE_SQLSTATES or isinstance(exc, psycopg.OperationalError)
    return False


def is_connection_limit(exc: BaseException) -> bool:
    """The server refused a new connection because every slot is taken (max_connections reached)."""
    text = str(getattr(exc, "orig", None) or exc).lower()
    return isinstance(exc, (psycopg.OperationalError, *sqlalchemy_error("OperationalError"))) and any(
        t in text for t in _CONNECTION_LIMIT_TEXTS
    )


def with_retries(attempt: Callable[[], T], attempts: int = ATTEMPTS, connection_wait_s: float | None = None) -> T:
    """Run `attempt` (one whole transaction) until it succeeds, retrying transient failures with a doubling
    pause (50 ms up to 2 s), `attempts` times at most; the last failure is raised. A refused connection (every
    slot taken) is waited out instead, for `connection_wait_s` at most (CONNECTION_WAIT_S), with one log line."""
    wait_s = CONNECTION_WAIT_S if connection_wait_s is None else connection_wait_s
    delay, number, waiting_since = _FIRST_DELAY_S, 0, None
    while True:
        try:
            result = attempt()
        except Exception as exc:
            if not is_database_error(exc):
                raise
            waiting_since = _wait_for_slot(exc, waiting_since, wait_s)
            number += waiting_since is None
            if (waiting_since is None and number >= attempts) or not is_transient(exc):
                raise
            time.sleep(delay)
            delay = min(delay * 2, _MAX_DELAY_S)
            continue
        if waiting_since is not None:
            log.warning("the queue database accepts connections again after %.0f s", time.monotonic() - waiting_since)
        return result


@contextmanager
def connection_wait(seconds: float) -> Iterator[None]:
    """Within this block, every wait for a free connection slot, however nested, ends `seconds` from now."""
    token = _wait_deadline.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _wait_deadline.reset(token)


def _wait_for_slot(exc: BaseException, since: float | None, wait_s: float) -> float | None:
    """When the waiting for a free connection slot began (None: `exc` is no refused connection); raises `exc`
    once the wait is over."""
    if not is_connection_limit(exc):
        return None
    now, deadline = time.monotonic(), _wait_deadline.get()
    if deadline is not None:
        if now >= deadline:
            raise exc
        wait_s = min(wait_s, deadline - (since or now))
    if since is None:
        log.warning("the queue database has no free connection (max_connections reached); waiting up to %.0f s", wait_s)
        return now
    if now - since > wait_s:
        raise exc
    return since


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


@lru_cache(maxsize=512)
def with_named_argument(sql: str) -> str:
    """A statement written with $1 (its jsonb argument) as psycopg sends it: %(args)s, other percent signs escaped.
    The hot path's statements are a handful of texts, rewritten once each."""
    return sql.replace("%", "%%").replace("$1", "%(args)s::jsonb")
