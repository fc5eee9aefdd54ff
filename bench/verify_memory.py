"""Verification's memory, whole sets vs streamed pages, side by side on one seeded queue and Qdrant Edge store.

Seeds N completed chunks in a throwaway queue database (set-based, tests.queue_support.bulk_seed) and an Edge
store holding a point for each (8-d vectors: the ids are what verification reads, not the vectors), minus 5
planted missing points, plus 5 orphan points. Then, each in a fresh process so its peak RSS is its own:

  whole      what verify did before it streamed: every completed chunk, every chunk id of the queue and every
             point's chunk id loaded into Python sets, compared in memory
  streamed   orchestration.verify.verify_stores: DOCQUEUE_VERIFY_PAGE (1000) ids at a time on both sides

Both must find the same 5 + 5 problems. Prints seconds and peak RSS growth over the process's baseline (after
imports; it includes the pages of the shard the scroll touched), then, in a second process per variant, the
Python heap's peak (tracemalloc: what verification itself holds), and ends with exactly one line `RESULT {json}`.

  .venv/bin/python bench/verify_memory.py [--n 200000] [--admin-url URL]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._result import print_result  # noqa: E402

DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
MODEL, DIM, PLANTED = "bench-verify", 8, 5


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


def _store(path: str):
    from resources.qdrant_edge import EdgeVectorStore

    return EdgeVectorStore(path=path, model_id=MODEL, dim=DIM)


def seed(queue_url: str, store_path: str, n: int) -> float:
    import numpy as np

    from queue_db.migrate import upgrade
    from queue_db.queue import create_queue_engine
    from resources.qdrant_base import PreparedPoint
    from resources.vector_payload import point_id
    from tests.queue_support import bulk_seed

    started = time.perf_counter()
    engine = create_queue_engine(queue_url)
    upgrade(engine)
    bulk_seed(engine, n // 1000, 10, 100, chunk_vector_status="completed")
    store, rng = _store(store_path), np.random.default_rng(0)
    after, skip = "", PLANTED  # the first PLANTED chunks in chunk-id order get no point
    with engine.connect() as conn:
        while True:
            ids = [
                r[0]
                for r in conn.exec_driver_sql(
                    "SELECT chunk_id FROM task_queue_chunk WHERE chunk_id > %(a)s ORDER BY chunk_id LIMIT 5000",
                    {"a": after},
                )
            ]
            if not ids:
                break
            after, keep, skip = ids[-1], ids[skip:], 0
            vectors = rng.normal(size=(len(keep), DIM)).astype(np.float32)
            store.write_prepared([PreparedPoint(point_id(c), v, {"chunk_id": c}) for c, v in zip(keep, vectors)])
    orphans = [f"orphan-{i}" for i in range(PLANTED)]
    store.write_prepared(
        [PreparedPoint(point_id(c), rng.normal(size=DIM).astype(np.float32), {"chunk_id": c}) for c in orphans]
    )
    store.close()
    engine.dispose()
    return time.perf_counter() - started


def measure(variant: str, queue_url: str, store_path: str, heap: bool = False) -> dict:
    """One variant's seconds and peak RSS growth; with `heap`, instead its Python heap peak (tracemalloc: the
    Python objects only, without the Edge shard's own memory and mapped pages, at the price of speed)."""
    import tracemalloc

    from orchestration.verify import verify_stores
    from queue_db.queue import TaskQueue, create_queue_engine

    queue = TaskQueue(create_queue_engine(queue_url))
    store = _store(store_path)
    store.count()  # the shard's own memory is in the baseline of both variants
    baseline = _rss_mb()
    if heap:
        tracemalloc.start()
    started = time.perf_counter()
    if variant == "whole":
        with queue.engine.connect() as conn:
            done = {
                r[0]: r[1]
                for r in conn.exec_driver_sql(
                    "SELECT chunk_id, id::text FROM task_queue_chunk WHERE vector_status = 'completed'"
                )
            }
            every = {r[0] for r in conn.exec_driver_sql("SELECT chunk_id FROM task_queue_chunk")}
        points = store.chunk_ids()
        missing = sorted(row for cid, row in done.items() if cid not in points)
        orphans = sorted(cid for cid in points if cid not in every)
    else:
        report = verify_stores(queue, vector_store=store)
        missing, orphans = report.chunks_without_point, report.points_without_chunk
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    store.close()
    found = {"missing": len(missing), "orphans": len(orphans)}
    if heap:
        return {"heap_peak_mb": round(tracemalloc.get_traced_memory()[1] / 2**20, 1), **found}
    return {"s": round(seconds, 2), "peak_growth_mb": round(peak - baseline, 1), **found}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000, help="completed chunks (a multiple of 1,000)")
    parser.add_argument("--admin-url", default=os.environ.get("DOCQUEUE_TEST_PG_ADMIN_URL", DEFAULT_ADMIN_URL))
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--queue-url", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--heap", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.variant:  # the child process of one measurement
        print(json.dumps(measure(args.variant, args.queue_url, args.store, args.heap)))
        return 0

    from bench.dagster_storage import throwaway_database

    figures = {}
    with throwaway_database(args.admin_url, "bench_verify") as url, tempfile.TemporaryDirectory() as folder:
        seeded = seed(url, folder, args.n)
        print(f"seeded {args.n:,} chunks and points in {seeded:.1f} s", flush=True)
        for variant in ("whole", "streamed"):
            figures[variant] = {}
            for extra in ([], ["--heap"]):
                out = subprocess.run(
                    [sys.executable, __file__, "--variant", variant, "--queue-url", url, "--store", folder, *extra],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                figures[variant].update(json.loads(out.strip().splitlines()[-1]))
            print(f"{variant:9s} {figures[variant]}", flush=True)
    for variant, found in figures.items():
        assert (found["missing"], found["orphans"]) == (PLANTED, PLANTED), (variant, found)
    print_result(
        {
            "n": args.n,
            "page": 1000,
            "seed_s": round(seeded, 1),
            "whole_s": figures["whole"]["s"],
            "streamed_s": figures["streamed"]["s"],
            "whole_peak_growth_mb": figures["whole"]["peak_growth_mb"],
            "streamed_peak_growth_mb": figures["streamed"]["peak_growth_mb"],
            "whole_heap_peak_mb": figures["whole"]["heap_peak_mb"],
            "streamed_heap_peak_mb": figures["streamed"]["heap_peak_mb"],
        }
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
