"""Scale-out: the same CPU-bound corpus (generated text pages, no OCR) processed three ways, each on fresh databases:

  inproc-1   the Dagster path in one process (`docqueue run` semantics: ranged runs executed in-process), that
             process pinned to one core;
  celery-1   the cluster path: ranged runs through Dagster's Celery executor (DOCQUEUE_EXECUTOR=celery) on a
             private Redis broker, one `docqueue worker --concurrency 1` pinned to one core;
  celery-2   the same with two workers, each pinned to a core of its own, two runs in flight.

Every worker runs its models with one thread (OMP_NUM_THREADS=1 and friends), so a worker is one core's worth of
work. The driver that plans and launches the runs (what the daemon does in a deployment) is not pinned: in the
Celery variants it only waits for results. Times are from "files registered" to "idle".

  speedup_2_vs_1      celery-1 time / celery-2 time (target >= 1.6)
  celery_overhead_1w  celery-1 time / inproc-1 time (target <= 1.25)

  .venv/bin/python bench/scale_out.py [--documents 12] [--pages 5] [--admin-url URL]

Needs the cluster extra (`pip install -e .[cluster]`) and redis-server. Ends with one line `RESULT {json}`.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.orchestration_overhead import (Databases, _ingest, clean_graph, free_port, make_corpus,  # noqa: E402
                                         outcome, services)

DOCQUEUE = Path(sys.executable).with_name("docqueue")
ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                     "NUMEXPR_NUM_THREADS", "TOKENIZERS_PARALLELISM")}
ONE_THREAD["TOKENIZERS_PARALLELISM"] = "false"
# ranges small enough that two workers always have a run each; the same for every variant
RUN_KEYS = {"DOCQUEUE_RUN_MAX_KEYS_OCR_PAGE": "10", "DOCQUEUE_RUN_MAX_KEYS_VECTOR_PAGE": "10",
            "DOCQUEUE_RUN_MAX_KEYS_VECTOR_CHUNK": "40", "DOCQUEUE_RUN_MAX_KEYS_GRAPHRAG_CHUNK": "40"}


# ------------------------------------------------------------------------------------------------ the children
def drive_celery(in_flight: int) -> dict:
    """Plan ranged runs as the sensors do and execute each through the job's own executor (Celery), keeping
    `in_flight` runs going at once, until nothing is left."""
    import dagster as dg
    from dagster._core.definitions.reconstruct import ReconstructableJob, ReconstructableRepository

    from queue_db.tasks import Level
    from orchestration.environment import dagster_instance
    from orchestration.jobs import job_name
    from orchestration.partitions import register_partitions
    from orchestration.runner import QUIET_CONSOLE, plan_next, waiting_work
    from resources.database import get_queue

    instance = dagster_instance()
    queue = get_queue()
    documents = _ingest(queue, Path(os.environ["BENCH_CORPUS"]))
    repository = ReconstructableRepository.for_module("orchestration.definitions", "defs", working_directory=str(REPO))
    started = time.perf_counter()
    register_partitions(instance, queue.engine, Level.DOCUMENT)

    def execute(run) -> bool:
        job = ReconstructableJob(repository, job_name(run.name))
        with dg.DagsterInstance.get() as own:
            return dg.execute_job(job, instance=own, tags=run.tags, run_config=QUIET_CONSOLE,
                                  raise_on_error=False).success

    runs = failed = 0
    running: dict = {}
    with ThreadPoolExecutor(in_flight) as pool:
        while True:
            if len(running) < in_flight:
                busy = set(running.values())
                for run in plan_next(queue, instance):
                    ident = (run.name, run.block, run.start_pos, run.end_pos)
                    if len(running) >= in_flight:
                        break
                    if ident not in busy:
                        running[pool.submit(execute, run)] = ident
                        busy.add(ident)
            if running:
                done, _ = wait(list(running), timeout=0.5, return_when=FIRST_COMPLETED)
                for future in done:
                    running.pop(future)
                    runs += 1
                    failed += 0 if future.result() else 1
                continue
            waiting = waiting_work(queue)
            if waiting["processing"] and sum(queue.recover_stale().values()):
                continue
            if not waiting["processing"] and waiting["next_retry_in_s"] is None and not any(queue.ready_counts().values()):
                break
            time.sleep(0.5)
    seconds = time.perf_counter() - started
    instance.dispose()
    return {"documents": documents, "seconds": seconds, "runs": runs, "failed_runs": failed}


def drive_in_process() -> dict:
    from queue_db.tasks import Level
    from orchestration.definitions import defs
    from orchestration.environment import dagster_instance
    from orchestration.partitions import register_partitions
    from orchestration.runner import run_until_idle
    from resources.database import get_queue

    os.sched_setaffinity(0, {int(os.environ["BENCH_CORE"])})
    instance = dagster_instance()
    queue = get_queue()
    documents = _ingest(queue, Path(os.environ["BENCH_CORPUS"]))
    started = time.perf_counter()
    register_partitions(instance, queue.engine, Level.DOCUMENT)
    report = run_until_idle(defs, instance, queue, until_idle=True, poll_s=0.5)
    seconds = time.perf_counter() - started
    instance.dispose()
    return {"documents": documents, "seconds": seconds, "runs": report.runs, "failed_runs": report.failed_runs}


def child_main(variant: str) -> None:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("dagster").setLevel(logging.WARNING)
    result = drive_in_process() if variant == "inproc" else drive_celery(int(variant.split("-")[1]))
    Path(os.environ["BENCH_RESULT"]).write_text(json.dumps(result))


# ------------------------------------------------------------------------------------------------ the parent
class Redis:
    def __init__(self):
        self.port = free_port()
        self.process = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
                                         "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        deadline = time.monotonic() + 20
        import socket

        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.2)
        raise SystemExit("redis-server did not start")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def run_variant(variant: str, corpus: Path, databases: Databases, bolt: dict, root: Path, broker: str) -> dict:
    from queue_db.migrate import upgrade
    from queue_db.queue import create_queue_engine

    queue_url = databases.create("queue")
    engine = create_queue_engine(queue_url)
    upgrade(engine)
    engine.dispose()
    home = root / f"{variant}-{uuid.uuid4().hex[:6]}"
    (home / "storage").mkdir(parents=True)
    clean_graph(bolt)
    env = {**os.environ, **ONE_THREAD, **RUN_KEYS, "DOCQUEUE_HOME": str(home), "DOCQUEUE_DATABASE_URL": queue_url,
           "DOCQUEUE_DAGSTER_PG_URL": databases.create("dagster"), "DAGSTER_HOME": str(home / "dagster"),
           "DOCQUEUE_STORAGE_DIR": str(home / "storage"), "DOCQUEUE_QDRANT_PATH": str(home / "qdrant"),
           "DOCQUEUE_QDRANT_URL": "", "DOCQUEUE_NEO4J_URI": bolt["uri"], "DOCQUEUE_NEO4J_USER": bolt["user"],
           "DOCQUEUE_NEO4J_PASSWORD": bolt["password"], "DOCQUEUE_NEO4J_DATABASE": bolt["database"] or "",
           "PYTHONUNBUFFERED": "1", "BENCH_CORPUS": str(corpus), "BENCH_CORE": "0",
           "BENCH_RESULT": str(home / "result.json")}
    workers = []
    if variant.startswith("celery"):
        env.update({"DOCQUEUE_EXECUTOR": "celery", "DOCQUEUE_BROKER_URL": broker})
        for core in range(int(variant.split("-")[1])):
            log = open(home / f"worker-{core}.log", "wb")
            workers.append((subprocess.Popen(
                ["taskset", "-c", str(core % os.cpu_count()), str(DOCQUEUE), "worker", "--broker", broker,
                 "--concurrency", "1", "--name", f"bench{core}@%h"],
                env=env, cwd=home, stdout=log, stderr=subprocess.STDOUT), log))
    try:
        started = time.perf_counter()
        done = subprocess.run([sys.executable, __file__, "--child", variant], env=env, cwd=REPO,
                              capture_output=True, text=True)
        wall = time.perf_counter() - started
    finally:
        for process, log in workers:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
            log.close()
    if done.returncode != 0 or not (home / "result.json").is_file():
        raise SystemExit(f"{variant} child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result = {**json.loads((home / "result.json").read_text()), "process_wall_s": round(wall, 2),
              "outcome": outcome(queue_url)}
    shutil.rmtree(home, ignore_errors=True)
    return result


def parent_main(args) -> None:
    root = Path(tempfile.mkdtemp(prefix="docqueue-bench-scale-"))
    redis, results, load_before = Redis(), {}, os.getloadavg()
    corpus = root / "corpus"
    make_corpus(corpus, args.documents, args.pages)
    try:
        with services(root, args.admin_url) as (bolt, databases):
            for variant in ("celery-1", "inproc", "celery-2"):
                results[variant] = r = run_variant(variant, corpus, databases, bolt, root, redis.url)
                print(f"{variant:9s}: {r['seconds']:7.1f} s, {r['runs']} runs ({r['failed_runs']} failed), "
                      f"{r['outcome']}", flush=True)
    finally:
        redis.stop()
    one, two, inproc = (results[v]["seconds"] for v in ("celery-1", "celery-2", "inproc"))
    chunks = results["celery-1"]["outcome"]["vectors"]
    same = len({json.dumps(r["outcome"], sort_keys=True) for r in results.values()}) == 1
    print(f"\ncorpus: {args.documents} documents x {args.pages} pages, {chunks} chunks; same outcome every way: {same}")
    print(f"celery, 1 worker : {one:7.1f} s ({chunks / one:.2f} chunks/s)")
    print(f"celery, 2 workers: {two:7.1f} s ({chunks / two:.2f} chunks/s)  speedup {one / two:.2f} (target >= 1.6)")
    print(f"in-process, 1    : {inproc:7.1f} s  celery overhead {one / inproc:.2f} (target <= 1.25)")
    print(f"machine load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    print("RESULT " + json.dumps({
        "documents": args.documents, "pages": args.pages, "chunks": chunks, "same_outcome": same,
        "celery_1w_s": round(one, 2), "celery_2w_s": round(two, 2), "inproc_1w_s": round(inproc, 2),
        "speedup_2_vs_1": round(one / two, 3), "celery_overhead_1w": round(one / inproc, 3),
        "runs": {v: r["runs"] for v, r in results.items()}, "cores": os.cpu_count(),
        "load_before": round(load_before[0], 2), "load_after": round(os.getloadavg()[0], 2)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=12)
    parser.add_argument("--pages", type=int, default=5)
    parser.add_argument("--admin-url", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args.child)
    else:
        parent_main(args)


if __name__ == "__main__":
    main()
