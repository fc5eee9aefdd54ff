"""The embedding-reuse probe (queue_db/embedding_reuse.embedded_chunks_by_hash) stays on its partial index whatever
the statistics say: where a few texts repeat across many chunks, the planner expects any hash to match thousands
of rows and would answer each hash's LIMIT 1 with a sequential scan of the chunk table. Counted in buffers
(auto_explain), not in time."""

from __future__ import annotations

import hashlib
import json

from queue_db.embedding_reuse import embedded_chunks_by_hash
from queue_db.queue import create_queue_engine
from tests.queue_support import BUFFER_PLANS, bulk_seed, load_auto_explain

DISTINCT_TEXTS = 5  # every completed chunk holds one of five texts: the statistics the planner is misled by


def _scans(node: dict) -> list[tuple[str, str | None, int]]:
    here = (
        [
            (
                node["Node Type"],
                node.get("Index Name"),
                node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0),
            )
        ]
        if node.get("Relation Name") == "task_queue_chunk"
        else []
    )
    return here + [scan for child in node.get("Plans", []) for scan in _scans(child)]


def test_the_reuse_probe_reads_its_index_where_few_texts_repeat_over_many_chunks(database_url):
    engine = create_queue_engine(database_url, pool_size=1, max_overflow=0)
    try:
        bulk_seed(engine, 20, 10, 100, chunk_vector_status="completed")  # 20,000 completed chunks
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "UPDATE task_queue_chunk SET chunk_content_hash = md5((chunk_index %% %(n)s)::text)",
                {"n": DISTINCT_TEXTS},
            )
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("ANALYZE task_queue_chunk")
        raw = engine.raw_connection()
        pg = raw.driver_connection
        load_auto_explain(pg, *BUFFER_PLANS, "log_nested_statements = on", on_skip=lambda: raw.close())
        pg.commit()
        plans: list[dict] = []
        pg.add_notice_handler(
            lambda d: (
                plans.append(json.loads(d.message_primary[d.message_primary.index("{") :]))
                if "{" in (d.message_primary or "")
                else None
            )
        )
        raw.close()

        unseen = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(64)]
        seen = [hashlib.md5(str(i).encode()).hexdigest() for i in range(DISTINCT_TEXTS)]
        assert embedded_chunks_by_hash(engine, unseen) == {}
        assert set(embedded_chunks_by_hash(engine, seen)) == set(seen)

        probes = [p for p in plans if "chunk_content_hash" in p.get("Query Text", "")]
        assert len(probes) == 2, [p.get("Query Text", "")[:80] for p in plans]
        for plan in probes:
            scans = _scans(plan["Plan"])
            assert scans and all(index == "idx_tqc_embedded_by_hash" for _, index, _ in scans), scans
            # one index probe per hash, not a walk of the table (20,000 chunks are some 500 pages)
            assert sum(buffers for *_, buffers in scans) <= 64 * 4, scans
    finally:
        engine.dispose()
