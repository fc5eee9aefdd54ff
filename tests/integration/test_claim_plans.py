"""The claim queries stay on their partial claim indexes on a table of 100,000+ rows (EXPLAIN-based)."""

from __future__ import annotations

import json

import pytest

from queue_db.phases import GRAPHRAG_CHUNK, OCR_DOCUMENT, OCR_PAGE, VECTOR_CHUNK, VECTOR_PAGE
from queue_db.queue import TaskQueue, create_queue_engine
from queue_db.rollup_sql import after_transition
from tests.queue_support import bulk_seed, load_auto_explain

EXPECTED_INDEX = {
    OCR_DOCUMENT: "idx_documents_expand_claim",
    OCR_PAGE: "idx_tqp_ocr_claim",
    VECTOR_PAGE: "idx_tqp_vector_claim",
    VECTOR_CHUNK: "idx_tqc_vector_claim",
    GRAPHRAG_CHUNK: "idx_tqc_graphrag_claim",
}


def _literal(args: dict) -> str:
    """EXECUTE in EXPLAIN takes no bind parameters: a quoted jsonb literal instead."""
    return "'" + json.dumps(args).replace("'", "''") + "'::jsonb"


def _explained(conn, statement: str, args: dict, plan_mode: str) -> list:
    """The JSON plan of `statement` ($1: `args`), prepared (as the hot path's statements are) and explained under
    plan_cache_mode `plan_mode`; the connection's transaction is rolled back after it."""
    conn.exec_driver_sql(f"SET plan_cache_mode = {plan_mode}")
    conn.exec_driver_sql(f"PREPARE claim_stmt(jsonb) AS {statement}")
    plan = conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) EXECUTE claim_stmt({_literal(args)})").scalar()
    conn.exec_driver_sql("DEALLOCATE ALL")
    conn.rollback()
    return plan


@pytest.fixture(scope="module")
def big_queue(create_database, migrated_template):
    engine = create_queue_engine(create_database(template=migrated_template))
    # 60,000 chunks waiting for vectors + 60,000 waiting for GraphRAG, pages and documents in every state
    bulk_seed(engine, 60, 10, 100)
    bulk_seed(engine, 60, 10, 100, chunk_vector_status="completed")
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE task_queue_page SET ocr_status = 'pending', chunked_at = NULL "
            "WHERE page_number %% 2 = 0 AND ctid IN (SELECT ctid FROM task_queue_page LIMIT 3000)"
        )
        conn.exec_driver_sql(
            "UPDATE task_queue_page SET chunked_at = NULL, vector_status = 'pending' WHERE page_number = 3"
        )
        conn.exec_driver_sql("""INSERT INTO documents (filename, document_key, content_hash, size_bytes)
                                SELECT 'new-' || n, 'new-' || n, md5(n::text) || md5(n::text), 1
                                FROM generate_series(1, 5000) n""")
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE")
        assert conn.exec_driver_sql("SELECT count(*) FROM task_queue_chunk").scalar() >= 100_000
    yield engine
    engine.dispose()


@pytest.mark.parametrize("kind", list(EXPECTED_INDEX), ids=lambda k: k.name)
def test_claim_reads_its_partial_index_in_order(big_queue, kind):
    statement = TaskQueue(big_queue).claim_sql(kind)
    with big_queue.connect() as conn:
        # a custom plan, as PL/pgSQL EXECUTE plans it
        plan = _explained(conn, statement, {"worker": "w", "limit": 50}, "force_custom_plan")
    nodes = list(_nodes(plan[0]["Plan"]))
    shown = "\n".join(f"{n.get('Node Type')} {n.get('Relation Name', '')} {n.get('Index Name', '')}" for n in nodes)
    assert any(n.get("Index Name") == EXPECTED_INDEX[kind] for n in nodes), (
        f"{kind.name} does not use its index:\n{shown}"
    )
    assert not any(n["Node Type"] == "Sort" for n in nodes), f"{kind.name} sorts instead of reading in order:\n{shown}"
    assert not any(n["Node Type"] == "Seq Scan" for n in nodes), f"{kind.name} scans a whole table:\n{shown}"


@pytest.mark.parametrize("plan_mode", ["force_custom_plan", "force_generic_plan"])
@pytest.mark.parametrize("kind", list(EXPECTED_INDEX), ids=lambda k: k.name)
def test_claim_after_the_cursor_seeks_its_index(big_queue, kind, plan_mode):
    """The claim after a cursor (a claim key) starts there by a row comparison on the claim index, not by walking
    the index from its head (where, under a held snapshot, lie the entries of every task claimed since)."""
    statement = TaskQueue(big_queue).claim_sql(kind, after=True)
    with big_queue.connect() as conn:
        after = conn.exec_driver_sql(
            f"SELECT jsonb_build_array({', '.join(kind.claim_key('t'))}) FROM {kind.table} t "
            f"WHERE {kind.claimable_sql('t')} ORDER BY {kind.claim_order_sql('t')} OFFSET 100 LIMIT 1"
        ).scalar()
        assert after, f"nothing to claim for {kind.name}"
        plan = _explained(conn, statement, {"worker": "w", "limit": 50, "after": after}, plan_mode)
    nodes = list(_nodes(plan[0]["Plan"]))
    shown = "\n".join(
        f"{n.get('Node Type')} {n.get('Relation Name', '')} {n.get('Index Name', '')} {n.get('Index Cond', '')}"
        for n in nodes
    )
    scans = [n for n in nodes if n.get("Index Name") == EXPECTED_INDEX[kind]]
    assert len(scans) == 2, f"{kind.name}: not two laps over its index:\n{shown}"
    assert any(n.get("Index Cond", "").startswith("(ROW(") for n in scans), (
        f"{kind.name}: the first lap does not seek past the cursor:\n{shown}"
    )
    assert not any(n["Node Type"] == "Sort" for n in nodes), f"{kind.name} sorts instead of reading in order:\n{shown}"
    assert not any(n["Node Type"] == "Seq Scan" for n in nodes), f"{kind.name} scans a whole table:\n{shown}"


def _nodes(node: dict):
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)


def test_claim_by_partition_ids_uses_the_primary_key(big_queue):
    statement = TaskQueue(big_queue).claim_sql(VECTOR_CHUNK, only_ids=True, override_retry_limit=True)
    with big_queue.connect() as conn:
        ids = [str(r[0]) for r in conn.exec_driver_sql("SELECT id FROM task_queue_chunk LIMIT 20")]
        plan = json.dumps(_explained(conn, statement, {"worker": "w", "limit": 50, "only": ids}, "force_custom_plan"))
    assert "task_queue_chunk_pkey" in plan and '"Node Type": "Seq Scan"' not in plan


SETUP = " /* plan-test setup */"


@pytest.mark.parametrize("kind", [OCR_PAGE, VECTOR_CHUNK, GRAPHRAG_CHUNK], ids=lambda k: k.name)
def test_bubble_up_after_claim_and_complete_reads_parents_by_index(big_queue, kind):
    """The bubble-up statements (queue_db.rollup_sql.after_transition) run prepared on generic plans; none of them
    may scan a whole queue table, whatever ids they are given. auto_explain shows their plans."""
    queue = TaskQueue(big_queue)
    raw = big_queue.raw_connection()
    pg = raw.driver_connection
    notices: list[str] = []
    pg.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    try:
        load_auto_explain(pg, "log_min_duration = 0", "log_nested_statements = on", "log_format = text")
        # The test's own statements carry SETUP so that only the bubble-up functions' plans are judged: the
        # simulated completion may well seq-scan the 1,200-row page table, and the claim has its own test above.
        claim = queue.claim_sql(kind).replace("%", "%%").replace("$1", "%(args)s::jsonb") + SETUP
        claimed = [r[0] for r in pg.execute(claim, {"args": json.dumps({"worker": "plan-test", "limit": 50})})]
        assert claimed, f"nothing to claim for {kind.name}"
        _bubble_up(pg, kind, None)
        pg.execute(f"UPDATE {kind.table} SET {kind.status} = 'completed' WHERE id = ANY(%s) {SETUP}", (claimed,))
        _bubble_up(pg, kind, claimed)
    finally:
        pg.rollback()
        raw.close()
    plans = [n for n in notices if "docqueue." in n or "task_queue_page p" in n or "documents p" in n]
    assert plans, "auto_explain showed no bubble-up statement"
    scans = [
        n
        for n in notices
        if SETUP not in n and any(f"Seq Scan on {t}" in n for t in ("task_queue_chunk", "task_queue_page", "documents"))
    ]
    assert not scans, "a bubble-up statement scans a whole table:\n" + "\n----\n".join(scans)


def _bubble_up(pg, kind, settled) -> None:
    """What the hot path sends after a transition of `kind`: its bubble-up statements, prepared."""
    for sql in after_transition(kind):
        pg.execute(sql, {"worker": "plan-test", "ids": settled} if "%(" in sql else None, prepare=True)
