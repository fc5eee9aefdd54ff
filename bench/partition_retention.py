"""A ranged run's key resolution with every chunk partition live vs after partition retention, side by side.

Dagster resolves a ranged run over a dynamic partitions definition by loading every key of the definition
(`get_partition_keys_in_range` calls `get_partition_keys()`, dagster 1.13.27), so the fixed cost of every run
grows with the partitions ever registered. orchestration/partitions.py retires completed ones. This bench, on one
throwaway Dagster database with the repository's pooled storage (dagster.yaml):

  all_live     N chunk keys registered (seeded set-based: one INSERT into Dagster's dynamic_partitions table);
               resolve a 1,000-key range (the default DOCQUEUE_RUN_MAX_KEYS_VECTOR_CHUNK) --repeats times
  retained     the same database after the oldest keys are deleted in batches of DOCQUEUE_PARTITION_RETIRE_BATCH
               through orchestration.dagster_pooled_storage.delete_dynamic_partitions (what the retention job
               calls), down to --live keys (DOCQUEUE_PARTITION_MAX_COMPLETED's default); the same resolution,
               same repeats

Prints medians and ends with exactly one line `RESULT {json}`.

  .venv/bin/python bench/partition_retention.py [--n 1000000] [--live 10000] [--repeats 3] [--admin-url URL]
The admin URL (default env DOCQUEUE_TEST_PG_ADMIN_URL or postgresql://postgres@127.0.0.1:5432/postgres) must be
allowed to CREATE/DROP DATABASE; the bench database is dropped at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # dagster.yaml names orchestration.dagster_pooled_storage by module path
    sys.path.insert(0, str(REPO))

import sqlalchemy as sa  # noqa: E402
from dagster import DagsterInstance, PartitionKeyRange  # noqa: E402
from dagster._core.definitions.partitions.context import partition_loading_context  # noqa: E402

from bench._result import print_result  # noqa: E402
from bench.dagster_storage import env, throwaway_database  # noqa: E402
from orchestration.dagster_pooled_storage import delete_dynamic_partitions, psycopg2_url  # noqa: E402
from orchestration.partitions import chunks_partitions  # noqa: E402
from queue_db.config import default  # noqa: E402
from queue_db.service_config import DagsterConfig  # noqa: E402

DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
RANGE_KEYS = default(DagsterConfig, "max_keys_vector_chunk")
RETIRE_BATCH = default(DagsterConfig, "partition_retire_batch")


def key(i: int) -> str:
    # the shape of a chunk key: document key / page / chunk
    return f"bench-{i // 4000:06d}-0000abcd/p{(i // 20) % 200 + 1:04d}/c{i % 20:03d}"


def seed(url: str, n: int) -> float:
    started = time.perf_counter()
    engine = sa.create_engine(psycopg2_url(url))
    with engine.begin() as conn:
        conn.exec_driver_sql(
            """INSERT INTO dynamic_partitions (partitions_def_name, partition, create_timestamp)
               SELECT %(name)s, 'bench-' || lpad((i / 4000)::text, 6, '0') || '-0000abcd/p'
                      || lpad(((i / 20) %% 200 + 1)::text, 4, '0') || '/c' || lpad((i %% 20)::text, 3, '0'), now()
               FROM generate_series(0, %(n)s - 1) i ORDER BY i""",
            {"name": chunks_partitions.name, "n": n},
        )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE dynamic_partitions")
    engine.dispose()
    return time.perf_counter() - started


def resolve(instance: DagsterInstance, first: int, repeats: int) -> float:
    """Median seconds to resolve the 1,000-key range starting at key `first`, as a ranged run does."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        with partition_loading_context(dynamic_partitions_store=instance):
            keys = chunks_partitions.get_partition_keys_in_range(
                PartitionKeyRange(key(first), key(first + RANGE_KEYS - 1))
            )
        times.append(time.perf_counter() - started)
        assert len(keys) == RANGE_KEYS, f"resolved {len(keys)} keys, expected {RANGE_KEYS}"
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="chunk partitions registered")
    parser.add_argument("--live", type=int, default=10_000, help="partitions left live after retention")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--admin-url", default=os.environ.get("DOCQUEUE_TEST_PG_ADMIN_URL", DEFAULT_ADMIN_URL))
    args = parser.parse_args(argv)
    if not RANGE_KEYS <= args.live <= args.n:
        parser.error(f"need {RANGE_KEYS} <= --live <= --n")

    home = tempfile.mkdtemp(prefix="bench_retention_")
    shutil.copy(REPO / "dagster.yaml", Path(home) / "dagster.yaml")
    try:
        with (
            throwaway_database(args.admin_url, "bench_retention") as url,
            env(DOCQUEUE_DAGSTER_PG_URL=url, DAGSTER_HOME=home),
        ):
            instance = DagsterInstance.from_config(home)
            try:
                instance.get_dynamic_partitions(chunks_partitions.name)  # creates the tables
                seeded_s = seed(url, args.n)
                print(f"seeded {args.n:,} chunk partitions in {seeded_s:.1f} s", flush=True)
                newest_range = args.n - RANGE_KEYS  # the range a run would take: recent, unfinished work
                all_live_s = resolve(instance, newest_range, args.repeats)
                print(f"all live ({args.n:,}): {all_live_s:.3f} s per 1,000-key range", flush=True)

                started, batches = time.perf_counter(), 0
                for start in range(0, args.n - args.live, RETIRE_BATCH):
                    stop = min(start + RETIRE_BATCH, args.n - args.live)
                    delete_dynamic_partitions(instance, chunks_partitions.name, [key(i) for i in range(start, stop)])
                    batches += 1
                retire_s = time.perf_counter() - started
                live = len(instance.get_dynamic_partitions(chunks_partitions.name))
                assert live == args.live, f"{live} live after retention, expected {args.live}"
                print(
                    f"retired {args.n - args.live:,} in {batches} batches of {RETIRE_BATCH:,}: {retire_s:.1f} s "
                    f"({retire_s / max(batches, 1):.3f} s per batch)",
                    flush=True,
                )
                retained_s = resolve(instance, newest_range, args.repeats)
                print(f"retained ({args.live:,} live): {retained_s:.3f} s per 1,000-key range", flush=True)
            finally:
                instance.dispose()
    finally:
        shutil.rmtree(home, ignore_errors=True)
    print_result(
        {
            "n": args.n,
            "live_after_retention": args.live,
            "range_keys": RANGE_KEYS,
            "repeats": args.repeats,
            "resolve_s_all_live": round(all_live_s, 4),
            "resolve_s_retained": round(retained_s, 4),
            "speedup": round(all_live_s / retained_s, 1),
            "seed_s": round(seeded_s, 1),
            "retire_batch": RETIRE_BATCH,
            "retire_s_per_batch": round(retire_s / max(batches, 1), 4),
        }
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
