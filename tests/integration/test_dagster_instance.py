"""The Dagster instance from the repo's dagster.yaml, against a real PostgreSQL server.

Each test module run gets a throwaway database (created here, dropped at the end) on the server at
``pg_admin_url``. The stock dagster-postgres storages open a connection per storage call, so the
connection counts asserted below would be in the thousands without orchestration.dagster_pooled_storage.
"""

import json
import logging
import multiprocessing
import os
import select
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from dagster import (
    AssetExecutionContext,
    AssetKey,
    BackfillPolicy,
    DagsterInstance,
    DynamicPartitionsDefinition,
    asset,
    materialize,
)
from dagster._core.definitions.run_request import InstigatorType
from dagster._core.events import DagsterEventType
from dagster._core.events.log import EventLogEntry
from dagster._core.run_coordinator import QueuedRunCoordinator
from dagster._core.storage.partition_status_cache import AssetPartitionStatus
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG
from dagster._serdes import serialize_value

from orchestration.dagster_pooled_storage import (
    MAX_OVERFLOW_ENV,
    PING_AFTER_IDLE_S,
    POOL_SIZE_ENV,
    PooledPostgresEventLogStorage,
    PooledPostgresRunStorage,
    PooledPostgresScheduleStorage,
    PoolSettings,
    psycopg2_url,
)

REPO = Path(__file__).resolve().parents[2]
ADMIN_URL_ENV = "DOCQUEUE_TEST_PG_ADMIN_URL"
DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
RANGED_RUN_KEYS = 200
# run, event-log and schedule storage, each at most pool_size + max_overflow connections
MAX_CONNECTIONS_PER_PROCESS = 3 * (PoolSettings().pool_size + PoolSettings().max_overflow)


@pytest.fixture(scope="module")
def pg_admin_url() -> str:
    """A PostgreSQL URL allowed to CREATE/DROP DATABASE (to be replaced by the conftest fixture)."""
    url = os.environ.get(ADMIN_URL_ENV)
    if url:
        return url
    try:
        _admin_engine(DEFAULT_ADMIN_URL).connect().close()
    except sa.exc.OperationalError:
        pytest.skip(f"no PostgreSQL at the default admin URL and {ADMIN_URL_ENV} is not set")
    return DEFAULT_ADMIN_URL


def _admin_engine(url: str) -> sa.engine.Engine:
    return sa.create_engine(psycopg2_url(url), isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)


def _with_database(url: str, name: str) -> str:
    return sa.engine.make_url(url).set(database=name).render_as_string(hide_password=False)


@pytest.fixture(scope="module")
def dagster_pg_url(pg_admin_url):
    name = f"docqueue_dagster_test_{uuid.uuid4().hex[:10]}"
    admin = _admin_engine(pg_admin_url)
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield _with_database(pg_admin_url, name)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="module")
def dagster_home(tmp_path_factory, dagster_pg_url):
    """DAGSTER_HOME as the CLI will set it up: a directory holding a copy of the repo's dagster.yaml."""
    home = tmp_path_factory.mktemp("dagster_home")
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DAGSTER_HOME", str(home))
        patch.setenv("DOCQUEUE_DAGSTER_PG_URL", dagster_pg_url)
        patch.delenv("DAGSTER_EVENT_BATCH_SIZE", raising=False)
        yield home


@pytest.fixture(scope="module")
def instance(dagster_home):
    with DagsterInstance.get() as inst:
        yield inst


def _backends_on(admin_conn: sa.Connection, database: str) -> int:
    return admin_conn.execute(
        sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = :db"), {"db": database}
    ).scalar_one()


class ConnectCounter:
    """Counts DBAPI connections opened by any SQLAlchemy pool in this process."""

    def __init__(self) -> None:
        self.count = 0

    def _on_connect(self, *_args) -> None:
        self.count += 1

    def __enter__(self) -> "ConnectCounter":
        sa.event.listen(sa.pool.Pool, "connect", self._on_connect)
        return self

    def __exit__(self, *_exc) -> None:
        sa.event.remove(sa.pool.Pool, "connect", self._on_connect)


def _all_materializations(instance: DagsterInstance, key: AssetKey) -> list:
    records, cursor = [], None
    while True:  # Dagster caps one fetch at 10,000 records
        page = instance.fetch_materializations(key, limit=10_000, cursor=cursor)
        records.extend(page.records)
        if not page.has_more:
            return records
        cursor = page.cursor


def _log_entry(run_id: str, message: str) -> EventLogEntry:
    return EventLogEntry(
        error_info=None, level=logging.INFO, user_message=message, run_id=run_id, timestamp=time.time()
    )


# --- instance built from dagster.yaml --------------------------------------------------------------


def test_dagster_yaml_builds_pooled_psycopg2_storages(instance):
    storages = (instance.run_storage, instance.event_log_storage, instance.schedule_storage)
    assert [type(s) for s in storages] == [
        PooledPostgresRunStorage,
        PooledPostgresEventLogStorage,
        PooledPostgresScheduleStorage,
    ]
    for storage in storages:
        assert isinstance(storage.engine.pool, sa.pool.QueuePool)
        assert storage.engine.pool.size() == PoolSettings().pool_size
        assert storage.engine.dialect.driver == "psycopg2"


def test_dagster_yaml_queues_runs_with_one_run_per_pool(instance):
    from dagster._core.instance.config import PoolGranularity

    assert type(instance.run_coordinator) is QueuedRunCoordinator
    concurrency = instance.get_concurrency_config()
    assert concurrency.pool_config.pool_granularity == PoolGranularity.RUN
    assert concurrency.pool_config.default_pool_limit == 1
    assert 1 <= concurrency.run_queue_config.max_concurrent_runs <= 3
    assert not concurrency.run_queue_config.tag_concurrency_limits


def test_every_asset_and_maintenance_op_declares_its_phase_as_pool():
    from orchestration.definitions import defs

    pools = {
        key.path[-1]: (assets_def.op.pool, assets_def.tags_by_key[key]["docqueue/phase"])
        for assets_def in defs.assets
        for key in assets_def.keys
    }
    assert pools and all(pool == phase for pool, phase in pools.values()), pools
    assert {p for p, _ in pools.values()} == {"ocr", "vector", "graphrag"}
    maintenance = [
        node
        for job in ("recovery_job", "nightly_reconciliation_job")
        for node in defs.resolve_job_def(job).graph.node_defs
    ]
    assert {node.name for node in maintenance} == {
        "recover_stale_tasks",
        "retire_completed_partitions",
        "index_vector_tail",
        "reconcile_and_verify",
    }
    assert {node.pool for node in maintenance} == {"maintenance"}


@pytest.mark.parametrize(
    "selection, pools",
    [
        ({"ocr_page"}, {"ocr"}),
        ({"vector_chunk", "vector_document_rollup"}, {"vector"}),
        ({"graphrag_chunk"}, {"graphrag"}),
        ({"ocr_page", "graphrag_chunk"}, {"ocr", "graphrag"}),
    ],
)
def test_a_run_launched_from_the_ui_needs_its_phases_pools(instance, selection, pools):
    """A UI backfill runs the implicit asset job, which carries no job tags; its steps' pools are what the queued
    run coordinator gates it on (with run granularity: one slot of each pool for the whole run)."""
    from orchestration.definitions import defs

    job = defs.resolve_implicit_global_asset_job_def()
    run = instance.create_run_for_job(job, asset_selection=frozenset(AssetKey(a) for a in selection))
    try:
        # the selected assets' checks, which a UI launch includes, take the maintenance pool
        assert set(run.run_op_concurrency.all_pools) - {"maintenance"} == pools
    finally:
        instance.delete_run(run.run_id)


def test_dagster_yaml_retries_monitors_and_stays_quiet(instance):
    assert instance.run_retries_enabled and instance.run_retries_max_retries == 2
    assert instance.run_monitoring_enabled
    assert instance.run_monitoring_max_resume_run_attempts == 0  # default launcher cannot resume
    assert 0 < instance.run_monitoring_start_timeout_seconds <= 600
    assert instance.run_monitoring_max_runtime_seconds > 0
    assert instance.get_settings("telemetry") == {"enabled": False}
    sensor_retention = instance.get_tick_retention_settings(InstigatorType.SENSOR)
    assert all(days > 0 for days in sensor_retention.values())  # -1 would keep ticks forever


def test_instance_ref_rebuilds_pooled_storages_without_the_url(instance, dagster_pg_url):
    """Run workers and code servers rebuild the instance from its ref; the secret stays an env ref."""
    ref = instance.get_ref()
    assert dagster_pg_url not in serialize_value(ref)
    with DagsterInstance.from_ref(ref) as rebuilt:
        assert isinstance(rebuilt.event_log_storage, PooledPostgresEventLogStorage)
        assert isinstance(rebuilt.run_storage, PooledPostgresRunStorage)


def _connections_opened(build) -> int:
    """New PostgreSQL connections while an instance is built by `build()` and answers a run query."""
    opened = []

    def count(*_args) -> None:
        opened.append(1)

    sa.event.listen(sa.pool.Pool, "connect", count)
    try:
        with build() as built:
            built.get_runs(limit=1)
    finally:
        sa.event.remove(sa.pool.Pool, "connect", count)
    return len(opened)


def test_an_instance_whose_tables_are_known_does_not_look_for_them(instance):
    """A run's process builds its instance inside known_tables (orchestration/run_process.py): none of the three
    storages opens connections of its own to read the catalog, and the instance answers as any other."""
    from orchestration.dagster_pooled_storage import known_tables

    ref = instance.get_ref()

    def known() -> DagsterInstance:
        with known_tables():
            return DagsterInstance.from_ref(ref)

    looking = _connections_opened(lambda: DagsterInstance.from_ref(ref))
    # one connection, the run storage's pooled one for the query, against 7 when every storage looks
    assert _connections_opened(known) == 1 and looking >= 4
    assert _connections_opened(lambda: DagsterInstance.from_ref(ref)) == looking  # only inside the block


def test_a_storage_asks_the_catalog_for_a_table_or_column_once(instance, monkeypatch):
    """Dagster's storages ask whether a table or column of a later migration exists before many reads and writes
    (orchestration/dagster_schema_shape.py): each question reaches the catalog once per storage, the reads answer as
    before, and a run's process handed what its launcher learned (known_tables) asks none."""
    from sqlalchemy.dialects.postgresql.base import PGDialect
    from sqlalchemy.engine.reflection import Inspector

    from orchestration.dagster_pooled_storage import known_tables
    from orchestration.dagster_schema_shape import learned_shape

    asked: list[str] = []
    get_columns, has_table = Inspector.get_columns, PGDialect.has_table

    def columns(self, table_name, *args, **kwargs):
        asked.append(f"columns of {table_name}")
        return get_columns(self, table_name, *args, **kwargs)

    def table(self, connection, table_name, *args, **kwargs):
        asked.append(f"table {table_name}")
        return has_table(self, connection, table_name, *args, **kwargs)

    monkeypatch.setattr(Inspector, "get_columns", columns)
    monkeypatch.setattr(PGDialect, "has_table", table)

    def reads(built: DagsterInstance) -> list[str]:
        built.get_run_records(limit=1)
        assert built.get_dynamic_partitions("shape_probe") == ["a"]
        assert built.has_dynamic_partition("shape_probe", "a")
        built.get_asset_records([AssetKey("shape_probe")])
        done = list(asked)
        asked.clear()
        return done

    ref = instance.get_ref()
    with DagsterInstance.from_ref(ref) as fresh:
        fresh.add_dynamic_partitions("shape_probe", ["a"])  # its question is counted in the first round
        rounds = [reads(fresh) for _ in range(3)]
        shape = learned_shape(fresh)
        # a run's process, handed what its launcher's instance learned, asks nothing; without it, it asks
        with known_tables(shape):
            handed = DagsterInstance.from_ref(ref)
        with known_tables():
            not_handed = DagsterInstance.from_ref(ref)
        with handed, not_handed:
            asked.clear()
            assert reads(handed) == [] and reads(not_handed) != []
        fresh.delete_dynamic_partition("shape_probe", "a")
    assert {"columns of asset_keys", "columns of runs", "table dynamic_partitions"} <= set(rounds[0])
    assert rounds[1:] == [[], []]


def test_pool_bounds_come_from_yaml_over_env(dagster_home, tmp_path, monkeypatch):
    yaml_text = (
        (dagster_home / "dagster.yaml")
        .read_text()
        .replace(
            "class: PooledPostgresRunStorage\n  config:\n",
            "class: PooledPostgresRunStorage\n  config:\n    pool_size: 1\n    max_overflow: 0\n",
        )
    )
    (tmp_path / "dagster.yaml").write_text(yaml_text)
    monkeypatch.setenv(POOL_SIZE_ENV, "3")
    monkeypatch.setenv(MAX_OVERFLOW_ENV, "1")
    with DagsterInstance.from_config(str(tmp_path)) as inst:
        assert inst.run_storage.pool_settings == PoolSettings(pool_size=1, max_overflow=0)
        assert inst.event_log_storage.pool_settings == PoolSettings(pool_size=3, max_overflow=1)


def test_bad_pool_env_names_the_variable(monkeypatch):
    monkeypatch.setenv(POOL_SIZE_ENV, "two")
    with pytest.raises(ValueError, match=POOL_SIZE_ENV):
        PoolSettings.from_env()
    monkeypatch.setenv(POOL_SIZE_ENV, "0")
    with pytest.raises(ValueError, match=POOL_SIZE_ENV):
        PoolSettings.from_env()


@pytest.mark.parametrize(
    "given",
    [
        "postgresql://u:p%40ss@db:5432/dagster",
        "postgres://u:p%40ss@db:5432/dagster",
        "postgresql+psycopg://u:p%40ss@db:5432/dagster",
        "postgresql+psycopg2://u:p%40ss@db:5432/dagster",
    ],
)
def test_storage_urls_are_pinned_to_psycopg2(given):
    pinned = sa.engine.make_url(psycopg2_url(given))
    assert pinned.drivername == "postgresql+psycopg2"
    assert (pinned.username, pinned.password, pinned.host, pinned.database) == ("u", "p@ss", "db", "dagster")


def test_non_postgres_url_is_refused_without_leaking_the_password():
    with pytest.raises(ValueError) as raised:
        psycopg2_url("mysql://user:s3cret@db/dagster")
    assert "s3cret" not in str(raised.value)


# --- a ranged run ----------------------------------------------------------------------------------

documents = DynamicPartitionsDefinition(name="test_documents")


@asset(partitions_def=documents, backfill_policy=BackfillPolicy.single_run())
def document_pages(context: AssetExecutionContext) -> None:
    context.log.debug("keys in run: %d", len(context.partition_keys))


def test_ranged_run_materializes_every_key_over_few_connections(instance, pg_admin_url, dagster_pg_url):
    keys = [f"doc-{n:05d}" for n in range(RANGED_RUN_KEYS)]
    instance.add_dynamic_partitions(documents.name, keys)
    database = sa.engine.make_url(dagster_pg_url).database
    peak_backends = 0
    done = threading.Event()

    def watch_backends(admin_conn: sa.Connection) -> None:
        nonlocal peak_backends
        while not done.wait(0.05):
            peak_backends = max(peak_backends, _backends_on(admin_conn, database))

    # opened before counting starts, so the sampler's own connection is not counted
    admin_conn = _admin_engine(pg_admin_url).connect()
    sampler = threading.Thread(target=watch_backends, args=(admin_conn,), daemon=True)
    with admin_conn, ConnectCounter() as connects:
        sampler.start()
        result = materialize(
            [document_pages],
            instance=instance,
            tags={ASSET_PARTITION_RANGE_START_TAG: keys[0], ASSET_PARTITION_RANGE_END_TAG: keys[-1]},
            run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}},
        )
        done.set()
        sampler.join()

    assert result.success
    key = AssetKey("document_pages")
    records = _all_materializations(instance, key)
    assert sorted(r.partition_key for r in records) == keys
    assert {r.run_id for r in records} == {result.run_id}
    assert instance.get_materialized_partitions(key) == set(keys)
    statuses = instance.get_status_by_partition(key, keys, documents)
    assert set(statuses.values()) == {AssetPartitionStatus.MATERIALIZED}
    # NullPool storages open several connections per key (well over 1,000 for this run)
    assert connects.count <= MAX_CONNECTIONS_PER_PROCESS
    assert 0 < peak_backends <= MAX_CONNECTIONS_PER_PROCESS


def _asset_event(run_id: str, event_type, name: str, partition: str) -> EventLogEntry:
    from dagster import AssetMaterialization
    from dagster._core.events import AssetMaterializationPlannedData, DagsterEvent, StepMaterializationData

    key = AssetKey(name)
    data = (
        StepMaterializationData(AssetMaterialization(asset_key=key, partition=partition))
        if event_type is DagsterEventType.ASSET_MATERIALIZATION
        else AssetMaterializationPlannedData(key, partition=partition)
    )
    event = DagsterEvent(event_type.value, "batch_job", step_key="batch_step", event_specific_data=data)
    return EventLogEntry(
        error_info=None, level=logging.DEBUG, user_message="", run_id=run_id, timestamp=time.time(), dagster_event=event
    )


def test_a_batch_of_asset_events_is_stored_in_its_order_and_indexes_each_assets_last(instance):
    run_id, keys = str(uuid.uuid4()), [f"p-{n:03d}" for n in (7, 3, 11, 5, 2)]
    storage = instance.event_log_storage
    storage.store_event_batch(
        [_asset_event(run_id, DagsterEventType.ASSET_MATERIALIZATION_PLANNED, n, k) for n in ("ea", "eb") for k in keys]
    )
    storage.store_event_batch([_asset_event(run_id, DagsterEventType.ASSET_MATERIALIZATION, "ea", k) for k in keys])

    stored = instance.fetch_materializations(AssetKey("ea"), limit=100, ascending=True).records
    assert [r.partition_key for r in stored] == keys  # the ids follow the batch's order
    latest = instance.get_latest_materialization_event(AssetKey("ea"))
    assert latest is not None and latest.dagster_event.partition == keys[-1]
    assert instance.get_materialized_partitions(AssetKey("ea")) == set(keys)
    for name in ("ea", "eb"):
        planned = storage.get_latest_planned_materialization_info(AssetKey(name))
        assert planned is not None and planned.run_id == run_id
    assert instance.get_materialized_partitions(AssetKey("eb")) == set()


# --- connections stay correct when reused --------------------------------------------------------


def test_pooled_connection_returns_to_autocommit_after_a_transaction(dagster_pg_url):
    storage = PooledPostgresEventLogStorage(dagster_pg_url, pool=PoolSettings(pool_size=1, max_overflow=0))
    try:
        with storage.index_transaction() as conn:
            in_transaction = conn.connection.dbapi_connection
            assert in_transaction.autocommit is False
        with storage.index_connection() as conn:
            assert conn.connection.dbapi_connection is in_transaction  # the same pooled connection
            assert conn.connection.dbapi_connection.autocommit is True
    finally:
        storage.dispose()


def test_an_idle_pooled_connection_cut_by_the_server_is_replaced_and_a_busy_one_is_not_pinged(
    dagster_pg_url, pg_admin_url, monkeypatch
):
    storage = PooledPostgresEventLogStorage(dagster_pg_url, pool=PoolSettings(pool_size=1, max_overflow=0))
    pings = []
    do_ping = storage.engine.dialect.do_ping
    monkeypatch.setattr(storage.engine.dialect, "do_ping", lambda connection: pings.append(1) or do_ping(connection))
    try:
        first = _backend_pid(storage)
        for _ in range(5):  # back in the pool a moment ago: handed out as it is
            assert _backend_pid(storage) == first
        assert pings == []
        with _admin_engine(pg_admin_url).connect() as admin:
            admin.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": first})
        time.sleep(PING_AFTER_IDLE_S + 0.2)
        # idle for longer: pinged, found cut, replaced before the call uses it
        assert _backend_pid(storage) != first
        assert pings
    finally:
        storage.dispose()


def _backend_pid(storage) -> int:
    with storage.engine.connect() as conn:
        return conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()


def _report_backend_pid(storage, queue) -> None:
    queue.put(_backend_pid(storage))


def test_forked_child_does_not_share_the_parents_connection(dagster_pg_url):
    storage = PooledPostgresRunStorage(dagster_pg_url, pool=PoolSettings(pool_size=1, max_overflow=0))
    try:
        parent_backend = _backend_pid(storage)
        fork = multiprocessing.get_context("fork")
        queue = fork.Queue()
        child = fork.Process(target=_report_backend_pid, args=(storage, queue))
        child.start()
        child_backend = queue.get(timeout=30)
        child.join(timeout=30)
        assert child.exitcode == 0
        assert child_backend != parent_backend
        # the child's exit did not close the parent's session
        assert _backend_pid(storage) == parent_backend
    finally:
        storage.dispose()


# --- the webserver's event watcher -----------------------------------------------------------------


def _wait_for_watched_message(storage, message: str) -> None:
    run_id = str(uuid.uuid4())
    seen = threading.Event()

    def on_event(event, _cursor) -> None:
        if event.user_message == message:
            seen.set()

    storage.watch(run_id, None, on_event)
    try:
        storage.store_event(_log_entry(run_id, message))
        assert seen.wait(timeout=15), "the event watcher never delivered the stored event"
    finally:
        storage.end_watch(run_id, on_event)


def test_event_watcher_delivers_new_events(instance):
    _wait_for_watched_message(instance.event_log_storage, "hello watcher")


def test_store_event_still_notifies_listeners(instance, dagster_pg_url):
    import psycopg2

    listener = psycopg2.connect(psycopg2_url(dagster_pg_url).replace("+psycopg2", ""))
    try:
        listener.autocommit = True
        listener.cursor().execute("LISTEN run_events")
        run_id = str(uuid.uuid4())
        instance.event_log_storage.store_event(_log_entry(run_id, "notify me"))
        deadline = time.monotonic() + 10
        payloads: list[str] = []
        while time.monotonic() < deadline and not any(p.startswith(run_id) for p in payloads):
            select.select([listener], [], [], 0.5)
            listener.poll()
            payloads.extend(n.payload for n in listener.notifies)
            listener.notifies.clear()
        assert any(p.startswith(run_id + "_") for p in payloads)
    finally:
        listener.close()


def test_webserver_mode_keeps_watching_and_sets_statement_timeout(dagster_home):
    with DagsterInstance.get() as webserver_instance:
        storage = webserver_instance.event_log_storage
        pooled_engine = storage.engine
        with pooled_engine.connect():
            pass  # leave one connection in the pool to be closed by the switch
        webserver_instance.optimize_for_webserver(statement_timeout=5000, pool_recycle=3600, max_overflow=4)
        assert storage.engine is not pooled_engine
        assert pooled_engine.pool.checkedin() == 0
        with storage.engine.connect() as conn:
            assert conn.execute(sa.text("SHOW statement_timeout")).scalar_one() == "5s"
        _wait_for_watched_message(storage, "hello webserver")


# --- workspace.yaml --------------------------------------------------------------------------------

THROWAWAY_DEFINITIONS = textwrap.dedent(
    """
    from dagster import Definitions, asset

    @asset
    def workspace_probe() -> None:
        pass

    defs = Definitions(assets=[workspace_probe])
    """
)


def test_workspace_yaml_loads_orchestration_definitions(tmp_path, instance, monkeypatch):
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import WorkspaceFileTarget

    shutil.copy(REPO / "workspace.yaml", tmp_path / "workspace.yaml")
    package = tmp_path / "orchestration"
    package.mkdir()
    # The code server imports orchestration.dagster_pooled_storage (for the instance) before the definitions, so
    # it must find this throwaway package first (its cwd is ours) and, through it, the real modules.
    (package / "__init__.py").write_text(f"__path__.append({str(REPO / 'orchestration')!r})\n")
    (package / "definitions.py").write_text(THROWAWAY_DEFINITIONS)
    monkeypatch.chdir(tmp_path)

    target = WorkspaceFileTarget(paths=[str(tmp_path / "workspace.yaml")])
    with WorkspaceProcessContext(instance, target) as workspace:
        request = workspace.create_request_context()
        error = request.get_code_location_error("docqueue")
        assert error is None, error and error.to_string()
        location = request.get_code_location("docqueue")
        repository = next(iter(location.get_repositories().values()))
        assert repository.get_asset_node_snap(AssetKey("workspace_probe")) is not None


def test_dynamic_partition_keys_read_as_the_parent_reads_them(instance):
    """get_dynamic_partitions reads through the driver's cursor: the same keys, in the order they were added, after
    adds and a batch delete, and nothing of another definition."""
    from dagster_postgres.event_log import PostgresEventLogStorage

    storage = instance.event_log_storage
    name, other = f"keys-{uuid.uuid4().hex[:8]}", f"other-{uuid.uuid4().hex[:8]}"
    assert storage.get_dynamic_partitions(name) == []
    instance.add_dynamic_partitions(name, ["b", "a", "c/p0001/c000"])
    instance.add_dynamic_partitions(other, ["z"])
    instance.add_dynamic_partitions(name, ["d", "a"])  # "a" is there already
    storage.delete_dynamic_partitions(name, ["b", "absent"])
    expected = ["a", "c/p0001/c000", "d"]
    assert storage.get_dynamic_partitions(name) == expected
    assert PostgresEventLogStorage.get_dynamic_partitions(storage, name) == expected
    assert instance.get_dynamic_partitions(other) == ["z"]


def test_a_process_reuses_partition_keys_until_any_writer_changes_them(instance, dagster_pg_url):
    """The keys read once are reused while the definition is unchanged; a change by anyone (this storage, plain
    SQL as another program would write, a delete, a truncate) is seen at the next read, by every process.
    Keys written with the triggers disabled show that the second read really is the process's copy."""
    from orchestration.partition_key_cache import PartitionKeyCache

    storage = instance.event_log_storage
    name, other = f"cached-{uuid.uuid4().hex[:8]}", f"cached-other-{uuid.uuid4().hex[:8]}"
    sql = _admin_engine(dagster_pg_url)

    def write(statement: str, *, silently: bool = False) -> None:
        with sql.connect() as conn:
            if silently:
                conn.execute(sa.text("ALTER TABLE dynamic_partitions DISABLE TRIGGER USER"))
            try:
                conn.execute(sa.text(statement))
            finally:
                conn.execute(sa.text("ALTER TABLE dynamic_partitions ENABLE TRIGGER USER"))

    def insert(key: str, of: str = name) -> str:
        return (
            "INSERT INTO dynamic_partitions (partitions_def_name, partition, create_timestamp) "
            f"VALUES ('{of}', '{key}', now())"
        )

    instance.add_dynamic_partitions(name, ["a", "b"])
    assert storage.get_dynamic_partitions(name) == ["a", "b"]
    write(insert("unseen"), silently=True)
    first = storage.get_dynamic_partitions(name)
    assert first == ["a", "b"]  # the copy: the silent write went past the version count
    first.append("changed by a caller")
    assert storage.get_dynamic_partitions(name) == ["a", "b"]  # callers get copies
    instance.add_dynamic_partitions(other, ["z"])  # another definition's change leaves this copy valid
    assert storage.get_dynamic_partitions(name) == ["a", "b"]
    write(insert("c"))  # another program's plain INSERT
    assert storage.get_dynamic_partitions(name) == ["a", "b", "unseen", "c"]
    write(f"DELETE FROM dynamic_partitions WHERE partitions_def_name = '{name}' AND partition = 'unseen'")
    assert storage.get_dynamic_partitions(name) == ["a", "b", "c"]
    storage.delete_dynamic_partitions(name, ["a"])
    instance.add_dynamic_partitions(name, ["d"])
    assert storage.get_dynamic_partitions(name) == ["b", "c", "d"]
    with DagsterInstance.get() as second:  # another process's storage sees the same versions
        assert second.event_log_storage.get_dynamic_partitions(name) == ["b", "c", "d"]
        write(insert("e"))
        assert second.event_log_storage.get_dynamic_partitions(name) == ["b", "c", "d", "e"]
    assert storage.get_dynamic_partitions(name) == ["b", "c", "d", "e"]
    write("TRUNCATE dynamic_partitions")
    assert storage.get_dynamic_partitions(name) == [] and storage.get_dynamic_partitions(other) == []

    # a set larger than the bound is read whole every time
    bounded = PartitionKeyCache(max_keys=2)
    storage._partition_keys, kept = bounded, storage._partition_keys
    try:
        instance.add_dynamic_partitions(name, ["x", "y", "w"])
        assert storage.get_dynamic_partitions(name) == ["x", "y", "w"]
        write(insert("v"), silently=True)
        assert storage.get_dynamic_partitions(name) == ["x", "y", "w", "v"]
    finally:
        storage._partition_keys = kept


def test_keys_are_read_whole_again_once_the_version_triggers_went_missing(instance, dagster_pg_url):
    """A Dagster database whose dynamic_partitions table lost the triggers (re-created by a wipe), or whose version
    table was dropped, is not trusted: the next read reinstalls them and reads the keys whole."""
    storage = instance.event_log_storage
    name = f"rebuilt-{uuid.uuid4().hex[:8]}"
    sql = _admin_engine(dagster_pg_url)
    instance.add_dynamic_partitions(name, ["a"])
    assert storage.get_dynamic_partitions(name) == ["a"]
    for damage in (
        "DROP TRIGGER docqueue_partition_keys_added ON dynamic_partitions",
        "DROP TABLE docqueue_partition_key_versions",
    ):
        with sql.connect() as conn:
            conn.execute(sa.text(damage))
            key = f"k{uuid.uuid4().hex[:6]}"
            conn.execute(
                sa.text(
                    "INSERT INTO dynamic_partitions (partitions_def_name, partition, create_timestamp) "
                    f"VALUES ('{name}', '{key}', now())"
                )
            )
        assert storage.get_dynamic_partitions(name)[-1] == key, damage
        instance.add_dynamic_partitions(name, [key + "x"])  # counted again
        assert storage.get_dynamic_partitions(name)[-1] == key + "x"


def test_a_cluster_worker_keeps_one_instance_per_reference_between_steps(instance):
    """dagster-celery built (and leaked) a Dagster instance for every step; a worker process now keeps one per
    instance reference, answering as the original does, and closes it at exit."""
    from orchestration import celery_steps

    ref = instance.get_ref()
    first = celery_steps.step_instance(ref)
    try:
        assert first is not instance
        assert celery_steps.step_instance(instance.get_ref()) is first
        assert isinstance(first.event_log_storage, PooledPostgresEventLogStorage)
        assert first.get_run_by_id("00000000-0000-0000-0000-000000000000") is None
    finally:
        celery_steps._close_instances()
    assert celery_steps.step_instance(ref) is not first
    celery_steps._close_instances()


TALKATIVE_RUN = textwrap.dedent(
    """
    import json, subprocess, sys

    started = []
    popen_init = subprocess.Popen.__init__

    def recording_init(self, args, *more, **kwargs):
        started.append(list(args))
        popen_init(self, args, *more, **kwargs)

    subprocess.Popen.__init__ = recording_init
    from dagster import DagsterInstance, asset, materialize

    @asset
    def talkative() -> None:
        print("to stdout from the step", flush=True)
        print("to stderr from the step", file=sys.stderr, flush=True)
        subprocess.run(["sh", "-c", "echo from a child of the step"], check=True)

    with DagsterInstance.get() as instance:
        result = materialize([talkative], instance=instance)
    print("RESULT " + json.dumps({"run_id": result.run_id, "success": result.success, "started": started}))
    """
)


def test_a_steps_output_is_kept_and_mirrored_without_starting_processes(instance, dagster_home):
    """dagster.yaml's compute log manager keeps a step's stdout and stderr (its children's too) in the instance's
    files and mirrors them on to the process's own streams by a thread: no `tail` and no watcher interpreter a
    run. The step runs in a process of its own, whose streams are its descriptors 1 and 2 as in any docqueue
    process (a test's captured streams are not)."""
    done = subprocess.run([sys.executable, "-c", TALKATIVE_RUN], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1].removeprefix("RESULT "))
    assert result["success"]
    assert ["sh", "-c", "echo from a child of the step"] in result["started"]
    # Dagster's default starts `tail -F` and a watcher interpreter (watch_orphans.py) for each stream
    assert not [args for args in result["started"] if args[0] == "tail" or "watch_orphans" in " ".join(args)]
    assert "to stdout from the step\nfrom a child of the step\n" in done.stdout
    assert "to stderr from the step\n" in done.stderr
    logs = Path(dagster_home, "storage", result["run_id"])
    (out,) = logs.rglob("*.out")
    (err,) = logs.rglob("*.err")
    assert out.read_text() == "to stdout from the step\nfrom a child of the step\n"
    assert "to stderr from the step\n" in err.read_text()  # beside Dagster's own log lines of the step
    assert list(logs.rglob("*.complete"))
