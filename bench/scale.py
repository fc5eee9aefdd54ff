"""Corpus scale on one machine: every per-unit cost and the whole-corpus views at N completed chunks, side by side.

For each N in --sizes (default 0, 100,000 and 1,000,000), a home of its own (DOCQUEUE_HOME: the embedded
PostgreSQL, the Qdrant Edge shard, the Bolt server, Dagster's storage) is seeded set-based, without models:
N completed chunks (documents of 40 pages x 5 chunks) in the queue, their points in the vector store (unit vectors
around 1,000 topics, through the store's own batched write, their index built every DOCQUEUE_QDRANT_INDEX_TAIL
points as the recovery schedule builds it), their Chunk nodes in the graph (UNWIND batches), and
their keys as Dagster dynamic partitions (direct INSERT, in the positions the queue records), plus 100,000 pending
chunks beside them; then the completed partitions are retired as the recovery schedule retires them (retire_s).
Then, each in the seeded home:

  nightly_s / nightly_peak_rss_mb / nightly_peak_anon_mb / nightly_capped
                             the first night: `nightly()` in a child process (inside a memory cgroup with
                             --nightly-cap-mb); its optimize() indexes what the day left unindexed
  claim_settle_tasks_per_s   4 worker processes x batch 50, TaskQueue.settle on vector_chunk, over --window s
  vector_write64_in_run_s    a 1,000-chunk run's writes: 64-point batches sharing one opening of the shard, per batch
  vector_open_s              that opening alone
  vector_write64_s           one 64-point write with its own open and close of the shard (median of 3): the worst case
  search_p50_ms/_p95_ms      --searches dense queries near the seeded topics, in one open session
  search_recall_at_5         20 of them against exact search
  search_session_*           the warm search session (resources/search_session.SearchSession) as an application
                             keeps it: --searches hybrid searches of made-up-word queries (the real model's query
                             embedding, both rankings, fusion, copies collapsed, entities from the graph), p50 / p95
                             in ms, then as many filtered to the tenant holding a tenth of the documents (_tenant_)
  search_cli_s               `docqueue search QUERY --json` in a new process: the median of 5 one after another,
                             start-up included; search_cli_first_s the first of them alone, which follows the warm
                             session's close and so reads the shard from disk (a closing evicts it from the page
                             cache; a search's end leaves it there); search_cli_tenant_s one more with --tenant
  search_full_tail_*         the warm session's p50 / p95 while a full tail (DOCQUEUE_QDRANT_INDEX_TAIL points,
                             search_full_tail_waiting) waits for the index build the recovery job then makes
  ranged_run_fixed_s         the Dagster side of a ranged 1,000-chunk run: resolving its keys and creating the run
                             record with its range tags (no launch, no model work; median of 3)
  sensor_tick_s              one vector_chunk_sensor tick as the daemon evaluates it (median of 7, after a first)
  status_s / stats_s         `docqueue status --json` (first page) and `docqueue stats --json`, wall time of the
                             command, start-up included (median of 3)
  recovery_*                 the recovery job's three steps with work in each (500 tasks claimed with an hour-old
                             heartbeat, the partitions of 25 seeded documents completed 8 days ago, a tail of
                             --tail points): recovery_release_s / _retire_s / _index_tail_s, what each did
                             (recovery_released / _retired / _indexed) and its cost per item (…_per_task_ms,
                             …_per_partition_ms, …_per_point_ms); the index build runs in a process of its own:
                             recovery_index_rss_before_mb (its imports), _peak_rss_mb and _peak_anon_mb
  checks_s                   the four asset checks, evaluated as functions
  partitions_page_s          the vector_chunk asset's partitions page in headless Chromium (dagster-webserver),
                             median of 3 loads
  real_run_*                 `docqueue run --max-docs 1` (the CLI, real models, embedding reuse on) on generated PDFs
                             ingested at priority 10 right before (their tasks untouched), into a tail half
                             --tail full: a one-page document (real_run_fixed_s: start-up, models, stores) and
                             one of --run-pages pages (real_run_s, real_run_chunks); real_run_per_chunk_s is the
                             difference over the difference of chunks. The stores are counted after:
                             real_run_points (its chunk ids in the vector store), _nodes (Chunk nodes),
                             _mentions (MENTIONS edges); a run that wrote less than every chunk fails. Peak RSS /
                             anonymous MB of the run's process tree, sampled every 0.2 s
  checks_per_chunk_us        checks_s over the chunk rows (completed and pending) they read

Each N runs in a child process bounded by what is left of --deadline; a figure not measured (skipped, out of
time, failed) is null and its reason is listed under "missing". Ends with one line `RESULT {json}`.

  .venv/bin/python bench/scale.py [--sizes 0,100000,1000000] [--quick] [--skip name,...] [--deadline S] [--reuse]

--quick is a smoke run: 20,000 pending chunks, a 0.5 s claim window, one write, one tick after the first, 20
searches, a 1,000-point tail, a 3-page real run.

The RESULT line carries the commit, whether each N's home was seeded by this run or reused (--reuse), the load
average before and after each N, every per-unit figure's ratio at each N against N = 0 (`ratios`, above 1 slower)
and the searches' also against N = 100,000 when it ran (`search_ratios_vs_100000`).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
# the commands of the environment this interpreter runs in, wherever its venv lives
BIN = Path(sys.executable).parent

from bench._result import print_result  # noqa: E402
from bench._scale_search import TENANT, TENANT_EVERY, chunk_texts, measure_cli, measure_session  # noqa: E402
from bench._scale_work import _sampled, fill_tail, make_recovery_work, measure_real_run, measure_recovery_job  # noqa: E402
from queue_db.tenants import BASE_TENANT  # noqa: E402

PAGES, CHUNKS = 40, 5  # a document of 40 pages, 5 chunks a page: 200 chunks
PENDING = 100_000
BLOCK = 10_000  # orchestration.partitions.BLOCK_SIZE
RANGE = 1_000
MEASURES = (
    "claim_settle",
    "vector_write",
    "search",
    "search_session",
    "search_cli",
    "search_full_tail",
    "ranged_run",
    "sensor_tick",
    "status",
    "stats",
    "recovery",
    "checks",
    "nightly",
    "partitions_page",
    "real_run",
)
# figure -> True when it is a rate (its ratio is inverted so that above 1 always means slower)
PER_UNIT = {
    "claim_settle_tasks_per_s": True,
    "vector_write64_in_run_s": False,
    "search_p50_ms": False,
    "search_p95_ms": False,
    "search_session_p50_ms": False,
    "search_session_p95_ms": False,
    "search_session_tenant_p95_ms": False,
    "search_cli_s": False,
    "search_full_tail_p95_ms": False,
    "ranged_run_fixed_s": False,
    "sensor_tick_s": False,
    "recovery_release_per_task_ms": False,
    "recovery_retire_per_partition_ms": False,
    "recovery_index_per_point_ms": False,
    "checks_per_chunk_us": False,
    "real_run_per_chunk_s": False,
    "real_run_fixed_s": False,
}
REAL_RUN = (
    "real_run_per_chunk_s",
    "real_run_fixed_s",
    "real_run_s",
    "real_run_chunks",
    "real_run_points",
    "real_run_nodes",
    "real_run_mentions",
    "real_run_peak_rss_mb",
    "real_run_peak_anon_mb",
)
RECOVERY = (
    "recovery_release_s",
    "recovery_retire_s",
    "recovery_index_tail_s",
    "recovery_released",
    "recovery_retired",
    "recovery_indexed",
    "recovery_index_rss_before_mb",
    "recovery_index_peak_rss_mb",
    "recovery_index_peak_anon_mb",
)
SEARCH_PATHS = (
    "search_session_p50_ms",
    "search_session_p95_ms",
    "search_session_tenant_p50_ms",
    "search_session_tenant_p95_ms",
    "search_session_hits",
)
FULL_TAIL = ("search_full_tail_p50_ms", "search_full_tail_p95_ms", "search_full_tail_waiting")
SEARCH_CLI = ("search_cli_s", "search_cli_tenant_s", "search_cli_first_s")
STALE_TASKS, RETIRED_DOCUMENTS = 500, 25
FIGURES = (
    "seed_s",
    "retire_s",
    "claim_settle_tasks_per_s",
    "vector_write64_in_run_s",
    "vector_open_s",
    "vector_write64_s",
    "search_p50_ms",
    "search_p95_ms",
    "search_recall_at_5",
    *SEARCH_PATHS,
    *SEARCH_CLI,
    *FULL_TAIL,
    "ranged_run_fixed_s",
    "sensor_tick_s",
    "status_s",
    "stats_s",
    *RECOVERY,
    "recovery_release_per_task_ms",
    "recovery_retire_per_partition_ms",
    "recovery_index_per_point_ms",
    "checks_s",
    "checks_per_chunk_us",
    "nightly_s",
    "nightly_peak_rss_mb",
    "nightly_peak_anon_mb",
    "nightly_capped",
    "partitions_page_s",
    *REAL_RUN,
)


# ------------------------------------------------------------------------------------------------ seeding
def chunk_id(doc: int, page: int, chunk: int) -> str:
    """The same id the seeding SQL writes: md5('scale/doc/page/chunk')."""
    return hashlib.md5(f"scale/{doc}/{page}/{chunk}".encode()).hexdigest()


def seed_queue(engine, documents: int, pending_documents: int) -> None:
    """Documents 1..documents completed, the next pending_documents with their chunks pending (pages OCR'd and
    chunked), all registered: blocks of 10,000 positions in key order, as register_partitions leaves them."""
    total = documents + pending_documents
    args = {"docs": documents, "total": total, "pages": PAGES, "chunks": CHUNKS, "block": BLOCK}
    with engine.begin() as conn:
        conn.exec_driver_sql("SET LOCAL maintenance_work_mem = '256MB'")
        conn.exec_driver_sql("SET LOCAL session_replication_role = replica")  # rows agree by construction
        # the secondary indexes are built once afterwards (a sorted build beats 1M incremental inserts); the
        # primary key and unique constraints stay, other tables' foreign keys hang on them
        indexes = conn.exec_driver_sql(
            """SELECT indexname, indexdef FROM pg_indexes i WHERE tablename = 'task_queue_chunk'
               AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname)"""
        ).all()
        for name, _ in indexes:
            conn.exec_driver_sql(f'DROP INDEX "{name}"')
        first = conn.exec_driver_sql("SELECT nextval('docqueue_partition_block_seq')").scalar()
        doc_blocks = -(-total // BLOCK)
        page_blocks = -(-total * PAGES // BLOCK)
        args.update(doc_first=first, page_first=first + doc_blocks, chunk_first=first + doc_blocks + page_blocks)
        # documents one second apart, so registration order is document number; completed ones took 2-4 s a task
        conn.exec_driver_sql(
            """INSERT INTO documents (filename, document_key, content_hash, size_bytes, page_count, pages_created_at,
                                      ocr_status, ocr_started_at, ocr_completed_at, vector_index_status,
                                      graphrag_index_status, created_at, partition_block, partition_pos,
                                      tenant_id)
               SELECT 'scale-' || n || '.pdf', 'scale-' || lpad(n::text, 6, '0'),
                      encode(sha256(convert_to('scale' || n, 'UTF8')), 'hex'), 100000, %(pages)s,
                      now() - make_interval(secs => %(total)s - n + 1), 'completed',
                      now() - make_interval(secs => %(total)s - n + 2),
                      now() - make_interval(secs => %(total)s - n + 1),
                      CASE WHEN n <= %(docs)s THEN 'completed' ELSE 'pending' END::task_status,
                      CASE WHEN n <= %(docs)s THEN 'completed' ELSE 'pending' END::task_status,
                      now() - make_interval(secs => %(total)s - n + 3), %(doc_first)s + (n - 1) / %(block)s,
                      (n - 1) %% %(block)s,
                      CASE WHEN n %% %(tenant_every)s = 0 THEN %(tenant)s ELSE %(base)s END
               FROM generate_series(1, %(total)s) n""",
            {**args, "tenant_every": TENANT_EVERY, "tenant": TENANT, "base": BASE_TENANT},
        )
        conn.exec_driver_sql(
            """INSERT INTO task_queue_page (document_id, page_number, page_file_path, ocr_status, ocr_started_at,
                                            ocr_completed_at, chunked_at, chunk_count, vector_status, graphrag_status,
                                            created_at, partition_block, partition_pos)
               SELECT d.id, p, d.document_key || '/page_' || p || '_nohf.md', 'completed', d.ocr_started_at,
                      d.ocr_completed_at, d.ocr_completed_at, %(chunks)s, d.vector_index_status,
                      d.graphrag_index_status, d.created_at, %(page_first)s + s.i / %(block)s, s.i %% %(block)s
               FROM documents d, generate_series(1, %(pages)s) p,
                    LATERAL (SELECT (right(d.document_key, 6)::int - 1) * %(pages)s + p - 1 AS i) s
               WHERE d.document_key LIKE 'scale-%%'""",
            args,
        )
        conn.exec_driver_sql(
            """INSERT INTO task_queue_chunk (page_id, document_id, chunk_id, chunk_index, chunk_content_hash,
                                             vector_status, vector_started_at, vector_completed_at, graphrag_status,
                                             graphrag_started_at, graphrag_completed_at, created_at, partition_block,
                                             partition_pos)
               SELECT pg.id, pg.document_id, md5('scale/' || s.doc || '/' || pg.page_number || '/' || c), c,
                      md5(c::text), pg.vector_status,
                      CASE WHEN done THEN pg.created_at + make_interval(secs => 5 + random()) END,
                      CASE WHEN done THEN pg.created_at + make_interval(secs => 6.5 + random()) END,
                      pg.graphrag_status,
                      CASE WHEN done THEN pg.created_at + make_interval(secs => 8 + random()) END,
                      CASE WHEN done THEN pg.created_at + make_interval(secs => 8.2 + random()) END,
                      pg.created_at, %(chunk_first)s + s.i / %(block)s, s.i %% %(block)s
               FROM task_queue_page pg JOIN documents d ON d.id = pg.document_id, generate_series(0, %(chunks)s - 1) c,
                    LATERAL (SELECT right(d.document_key, 6)::int AS doc,
                                    ((right(d.document_key, 6)::int - 1) * %(pages)s + pg.page_number - 1) * %(chunks)s
                                    + c AS i, pg.vector_status = 'completed' AS done) s
               WHERE d.document_key LIKE 'scale-%%'""",
            args,
        )
        conn.exec_driver_sql(
            """INSERT INTO task_queue_chunk_text (chunk_task_id, content)
               SELECT id, 'pending chunk ' || chunk_index FROM task_queue_chunk WHERE vector_status = 'pending'"""
        )
        conn.exec_driver_sql(
            "SELECT setval('docqueue_partition_block_seq', %(last)s)",
            {"last": args["chunk_first"] + -(-total * PAGES * CHUNKS // BLOCK)},
        )
        for _, definition in indexes:
            conn.exec_driver_sql(definition)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE")


def seed_dagster_partitions(queue_engine, dagster_url: str) -> None:
    """Every seeded key as a dynamic partition, in position order (Dagster's key order is insertion order)."""
    import sqlalchemy as sa

    from orchestration.partitions import chunks_partitions, documents_partitions, pages_partitions

    selects = (
        (documents_partitions.name, "SELECT document_key FROM documents ORDER BY partition_block, partition_pos"),
        (
            pages_partitions.name,
            "SELECT d.document_key || '/p' || lpad(p.page_number::text, 4, '0') FROM "
            "task_queue_page p JOIN documents d ON d.id = p.document_id "
            "ORDER BY p.partition_block, p.partition_pos",
        ),
        (
            chunks_partitions.name,
            "SELECT d.document_key || '/p' || lpad(c_page.page_number::text, 4, '0') || '/c' || "
            "lpad(c.chunk_index::text, 3, '0') FROM task_queue_chunk c "
            "JOIN task_queue_page c_page ON c_page.id = c.page_id "
            "JOIN documents d ON d.id = c.document_id "
            "ORDER BY c.partition_block, c.partition_pos",
        ),
    )
    dagster = sa.create_engine(dagster_url)
    try:
        for name, select in selects:
            with queue_engine.connect() as source, dagster.begin() as target:
                result = source.execution_options(stream_results=True, yield_per=50_000).exec_driver_sql(select)
                for rows in result.partitions(50_000):
                    target.exec_driver_sql(
                        "INSERT INTO dynamic_partitions (partitions_def_name, partition, create_timestamp) "
                        "SELECT %(name)s, k, now() FROM unnest(%(keys)s::text[]) WITH ORDINALITY AS v(k, o) ORDER BY o",
                        {"name": name, "keys": [r[0] for r in rows]},
                    )
        with dagster.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE dynamic_partitions")
    finally:
        dagster.dispose()


def centres(dim: int):
    """The 1,000 topics the seeded vectors gather around (the same for every N and for the queries)."""
    import numpy as np

    return np.random.default_rng(0).standard_normal((1_000, dim), dtype=np.float32)


def clustered(rng, dim: int, n: int):
    """Unit vectors near one of the centres each, as embeddings of related passages lie: uniform random vectors in
    384 dimensions have no near neighbours at all, which no index (and no real corpus) is made for."""
    import numpy as np

    topics = centres(dim)
    vectors = topics[rng.integers(0, len(topics), n)] + 0.6 * rng.standard_normal((n, dim), dtype=np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def seed_tenant(doc: int) -> str:
    """Every TENANT_EVERY-th document is TENANT's, the others the base tenant's, as the writer tags them."""
    return TENANT if doc % TENANT_EVERY == 0 else BASE_TENANT


def seed_vectors(store, documents: int, document_ids: dict[int, str], rng) -> None:
    """Clustered unit vectors for every completed chunk, with a text of CHUNK_WORDS words (its sparse vector) and
    its tenant, through the store's own batched write."""
    from resources.qdrant_base import PreparedPoint
    from resources.vector_payload import point_id

    dim = store.dim
    batch: list[tuple[int, int, int]] = []

    def flush() -> None:
        vectors = clustered(rng, dim, len(batch))
        texts = chunk_texts(rng, len(batch))
        points = []
        for (doc, page, c), vector, text in zip(batch, vectors, texts):
            cid = chunk_id(doc, page, c)
            points.append(
                PreparedPoint(
                    point_id(cid),
                    vector.tolist(),
                    {
                        "document_id": document_ids[doc],
                        "document_key": f"scale-{doc:06d}",
                        "filename": f"scale-{doc}.pdf",
                        "page_number": page,
                        "chunk_index": c,
                        "text": text,
                        "chunk_id": cid,
                        "tenant_id": seed_tenant(doc),
                    },
                )
            )
        store.write_prepared(points)
        batch.clear()

    from queue_db.config import VectorStoreConfig, settings

    tail = settings(VectorStoreConfig).index_tail
    store.ensure_collection()
    with store.session():
        for doc in range(1, documents + 1):
            for page in range(1, PAGES + 1):
                for c in range(CHUNKS):
                    batch.append((doc, page, c))
            if len(batch) >= 2000:
                flush()
                # what the recovery schedule does while a corpus arrives: index each DOCQUEUE_QDRANT_INDEX_TAIL
                store.index_tail(tail)
        if batch:
            flush()


def seed_graph(graph, documents: int, document_ids: dict[int, str]) -> None:
    """A Chunk node per completed chunk, 10,000 per UNWIND, under the schema every written graph has (the first
    write_chunks creates it)."""
    graph.ensure_schema()
    rows: list[dict] = []
    with graph._session() as session:  # the store has no bulk path for bare Chunk nodes
        for doc in range(1, documents + 1):
            rows.extend(
                {"id": chunk_id(doc, page, c), "document_id": document_ids[doc]}
                for page in range(1, PAGES + 1)
                for c in range(CHUNKS)
            )
            if len(rows) >= 10_000 or doc == documents:
                session.run(
                    "UNWIND $rows AS r CREATE (c:Chunk {id: r.id, document_id: r.document_id})", rows=rows
                ).consume()
                rows = []


# ------------------------------------------------------------------------------------------------ measuring
def _settle_worker(url: str, batch: int, ready, stop, results) -> None:
    from queue_db.config import QueueSettings
    from queue_db.phases import VECTOR_CHUNK
    from queue_db.queue import TaskQueue, create_queue_engine, make_worker_id

    queue = TaskQueue(create_queue_engine(url, pool_size=1, max_overflow=1), QueueSettings())
    worker = make_worker_id("scale")
    done, held = 0, []
    try:
        ready.wait(60)
        while True:
            stopping = stop.is_set()
            result = queue.settle(VECTOR_CHUNK, worker, completed=held, claim=0 if stopping else batch)
            done += len(result.completed.applied)
            held = [row["id"] for row in result.claimed]
            if stopping or not held:
                break
        results.put((done, None))
    except BaseException as exc:  # the parent must hear of it rather than wait
        results.put((done, f"{type(exc).__name__}: {exc}"[:300]))
    finally:
        queue.engine.dispose()


def measure_claim_settle(
    url: str, window_s: float, workers: int = 4, batch: int = 50, pending: int | None = None
) -> float:
    ctx = mp.get_context("spawn")
    ready, stop, results = ctx.Barrier(workers + 1), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_settle_worker, args=(url, batch, ready, stop, results)) for _ in range(workers)]
    for p in procs:
        p.start()
    ready.wait(120)
    started = time.perf_counter()
    time.sleep(window_s)
    stop.set()
    outcomes = [results.get(timeout=120) for _ in procs]
    elapsed = time.perf_counter() - started
    for p in procs:
        p.join(30)
    errors = [e for _, e in outcomes if e]
    if errors:
        raise RuntimeError(errors[0])
    done = sum(done for done, _ in outcomes)
    if pending is not None and done >= pending:
        # the rate would be the work available over the window, not the queue's
        raise RuntimeError(
            f"the workers drained all {pending:,} pending tasks inside the {window_s} s window; "
            f"shorten --window or raise --pending"
        )
    return done / elapsed


def measure_vector_write(make_store, rng, rounds: int = 3) -> float:
    import numpy as np

    from resources.ports import ChunkPoint

    timings = []
    for r in range(rounds):
        vectors = rng.standard_normal((64, make_store().dim), dtype=np.float32)
        points = [
            ChunkPoint(f"bench-write-{r}-{i}", v, {"document_id": "bench-write", "text": "x"})
            for i, v in enumerate(vectors)
        ]
        store = make_store()
        gate = store._tail_gate  # what a write opens
        linger, gate.linger_s = gate.linger_s, 0.0  # this write pays its own opening and closing: the worst case
        try:
            started = time.perf_counter()
            store.upsert(points)
            store.close()
            timings.append(time.perf_counter() - started)
        finally:
            gate.linger_s = linger
    store = make_store()
    store.delete_document("bench-write")
    store.close()
    return statistics.median(timings)


def measure_vector_write_in_run(make_store, rng, run_chunks: int = RANGE) -> tuple[float, float]:
    """A ranged run's vector writes as a run makes them: 64-point batches sharing one opening of the shard (the
    store lingers between batches). Returns (seconds per 64-point write, the opening's share included; the
    opening alone)."""
    import numpy as np

    from resources.ports import ChunkPoint

    store = make_store()
    started = time.perf_counter()
    with store.session():
        opened = time.perf_counter() - started
        for first in range(0, run_chunks, 64):
            vectors = clustered(rng, store.dim, min(64, run_chunks - first))
            store.upsert(
                [
                    ChunkPoint(f"bench-run-{first + i}", np.asarray(v), {"document_id": "bench-run", "text": "x"})
                    for i, v in enumerate(vectors)
                ]
            )
    elapsed = time.perf_counter() - started
    store.close()
    store = make_store()
    store.delete_document("bench-run")
    store.close()
    return elapsed / -(-run_chunks // 64), opened


def measure_search(store, rng, searches: int) -> tuple[float, float, float]:
    """Dense searches near the seeded topics: p50, p95 (ms) and recall@5 against exact search on 20 of them."""
    import qdrant_edge as qe

    timings, queries = [], clustered(rng, store.dim, searches)
    with store.session():
        for query in queries:
            started = time.perf_counter()
            store.search(query, limit=5)
            timings.append((time.perf_counter() - started) * 1000)
        found = 0
        checked = queries[:20]
        with store._both() as shards:  # the tail (points not yet indexed) and the main shard
            for query in checked:
                nearest = sorted(
                    (
                        p
                        for shard in shards
                        if shard is not None
                        for p in shard.query(
                            qe.QueryRequest(
                                query=qe.Query.Nearest(query.tolist()),
                                limit=5,
                                with_payload=["chunk_id"],
                                params=qe.SearchParams(exact=True),
                            )
                        )
                    ),
                    key=lambda p: -p.score,
                )
                exact = {p.payload.get("chunk_id") for p in nearest[:5]}
                found += len({h.payload.get("chunk_id") for h in store.search(query, limit=5)} & exact)
    timings.sort()
    recall = found / (5 * len(checked)) if store.count() else None  # an empty store has nothing to recall
    return timings[len(timings) // 2], timings[min(len(timings) - 1, int(len(timings) * 0.95))], recall


RANGED_RUNS = 3


def measure_ranged_run(instance, defs, documents: int) -> float:
    """Resolve a 1,000-key range of vector_chunk keys and create its run record with the range tags (the median of
    RANGED_RUNS; one varied from 1.2 to 1.7 s between passes on the same kind of home)."""
    import dagster as dg
    from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    from orchestration.partitions import chunks_partitions
    from orchestration.planning import RANGE_END_TAG, RANGE_START_TAG

    # the range is ready work, the first pending documents' chunks: live partitions whatever retention retired
    doc = documents + 1
    start, end = f"scale-{doc:06d}/p0001/c000", None
    per_doc = PAGES * CHUNKS
    last = doc + RANGE // per_doc - 1
    end = f"scale-{last:06d}/p{PAGES:04d}/c{CHUNKS - 1:03d}"
    location = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(module_name="orchestration.definitions"), location_name="docqueue"
    )
    timings = []
    for _ in range(RANGED_RUNS):
        started = time.perf_counter()
        with dg.partition_loading_context(dynamic_partitions_store=instance):
            keys = chunks_partitions.get_partition_keys_in_range(dg.PartitionKeyRange(start, end))
        assert len(keys) == RANGE, len(keys)
        run = instance.create_run_for_job(
            job_def=defs.resolve_job_def("vector_chunk_job"),
            tags={RANGE_START_TAG: start, RANGE_END_TAG: end},
            status=dg.DagsterRunStatus.QUEUED,
            asset_selection=None,
            remote_job_origin=RemoteJobOrigin(RemoteRepositoryOrigin(location, "__repository__"), "vector_chunk_job"),
        )
        timings.append(time.perf_counter() - started)
        instance.delete_run(run.run_id)
    return statistics.median(timings)


def measure_sensor_tick(instance, defs, rounds: int = 3) -> float:
    import dagster as dg

    from orchestration.code_location import build_resources
    from queue_db.config import Settings

    sensor = defs.get_sensor_def("vector_chunk_sensor")
    timings = []
    # This process holds what seeding left (more at a larger N), which a daemon's sensor process never holds; a tick
    # allocates its candidates (up to 10,000), and the full collections they set off would scan that heap too (one
    # tick in six took 0.51 s instead of 0.15 s beside a million held objects). So the heap as it is now is left out.
    gc.collect()
    gc.freeze()
    try:
        for _ in range(rounds + 1):
            with dg.build_sensor_context(
                instance_ref=instance.get_ref(),
                definitions=defs,
                sensor_name=sensor.name,
                resources=build_resources(Settings.from_env()),
            ) as ctx:
                started = time.perf_counter()
                sensor.evaluate_tick(ctx)
                timings.append(time.perf_counter() - started)
    finally:
        gc.unfreeze()
    return statistics.median(timings[1:])


def cli_seconds(*args: str) -> float:
    started = time.perf_counter()
    done = subprocess.run([str(BIN / "docqueue"), *args], capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"docqueue {' '.join(args)} exited {done.returncode}: {done.stderr.strip()[:300]}")
    json.loads(done.stdout)
    return elapsed


def measure_checks(queue, store, graph) -> float:
    """The checks' own reads, as their functions do them (the Dagster wrappers only add metadata): the two
    store checks stream both sides through verify_stores, DOCQUEUE_VERIFY_PAGE ids at a time."""
    from orchestration.verify import verify_stores
    from queue_db.inspection import stuck_counts

    started = time.perf_counter()
    with queue.engine.connect() as conn:
        stuck_counts(conn, queue.settings.stale_timeout_s)
    queue.disagreeing_parents()
    vectors = verify_stores(queue, vector_store=store)
    assert not vectors.chunks_without_point
    graphs = verify_stores(queue, graph_store=graph)
    assert not graphs.chunks_without_graph
    return time.perf_counter() - started


NIGHTLY_CHILD = """
import json, resource, sys, time
sys.path.insert(0, {repo!r})
from orchestration.environment import dagster_instance
from queue_db.config import Settings
from orchestration.maintenance import nightly
from resources.database import open_queue
from queue_db.config import QueueSettings, Settings
from resources.bolt_graph import GraphStore
from resources.graph_stores import Neo4jResource
from resources.vector_resource import QdrantResource
model_id, dim = {model!r}, {dim}
queue, instance = open_queue(Settings.from_env()), dagster_instance(Settings.from_env())
store = QdrantResource.from_settings(Settings.from_env()).get_store(model_id, dim)
graph = GraphStore(*Neo4jResource.from_settings(Settings.from_env()).connection())
started = time.perf_counter()
report = nightly(queue, instance, store, graph)
elapsed = time.perf_counter() - started
print(json.dumps({{"s": elapsed, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "consistent": report["verification"].get("consistent"),
                  "index_built": report.get("vector_index_built")}}))
"""
CGROUP_V1 = Path("/sys/fs/cgroup/memory")


def measure_nightly(model_id: str, dim: int, timeout_s: float, cap_mb: int) -> tuple[float, float, float, float]:
    """`nightly()` in a child process; with --nightly-cap-mb, inside a memory cgroup capped there when this machine
    allows one (root, cgroup v1 memory controller): the cap counts its anonymous memory and the page cache it
    touches, and the kernel reclaims cache to stay under it, so finishing inside it is what "runs in that much
    memory" means. Peak RSS also counts the mapped store files it read; peak anonymous memory is what cannot be
    reclaimed. Returns (seconds, peak RSS MB, peak anonymous MB, 1.0 if it ran inside the capped cgroup else 0.0)."""
    command = [sys.executable, "-c", NIGHTLY_CHILD.format(repo=str(REPO), model=model_id, dim=dim)]
    group = CGROUP_V1 / f"docqueue-scale-nightly-{os.getpid()}"
    capped = False
    try:
        if cap_mb:
            group.mkdir()
            (group / "memory.limit_in_bytes").write_text(str(cap_mb << 20))
            command = ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "nightly", *command]
            capped = True
    except OSError:
        pass  # no cgroup here: measured without the cap (the result says so)
    try:
        # sampled from here: optimize() holds the child's GIL, so a thread in the child would miss its peak
        done, _, peak_anon = _sampled(command, timeout_s)
    finally:
        if capped:
            try:
                group.rmdir()
            except OSError:
                pass
    if done.returncode != 0:
        raise RuntimeError(
            f"nightly exited {done.returncode}"
            f"{f' (killed at the {cap_mb} MB cap)' if capped and done.returncode in (-9, 137) else ''}: "
            f"{done.stderr.strip()[-300:]}"
        )
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return figures["s"], figures["rss_mb"], peak_anon / 2**20, 1.0 if capped else 0.0


PAGE_LOADS = 3


def measure_partitions_page(timeout_s: float) -> float:
    """dagster-webserver on a free port; the vector_chunk asset's partitions page in headless Chromium (Debian's,
    driven by Playwright as tests/acceptance/test_ui_browser.py does), timed from navigation until the page shows
    its partition count ("N Partitions Selected"); the median of PAGE_LOADS loads, each from another page (one load
    varies by a second or more on this machine: 2.97, 4.27 and 3.63 s in a row at a million)."""
    import re
    import socket
    import urllib.request

    from playwright.sync_api import expect, sync_playwright

    chromium = Path(os.environ.get("DOCQUEUE_TEST_CHROMIUM", "/usr/bin/chromium"))
    if not chromium.exists():
        raise RuntimeError(f"no Chromium at {chromium} (apt-get install chromium)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tempfile.NamedTemporaryFile(prefix="scale-webserver-", suffix=".log", delete=False)
    server = subprocess.Popen(
        [str(BIN / "dagster-webserver"), "-m", "orchestration.definitions", "-h", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + min(timeout_s, 240)
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError(f"dagster-webserver did not start (log: {log.name})") from None
                time.sleep(1)
        wait_ms = int(min(max(timeout_s - 30, 10), 180) * 1000)
        with sync_playwright() as playwright, tempfile.TemporaryDirectory() as profile:
            browser = playwright.chromium.launch_persistent_context(
                profile,
                executable_path=str(chromium),
                headless=True,
                viewport={"width": 1600, "height": 1000},
                args=["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync"],
            )
            try:
                page = browser.new_page()
                page.set_default_timeout(wait_ms)
                page.goto(f"http://127.0.0.1:{port}/asset-groups")  # the app's code, cached before the timing
                expect(page.get_by_text("Global asset lineage")).to_be_visible(timeout=wait_ms)
                loads = []
                for _ in range(PAGE_LOADS):
                    started = time.perf_counter()
                    page.goto(f"http://127.0.0.1:{port}/assets/vector_chunk?view=partitions")
                    expect(page.get_by_text(re.compile(r"[\d,]+ Partitions Selected"))).to_be_visible(timeout=wait_ms)
                    loads.append(time.perf_counter() - started)
                    page.goto(f"http://127.0.0.1:{port}/asset-groups")
                    expect(page.get_by_text("Global asset lineage")).to_be_visible(timeout=wait_ms)
                print(f"    partitions page loads: {[round(x, 2) for x in loads]}", file=sys.stderr, flush=True)
                return statistics.median(loads)
            finally:
                browser.close()
    finally:
        os.killpg(server.pid, 15)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)


# ------------------------------------------------------------------------------------------------ one N (child)
def _seed_once(n: int, home: Path, args, queue, model_id: str, dim: int, rng) -> dict[str, float | None]:
    """Seed the queue, Dagster's partitions, the vectors and the graph for N once (a marker in `home` remembers it);
    returns the seeding figures (seed_s, retire_s)."""
    from orchestration.environment import dagster_instance
    from queue_db.config import Settings
    from resources.bolt_graph import GraphStore
    from resources.graph_stores import Neo4jResource
    from resources.vector_resource import QdrantResource

    figures: dict[str, float | None] = {}
    documents = n // (PAGES * CHUNKS)
    marker = home / "scale-seeded.json"
    if not marker.exists():
        started = time.perf_counter()
        seed_queue(queue.engine, documents, args.pending // (PAGES * CHUNKS))
        seed_dagster_partitions(
            queue.engine, os.environ["DOCQUEUE_DAGSTER_PG_URL"].replace("postgresql://", "postgresql+psycopg://", 1)
        )
        with queue.engine.connect() as conn:
            ids = {
                int(k[-6:]): str(i)
                for k, i in conn.exec_driver_sql(
                    "SELECT document_key, id FROM documents WHERE document_key LIKE 'scale-%%'"
                ).all()
            }
        print(
            f"  N={n:,}: queue and partitions seeded at {time.perf_counter() - started:.1f} s",
            file=sys.stderr,
            flush=True,
        )
        store = QdrantResource.from_settings(Settings.from_env()).get_store(model_id, dim)
        seed_vectors(store, documents, ids, rng)
        store.close()
        print(f"  N={n:,}: vectors seeded at {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
        graph = GraphStore(*Neo4jResource.from_settings(Settings.from_env()).connection())
        seed_graph(graph, documents, ids)
        graph.close()
        figures["seed_s"] = round(time.perf_counter() - started, 1)
        # what the recovery schedule has done by the time a corpus this size is complete: completed partitions
        # beyond DOCQUEUE_PARTITION_MAX_COMPLETED retired, a batch per run
        started = time.perf_counter()
        retire_all(dagster_instance(Settings.from_env()), queue.engine)
        figures["retire_s"] = round(time.perf_counter() - started, 3)
        marker.write_text(json.dumps({"n": n, "seed_s": figures["seed_s"], "retire_s": figures["retire_s"]}))
    else:
        seeded = json.loads(marker.read_text())
        figures["seed_s"], figures["retire_s"] = seeded["seed_s"], seeded.get("retire_s")
    return figures


class _Measurements:
    """The figures of one N, and why any of them is missing: `attempt` measures one group within the deadline."""

    def __init__(self, n: int, skip: set[str], deadline: float):
        self.n, self.skip, self.deadline = n, skip, deadline
        self.figures: dict[str, float | None] = {}
        self.missing: dict[str, str] = {}

    def attempt(self, name: str, fn, keys: tuple[str, ...]) -> None:
        if name in self.skip:
            for key in keys:
                self.figures[key] = None
                self.missing[key] = "skipped (--skip)"
            return
        left = self.deadline - time.monotonic()
        if left < 5:
            for key in keys:
                self.figures[key] = None
                self.missing[key] = "not measured: out of time (--deadline)"
            return
        try:
            values = fn(left)
            for key, value in zip(keys, values if isinstance(values, tuple) else (values,)):
                self.figures[key] = None if value is None else round(float(value), 4)
                if value is None:
                    self.missing[key] = "not measured: nothing to measure at this size (an empty store)"
        except subprocess.TimeoutExpired:
            for key in keys:
                self.figures[key] = None
                self.missing[key] = f"not measured: ran past the {left:.0f} s left of --deadline"
        except Exception as exc:  # one failed figure must not cost the others
            for key in keys:
                self.figures[key] = None
                self.missing[key] = f"failed: {type(exc).__name__}: {str(exc)[:200]}"
        print(f"  N={self.n:,}: {name}: {[self.figures[k] for k in keys]}", file=sys.stderr, flush=True)


def child(n: int, home: Path, args) -> dict:
    import warnings

    import numpy as np

    os.environ["DOCQUEUE_HOME"] = str(home)
    # the beta/preview notes Dagster prints at import, as the CLI silences them (nothing the bench can act on)
    warnings.filterwarnings("ignore", message=r".* is currently in (beta|preview), and may have breaking changes")
    load_before = [round(x, 2) for x in os.getloadavg()]
    measured = _Measurements(n, set(args.skip), time.monotonic() + args.child_budget)
    figures, attempt = measured.figures, measured.attempt
    rng = np.random.default_rng(n)

    subprocess.run([str(BIN / "docqueue"), "db", "upgrade", "--json"], check=True, capture_output=True, timeout=600)
    from orchestration.environment import dagster_instance, prepare_environment
    from orchestration.stores import embedding_model
    from queue_db.config import Settings
    from resources.bolt_graph import GraphStore
    from resources.database import open_queue
    from resources.graph_stores import Neo4jResource
    from resources.vector_resource import QdrantResource

    prepare_environment(Settings.from_env())
    queue = open_queue(Settings.from_env())
    model_id, dim = embedding_model(Settings.from_env().embedding)
    documents = n // (PAGES * CHUNKS)
    fresh = not (home / "scale-seeded.json").exists()
    figures.update(_seed_once(n, home, args, queue, model_id, dim, rng))
    print(f"  N={n:,}: seeded in {figures['seed_s']} s", file=sys.stderr, flush=True)

    def make_store():
        return QdrantResource.from_settings(Settings.from_env()).get_store(model_id, dim)

    def search(_left):
        store = make_store()
        try:
            return measure_search(store, rng, args.searches)
        finally:
            store.close()

    def open_stores():
        return queue, make_store(), GraphStore(*Neo4jResource.from_settings(Settings.from_env()).connection())

    def checks(_left):
        store, graph = make_store(), GraphStore(*Neo4jResource.from_settings(Settings.from_env()).connection())
        try:
            return measure_checks(queue, store, graph)
        finally:
            store.close()
            graph.close()

    from orchestration.definitions import defs

    instance = dagster_instance(Settings.from_env())
    # the first night after the corpus arrived: it builds the whole index, so the searches below use it
    attempt(
        "nightly",
        lambda left: measure_nightly(model_id, dim, left, args.nightly_cap_mb),
        ("nightly_s", "nightly_peak_rss_mb", "nightly_peak_anon_mb", "nightly_capped"),
    )
    # the median of 3: the first after the nightly run above reads what its 1 GiB cap pushed out of the cache
    attempt("status", lambda _l: statistics.median(cli_seconds("status", "--json") for _ in range(3)), ("status_s",))
    attempt("stats", lambda _l: statistics.median(cli_seconds("stats", "--json") for _ in range(3)), ("stats_s",))
    rounds = 1 if args.quick else 3
    attempt(
        "vector_write",
        lambda _l: measure_vector_write_in_run(make_store, rng, 128 if args.quick else RANGE),
        ("vector_write64_in_run_s", "vector_open_s"),
    )
    attempt("vector_write", lambda _l: measure_vector_write(make_store, rng, rounds), ("vector_write64_s",))
    attempt("search", search, ("search_p50_ms", "search_p95_ms", "search_recall_at_5"))
    attempt("search_session", lambda _l: measure_session(Settings.from_env(), rng, args.searches), SEARCH_PATHS)
    attempt("search_cli", lambda _l: measure_cli(rng, expect_hits=n > 0), SEARCH_CLI)
    attempt("sensor_tick", lambda _l: measure_sensor_tick(instance, defs, 1 if args.quick else 7), ("sensor_tick_s",))
    attempt("ranged_run", lambda _l: measure_ranged_run(instance, defs, documents), ("ranged_run_fixed_s",))
    attempt("checks", checks, ("checks_s",))
    attempt(
        "claim_settle",
        lambda _l: measure_claim_settle(
            os.environ["DOCQUEUE_DATABASE_URL"], args.window, pending=_pending_vector_chunks(queue)
        ),
        ("claim_settle_tasks_per_s",),
    )
    attempt("partitions_page", measure_partitions_page, ("partitions_page_s",))
    if figures.get("checks_s"):
        figures["checks_per_chunk_us"] = round(figures["checks_s"] / (n + args.pending) * 1e6, 4)
    else:
        figures["checks_per_chunk_us"] = None
        measured.missing["checks_per_chunk_us"] = measured.missing.get("checks_s", "not measured")
    # writes land in a tail half full, as they do between two index builds on average
    tail = args.tail or Settings.from_env().vector.index_tail
    fill_tail(make_store, rng, max(tail // 2 - _unindexed(make_store), 0), clustered, "bench-tail")
    attempt(
        "real_run",
        lambda left: measure_real_run(left, open_stores, args.run_pages, seed=n + int(time.time())),
        REAL_RUN,
    )

    def full_tail_search(_left):
        fill_tail(make_store, rng, max(tail - _unindexed(make_store), 0), clustered, "bench-tail2")
        p50, p95, *_ = measure_session(Settings.from_env(), rng, args.searches, tenant=False)
        return p50, p95, _unindexed(make_store)

    # the searches while DOCQUEUE_QDRANT_INDEX_TAIL points wait for the build the recovery job then makes
    attempt("search_full_tail", full_tail_search, FULL_TAIL)

    def recovery(left):
        fill_tail(make_store, rng, max(tail - _unindexed(make_store), 0), clustered, "bench-tail2")
        make_recovery_work(queue, STALE_TASKS, RETIRED_DOCUMENTS)
        return measure_recovery_job(
            queue,
            instance,
            QdrantResource.from_settings(Settings.from_env()),
            Settings.from_env().embedding.model,
            tail,
            left,
        )

    attempt("recovery", recovery, RECOVERY)
    for seconds, count, per_item in (
        ("recovery_release_s", "recovery_released", "recovery_release_per_task_ms"),
        ("recovery_retire_s", "recovery_retired", "recovery_retire_per_partition_ms"),
        ("recovery_index_tail_s", "recovery_indexed", "recovery_index_per_point_ms"),
    ):
        if figures.get(count):
            figures[per_item] = round(figures[seconds] / figures[count] * 1000, 4)
        else:
            figures[per_item] = None
            measured.missing[per_item] = measured.missing.get(count, "not measured")
    instance.dispose()
    return {
        "n": n,
        "figures": figures,
        "missing": measured.missing,
        "home": "fresh" if fresh else "reused",
        "load_before": load_before,
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }


def _unindexed(make_store) -> int:
    store = make_store()
    try:
        return store.unindexed()
    finally:
        store.close()


def _pending_vector_chunks(queue) -> int:
    with queue.engine.connect() as conn:
        return conn.exec_driver_sql("SELECT count(*) FROM task_queue_chunk WHERE vector_status = 'pending'").scalar()


def retire_all(instance, engine) -> None:
    from orchestration.partitions import retire_partitions_as_configured
    from queue_db.config import Settings

    dagster = Settings.from_env().dagster
    while any(retire_partitions_as_configured(instance, engine, dagster).values()):
        pass


def stop_servers(home: Path) -> None:
    subprocess.run(
        [str(BIN / "docqueue"), "db", "stop", "--json"],
        capture_output=True,
        timeout=120,
        env={**os.environ, "DOCQUEUE_HOME": str(home)},
    )


# ------------------------------------------------------------------------------------------------ parent
def ratio(value, base, rate: bool) -> float | None:
    """`value` against `base`, above 1 always meaning slower (a rate's ratio is inverted)."""
    if base in (None, 0) or value in (None, 0):
        return None
    return round(base / value if rate else value / base, 3)


def parent(args) -> int:
    started = time.monotonic()
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="docqueue-scale-"))
    root.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    results = []
    for index, n in enumerate(args.sizes):
        home = root / f"n{n}"
        if home.exists() and not args.reuse:
            stop_servers(home)
            shutil.rmtree(home)
        home.mkdir(parents=True, exist_ok=True)
        left = args.deadline - (time.monotonic() - started)
        # what is left is shared among the sizes still to run, the larger ones weighing more
        weights = [m + 100_000 for m in args.sizes[index:]]
        budget = left * weights[0] / sum(weights)
        out = root / f"n{n}.json"
        out.unlink(missing_ok=True)
        command = [
            sys.executable,
            __file__,
            "--child",
            str(n),
            "--home",
            str(home),
            "--out",
            str(out),
            "--child-budget",
            str(max(budget - 30, 10)),
            "--window",
            str(args.window),
            "--pending",
            str(args.pending),
            "--searches",
            str(args.searches),
            "--skip",
            ",".join(args.skip),
            "--nightly-cap-mb",
            str(args.nightly_cap_mb),
            "--tail",
            str(args.tail),
            "--run-pages",
            str(args.run_pages),
        ]
        print(f"N={n:,}: budget {budget:.0f} s", file=sys.stderr, flush=True)
        reason = "not measured: the seeding or a measurement ran past --deadline"
        try:
            code = subprocess.run(command, timeout=budget + 60, check=False).returncode
            if code:
                reason = f"not measured: the bench's process for this N failed (exit {code}, see its output)"
        except subprocess.TimeoutExpired:
            pass
        finally:
            stop_servers(home)
        if out.exists():
            results.append(json.loads(out.read_text()))
        else:
            results.append({"n": n, "figures": {}, "missing": {f: reason for f in FIGURES}, "home": None})
        if not args.reuse and not args.keep:
            shutil.rmtree(home, ignore_errors=True)
    figures = {name: [r["figures"].get(name) for r in results] for name in FIGURES}
    missing = {f"{name}@{r['n']}": reason for r in results for name, reason in r.get("missing", {}).items()}
    at_max = {name: values[-1] for name, values in figures.items()}
    result = {
        "n": args.sizes,
        "figures": figures,
        "ratios": {name: [ratio(v, figures[name][0], rate) for v in figures[name]] for name, rate in PER_UNIT.items()},
        "ratios_at_max": {name: ratio(figures[name][-1], figures[name][0], rate) for name, rate in PER_UNIT.items()},
        "search_ratios_vs_100000": {
            name: [ratio(v, figures[name][args.sizes.index(100_000)], False) for v in figures[name]]
            if 100_000 in args.sizes
            else None
            for name in ("search_p50_ms", "search_p95_ms", "search_session_p95_ms", "search_cli_s")
        },
        "homes": [r.get("home") for r in results],
        "load_per_n": [[r.get("load_before"), r.get("load_after")] for r in results],
        "search_p95_ms_at_max": at_max["search_p95_ms"],
        "partitions_page_s_at_max": at_max["partitions_page_s"],
        "nightly_peak_rss_mb_at_max": at_max["nightly_peak_rss_mb"],
        "nightly_s_at_max": at_max["nightly_s"],
        "status_s_at_max": at_max["status_s"],
        "stats_s_at_max": at_max["stats_s"],
        "real_run_peak_rss_mb_at_max": at_max["real_run_peak_rss_mb"],
        "real_run_peak_anon_mb_at_max": at_max["real_run_peak_anon_mb"],
        "nightly_peak_anon_mb_at_max": at_max["nightly_peak_anon_mb"],
        "nightly_capped_at_max": at_max["nightly_capped"],
        "search_recall_at_5_at_max": at_max["search_recall_at_5"],
        "search_session_p95_ms_at_max": at_max["search_session_p95_ms"],
        "search_session_tenant_p95_ms_at_max": at_max["search_session_tenant_p95_ms"],
        "search_cli_s_at_max": at_max["search_cli_s"],
        "search_full_tail_p95_ms_at_max": at_max["search_full_tail_p95_ms"],
        "recovery_index_peak_rss_mb_at_max": at_max["recovery_index_peak_rss_mb"],
        "missing": missing,
        "quick": args.quick,
        "load_before": [round(x, 1) for x in load_before],
        "load_after": [round(x, 1) for x in os.getloadavg()],
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    for name, values in figures.items():
        print(f"{name:28} " + "  ".join("-" if v is None else f"{v:,.4g}" for v in values))
    print_result(result, separators=(",", ":"))
    return 0


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", default="0,100000,1000000", help="completed chunks per run, comma-separated (multiples of 200)"
    )
    parser.add_argument("--quick", action="store_true", help="short windows and few searches (a smoke run)")
    parser.add_argument("--skip", default="", help=f"measurements to leave out: {','.join(MEASURES)}")
    parser.add_argument("--deadline", type=float, default=3600.0, help="seconds for the whole bench")
    parser.add_argument("--reuse", action="store_true", help="keep each N's seeded home and use it again")
    parser.add_argument("--keep", action="store_true", help="keep the homes after the run (for a look)")
    parser.add_argument("--root", help="folder of the homes (default: a new temporary folder)")
    parser.add_argument("--window", type=float, default=None, help="seconds of the claim + settle window")
    parser.add_argument("--searches", type=int, default=None, help="search queries per N")
    parser.add_argument(
        "--pending",
        type=int,
        default=None,
        help=f"pending chunks beside the N completed ones ({PENDING:,}; --quick: 2,000)",
    )
    parser.add_argument(
        "--nightly-cap-mb",
        type=int,
        default=0,
        help="run the nightly measurement inside a memory cgroup of this many MB (root, cgroup v1)",
    )
    parser.add_argument(
        "--tail",
        type=int,
        default=None,
        help="points in the vector tail the recovery job indexes (default DOCQUEUE_QDRANT_INDEX_TAIL; --quick: 1,000); "
        "the real run writes into it half full",
    )
    parser.add_argument(
        "--run-pages",
        type=int,
        default=None,
        help="pages of the real run's large document (50, about 200 chunks; --quick: 3)",
    )
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--home", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--child-budget", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--sizes takes whole numbers separated by commas, not {args.sizes!r}")
    if not args.sizes or any(n < 0 or n % (PAGES * CHUNKS) for n in [*args.sizes, args.pending or 0]):
        parser.error(f"--sizes and --pending: each N must be a non-negative multiple of {PAGES * CHUNKS}")
    args.skip = [s.strip() for s in args.skip.split(",") if s.strip()]
    unknown = set(args.skip) - set(MEASURES)
    if unknown:
        parser.error(f"--skip: unknown measurement {sorted(unknown)[0]!r}; known: {', '.join(MEASURES)}")
    if args.window is None:
        args.window = 0.5 if args.quick else 5.0
    if args.pending is None:
        args.pending = 20_000 if args.quick else PENDING
    if args.tail is None:
        args.tail = 1_000 if args.quick else 0  # 0: DOCQUEUE_QDRANT_INDEX_TAIL
    if args.run_pages is None:
        args.run_pages = 3 if args.quick else 50
    if args.tail < 0 or args.run_pages < 2:
        parser.error("--tail takes a number of points (0 or more) and --run-pages 2 or more")
    if args.searches is None:
        args.searches = 20 if args.quick else 200
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        result = child(args.child, Path(args.home), args)
        Path(args.out).write_text(json.dumps(result))
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
