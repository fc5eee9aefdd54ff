"""Dagster instance storage on PostgreSQL that reuses connections.

Stock dagster-postgres storages build their SQLAlchemy engine with ``NullPool``, so *every* storage
call opens and closes a PostgreSQL connection (6-9 ms each here). A ranged run writes two events per
partition key, which made 10,000 keys cost ~9 minutes of connection churn alone. The subclasses below
change only that: after the parent constructor has run (and created/stamped the tables with its
throw-away NullPool engine), ``self._engine`` is replaced by a small ``QueuePool`` engine.

dagster-postgres internals relied on (pinned: dagster==1.13.27, dagster-postgres==0.29.27):
- every storage call goes through ``self._engine`` (``_connect``/``connect``/``index_connection``,
  ``db.inspect(self._engine)``, ``InstanceInfo.create(self._engine)``, the event-log cursor lookup);
- the parents' constructors accept ``(postgres_url, should_autocreate_tables, inst_data,
  token_provider)`` and keep ``postgres_url`` / ``_token_provider`` on ``self``;
- ``optimize_for_webserver`` swaps ``self._engine`` for a webserver engine without disposing the old
  one (harmless with NullPool, a leak with a pool, hence the override);
- ``index_transaction`` switches a pooled AUTOCOMMIT connection to READ COMMITTED through
  ``Connection.execution_options``; SQLAlchemy resets that isolation level when the connection goes
  back to the pool, so pooling cannot leak a transaction mode into the next call.
If an upgrade moves any of these, ``tests/integration/test_dagster_instance.py`` fails.

Driver: SQLAlchemy 2.1 maps a bare ``postgresql://`` to psycopg 3, but dagster-postgres is written
against psycopg2 (``set_pg_statement_timeout`` uses ``with conn:``, which *closes* a psycopg 3
connection, and the table-creation race check reads ``exc.orig.pgcode``, which psycopg 3 lacks).
So every URL given to these storages is pinned to ``postgresql+psycopg2``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as db
import sqlalchemy.exc
import sqlalchemy.pool
from dagster import Field, IntSource
from dagster._config.config_schema import UserConfigSchema
from dagster._core.storage.config import pg_config
from dagster._serdes import ConfigurableClassData
from dagster_postgres.event_log import PostgresEventLogStorage
from dagster_postgres.run_storage import PostgresRunStorage
from dagster_postgres.schedule_storage import PostgresScheduleStorage
from dagster_postgres.utils import create_pg_engine, get_token_provider_from_config, pg_url_from_config

from orchestration.dagster_schema_shape import EventLogSchemaShape, RunSchemaShape, seed
from orchestration.partition_key_cache import PartitionKeyCache
from queue_db.config import DagsterConfig, DatabaseConfig, default, settings

if TYPE_CHECKING:
    from dagster_postgres.auth import PgTokenProvider

PSYCOPG2_DRIVERNAME = "postgresql+psycopg2"

POOL_SIZE_ENV = "DOCQUEUE_DAGSTER_PG_POOL_SIZE"
MAX_OVERFLOW_ENV = "DOCQUEUE_DAGSTER_PG_MAX_OVERFLOW"
POOL_RECYCLE_ENV = "DOCQUEUE_DAGSTER_PG_POOL_RECYCLE_S"
POOL_TIMEOUT_ENV = "DOCQUEUE_DAGSTER_PG_POOL_TIMEOUT_S"


@dataclass(frozen=True)
class PoolSettings:
    """Bounds of one storage's connection pool.

    Each Dagster process holds three of these (run, event log, schedule storage), so the worst case per
    process is ``3 * (pool_size + max_overflow)`` connections; idle it keeps at most ``3 * pool_size``.
    """

    pool_size: int = default(DatabaseConfig, "dagster_pool_size")
    max_overflow: int = default(DatabaseConfig, "dagster_max_overflow")
    # below PostgreSQL/pgbouncer/firewall idle cut-offs, so a recycled connection is never a dead one
    recycle_s: int = default(DatabaseConfig, "dagster_pool_recycle_s")
    # how long a storage call waits for a free connection before failing instead of hanging
    timeout_s: int = default(DatabaseConfig, "dagster_pool_timeout_s")

    def __post_init__(self) -> None:
        if self.pool_size < 1:
            raise ValueError(f"pool_size ({POOL_SIZE_ENV}) must be at least 1, got {self.pool_size}")
        if self.max_overflow < 0:
            raise ValueError(f"max_overflow ({MAX_OVERFLOW_ENV}) must be 0 or more, got {self.max_overflow}")
        if self.recycle_s < 1:
            raise ValueError(f"pool_recycle_seconds ({POOL_RECYCLE_ENV}) must be at least 1, got {self.recycle_s}")
        if self.timeout_s < 1:
            raise ValueError(f"pool_timeout_seconds ({POOL_TIMEOUT_ENV}) must be at least 1, got {self.timeout_s}")

    @classmethod
    def from_env(cls) -> PoolSettings:
        env = settings(DatabaseConfig)
        return cls(
            pool_size=env.dagster_pool_size,
            max_overflow=env.dagster_max_overflow,
            recycle_s=env.dagster_pool_recycle_s,
            timeout_s=env.dagster_pool_timeout_s,
        )

    @classmethod
    def from_config(cls, config_value: Mapping[str, Any]) -> PoolSettings:
        """dagster.yaml values win; unset ones come from the environment, then the defaults."""
        from_env = cls.from_env()
        return cls(
            pool_size=config_value.get("pool_size", from_env.pool_size),
            max_overflow=config_value.get("max_overflow", from_env.max_overflow),
            recycle_s=config_value.get("pool_recycle_seconds", from_env.recycle_s),
            timeout_s=config_value.get("pool_timeout_seconds", from_env.timeout_s),
        )


def pool_config_schema() -> dict[str, Field]:
    return {
        "pool_size": Field(IntSource, is_required=False, description="Connections kept open."),
        "max_overflow": Field(IntSource, is_required=False, description="Extra connections allowed under load."),
        "pool_recycle_seconds": Field(
            IntSource, is_required=False, description="Reconnect connections older than this."
        ),
        "pool_timeout_seconds": Field(
            IntSource, is_required=False, description="Max wait for a free pooled connection."
        ),
    }


def psycopg2_url(postgres_url: str) -> str:
    """The same PostgreSQL URL with its driver pinned to psycopg2 (see the module docstring)."""
    try:
        url = db.engine.make_url(postgres_url)
    except sqlalchemy.exc.ArgumentError:
        # the URL may carry a password, so it stays out of the message
        raise ValueError("Dagster storage URL is not a valid database URL") from None
    if url.get_backend_name() not in ("postgresql", "postgres"):
        raise ValueError(f"Dagster storage needs a PostgreSQL URL, got scheme {url.drivername!r}")
    return url.set(drivername=PSYCOPG2_DRIVERNAME).render_as_string(hide_password=False)


def _discard_connections_inherited_across_fork(engine: db.engine.Engine) -> None:
    """A forked child must not talk over its parent's sockets (SQLAlchemy's documented recipe).

    The child drops the inherited DBAPI connection without closing it (closing would terminate the
    parent's session) and the pool opens a fresh one.
    """

    @db.event.listens_for(engine, "connect")
    def _remember_owner(dbapi_connection, connection_record) -> None:
        connection_record.info["pid"] = os.getpid()

    @db.event.listens_for(engine, "checkout")
    def _refuse_foreign(dbapi_connection, connection_record, connection_proxy) -> None:
        if connection_record.info.get("pid") != os.getpid():
            connection_record.dbapi_connection = connection_proxy.dbapi_connection = None
            raise sqlalchemy.exc.DisconnectionError("pooled connection was opened by another process; reconnecting")


def create_pooled_engine(
    postgres_url: str, pool: PoolSettings, token_provider: PgTokenProvider | None = None
) -> db.engine.Engine:
    """What dagster-postgres builds (AUTOCOMMIT, optional token auth) but with a bounded QueuePool."""
    engine = create_pg_engine(
        postgres_url,
        token_provider,
        isolation_level="AUTOCOMMIT",
        poolclass=sqlalchemy.pool.QueuePool,
        pool_size=pool.pool_size,
        max_overflow=pool.max_overflow,
        pool_recycle=pool.recycle_s,
        pool_timeout=pool.timeout_s,
    )
    _discard_connections_inherited_across_fork(engine)
    # after the fork guard: checkout listeners run in the order they were added, so a parent's connection is refused
    # before any ping could talk over its socket
    _ping_connections_idle_for(engine, PING_AFTER_IDLE_S)
    return engine


# A pooled connection may have been cut by a server restart while it sat in the pool, so one idle longer than this
# is pinged before it is handed out. One back sooner is not: a run's storage calls follow each other by
# milliseconds, and a ping before each was a round trip each (pool_pre_ping: 0.17 s of a 16 s, nine-run
# `docqueue run` in bench/orchestration_overhead.py). A restart inside that second fails the call it meets, as any
# outage mid-call does.
PING_AFTER_IDLE_S = 1.0


def _ping_connections_idle_for(engine: db.engine.Engine, idle_s: float) -> None:
    @db.event.listens_for(engine, "connect")
    def _new(dbapi_connection, connection_record) -> None:
        connection_record.info["returned_at"] = time.monotonic()

    @db.event.listens_for(engine, "checkin")
    def _returned(dbapi_connection, connection_record) -> None:
        connection_record.info["returned_at"] = time.monotonic()

    @db.event.listens_for(engine, "checkout")
    def _ping_if_idle(dbapi_connection, connection_record, connection_proxy) -> None:
        if time.monotonic() - connection_record.info.get("returned_at", 0.0) < idle_s:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_connection)
        except engine.dialect.loaded_dbapi.Error as exc:
            alive = not engine.dialect.is_disconnect(exc, dbapi_connection, None)
            if alive:
                raise
        if not alive:
            raise sqlalchemy.exc.DisconnectionError("pooled connection was closed by the server; reconnecting")


class _PooledEngineMixin:
    """Swaps the parent's NullPool engine for a pooled one; shared by the three storages."""

    _engine: db.engine.Engine
    postgres_url: str
    _token_provider: PgTokenProvider | None

    def _install_pooled_engine(self, pool: PoolSettings) -> None:
        stock_engine = self._engine
        self.pool_settings = pool
        self._engine = create_pooled_engine(self.postgres_url, pool, self._token_provider)
        stock_engine.dispose()

    @property
    def engine(self) -> db.engine.Engine:
        """The engine every storage call of this instance goes through (for tests and diagnostics)."""
        return self._engine

    def optimize_for_webserver(self, statement_timeout: int, pool_recycle: int, max_overflow: int) -> None:
        # The parent builds its own small pool with a statement_timeout hook; keep that behaviour,
        # but close our pool instead of leaving its connections to the garbage collector.
        pooled_engine = self._engine
        super().optimize_for_webserver(  # type: ignore[misc]
            statement_timeout=statement_timeout, pool_recycle=pool_recycle, max_overflow=max_overflow
        )
        _discard_connections_inherited_across_fork(self._engine)
        pooled_engine.dispose()

    def dispose(self) -> None:
        super().dispose()  # type: ignore[misc]
        self._engine.dispose()


# set while an instance is built whose tables are known to exist (known_tables): what its launcher's storages had
# learned of the schema, by role (dagster_schema_shape.learned_shape)
_tables_known: ContextVar[Mapping[str, frozenset[tuple]] | None] = ContextVar(
    "docqueue_dagster_tables_known", default=None
)


@contextmanager
def known_tables(shape: Mapping[str, frozenset[tuple]] | None = None) -> Iterator[None]:
    """Storages built inside do not look for their tables: each would otherwise open connections of its own and read
    the catalog to decide whether to create them (an instance built and asked one query opens 7 connections, 1
    without). For a process that executes a run its launcher created: the run was written to these tables, so they
    exist. `shape`: what the launcher's storages learned of the schema's later migrations, which the new storages
    then need not ask the catalog (orchestration.dagster_schema_shape)."""
    token = _tables_known.set(shape or {})
    try:
        yield
    finally:
        _tables_known.reset(token)


def _seeded(storage: Any, role: str) -> Any:
    shape = _tables_known.get()
    if shape:
        seed(storage, shape.get(role, frozenset()))
    return storage


def _storage_kwargs(inst_data: ConfigurableClassData | None, config_value: Mapping[str, Any]) -> dict[str, Any]:
    return dict(
        inst_data=inst_data,
        postgres_url=pg_url_from_config(config_value),
        should_autocreate_tables=config_value.get("should_autocreate_tables", True) and _tables_known.get() is None,
        token_provider=get_token_provider_from_config(config_value),
        pool=PoolSettings.from_config(config_value),
    )


class PooledPostgresEventLogStorage(_PooledEngineMixin, EventLogSchemaShape, PostgresEventLogStorage):
    """``PostgresEventLogStorage`` with a bounded connection pool instead of a connect per call.

    The event watcher the webserver uses (``watch``/``end_watch``, a polling thread per run) is the
    parent's; it benefits most, since it queries several times a second per watched run.
    """

    def __init__(
        self,
        postgres_url: str,
        should_autocreate_tables: bool = True,
        inst_data: ConfigurableClassData | None = None,
        token_provider: PgTokenProvider | None = None,
        pool: PoolSettings | None = None,
    ):
        super().__init__(psycopg2_url(postgres_url), should_autocreate_tables, inst_data, token_provider)
        self._install_pooled_engine(pool or PoolSettings.from_env())
        self._partition_keys = PartitionKeyCache(settings(DagsterConfig).partition_key_cache_max)

    def store_event_batch(self, events) -> None:
        """A batch of asset events in one INSERT whose statement is compiled once per process.

        dagster-postgres stores planned events one by one (an INSERT, a NOTIFY and an asset-index update each), and
        batches materializations and observations in an INSERT of one VALUES row per event, which SQLAlchemy
        compiles anew for every batch: most of the batch's CPU. Here all three take one path: one statement
        executed for the list of rows (the driver sends them in pages, in order, and returns their ids), the events'
        tags stored, and each asset's index row updated once, from its last event (the row keeps the latest event,
        so the intermediate updates were overwritten anyway). Anything else in a batch (a new run's planned asset
        checks) keeps the parent's path."""
        from dagster._core.events import DagsterEventType

        planned = [
            e for e in events if e.get_dagster_event().event_type == DagsterEventType.ASSET_MATERIALIZATION_PLANNED
        ]
        others = [
            e for e in events if e.get_dagster_event().event_type != DagsterEventType.ASSET_MATERIALIZATION_PLANNED
        ]
        if planned:
            self._store_asset_events(planned)
        kinds = {e.get_dagster_event().event_type for e in others}
        if kinds in ({DagsterEventType.ASSET_MATERIALIZATION}, {DagsterEventType.ASSET_OBSERVATION}):
            self._store_asset_events(others)
        elif others:
            super().store_event_batch(others)

    def _store_asset_events(self, events) -> None:
        from dagster._core.storage.event_log.schema import SqlEventLogStorageTable

        insert = SqlEventLogStorageTable.insert().returning(SqlEventLogStorageTable.c.id, sort_by_parameter_order=True)
        with self._connect() as conn:
            result = conn.execute(insert, [self._event_to_row(event) for event in events])
            event_ids = [int(row[0]) for row in result.fetchall()]
        last_by_asset = {e.get_dagster_event().asset_key: (e, i) for e, i in zip(events, event_ids)}
        with self.index_transaction() as conn:
            self._store_asset_event_tags(conn, events, event_ids)
            for event, event_id in last_by_asset.values():
                self._store_asset_event(conn, event, event_id)

    def get_dynamic_partitions(self, partitions_def_name: str) -> Sequence[str]:
        """Every key of a dynamic partitions definition, in the order they were added, as the parent returns them:
        the process's copy while the definition is unchanged (orchestration.partition_key_cache), else read
        through the driver's cursor. The webserver reads them several times for one partitions page, and the
        parent's SQLAlchemy rows cost 0.34-0.65 s per read of 110,000 keys here, the cursor 0.13 s."""
        from dagster._core.storage.event_log.schema import DynamicPartitionsTable

        def read(conn) -> list[str]:
            cursor = conn.connection.dbapi_connection.cursor()
            try:
                cursor.execute(
                    f"SELECT partition FROM {DynamicPartitionsTable.name} WHERE partitions_def_name = %s ORDER BY id",
                    (partitions_def_name,),
                )
                return [row[0] for row in cursor.fetchall()]
            finally:
                cursor.close()

        self._check_partitions_table()
        return self._partition_keys.keys(self.index_connection, partitions_def_name, read)

    def delete_dynamic_partitions(self, partitions_def_name: str, partition_keys: Sequence[str]) -> None:
        """Delete many keys of a dynamic partitions definition in one statement (the parent deletes one key
        per call and connection use); absent keys are ignored, like the parent's."""
        from dagster._core.storage.event_log.schema import DynamicPartitionsTable

        if not partition_keys:
            return
        self._check_partitions_table()
        with self.index_connection() as conn:
            conn.execute(
                DynamicPartitionsTable.delete().where(
                    DynamicPartitionsTable.c.partitions_def_name == partitions_def_name,
                    DynamicPartitionsTable.c.partition.in_(list(partition_keys)),
                )
            )

    @classmethod
    def config_type(cls) -> UserConfigSchema:
        return {**pg_config(), **pool_config_schema()}

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData | None, config_value: Mapping[str, Any]
    ) -> PooledPostgresEventLogStorage:
        return _seeded(cls(**_storage_kwargs(inst_data, config_value)), "event_log")


class PooledPostgresRunStorage(_PooledEngineMixin, RunSchemaShape, PostgresRunStorage):
    """``PostgresRunStorage`` with a bounded connection pool instead of a connect per call."""

    def __init__(
        self,
        postgres_url: str,
        should_autocreate_tables: bool = True,
        inst_data: ConfigurableClassData | None = None,
        token_provider: PgTokenProvider | None = None,
        pool: PoolSettings | None = None,
    ):
        super().__init__(psycopg2_url(postgres_url), should_autocreate_tables, inst_data, token_provider)
        self._install_pooled_engine(pool or PoolSettings.from_env())

    @classmethod
    def config_type(cls) -> UserConfigSchema:
        return {**pg_config(), **pool_config_schema()}

    @classmethod
    def from_config_value(  # type: ignore[override]
        cls, inst_data: ConfigurableClassData | None, config_value: Mapping[str, Any]
    ) -> PooledPostgresRunStorage:
        return _seeded(cls(**_storage_kwargs(inst_data, config_value)), "runs")


class PooledPostgresScheduleStorage(_PooledEngineMixin, PostgresScheduleStorage):
    """``PostgresScheduleStorage`` with a bounded connection pool instead of a connect per call."""

    def __init__(
        self,
        postgres_url: str,
        should_autocreate_tables: bool = True,
        inst_data: ConfigurableClassData | None = None,
        token_provider: PgTokenProvider | None = None,
        pool: PoolSettings | None = None,
    ):
        super().__init__(psycopg2_url(postgres_url), should_autocreate_tables, inst_data, token_provider)
        self._install_pooled_engine(pool or PoolSettings.from_env())

    @classmethod
    def config_type(cls) -> UserConfigSchema:
        return {**pg_config(), **pool_config_schema()}

    @classmethod
    def from_config_value(  # type: ignore[override]
        cls, inst_data: ConfigurableClassData | None, config_value: Mapping[str, Any]
    ) -> PooledPostgresScheduleStorage:
        return cls(**_storage_kwargs(inst_data, config_value))


def delete_dynamic_partitions(instance, partitions_def_name: str, partition_keys: Sequence[str]) -> None:
    """Delete the keys from a dynamic partitions definition: one statement on docqueue's pooled event storage,
    the instance's key-by-key `delete_dynamic_partition` on any other (a test's SQLite instance)."""
    storage = instance.event_log_storage
    if isinstance(storage, PooledPostgresEventLogStorage):
        storage.delete_dynamic_partitions(partitions_def_name, partition_keys)
        return
    for key in partition_keys:
        instance.delete_dynamic_partition(partitions_def_name, key)
