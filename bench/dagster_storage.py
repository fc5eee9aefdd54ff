"""Stock dagster-postgres storage vs orchestration.dagster_pooled_storage's pooled storage, side by side.

Each variant gets its own fresh database on the same PostgreSQL server and materializes the same
dynamic-partitioned asset for N keys in ONE ranged run, in-process (the shape of a docqueue phase run):

  stock          dagster_postgres.Postgres*Storage (NullPool: a new connection per storage call)
  pooled         the repo's dagster.yaml (orchestration.dagster_pooled_storage.PooledPostgres*Storage)
  pooled+batch   pooled, plus Dagster's DAGSTER_EVENT_BATCH_SIZE (batches materialization events)

All variants use the psycopg2 driver, so only the pooling differs. Prints ms per key, connections
opened and the ratios, and ends with exactly one line `RESULT {json}`.

  .venv/bin/python bench/dagster_storage.py [--keys 500] [--batch-size 100] [--repeats 1] [--admin-url URL]
The admin URL (default env DOCQUEUE_TEST_PG_ADMIN_URL or postgresql://postgres@127.0.0.1:5432/postgres)
must be allowed to CREATE/DROP DATABASE; the bench databases are dropped at the end.
"""

import argparse
import contextlib
import logging
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # dagster.yaml names orchestration.dagster_pooled_storage by module path
    sys.path.insert(0, str(REPO))

import sqlalchemy as sa  # noqa: E402
from dagster import (  # noqa: E402
    AssetExecutionContext,
    AssetKey,
    BackfillPolicy,
    DagsterInstance,
    DynamicPartitionsDefinition,
    asset,
    materialize,
)
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG  # noqa: E402

from bench._result import print_result  # noqa: E402
from orchestration.dagster_pooled_storage import psycopg2_url  # noqa: E402

DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
PG_URL_ENV = "DOCQUEUE_DAGSTER_PG_URL"
BATCH_ENV = "DAGSTER_EVENT_BATCH_SIZE"
WARMUP_KEYS = 5

STOCK_YAML = """
run_storage:
  module: dagster_postgres.run_storage
  class: PostgresRunStorage
  config: {postgres_url: {env: DOCQUEUE_DAGSTER_PG_URL}}
event_log_storage:
  module: dagster_postgres.event_log
  class: PostgresEventLogStorage
  config: {postgres_url: {env: DOCQUEUE_DAGSTER_PG_URL}}
schedule_storage:
  module: dagster_postgres.schedule_storage
  class: PostgresScheduleStorage
  config: {postgres_url: {env: DOCQUEUE_DAGSTER_PG_URL}}
telemetry: {enabled: false}
"""

documents = DynamicPartitionsDefinition(name="bench_documents")


@asset(partitions_def=documents, backfill_policy=BackfillPolicy.single_run())
def bench_pages(context: AssetExecutionContext) -> None:
    # one materialization per key is what a phase run records; the work itself is not measured
    context.log.debug("keys in run: %d", len(context.partition_keys))


QUIET_RUN_CONFIG = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def database_url(admin_url: str, name: str) -> str:
    return sa.engine.make_url(admin_url).set(database=name).render_as_string(hide_password=False)


@contextlib.contextmanager
def throwaway_database(admin_url: str, prefix: str) -> Iterator[str]:
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(psycopg2_url(admin_url), isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield database_url(admin_url, name)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextlib.contextmanager
def env(**values: str | None) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    try:
        for key, value in values.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


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


def ranged_run(instance: DagsterInstance, keys: list[str]) -> None:
    result = materialize(
        [bench_pages],
        instance=instance,
        tags={ASSET_PARTITION_RANGE_START_TAG: keys[0], ASSET_PARTITION_RANGE_END_TAG: keys[-1]},
        run_config=QUIET_RUN_CONFIG,
    )
    if not result.success:
        raise RuntimeError("bench run failed")


def count_materializations(instance: DagsterInstance) -> int:
    total, cursor = 0, None
    while True:  # Dagster caps one fetch at 10,000 records
        page = instance.fetch_materializations(AssetKey("bench_pages"), limit=10_000, cursor=cursor)
        total += len(page.records)
        if not page.has_more:
            return total
        cursor = page.cursor


def run_variant(name: str, dagster_yaml: str, admin_url: str, n_keys: int, batch_size: int | None) -> dict:
    with (
        throwaway_database(admin_url, f"docqueue_bench_{name.replace('+', '_')}") as pg_url,
        tempfile.TemporaryDirectory(prefix=f"dagster-home-{name}-") as home,
        env(**{PG_URL_ENV: psycopg2_url(pg_url), BATCH_ENV: str(batch_size) if batch_size else None}),
    ):
        Path(home, "dagster.yaml").write_text(dagster_yaml)
        instance = DagsterInstance.from_config(home)
        try:
            warmup = [f"warm-{i:03d}" for i in range(WARMUP_KEYS)]
            keys = [f"doc-{i:06d}" for i in range(n_keys)]
            instance.add_dynamic_partitions(documents.name, warmup + keys)
            ranged_run(instance, warmup)  # imports, job snapshot and first-use costs stay out of the figure
            with ConnectCounter() as connects:
                started = time.perf_counter()
                ranged_run(instance, keys)
                elapsed = time.perf_counter() - started
            materialized = count_materializations(instance) - WARMUP_KEYS
            if materialized != n_keys:
                raise RuntimeError(f"{name}: expected {n_keys} materializations, found {materialized}")
            storage = type(instance.event_log_storage).__name__
        finally:
            instance.dispose()
    ms_per_key = elapsed * 1000 / n_keys
    print(f"{name:13s} {storage:32s} {elapsed:8.2f} s  {ms_per_key:7.2f} ms/key  {connects.count:6d} connects")
    return {"seconds": round(elapsed, 3), "ms_per_key": round(ms_per_key, 3), "connects": connects.count}


def median_result(runs: list[dict]) -> dict:
    """The run with the median ms/key (the machine is shared, so single runs are noisy)."""
    ordered = sorted(runs, key=lambda run: run["ms_per_key"])
    return {**ordered[len(ordered) // 2], "all_ms_per_key": [run["ms_per_key"] for run in runs]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=100, help="DAGSTER_EVENT_BATCH_SIZE for pooled+batch")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of all variants; the median is reported")
    parser.add_argument("--admin-url", default=os.environ.get("DOCQUEUE_TEST_PG_ADMIN_URL", DEFAULT_ADMIN_URL))
    args = parser.parse_args(argv)
    if min(args.keys, args.batch_size, args.repeats) < 1:
        parser.error("--keys, --batch-size and --repeats must be positive")
    logging.getLogger("dagster").setLevel(logging.WARNING)

    pooled_yaml = (REPO / "dagster.yaml").read_text()
    variants = {
        "stock": (STOCK_YAML, None),
        "pooled": (pooled_yaml, None),
        "pooled+batch": (pooled_yaml, args.batch_size),
    }
    print(f"{args.keys} dynamic-partition keys, one ranged run each, in-process, {args.repeats} round(s)")
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    for _ in range(args.repeats):  # interleaved, so a burst of load elsewhere hits every variant
        for name, (dagster_yaml, batch_size) in variants.items():
            runs[name].append(run_variant(name, dagster_yaml, args.admin_url, args.keys, batch_size))
    results = {name: median_result(variant_runs) for name, variant_runs in runs.items()}
    stock_ms = results["stock"]["ms_per_key"]
    ratios = {
        "stock/pooled": round(stock_ms / results["pooled"]["ms_per_key"], 2),
        "stock/pooled+batch": round(stock_ms / results["pooled+batch"]["ms_per_key"], 2),
    }
    for name, result in results.items():
        print(f"median {name:13s} {result['ms_per_key']:7.2f} ms/key")
    for label, ratio in ratios.items():
        print(f"{label:20s} {ratio:6.2f}x")
    summary = {
        "keys": args.keys,
        "event_batch_size": args.batch_size,
        "repeats": args.repeats,
        "variants": results,
        "ratios": ratios,
    }
    print_result(summary, sort_keys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
