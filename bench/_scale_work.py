"""bench/scale.py's measurements of real work in a seeded home: a `docqueue run` on freshly ingested documents
with the real models, and the recovery job's steps with something to do in each. Not a bench of its own (the
smoke test leaves out modules whose names start with an underscore).

A run's documents are generated PDFs ingested at the highest priority right before the run, so nothing the
bench did earlier (claim + settle completes the oldest pending tasks without writing points) has touched their
tasks, and `--max-docs 1` picks them over the seeded pending documents. What the run wrote is counted in the
stores, by document: a run that wrote nothing fails its figures."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
EXIT_TASKS_FAILED = 4  # orchestration.cli.errors.EXIT_TASKS_FAILED, without importing the CLI here

PEOPLE = ("Ada Moreau", "Jonas Lindqvist", "Priya Raman", "Tomasz Nowak", "Elena Rossi", "Kwame Mensah")
PLACES = ("Rotterdam", "Lisbon", "Gdansk", "Marseille", "Bergen", "Valencia", "Antwerp", "Tallinn")
FIRMS = ("Northwind Shipping", "Harbor Ledger", "Baltic Freight", "Atlas Carriers", "Meridian Logistics")
WORDS = (
    "pallet invoice carrier quarter ledger warehouse crane berth tariff manifest customs audit forecast "
    "container schedule route storm harbour dock freight contract volume delay budget crew engine"
).split()


def _sampled(
    command: list[str], timeout_s: float, *, tree: bool = False, env: dict | None = None
) -> tuple[subprocess.CompletedProcess, int, int]:
    """Run `command` (in a session of its own), sampling from outside every 0.2 s the largest RSS and anonymous
    memory (RSS minus resident mapped files) of its process, or with `tree` of any process of its tree. Returns
    (its completion, peak RSS bytes, peak anonymous bytes). Output goes to files, not pipes: a child writing more
    than a pipe holds would block while nobody reads."""
    import psutil

    started = time.monotonic()
    peak_rss = peak_anon = 0
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(command, stdout=out, stderr=err, text=True, start_new_session=True, env=env)
        try:
            watched = psutil.Process(proc.pid)
            while proc.poll() is None:
                if time.monotonic() - started > timeout_s:
                    raise subprocess.TimeoutExpired(command, timeout_s)
                try:
                    for p in [watched, *(watched.children(recursive=True) if tree else ())]:
                        try:
                            info = p.memory_info()  # shared: its resident mapped files
                            peak_rss = max(peak_rss, info.rss)
                            peak_anon = max(peak_anon, info.rss - info.shared)
                        except (psutil.NoSuchProcess, psutil.AccessDenied):
                            pass
                except psutil.NoSuchProcess:
                    pass
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
            proc.wait()
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(command, proc.returncode, out.read(), err.read()), peak_rss, peak_anon


# ------------------------------------------------------------------------------------------------ a real run
def generated_pdf(directory: Path, name: str, pages: int, seed: int) -> Path:
    """A text PDF of `pages` pages of distinct sentences naming people, places and firms (the extractor's
    entities): no two chunks alike, so embedding reuse (on, as by default) has nothing to copy."""
    sys.path.insert(0, str(REPO / "tests"))
    from pdf_factory import text_pdf

    rng = random.Random(seed)

    def sentence(i: int) -> str:
        words = " ".join(rng.choice(WORDS) for _ in range(8))
        return (
            f"{rng.choice(PEOPLE)} of {rng.choice(FIRMS)} met {rng.choice(PEOPLE)} in {rng.choice(PLACES)} "
            f"about {words} (note {seed}-{i}-{rng.randrange(10**6)})."
        )

    body = [
        [f"# {name} page {p}", *(" ".join(sentence(p * 100 + k * 10 + j) for j in range(4)) for k in range(4))]
        for p in range(1, pages + 1)
    ]
    return text_pdf(directory, f"{name}.pdf", body)


def _docqueue(*args: str, timeout: float = 600) -> dict:
    done = subprocess.run([str(BIN / "docqueue"), *args, "--json"], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"docqueue {args[0]} exited {done.returncode}: {(done.stderr or done.stdout)[-300:]}")
    return json.loads(done.stdout)


def ingest(path: Path) -> str:
    """Register `path` at the highest priority; its document id."""
    result = _docqueue("ingest", str(path), "--priority", "10")["results"][0]
    if result["status"] != "new":
        raise RuntimeError(f"the generated document was not registered as new: {result}")
    return result["document_id"]


def written(queue, store, graph, document_id: str) -> dict[str, int]:
    """What the stores hold for one document: its chunk tasks and completed ones in the queue, the points of
    its chunk ids in the vector store, its Chunk nodes and their MENTIONS edges in the graph (through the Bolt
    driver)."""
    with queue.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            """SELECT chunk_id, vector_status = 'completed' AND graphrag_status = 'completed'
               FROM task_queue_chunk WHERE document_id = %(d)s""",
            {"d": document_id},
        ).all()
    ids = {chunk for chunk, _ in rows}
    with graph._session() as session:
        nodes = session.run("MATCH (c:Chunk {document_id: $d}) RETURN count(c) AS n", d=document_id).single()["n"]
        mentions = session.run(
            "MATCH (c:Chunk {document_id: $d})-[m:MENTIONS]->() RETURN count(m) AS n", d=document_id
        ).single()["n"]
    return {
        "chunks": len(ids),
        "completed": sum(1 for _, done in rows if done),
        "points": len(store.chunk_ids(document_id) & ids),
        "nodes": nodes,
        "mentions": mentions,
    }


def run_one(pdf: Path, timeout_s: float, open_stores) -> dict:
    """Ingest `pdf`, then `docqueue run --max-docs 1 --json` (the real CLI, real models, embedding reuse as
    configured), its process tree sampled for memory; then count what the stores hold for it and fail unless
    every chunk was completed with its point and its Chunk node and the graph got mentions."""
    document_id = ingest(pdf)
    started = time.perf_counter()
    done, peak_rss, peak_anon = _sampled(
        [str(BIN / "docqueue"), "run", "--max-docs", "1", "--json"], timeout_s, tree=True
    )
    seconds = time.perf_counter() - started
    # 4: the queue holds failed or blocked work; in a home an earlier pass used (--reuse), that is seeded documents
    # whose tasks claim + settle completed without their roll-ups. The run's own document is checked below.
    if done.returncode not in (0, EXIT_TASKS_FAILED):
        raise RuntimeError(f"docqueue run exited {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if report.get("documents") != [document_id] or report["failed_runs"]:
        raise RuntimeError(f"the run did not work on the ingested document {document_id}: {done.stdout[-300:]}")
    queue, store, graph = open_stores()
    try:
        counts = written(queue, store, graph, document_id)
    finally:
        store.close()
        graph.close()
    chunks = counts["chunks"]
    if not chunks or counts["completed"] != chunks or counts["points"] != chunks or counts["nodes"] != chunks:
        raise RuntimeError(f"the run did not write its document {document_id} whole: {counts}")
    if not counts["mentions"]:
        raise RuntimeError(f"the run wrote no MENTIONS edges for {document_id}: {counts}")
    return {**counts, "s": seconds, "rss": peak_rss, "anon": peak_anon, "reused": report.get("vectors_reused", 0)}


def measure_real_run(timeout_s: float, open_stores, pages: int, seed: int) -> tuple:
    """Two runs: a one-page document (the run's fixed cost: start-up, the models' loading, opening the stores,
    the tail's index check) and one of `pages` pages; the time per chunk is the difference over the difference of
    their chunks. Returns (seconds per chunk, fixed seconds, the large run's seconds, its chunks, its points,
    its Chunk nodes, its mentions, its peak RSS MB and peak anonymous MB, either run's process tree)."""
    with tempfile.TemporaryDirectory(prefix="scale-run-") as folder:
        started = time.monotonic()
        small = run_one(generated_pdf(Path(folder), f"real-small-{seed}", 1, seed), timeout_s, open_stores)
        left = timeout_s - (time.monotonic() - started)
        large = run_one(generated_pdf(Path(folder), f"real-large-{seed}", pages, seed + 1), left, open_stores)
    if large["chunks"] <= small["chunks"]:
        raise RuntimeError(f"the large document has no more chunks than the small one: {large} / {small}")
    per_chunk = (large["s"] - small["s"]) / (large["chunks"] - small["chunks"])
    print(
        f"    real run: 1 page {small['chunks']} chunks {small['s']:.1f} s; {pages} pages {large['chunks']} chunks "
        f"{large['s']:.1f} s, {large['points']} points, {large['nodes']} nodes, {large['mentions']} mentions, "
        f"{large['reused']} vectors reused",
        file=sys.stderr,
        flush=True,
    )
    mb = 2**20
    return (
        per_chunk,
        small["s"],
        large["s"],
        large["chunks"],
        large["points"],
        large["nodes"],
        large["mentions"],
        max(small["rss"], large["rss"]) / mb,
        max(small["anon"], large["anon"]) / mb,
    )


# ------------------------------------------------------------------------------------------------ recovery
def fill_tail(make_store, rng, points: int, clustered, label: str) -> None:
    """`points` points written to the tail as runs write them (64 at a time, one opening shared), with texts like
    the seeded chunks' and a document id of the writer's form (a uuid) under the base tenant."""
    import uuid

    import numpy as np

    from bench._scale_search import chunk_texts
    from queue_db.tenants import BASE_TENANT
    from resources.ports import ChunkPoint

    document = str(uuid.uuid5(uuid.NAMESPACE_URL, f"docqueue-scale/{label}"))
    store = make_store()
    try:
        with store.session():
            for first in range(0, points, 64):
                vectors = clustered(rng, store.dim, min(64, points - first))
                texts = chunk_texts(rng, len(vectors))
                store.upsert(
                    [
                        ChunkPoint(
                            f"{label}-{first + i}",
                            np.asarray(v),
                            {"document_id": document, "text": text, "tenant_id": BASE_TENANT},
                        )
                        for i, (v, text) in enumerate(zip(vectors, texts))
                    ]
                )
    finally:
        store.close()


def make_recovery_work(queue, stale: int, documents: int) -> None:
    """Tasks for every step of the recovery job: `stale` pending vector tasks claimed by a worker whose heartbeat
    is an hour old, and the chunks and pages of the last `documents` seeded documents whose tasks are all still
    pending (claim + settle starts at the oldest) completed eight days ago, past DOCQUEUE_PARTITION_RETENTION,
    with their partitions live."""
    from queue_db.phases import VECTOR_CHUNK
    from queue_db.queue import make_worker_id

    worker = make_worker_id("scale-stale")
    claimed = 0
    while claimed < stale:
        result = queue.settle(VECTOR_CHUNK, worker, completed=[], claim=min(50, stale - claimed))
        if not result.claimed:
            break
        claimed += len(result.claimed)
    with queue.engine.begin() as conn:
        conn.exec_driver_sql(
            """UPDATE task_queue_chunk SET vector_last_heartbeat = now() - interval '1 hour'
               WHERE vector_status = 'processing' AND vector_worker_id = %(w)s""",
            {"w": worker},
        )
        ids = [
            r[0]
            for r in conn.exec_driver_sql(
                """SELECT d.id FROM documents d WHERE d.document_key LIKE 'scale-%%' AND NOT EXISTS (
                       SELECT 1 FROM task_queue_chunk c WHERE c.document_id = d.id
                       AND (c.vector_status <> 'pending' OR c.graphrag_status <> 'pending'))
                   ORDER BY d.document_key DESC LIMIT %(n)s""",
                {"n": documents},
            )
        ]
        for table in ("task_queue_chunk", "task_queue_page"):
            page = table == "task_queue_page"
            conn.exec_driver_sql(
                f"""UPDATE {table} SET vector_status = 'completed', graphrag_status = 'completed',
                       vector_completed_at = now() - interval '8 days',
                       graphrag_completed_at = now() - interval '8 days'
                       {", ocr_completed_at = now() - interval '8 days'" if page else ""}
                    WHERE document_id = ANY(%(ids)s::uuid[])""",
                {"ids": ids},
            )


def measure_recovery_job(queue, instance, qdrant, model: str, tail: int, timeout_s: float) -> tuple:
    """The recovery job's three ops in their order, each calling what its op calls with the settings it reads:
    release stale tasks (recover), retire completed partitions (one batch), build the vector tail's index once
    `tail` points wait (in a process of its own, sampled for memory: bench/_scale_search.measure_index_build).
    Returns (the three seconds, what each did: tasks released, partitions retired, tail points merged into the
    main shard and indexed; the build's process: RSS before it, peak RSS and peak anonymous memory, MB)."""
    from bench._scale_search import measure_index_build
    from orchestration.maintenance import recover, vector_tail_waiting
    from orchestration.partitions import retire_partitions_as_configured
    from queue_db.config import Settings

    dagster = Settings.from_env().dagster
    started = time.perf_counter()
    released = recover(queue)["released_total"]
    recover_s = time.perf_counter() - started
    started = time.perf_counter()
    retired = sum(retire_partitions_as_configured(instance, queue.engine, dagster).values())
    retire_s = time.perf_counter() - started
    indexed = measure_index_build(model, tail, timeout_s)
    index_s = indexed["s"]
    # the merge into the main shard is the step's work; Qdrant builds HNSW only for segments big enough to need it
    merged = indexed["waiting"] - vector_tail_waiting(qdrant, model)
    print(
        f"    recovery job: {released} released in {recover_s:.3f} s, {retired} retired in {retire_s:.3f} s, "
        f"{merged} of {indexed['waiting']} tail points merged in {index_s:.3f} s (HNSW built: {indexed['built']}; "
        f"RSS {indexed['rss_before_mb']:.0f} MB before, peak {indexed['peak_rss_mb']:.0f} MB, anonymous "
        f"{indexed['peak_anon_mb']:.0f} MB)",
        file=sys.stderr,
        flush=True,
    )
    if not released or not retired or merged <= 0:
        raise RuntimeError(
            f"a recovery step had nothing to do: {released} released, {retired} retired, {merged} merged"
        )
    return (
        recover_s,
        retire_s,
        index_s,
        released,
        retired,
        merged,
        indexed["rss_before_mb"],
        indexed["peak_rss_mb"],
        indexed["peak_anon_mb"],
    )
