"""Row 5 of bench/faults.py, a full disk: the pipeline itself, not the queue-only fleet of rows 1-4.

A child process ingests a generated corpus and runs orchestration.pipeline.Pipeline in the plain loop (claim ->
process -> settle, every kind in phase order, failed tasks claimed again once their back-off has passed) until every
document is complete. The parent mounts a tmpfs of its own on the child's storage folder and on its embedded
Qdrant folder, fills one of them once a share of that phase's work is done, keeps it full for --full-s seconds,
frees it, and then counts: tasks lost (not completed), points per chunk id, duplicate graph nodes and
relationships, temporary files left, `docqueue verify`, and the completions per second before, during and after,
from the queue's own completion times, against a clean run of the same corpus on the same mounts.

Not a bench of its own (its name starts with an underscore): `faults.py --rows 5` runs it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from bench._pipeline_env import pipeline_env

REPO = Path(__file__).resolve().parents[1]
SETTINGS_ENV = {  # retries outlast the fault; back-off short enough to see recovery within a second
    "MAX_TASK_RETRIES": "100",
    "DOCQUEUE_RETRY_BACKOFF_BASE": "0.2",
    "DOCQUEUE_RETRY_BACKOFF_MAX": "1",
    "HEARTBEAT_INTERVAL": "1",
    "STALE_TASK_TIMEOUT": "30",
}
# The Qdrant folder is filled to a quarter of the store's write headroom, not to the last byte: a write already under
# way when the filler lands needs its pages, and the engine, which writes through memory maps, cannot be refused
# them (a fill to the last byte during a write ends the worker with SIGBUS). The headroom exists for that write.
QDRANT_LEFT_BYTES = 16 << 20
# phase -> (table, the phase's column prefix, the folder its writes go to)
FAULTS = {"storage": ("task_queue_page", "ocr", "storage"), "qdrant": ("task_queue_chunk", "vector", "qdrant")}
COMPLETIONS_SQL = """
    SELECT extract(epoch FROM ocr_completed_at) FROM task_queue_page WHERE ocr_status = 'completed'
    UNION ALL SELECT extract(epoch FROM vector_completed_at) FROM task_queue_chunk WHERE vector_status = 'completed'
    UNION ALL SELECT extract(epoch FROM graphrag_completed_at) FROM task_queue_chunk
        WHERE graphrag_status = 'completed'"""


# ------------------------------------------------------------------------------------------------ the child
def child(corpus: Path, timeout_s: float) -> None:
    """Ingest `corpus`, then the plain loop until every document is complete; prints `CHILD {json}`."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    from bench.orchestration_overhead import _ingest
    from orchestration.assets.common import CLAIM_BATCH
    from orchestration.assets.handlers import process_tasks
    from orchestration.pipeline import Pipeline
    from queue_db.config import Settings
    from queue_db.heartbeat import Heartbeat
    from queue_db.phases import ALL_KINDS
    from queue_db.queue import make_worker_id
    from resources.database import open_queue

    settings = Settings.from_env()
    queue = open_queue(settings)
    documents = _ingest(queue, corpus)
    print("INGESTED", flush=True)
    pipeline = Pipeline.from_settings(queue, settings)
    worker = make_worker_id("bench-disk-full")
    started = time.monotonic()
    try:
        while time.monotonic() < started + timeout_s and not _all_complete(queue):
            claimed = 0
            for kind in ALL_KINDS:
                with Heartbeat(queue, kind, worker) as heartbeat:
                    while tasks := queue.claim(kind, worker, CLAIM_BATCH[kind.name]):
                        ids = [t["id"] for t in tasks]
                        heartbeat.add(ids)
                        process_tasks(pipeline, kind, worker, tasks)
                        heartbeat.remove(ids)
                        claimed += len(tasks)
            if not claimed:
                time.sleep(0.1)  # what is left waits for its back-off
    finally:
        pipeline.close()
    print("CHILD " + json.dumps({"documents": documents, "seconds": round(time.monotonic() - started, 2)}))


def _all_complete(queue) -> bool:
    with queue.engine.connect() as conn:
        return not conn.exec_driver_sql(
            "SELECT 1 FROM documents WHERE ocr_status <> 'completed' OR vector_index_status <> 'completed' "
            "OR graphrag_index_status <> 'completed' LIMIT 1"
        ).first()


# ------------------------------------------------------------------------------------------------ the parent
class SmallDisk:
    def __init__(self, folder: Path, size_mib: int):
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(folder)], check=True)
        self.folder, self.filler = folder, folder / "filler.bin"

    def fill(self, leave_bytes: int) -> None:
        left = shutil.disk_usage(self.folder).free - leave_bytes
        block = b"\0" * (1 << 20)
        with open(self.filler, "ab") as handle:
            while left > 0:
                try:
                    handle.write(block[: min(left, len(block))])
                    handle.flush()
                except OSError:
                    break
                left -= len(block)

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.folder)], check=False)


def mounting_permitted() -> str | None:
    """None, or why a tmpfs cannot be mounted here."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    return None


def run_one(args, fault: str | None, corpus: Path, services: tuple, root: Path) -> dict:
    """One child run on fresh databases and mounts; `fault` ("storage", "qdrant" or None) fills that folder."""
    import psycopg

    from bench.orchestration_overhead import clean_graph
    from queue_db.migrate import upgrade
    from queue_db.queue import create_queue_engine

    bolt, databases = services
    queue_url = databases.create("disk_queue")
    engine = create_queue_engine(queue_url)
    upgrade(engine)
    engine.dispose()
    clean_graph(bolt)
    home = root / f"home-{fault or 'clean'}-{uuid.uuid4().hex[:6]}"
    headroom_mib = _headroom_mib()
    disks = {
        "storage": SmallDisk(home / "storage", args.storage_mib),
        "qdrant": SmallDisk(home / "qdrant", headroom_mib + args.qdrant_extra_mib),
    }
    env = {
        **os.environ,
        **pipeline_env(home, queue_url, databases.create("disk_dagster"), bolt),
        "PYTHONPATH": str(REPO),
        **SETTINGS_ENV,
    }
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "bench" / "faults.py"), "--disk-child", str(corpus)],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    marks: dict[str, float] = {}
    errors: set[str] = set()
    failed_tasks: set[str] = set()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the corpus is in the storage folder before any fault
            if line.startswith("INGESTED"):
                break
        marks["start"] = time.time()
        with psycopg.connect(queue_url, autocommit=True) as watcher:
            if fault:
                table, phase, folder = FAULTS[fault]
                _wait_share(watcher, table, phase, args.fill_at, proc)
                disks[folder].fill(leave_bytes=0 if fault == "storage" else QDRANT_LEFT_BYTES)
                marks["filled"] = time.time()
                while time.time() < marks["filled"] + args.full_s and proc.poll() is None:
                    _look(watcher, table, phase, errors, failed_tasks)
                    time.sleep(0.2)
                _look(watcher, table, phase, errors, failed_tasks)
                disks[folder].free()
                marks["freed"] = time.time()
            out, err = proc.communicate(timeout=args.disk_timeout_s + 60)
            marks["end"] = time.time()
            done = [float(r[0]) for r in watcher.execute(COMPLETIONS_SQL).fetchall()]
            phase_done = (
                [
                    float(r[0])
                    for r in watcher.execute(
                        f"SELECT extract(epoch FROM {phase}_completed_at) FROM {table} "
                        f"WHERE {phase}_status = 'completed'"
                    ).fetchall()
                ]
                if fault
                else []
            )
            check = _check(watcher, env, home)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for disk in disks.values():
            disk.unmount()
    lines = [line for line in out.splitlines() if line.startswith("CHILD ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"disk-full child of the {fault or 'clean'} run failed ({proc.returncode}):\n{err[-3000:]}")
    return {
        "marks": marks,
        "done": done,
        "phase_done": phase_done,
        "folder": str(home / FAULTS[fault][2]) if fault else None,
        "errors": sorted(errors),
        "failed_tasks": len(failed_tasks),
        **check,
    }


def _headroom_mib() -> int:
    from resources.folder_room import WRITE_HEADROOM_BYTES

    return WRITE_HEADROOM_BYTES >> 20


def _wait_share(watcher, table: str, phase: str, share: float, proc) -> None:
    """Until `share` of the phase's tasks completed (the fault lands mid-phase)."""
    while proc.poll() is None:
        done, total = watcher.execute(
            f"SELECT count(*) FILTER (WHERE {phase}_status = 'completed'), count(*) FROM {table}"
        ).fetchone()
        if total and done >= share * total:
            return
        time.sleep(0.05)


def _look(watcher, table: str, phase: str, errors: set[str], failed_tasks: set[str]) -> None:
    for task_id, error in watcher.execute(
        f"SELECT id::text, {phase}_error_class || ': ' || {phase}_error FROM {table} WHERE {phase}_status = 'failed'"
    ).fetchall():
        errors.add(error)
        failed_tasks.add(task_id)


def _check(watcher, env: dict, home: Path) -> dict:
    """What the run left: tasks not completed, points per chunk, graph duplicates, temp files, `docqueue verify`."""
    pages, chunks, unfinished = watcher.execute(
        "SELECT (SELECT count(*) FROM task_queue_page), (SELECT count(*) FROM task_queue_chunk), "
        "(SELECT count(*) FROM task_queue_page WHERE ocr_status <> 'completed') + "
        "(SELECT count(*) FROM task_queue_chunk WHERE vector_status <> 'completed' "
        "OR graphrag_status <> 'completed')"
    ).fetchone()
    verify = subprocess.run(
        [sys.executable, "-m", "orchestration.cli", "verify", "--json"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(verify.stdout) if verify.returncode in (0, 3) and verify.stdout.strip() else {}
    counted = subprocess.run(
        [sys.executable, str(REPO / "bench" / "faults.py"), "--disk-count"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    counts = json.loads(counted.stdout.strip().splitlines()[-1]) if counted.returncode == 0 else {}
    return {
        "pages": pages,
        "chunks": chunks,
        "tasks_lost": unfinished,
        "verify_consistent": bool(report.get("consistent")) and verify.returncode == 0,
        "verify_error": verify.stderr.strip().splitlines()[-1:] if verify.returncode else [],
        "points": counts.get("points"),
        "distinct_point_chunk_ids": counts.get("chunk_ids"),
        "duplicate_points": (counts["points"] - chunks) if counts else None,
        "duplicate_nodes_edges": counts.get("graph_duplicates"),
        "temp_files_left": sum(
            1 for p in (home / "storage").rglob(".tmp-*") if p.is_file()
        ),  # the mount is still there: counted before unmounting
    }


def count_stores() -> None:
    """Child of _check: points and distinct chunk ids in the vector store, duplicate nodes and edges in the graph."""
    from queue_db.config import Settings
    from resources.embeddings import DEFAULT_MODEL, MODELS
    from resources.graph_stores import Neo4jResource
    from resources.vector_resource import QdrantResource
    from tests.reliability.support import graph_duplicates

    spec = MODELS[DEFAULT_MODEL]
    settings = Settings.from_env()
    vector = QdrantResource.from_settings(settings).get_store(spec.model_id, spec.dim)
    graph = Neo4jResource.from_settings(settings).get_store()
    try:
        figures = {
            "points": vector.count(),
            "chunk_ids": len(vector.chunk_ids()),
            "graph_duplicates": sum(graph_duplicates(graph).values()),
        }
    finally:
        vector.close()
        graph.close()
    print(json.dumps(figures))


def rates(run: dict) -> dict:
    """Completions (pages OCRed, chunks embedded, chunks extracted) per second: the whole run, and before, during
    and after the fault."""
    marks, done = run["marks"], run["done"]

    def rate(a: float, b: float) -> float | None:
        return round(sum(1 for t in done if a <= t < b) / (b - a), 2) if b > a else None

    last = max(done, default=marks["end"])
    if "filled" not in marks:
        return {"overall": rate(marks["start"], last + 1e-6)}
    return {
        "before": rate(marks["start"], marks["filled"]),
        "during": rate(marks["filled"], marks["freed"]),
        "after": rate(marks["freed"], last + 1e-6),
        "overall": rate(marks["start"], last + 1e-6),
    }


def clean_rates_alike(clean: dict, run: dict) -> dict:
    """The clean run's completions per second over the same stretches of time since its start as the fault run's
    before, during and after (the phases a run is in at a given second are alike in both)."""
    offsets = [run["marks"][m] - run["marks"]["start"] for m in ("filled", "freed")]
    start, done = clean["marks"]["start"], clean["done"]
    end = max(done, default=start) + 1e-6

    def rate(a: float, b: float) -> float | None:
        return round(sum(1 for t in done if a <= t < b) / (b - a), 2) if b > a else None

    return {
        "before": rate(start, start + offsets[0]),
        "during": rate(start + offsets[0], start + offsets[1]),
        "after": rate(start + offsets[1], end),
    }


def recovery_s(run: dict) -> float | None:
    """From freeing the space to the faulted phase's first completion after it."""
    freed = run["marks"].get("freed")
    later = [t for t in run["phase_done"] if freed is not None and t >= freed]
    return round(min(later) - freed, 2) if later else None
