"""The queue's database for a command that starts, asks and ends (`status`, `stats`, `ingest`, `search`): the part
of SQLAlchemy's `Engine` those commands' queue calls use (connect, begin, exec_driver_sql and its results,
savepoints, autocommit), over psycopg alone. Claims and heartbeats, which take a raw connection for their pipelined
round trip, run in the long-running processes only.

SQLAlchemy's import is about a third of such a command's start-up, and the queue uses it as a connection pool and
a DBAPI wrapper only: every statement is the queue's own text, run by psycopg either way, and psycopg loads every
type the same under both (tests/integration/test_direct_engine.py runs the read models through both and compares).
Long-running processes (runners, sensors, the search session an application keeps) keep SQLAlchemy's pool
(queue_db.transactions.create_queue_engine).

Semantics follow SQLAlchemy 2's "commit as you go": a connection begins a transaction with its first statement and
rolls back what it did not commit when it is closed; `begin()` commits at the end of its block; `begin_nested()`
is a savepoint. Errors are psycopg's own, which the queue's retry rule (queue_db.transactions.is_transient) and the
commands' error mapping read like SQLAlchemy's. One idle connection is kept for the next `connect()`; a connection
in use is never shared, so threads may use the engine side by side.
"""

from __future__ import annotations

import copy
import threading
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any, Iterator, Sequence

import psycopg
from psycopg.pq import TransactionStatus

from .database_urls import libpq_url


class Row(tuple):
    """A result row: a tuple whose values are also attributes by column name, as SQLAlchemy's Row."""

    _fields: tuple[str, ...] = ()

    def __getattr__(self, name: str) -> Any:
        try:
            return self[self._fields.index(name)]
        except ValueError:
            raise AttributeError(name) from None

    @property
    def _mapping(self) -> dict[str, Any]:
        return dict(zip(self._fields, self))


class MappingResult:
    """`Result.mappings()`: the rows as dicts."""

    def __init__(self, rows: list[dict[str, Any]]):
        self._rows = rows

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._rows)

    def all(self) -> list[dict[str, Any]]:
        return list(self._rows)

    def first(self) -> dict[str, Any] | None:
        return self._rows[0] if self._rows else None


class Result:
    """What `exec_driver_sql` returns: every row, read at once (a command's answers are pages of rows)."""

    def __init__(self, names: Sequence[str], rows: list[tuple], rowcount: int):
        self._names = tuple(names)
        self._rows = rows
        self.rowcount = rowcount

    def keys(self) -> list[str]:
        return list(self._names)

    def _as_rows(self) -> list[Row]:
        rows = []
        for values in self._rows:
            row = Row(values)
            row._fields = self._names
            rows.append(row)
        return rows

    def __iter__(self) -> Iterator[Row]:
        return iter(self._as_rows())

    def mappings(self) -> MappingResult:
        return MappingResult([dict(zip(self._names, values)) for values in self._rows])

    def all(self) -> list[Row]:
        return self._as_rows()

    fetchall = all

    def first(self) -> Row | None:
        rows = self._as_rows()
        return rows[0] if rows else None

    def one(self) -> Row:
        return _one(self._as_rows())

    def scalar(self) -> Any:
        return self._rows[0][0] if self._rows else None

    def scalar_one(self) -> Any:
        return _one(self._rows)[0]


def _one(rows: list) -> Any:
    if len(rows) != 1:
        raise LookupError(f"expected one row, the statement returned {len(rows)}")
    return rows[0]


class Connection:
    """One connection of a `DirectEngine`, checked out until it is closed (the end of its `with` block)."""

    def __init__(self, engine: "DirectEngine", pg: psycopg.Connection):
        self._engine = engine
        self._pg: psycopg.Connection | None = pg
        pg.autocommit = engine.autocommit

    @property
    def pg(self) -> psycopg.Connection:
        if self._pg is None:
            raise psycopg.InterfaceError("the connection is closed")
        return self._pg

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def exec_driver_sql(self, statement: str, parameters: Any = None) -> Result:
        """Run `statement` as written (psycopg's %(name)s placeholders); a list of parameter sets runs it once per
        set."""
        with self.pg.cursor() as cursor:
            if isinstance(parameters, list):
                cursor.executemany(statement, parameters)
            elif parameters is None:
                cursor.execute(statement)
            else:
                cursor.execute(statement, parameters)
            if cursor.description is None:
                return Result((), [], cursor.rowcount)
            return Result([c.name for c in cursor.description], cursor.fetchall(), cursor.rowcount)

    def execution_options(self, isolation_level: str | None = None) -> "Connection":
        """Only `isolation_level="AUTOCOMMIT"` (each statement its own transaction) is known, the one the queue
        asks for."""
        if isolation_level is not None:
            if isolation_level != "AUTOCOMMIT":
                raise ValueError(f"isolation level {isolation_level!r} is not supported here")
            self.pg.autocommit = True
        return self

    @contextmanager
    def begin(self) -> Iterator["Connection"]:
        """A transaction that commits at the end of the block (rolls back on an error)."""
        if self.pg.info.transaction_status != TransactionStatus.IDLE:
            raise psycopg.ProgrammingError("a transaction is already open on this connection: commit it first")
        with self.pg.transaction():
            yield self

    @contextmanager
    def begin_nested(self) -> Iterator["Connection"]:
        """A savepoint inside the open transaction: an error in the block undoes the block only."""
        with self.pg.transaction():
            yield self

    @property
    def connection(self) -> SimpleNamespace:
        """The psycopg connection as SQLAlchemy's `Connection.connection` shows it (`dbapi_connection`,
        `driver_connection`); it stays this Connection's, given back when this one closes."""
        return SimpleNamespace(dbapi_connection=self.pg, driver_connection=self.pg)

    def commit(self) -> None:
        self.pg.commit()

    def rollback(self) -> None:
        self.pg.rollback()

    def close(self) -> None:
        pg, self._pg = self._pg, None
        if pg is not None:
            self._engine._give_back(pg)


class DirectEngine:
    """Connections to the queue's database at `url` (a SQLAlchemy-style or libpq URL), with one idle connection
    kept for the next checkout. `autocommit`: every statement its own transaction (`execution_options`)."""

    def __init__(self, url: str, *, autocommit: bool = False):
        self._conninfo = libpq_url(url)
        self.autocommit = autocommit
        self._idle = _IdleSlot()

    def execution_options(self, isolation_level: str | None = None) -> "DirectEngine":
        """The same engine (its idle connection shared) whose connections run each statement as its own transaction
        with `isolation_level="AUTOCOMMIT"`."""
        if isolation_level not in (None, "AUTOCOMMIT"):
            raise ValueError(f"isolation level {isolation_level!r} is not supported here")
        variant = copy.copy(self)
        variant.autocommit = self.autocommit or isolation_level == "AUTOCOMMIT"
        return variant

    def _checkout(self) -> psycopg.Connection:
        pg = self._idle.take()
        return pg if pg is not None else psycopg.connect(self._conninfo)

    def _give_back(self, pg: psycopg.Connection) -> None:
        """Keep `pg` for the next checkout when it is sound and the slot is free, its transaction rolled back."""
        try:
            if not pg.closed and not pg.broken and pg.info.transaction_status != TransactionStatus.IDLE:
                pg.rollback()
            if pg.closed or pg.broken or pg.info.transaction_status != TransactionStatus.IDLE:
                pg.close()
                return
            pg.autocommit = False
        except psycopg.Error:
            pg.close()
            return
        if not self._idle.keep(pg):
            pg.close()

    def connect(self) -> Connection:
        return Connection(self, self._checkout())

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        with self.connect() as conn, conn.begin():
            yield conn

    def dispose(self) -> None:
        self._idle.close()


class _IdleSlot:
    """The one idle connection an engine (and its autocommit variants) keeps."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pg: psycopg.Connection | None = None

    def take(self) -> psycopg.Connection | None:
        with self._lock:
            pg, self._pg = self._pg, None
        return pg

    def keep(self, pg: psycopg.Connection) -> bool:
        with self._lock:
            if self._pg is None:
                self._pg = pg
                return True
        return False

    def close(self) -> None:
        pg = self.take()
        if pg is not None:
            pg.close()
