"""Dagster's own storage database (DOCQUEUE_DAGSTER_PG_URL, else `dagster` beside the queue's database).

`docqueue db upgrade` creates it when it is missing and the role may create databases, and migrates Dagster's
tables. Every other command checks that it answers before Dagster touches it: Dagster itself retries a missing or
unreachable database for 15 s, logging each attempt, before it gives up with a traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import psycopg.conninfo
import psycopg.errors

from queue_db.config import DatabaseConfig, secret_value

CONNECT_TIMEOUT_S = 5
_INVALID_CATALOG_NAME = "3D000"  # SQLSTATE: the database does not exist

_checked: set[str] = set()


class DagsterStorageError(RuntimeError):
    """Dagster's storage database cannot be used; the message is one sentence that says what to do."""


def _libpq(url: str) -> dict:
    """libpq connection parameters of a SQLAlchemy or libpq URL (the driver suffix is SQLAlchemy's only)."""
    scheme, _, rest = url.partition("://")
    return psycopg.conninfo.conninfo_to_dict(f"{scheme.split('+')[0]}://{rest}")


def _where(params: dict) -> str:
    return f"{params.get('host') or 'localhost'}:{params.get('port') or 5432}"


def _missing(params: dict) -> str:
    return (
        f'Dagster\'s storage database "{params.get("dbname")}" does not exist on {_where(params)}: '
        "run `docqueue db upgrade` (it creates it when the role may create databases), or create it, or point "
        "DOCQUEUE_DAGSTER_PG_URL at another database"
    )


def _connect(params: dict) -> psycopg.Connection:
    return psycopg.connect(**params, connect_timeout=CONNECT_TIMEOUT_S, autocommit=True)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def check_dagster_storage(url: str) -> None:
    """Raise DagsterStorageError unless the database at `url` accepts a connection (checked once per process)."""
    if url in _checked:
        return
    params = _libpq(url)
    try:
        _connect(params).close()
    except psycopg.OperationalError as exc:
        if exc.sqlstate == _INVALID_CATALOG_NAME or "does not exist" in str(exc):
            raise DagsterStorageError(_missing(params)) from None
        raise DagsterStorageError(
            f"cannot connect to Dagster's storage database on {_where(params)} "
            f"({_first_line(exc)}); check DOCQUEUE_DAGSTER_PG_URL"
        ) from None
    _checked.add(url)


def ensure_dagster_database(url: str, queue_url: str) -> bool:
    """Create the database at `url` if it does not exist; True when it was created. Created from the queue's
    database when both live on one server (a role that may create databases need not reach `postgres`)."""
    params = _libpq(url)
    try:
        _connect(params).close()
        return False
    except psycopg.OperationalError as exc:
        if not (exc.sqlstate == _INVALID_CATALOG_NAME or "does not exist" in str(exc)):
            raise DagsterStorageError(
                f"cannot connect to Dagster's storage database on {_where(params)} "
                f"({_first_line(exc)}); check DOCQUEUE_DAGSTER_PG_URL"
            ) from None
    queue = _libpq(queue_url)
    same_server = all(queue.get(k) == params.get(k) for k in ("host", "port", "user"))
    admin = queue if same_server else {**params, "dbname": "postgres"}
    name = params["dbname"]
    try:
        with _connect(admin) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.errors.DuplicateDatabase:
        return False  # another process created it meanwhile
    except psycopg.errors.InsufficientPrivilege:
        raise DagsterStorageError(
            f'Dagster\'s storage database "{name}" does not exist on {_where(params)} and role '
            f'"{params.get("user")}" may not create databases: ask for `CREATE DATABASE "{name}" OWNER '
            f'"{params.get("user")}"` or point DOCQUEUE_DAGSTER_PG_URL at a database the role may use'
        ) from None
    except psycopg.OperationalError as exc:
        raise DagsterStorageError(f"{_missing(params)} (creating it failed: {_first_line(exc)})") from None
    return True


def dagster_storage_status(url: str, open_instance: Callable[[], Any]) -> dict:
    """Whether Dagster's storage exists and each of its three storages (runs, event log, schedules) is at the
    schema the installed Dagster expects: {"database": "ok" | sentence, "storages": {name: {"at", "head"}}}.
    `open_instance()` opens the Dagster instance, once the database answers."""
    try:
        check_dagster_storage(url)
    except DagsterStorageError as exc:
        return {"database": str(exc), "storages": {}, "pending": True}
    instance = open_instance()
    storages = {}
    for name, storage in (
        ("runs", instance.run_storage),
        ("event_log", instance.event_log_storage),
        ("schedules", instance.schedule_storage),
    ):
        at, head = storage.alembic_version()
        storages[name] = {"at": at, "head": head}
    return {"database": "ok", "storages": storages, "pending": any(s["at"] != s["head"] for s in storages.values())}


def dagster_database_url(database: DatabaseConfig, queue_url: str) -> str:
    """Dagster's own storage: DOCQUEUE_DAGSTER_PG_URL, else a database beside the queue's (at `queue_url`):
    `dagster` beside `docqueue` (the embedded server's names), `<queue database>_dagster` beside any other, so two
    projects whose queues share a server never share Dagster's runs and partitions."""
    configured = secret_value(database.dagster_pg_url)
    if configured:
        return configured
    base, _, rest = queue_url.rpartition("/")
    queue_database, query = rest.split("?", 1) if "?" in rest else (rest, "")
    name = "dagster" if queue_database == "docqueue" else f"{queue_database}_dagster"
    return base.replace("postgresql+psycopg://", "postgresql://") + f"/{name}" + (f"?{query}" if query else "")
