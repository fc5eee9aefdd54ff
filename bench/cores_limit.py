"""How near `docqueue run --until-idle --workers 2` comes to the wall time the machine's cores allow, per input set.

The sets: `text`, generated text-layer pages (bench/orchestration_overhead.make_corpus, documents of
--pages-per-document pages); `scanned`, the same kind of pages as pictures without a text layer, so every page goes
through OCR (bench/scale_out.scanned_copies); `corpus`, the PDFs of ../shared/corpus (DOCQUEUE_CORPUS, --corpus),
when it exists, broken files and all: their tasks fail as they do for a user (--corpus-max-docs takes the first N).

For each set, in a fresh DOCQUEUE_HOME of its own (its embedded PostgreSQL and Bolt server on free ports, stopped
and deleted afterwards):

  a) the user's path: `docqueue db upgrade`, `ingest` of the set's files, then `docqueue run --until-idle --workers
     N --json`, timed from its start to its exit: wall, pages/s, chunks/s. CPU seconds by role from psutil samples
     every 0.5 s (bench/scale_out.CpuSampler): the run's parent process, each worker (with its PDF worker), the
     home's PostgreSQL, its Bolt server, this bench, and the rest of the machine (other users); the run's own
     process tree exactly, from getrusage(RUSAGE_CHILDREN). From the queue's timestamps: the seconds from the
     start to the first task claimed (start-up) and from the last task settled to the exit (wind-down).
  b) each stage alone, in this process, over the same documents, pages and chunks, through the objects and
     functions the pipeline calls (orchestration.pipeline.Pipeline.from_settings on the same home): opening each
     document (inspect), each page to markdown (split by the method the page took: text layer or OCR), chunking
     (processing.chunking.chunk_markdown), embedding (embed_covered, each distinct chunk text once, in batches of
     the vector_chunk claim), extraction (spaCy, in batches of the graphrag_chunk claim) and the writes: page
     markdown to storage, points to a fresh embedded vector shard beside the run's, chunks to the run's Bolt
     server emptied first (its CPU counted with the writes). CPU seconds of this process tree (the PDF worker
     included), after a warm-up whose cost (worker start, model loads) is reported apart as `loads_cpu_s`.
  c) limit_s = stage CPU / cores (os.sched_getaffinity), ratio = limit_s / wall (target >= 0.8). Where the
     wall x cores core-seconds went: the stages' work, the run's own processes beyond it (start-up imports,
     model loads in each worker, Dagster, planning, the queue's client side), PostgreSQL, the Bolt server beyond
     the graph writes, this bench's sampling, other users, and idle cores. On a shared machine two figures say
     more than the wall: cpu_ratio, the stages' CPU over the run's own (its process tree, PostgreSQL and the Bolt
     server), and ratio_if_alone, limit_s over the wall less the core time other users took (wall x cores minus
     their CPU, over the cores); ratio_bound_by_busiest_worker, limit_s over the busier worker's CPU seconds, a
     floor on the wall however quiet the machine (the work is not split evenly: tasks_by_worker and
     rows_by_block_share show how the workers shared it).

Not covered: the run's wall includes its start-up (imports, models), which the limit leaves out on purpose (a
user waits for it); the limit assumes the stages split perfectly over the cores, which the vector writes cannot (the
embedded shard takes one writer process at a time) and the phase order does not allow at the run's start and end.

  .venv/bin/python bench/cores_limit.py [--text-pages 200] [--scanned-pages 30] [--corpus DIR]
        [--corpus-max-docs N] [--pages-per-document 10] [--workers 2] [--sets text,scanned,corpus]

Ends with one line `RESULT {json}`: per set pages, chunks, wall_s, pages_per_s, chunks_per_s, stage_cpu_s,
limit_s, ratio, ratio_if_alone, cpu_ratio, the core-seconds breakdown (core_s, core_share), CPU by role and by
stage, start-up and wind-down seconds, the load average before and after.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._result import print_result  # noqa: E402
from bench.orchestration_overhead import clean_graph, free_port, make_corpus  # noqa: E402
from bench.scale_out import CpuSampler, scanned_copies  # noqa: E402

DEFAULT_CORPUS = Path(os.environ.get("DOCQUEUE_CORPUS") or REPO.parent / "shared" / "corpus")
SETS = ("text", "scanned", "corpus")
TARGET = 0.8
OCR_PREFIX = "ocr"  # a page's method: "text-layer", or "ocr:<engine>"
# the stages, in the order the pipeline runs them; the graph writes are the only ones whose CPU is partly another
# process's (the Bolt server's)
STAGES = (
    "inspect",
    "text_layer",
    "ocr",
    "failed_pages",
    "chunking",
    "embedding",
    "extraction",
    "writes_pages",
    "writes_vectors",
    "writes_graph",
)


# ------------------------------------------------------------------------------------------------ CPU
class ProcessTree:
    """CPU seconds of this process, its reaped children and the live descendants found at the last `refresh()`
    (the PDF worker), plus `others` (the Bolt server, not a descendant). Cheap enough to read around every page:
    the descendants are looked up only on `refresh()`."""

    def __init__(self, others: tuple[int, ...] = ()):
        import psutil

        self.psutil = psutil
        self.others = [psutil.Process(pid) for pid in others]
        self.refresh()

    def refresh(self) -> None:
        self.children = self.psutil.Process(os.getpid()).children(recursive=True)

    def cpu(self, with_others: bool = False) -> float:
        own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        total = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
        return total + _cpu_times(self.children) + (self.other_cpu() if with_others else 0.0)

    def other_cpu(self) -> float:
        return _cpu_times(self.others)


def _cpu_times(processes) -> float:
    import psutil

    total = 0.0
    for process in processes:
        try:
            t = process.cpu_times()
        except psutil.Error:  # ended: its time is in its parent's reaped children once waited for
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


class StageClock:
    """CPU and wall seconds per stage, summed over calls."""

    def __init__(self, tree: ProcessTree):
        self.tree = tree
        self.cpu = {stage: 0.0 for stage in STAGES}
        self.wall = {stage: 0.0 for stage in STAGES}
        self.server_cpu = 0.0

    def time(self, stage: str, work, with_server: bool = False):
        """`work()`'s value, its CPU charged to `stage` (an exception still charges it, then propagates)."""
        server_before = self.tree.other_cpu() if with_server else 0.0
        before, started = self.tree.cpu(with_server), time.perf_counter()
        try:
            return work()
        finally:
            self.wall[stage] += time.perf_counter() - started
            self.cpu[stage] += self.tree.cpu(with_server) - before
            if with_server:
                self.server_cpu += self.tree.other_cpu() - server_before

    def charge(self, stage: str, cpu_s: float, wall_s: float) -> None:
        self.cpu[stage] += cpu_s
        self.wall[stage] += wall_s


def cpu_of(tree: ProcessTree, work) -> float:
    """CPU seconds of `work()` in this process tree (descendants it starts included)."""
    before = tree.cpu()
    work()
    tree.refresh()
    return round(tree.cpu() - before, 2)


# ------------------------------------------------------------------------------------------------ the home
def home_env(home: Path) -> dict[str, str]:
    """A user's environment on a fresh home: no DOCQUEUE_* setting from outside, the embedded servers on free
    ports."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCQUEUE_", "DAGSTER_HOME"))}
    env.update(
        {
            "DOCQUEUE_HOME": str(home),
            "DOCQUEUE_PG_PORT": str(free_port()),
            "DOCQUEUE_BOLT_PORT": str(free_port()),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def docqueue(env: dict, *args: str, timeout: float = 600, failed_tasks_ok: bool = False) -> str:
    from bench._pipeline_env import docqueue as _docqueue
    from orchestration.cli.errors import EXIT_TASKS_FAILED

    done = _docqueue(env, *args, check=False, timeout=timeout)
    if done.returncode != 0 and not (failed_tasks_ok and done.returncode == EXIT_TASKS_FAILED):
        raise SystemExit(f"docqueue {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout


def server_pids(home: Path) -> dict[int, str]:
    """The home's postmaster and Bolt server (both detached: not this process's children)."""
    pids = {}
    postmaster = home / "postgres" / "data" / "postmaster.pid"
    if postmaster.is_file():
        pids[int(postmaster.read_text().split()[0])] = "postgres"
    bolt = home / "bolt" / "server.json"
    if bolt.is_file():
        pids[int(json.loads(bolt.read_text())["pid"])] = "bolt server"
    return pids


# ------------------------------------------------------------------------------------------------ a) the run
def name_processes(
    child: subprocess.Popen, sampler: CpuSampler, home: Path, workers: int, timeout_s: float = 180
) -> dict[int, str]:
    """Give each worker process of the run its own role as soon as it exists, and the Bolt server the run starts
    (detached, but the run's child until its starter exits) its own."""
    import psutil

    named: dict[int, str] = {}
    bolt = False
    until = time.monotonic() + timeout_s
    while (len(named) < workers or not bolt) and child.poll() is None and time.monotonic() < until:
        for pid, role in server_pids(home).items():
            if role == "bolt server" and not bolt:
                sampler.add_root(pid, role)
                bolt = True
        try:
            parent = psutil.Process(child.pid)
            parent_argv, children = parent.cmdline(), parent.children()
        except psutil.Error:
            return named
        for process in sorted(children, key=lambda p: p.pid):
            try:
                argv = process.cmdline()
            except psutil.Error:
                continue
            if process.pid in named:
                continue
            if "--worker-index" in argv:  # spawned: its command line names it
                named[process.pid] = f"worker {argv[argv.index('--worker-index') + 1]}"
            elif argv == parent_argv:  # forked (orchestration.workers.ForkedWorker): in the order they started
                named[process.pid] = f"worker {len(named)}"
            else:
                continue
            sampler.add_root(process.pid, named[process.pid])
        time.sleep(0.05)
    return named


def measure_run(home: Path, env: dict, workers: int, timeout: float) -> dict:
    from orchestration.cli.errors import EXIT_TASKS_FAILED

    servers = server_pids(home)
    # no clock file: the sampler counts from its construction, right before the run starts
    sampler = CpuSampler({os.getpid(): "bench", **servers}, home / "no-clock-file")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started_epoch, started = time.time(), time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "orchestration.cli", "run", "--until-idle", "--workers", str(workers), "--json"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    sampler.add_root(child.pid, "run parent")
    worker_pids = name_processes(child, sampler, home, workers)
    try:
        out, err = child.communicate(timeout=timeout)
    finally:
        wall = time.perf_counter() - started
        ended_epoch = time.time()
        cpu = sampler.stop()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if child.returncode not in (0, EXIT_TASKS_FAILED):
        raise SystemExit(f"docqueue run failed ({child.returncode}): {err.strip()[-3000:]}")
    report = json.loads(out)
    return {
        "wall_s": wall,
        "started_epoch": started_epoch,
        "ended_epoch": ended_epoch,
        "exit": child.returncode,
        "tree_cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
        "sampled": cpu,
        "runs": report["runs"],
        "vectors_reused": report["vectors_reused"],
        "summary": report["summary"],
        "worker_pids": worker_pids,
    }


def queue_figures(engine, worker_pids: dict[int, str], workers: int) -> dict:
    """Pages and chunks the run settled, the epochs of its first claim and last settlement (the database's clock,
    on this machine), each kind's tasks by the worker that settled them (the pid in the worker id) and by the worker
    whose share their registration block falls in (block % workers)."""
    with engine.connect() as conn:
        figures = dict(
            conn.exec_driver_sql(
                """SELECT (SELECT count(*) FROM task_queue_page) AS pages,
                          (SELECT count(*) FROM task_queue_page WHERE ocr_status = 'completed') AS pages_completed,
                          (SELECT count(*) FROM task_queue_page WHERE ocr_method LIKE 'ocr%%') AS pages_ocr,
                          (SELECT count(*) FROM task_queue_chunk) AS chunks,
                          (SELECT count(*) FROM task_queue_chunk WHERE graphrag_status = 'completed')
                              AS chunks_graph_completed,
                          (SELECT count(*) FROM documents) AS documents"""
            )
            .mappings()
            .one()
        )
        starts, ends = [], []
        by_worker: dict[str, dict[str, int]] = {}
        by_share: dict[str, dict[str, int]] = {}
        for table in ("documents", "task_queue_page", "task_queue_chunk"):
            columns = conn.exec_driver_sql(
                "SELECT column_name FROM information_schema.columns WHERE table_name = %(t)s", {"t": table}
            ).scalars()
            for column in columns:
                if column.endswith("_started_at"):
                    starts.append(f"(SELECT extract(epoch FROM min({column})) FROM {table})")
                elif column.endswith("_completed_at"):
                    ends.append(f"(SELECT extract(epoch FROM max({column})) FROM {table})")
                elif column.endswith("_worker_id") and column != "current_worker_id":
                    rows = conn.exec_driver_sql(
                        f"""SELECT substring({column} from ':([0-9]+):[0-9a-f]{{12}}$'), count(*) FROM {table}
                           WHERE {column} IS NOT NULL GROUP BY 1"""
                    ).all()
                    by_worker[f"{table}.{column}"] = {
                        worker_pids.get(int(pid), "other process") if pid else "unknown": n for pid, n in rows
                    }
            rows = conn.exec_driver_sql(
                f"SELECT partition_block %% %(w)s, count(*) FROM {table} WHERE partition_block IS NOT NULL GROUP BY 1",
                {"w": workers},
            ).all()
            by_share[table] = {f"worker {share}": n for share, n in rows}
        figures["tasks_by_worker"] = by_worker
        figures["rows_by_block_share"] = by_share
        first, last = conn.exec_driver_sql(f"SELECT least({', '.join(starts)}), greatest({', '.join(ends)})").one()
    figures["first_claim_epoch"] = float(first) if first is not None else None
    figures["last_settled_epoch"] = float(last) if last is not None else None
    return figures


# ------------------------------------------------------------------------------------------------ b) the stages
def measure_stages(home: Path, bolt_pid: int | None) -> dict:
    """Every stage alone over the documents, pages and chunks the run had, as the pipeline's functions do it."""
    from orchestration.assets.common import CLAIM_BATCH
    from orchestration.cli.context import open_queue
    from orchestration.pipeline import Pipeline
    from orchestration.stores import embedding_model, open_vectors
    from processing.chunking import chunk_markdown
    from processing.entities import ChunkGraph
    from queue_db.config import Settings
    from queue_db.keys import page_partition_key
    from resources.graph_stores import Neo4jResource
    from resources.ports import ChunkPoint
    from resources.storage import page_file_key
    from resources.vector_payload import chunk_payload

    settings = Settings.from_env()
    queue = open_queue(settings)
    pipeline = Pipeline.from_settings(queue, settings)
    with queue.engine.connect() as conn:
        ids = conn.exec_driver_sql("SELECT id::text FROM documents ORDER BY created_at, id").scalars().all()
        page_rows = conn.exec_driver_sql(
            "SELECT document_id::text, page_number FROM task_queue_page ORDER BY document_id, page_number"
        ).all()
    documents: dict[str, dict] = {i: queue.document(i) or {} for i in ids}
    tree = ProcessTree((bolt_pid,) if bolt_pid else ())
    clock = StageClock(tree)
    reader, limits = pipeline.page_reader, pipeline.limits

    # the graph the run wrote is emptied: the stage's writes go into an empty graph, as the run's did
    graph_resource = Neo4jResource.from_settings(settings)
    uri, user, password, database = graph_resource.connection()
    clean_graph({"uri": uri, "user": user, "password": password, "database": database})
    graph = graph_resource.get_store()
    graph.ensure_schema()
    # a fresh shard beside the run's, so the points are new ones, as the run's were
    model_id, dim = embedding_model(settings.embedding)
    stage_settings = dataclasses.replace(
        settings, vector=settings.vector.model_copy(update={"path": str(home / "qdrant-stages")})
    )
    store = open_vectors(stage_settings, model_id, dim)
    store.ensure_collection()

    loads: dict[str, float] = {}
    # the PDF worker's start (and the OCR engine's load, on a set whose first page is a scan), one page's work with it
    if page_rows:
        loads["pdf_worker"] = cpu_of(tree, lambda: _warm_page(reader, documents[page_rows[0][0]], page_rows[0][1]))
    loads["embedder"] = cpu_of(tree, lambda: pipeline.embedder.embed_covered(["warm up the model"]))
    loads["extractor"] = cpu_of(tree, lambda: pipeline.extractor.extract(["Anna Keller works in Geneva."]))

    for document in documents.values():
        tree.refresh()
        try:
            clock.time("inspect", lambda: reader.inspect(document))
        except Exception:  # noqa: BLE001 - a broken file's failure costs what the run paid for it too
            pass
    chunks: list[tuple[dict, int, Any]] = []  # (document, page number, chunk)
    methods: dict[str, int] = {}
    for document_id, page_number in page_rows:
        document = documents[document_id]
        tree.refresh()  # a PDF worker restarted after a bad file is a new process
        before, started = tree.cpu(), time.perf_counter()
        try:
            result = reader.convert_page(document, page_number)
        except Exception:  # noqa: BLE001
            clock.charge("failed_pages", tree.cpu() - before, time.perf_counter() - started)
            methods["failed"] = methods.get("failed", 0) + 1
            continue
        stage = "ocr" if result.method.startswith(OCR_PREFIX) else "text_layer"
        clock.charge(stage, tree.cpu() - before, time.perf_counter() - started)
        methods[result.method] = methods.get(result.method, 0) + 1
        key = page_file_key(document["document_key"], page_number)
        clock.time("writes_pages", lambda: pipeline.storage.put_text(key, result.markdown))
        page_chunks = clock.time(
            "chunking",
            lambda: chunk_markdown(
                result.markdown,
                page_key=page_partition_key(document["document_key"], page_number),
                max_chunks=limits.max_chunks_per_page,
            ),
        )
        chunks.extend((document, page_number, c) for c in page_chunks)

    # embedding: each distinct text once (identical chunks take a copy of the first one's vector in the pipeline)
    vectors: dict[str, tuple] = {}
    distinct = list({c.content_hash: c.text for _, _, c in chunks}.items())
    batch = CLAIM_BATCH["vector_chunk"]
    for start in range(0, len(distinct), batch):
        texts = distinct[start : start + batch]
        embedded = clock.time("embedding", lambda: pipeline.embedder.embed_covered([text for _, text in texts]))
        for row, (content_hash, _) in enumerate(texts):
            vectors[content_hash] = (embedded.vectors[row], embedded.tokens[row], embedded.embedded_tokens[row])
    for start in range(0, len(chunks), batch):
        part = chunks[start : start + batch]
        points = [
            ChunkPoint(
                chunk_id=c.chunk_id,
                vector=vectors[c.content_hash][0],
                payload=chunk_payload(
                    document_id=str(d["id"]),
                    document_key=d["document_key"],
                    tenant_id=d["tenant_id"],
                    filename=d["filename"],
                    page_number=n,
                    chunk_index=c.index,
                    text=c.text,
                    content_hash=c.content_hash,
                    tokens=vectors[c.content_hash][1],
                    embedded_tokens=vectors[c.content_hash][2],
                    vector_reused_from=None,
                ),
            )
            for d, n, c in part
        ]
        clock.time("writes_vectors", lambda: store.upsert(points))
    store.close()

    batch = CLAIM_BATCH["graphrag_chunk"]
    entities = 0
    for start in range(0, len(chunks), batch):
        part = chunks[start : start + batch]
        extractions = clock.time("extraction", lambda: pipeline.extractor.extract([c.text for _, _, c in part]))
        entities += sum(len(e.entities) for e in extractions)
        rows = [
            ChunkGraph(
                document_id=str(d["id"]),
                filename=d["filename"],
                page_number=n,
                chunk_id=c.chunk_id,
                chunk_index=c.index,
                extraction=extractions[i],
                tenant_id=d["tenant_id"],
            )
            for i, (d, n, c) in enumerate(part)
        ]
        clock.time("writes_graph", lambda: graph.write_chunks(rows), with_server=True)
    graph.close()
    pipeline.close()
    queue.engine.dispose()
    return {
        "cpu_s": clock.cpu,
        "wall_s": clock.wall,
        "graph_server_cpu_s": clock.server_cpu,
        "loads_cpu_s": loads,
        "pages": len(page_rows),
        "methods": methods,
        "chunks": len(chunks),
        "distinct_chunk_texts": len(distinct),
        "entities": entities,
    }


def _warm_page(reader, document: dict, page_number: int) -> None:
    try:
        reader.inspect(document)
        reader.convert_page(document, page_number)
    except Exception:  # noqa: BLE001 - a broken first file warms the worker all the same
        pass


# ------------------------------------------------------------------------------------------------ c) the limit
def limit_figures(run: dict, queue: dict, stages: dict, cores: int) -> dict:
    wall = run["wall_s"]
    stage_cpu = sum(stages["cpu_s"].values())
    limit = stage_cpu / cores
    roles = run["sampled"]["cpu_s"]
    workers = {role: s for role, s in roles.items() if role.startswith("worker")}
    capacity = wall * cores
    client_stage_cpu = stage_cpu - stages["graph_server_cpu_s"]
    run_tree = run["tree_cpu_s"]
    postgres, bolt = roles.get("postgres", 0.0), roles.get("bolt server", 0.0)
    other, bench = roles.get("rest of machine", 0.0), roles.get("bench", 0.0)
    used = run_tree + postgres + bolt + other + bench
    breakdown = {
        "stages": stage_cpu,
        "run_processes_beyond_stages": run_tree - client_stage_cpu,
        "postgres": postgres,
        "bolt_server_beyond_graph_writes": bolt - stages["graph_server_cpu_s"],
        "bench_sampling": bench,
        "other_users": other,
        "idle": capacity - used,
    }
    # the run's own CPU, its servers' included: what the stages' work cost inside the run
    run_cpu = run_tree + postgres + bolt
    # core-seconds other users took are counted as if they had been ours to use: the wall of a machine of our own
    alone_s = (capacity - other) / cores
    first, last = queue["first_claim_epoch"], queue["last_settled_epoch"]
    pages, chunks = queue["pages"], queue["chunks"]
    return {
        "pages": pages,
        "pages_ocr": queue["pages_ocr"],
        "pages_completed": queue["pages_completed"],
        "chunks": chunks,
        "chunks_graph_completed": queue["chunks_graph_completed"],
        "documents": queue["documents"],
        "wall_s": round(wall, 1),
        "pages_per_s": round(pages / wall, 3),
        "chunks_per_s": round(chunks / wall, 2),
        "stage_cpu_s": round(stage_cpu, 1),
        "limit_s": round(limit, 1),
        "ratio": round(limit / wall, 3),
        "target": TARGET,
        "cpu_ratio": round(stage_cpu / run_cpu, 3) if run_cpu else None,
        "ratio_if_alone": round(limit / alone_s, 3) if alone_s > 0 else None,
        # a worker's CPU is a floor on the wall however quiet the machine: the busier one's bounds the ratio
        "ratio_bound_by_busiest_worker": round(limit / max(workers.values()), 3) if workers else None,
        "run_cpu_s": round(run_cpu, 1),
        "run_tree_cpu_s": round(run_tree, 1),
        "cpu_s_by_role": {role: round(s, 1) for role, s in roles.items()},
        "worker_cpu_share": {role: round(s / sum(workers.values()), 3) for role, s in workers.items()}
        if workers and sum(workers.values())
        else None,
        "core_s": {name: round(value, 1) for name, value in breakdown.items()},
        "core_s_capacity": round(capacity, 1),
        "core_share": {name: round(value / capacity, 3) for name, value in breakdown.items()},
        "machine_busy_cpu_s": run["sampled"]["machine_busy_cpu_s"],
        "startup_s": round(first - run["started_epoch"], 1) if first else None,
        "wind_down_s": round(run["ended_epoch"] - last, 1) if last else None,
        "stage_cpu_by_stage_s": {s: round(v, 2) for s, v in stages["cpu_s"].items() if v},
        "stage_cores_alone": {
            s: round(stages["cpu_s"][s] / w, 2) for s, w in stages["wall_s"].items() if w >= 0.05 and stages["cpu_s"][s]
        },
        "graph_server_cpu_s": round(stages["graph_server_cpu_s"], 2),
        "loads_cpu_s": stages["loads_cpu_s"],
        "methods": stages["methods"],
        "tasks_by_worker": queue["tasks_by_worker"],
        "rows_by_block_share": queue["rows_by_block_share"],
        "stage_chunks": stages["chunks"],
        "distinct_chunk_texts": stages["distinct_chunk_texts"],
        "vectors_reused": run["vectors_reused"],
        "runs": run["runs"],
        "exit": run["exit"],
        "failed_tasks": run["summary"]["failed"],
    }


# ------------------------------------------------------------------------------------------------ the sets
def make_set(name: str, folder: Path, args) -> list[Path]:
    if name in ("text", "scanned"):
        folder.mkdir(parents=True)
        pages = args.text_pages if name == "text" else args.scanned_pages
        per = args.pages_per_document
        files = make_corpus(folder, -(-pages // per), per) if pages else []
        if name == "scanned":
            scanned_copies(folder)
        return files
    inputs = sorted(path for path in args.corpus.iterdir() if path.is_file() and path.suffix.lower() == ".pdf")
    return inputs[: args.corpus_max_docs] if args.corpus_max_docs else inputs


def measure_set(name: str, files: list[Path], root: Path, args, cores: int) -> dict:
    home = root / f"home-{name}"
    home.mkdir()
    env = home_env(home)
    # the stages run in this process on the same home: the settings are built from the same environment
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    load_before = [round(x, 2) for x in os.getloadavg()]
    try:
        docqueue(env, "db", "upgrade")
        docqueue(env, "ingest", *map(str, files), "--json")
        run = measure_run(home, env, args.workers, args.timeout)
        from orchestration.cli.context import open_queue
        from queue_db.config import Settings

        queue = open_queue(Settings.from_env())
        counted = queue_figures(queue.engine, run["worker_pids"], args.workers)
        queue.engine.dispose()
        bolt_pid = next((pid for pid, role in server_pids(home).items() if role == "bolt server"), None)
        stages = measure_stages(home, bolt_pid)
    finally:
        subprocess.run(
            [sys.executable, "-m", "orchestration.cli", "db", "stop"],
            cwd=REPO,
            env=env,
            capture_output=True,
            timeout=120,
        )
        os.environ.clear()
        os.environ.update(saved)
    figures = limit_figures(run, counted, stages, cores)
    figures["files"] = len(files)
    figures["loadavg"] = [load_before, [round(x, 2) for x in os.getloadavg()]]
    return figures


def print_set(name: str, f: dict) -> None:
    print(
        f"{name}: {f['documents']} documents, {f['pages']} pages ({f['pages_ocr']} OCR), {f['chunks']} chunks; "
        f"run {f['wall_s']} s: {f['pages_per_s']} pages/s, {f['chunks_per_s']} chunks/s; stage CPU "
        f"{f['stage_cpu_s']} s -> limit {f['limit_s']} s: ratio {f['ratio']} (target {TARGET}), "
        f"{f['ratio_if_alone']} without other users' core time, at most {f['ratio_bound_by_busiest_worker']} "
        f"with the busier worker's CPU; stage CPU / run CPU {f['cpu_ratio']}",
        flush=True,
    )
    print(f"  stages (CPU s): {f['stage_cpu_by_stage_s']}; cores a stage uses alone: {f['stage_cores_alone']}")
    print(f"  core-seconds of {f['core_s_capacity']}: {f['core_s']}")
    print(f"  tasks by worker: {f['tasks_by_worker']}; rows by block share: {f['rows_by_block_share']}")
    print(
        f"  CPU by role: {f['cpu_s_by_role']}; workers' shares {f['worker_cpu_share']}; start-up "
        f"{f['startup_s']} s, wind-down {f['wind_down_s']} s; loads (one process) {f['loads_cpu_s']}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--text-pages", type=int, default=200, help="generated text-layer pages")
    parser.add_argument("--scanned-pages", type=int, default=30, help="generated pages without a text layer")
    parser.add_argument("--pages-per-document", type=int, default=10)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="folder of real PDFs (skipped if absent)")
    parser.add_argument("--corpus-max-docs", type=int, default=None, help="only the first N PDFs, sorted by name")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sets", default=",".join(SETS), help="comma-separated choice of " + ", ".join(SETS))
    parser.add_argument("--timeout", type=float, default=1800, help="seconds allowed for each `docqueue run`")
    args = parser.parse_args(argv)
    chosen = [s.strip() for s in args.sets.split(",") if s.strip()]
    if not chosen or set(chosen) - set(SETS):
        parser.error(f"--sets takes a comma-separated choice of {', '.join(SETS)}, got {args.sets!r}")
    cores = len(os.sched_getaffinity(0))
    results: dict = {"cores": cores, "workers": args.workers, "target": TARGET, "sets": {}, "skipped": {}}
    root = Path(tempfile.mkdtemp(prefix="docqueue-bench-cores-"))
    try:
        for name in chosen:
            if name == "corpus" and not args.corpus.is_dir():
                results["skipped"][name] = f"no folder {args.corpus}"
                continue
            if name != "corpus" and not (args.text_pages if name == "text" else args.scanned_pages):
                results["skipped"][name] = "0 pages asked"
                continue
            files = make_set(name, root / f"input-{name}", args)
            results["sets"][name] = measure_set(name, files, root, args, cores)
            print_set(name, results["sets"][name])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_result(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
