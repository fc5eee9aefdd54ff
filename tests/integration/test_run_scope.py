"""`docqueue run --max-docs N` and `--log-level`: the N most urgent unfinished documents, chosen through
idx_documents_unfinished, go through every phase and the run ends; the others are left as they were."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from queue_db.run_scope import MOST_URGENT_SQL, most_urgent_unfinished, still_unfinished
from tests.queue_support import register

DOCQUEUE = str(Path(sys.executable).with_name("docqueue"))
REPO = Path(__file__).resolve().parents[2]
NOTE = (
    "# Field notes\n\nThe survey team mapped the river delta near Harwick and counted the nesting herons along "
    "the eastern bank.\n\nDr. Ada Brennan of Northfield University reported count number {n} to the Wildlife "
    "Council in spring.\n"
)


def test_the_most_urgent_unfinished_documents_come_from_the_index(queue):
    low, high, other_high = register(queue, "a.pdf", 1), register(queue, "b.pdf", 5), register(queue, "c.pdf", 5)
    done = register(queue, "d.pdf", 9)
    with queue.engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE documents SET graphrag_index_status = 'completed' WHERE id = %s", (str(done["id"]),)
        )
    assert most_urgent_unfinished(queue.engine, 2) == [str(high["id"]), str(other_high["id"])]
    assert most_urgent_unfinished(queue.engine, 1000)[-1] == str(low["id"])
    assert still_unfinished(queue.engine, [str(done["id"]), str(low["id"])]) == 1
    with queue.engine.connect() as conn:
        conn.exec_driver_sql("SET enable_seqscan = off; SET enable_bitmapscan = off")  # as on a large table
        plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + MOST_URGENT_SQL, {"n": 5}))
    assert "Index Scan using idx_documents_unfinished on documents d" in plan and "Sort" not in plan, plan
    with pytest.raises(ValueError, match="between 1 and 1000"):
        most_urgent_unfinished(queue.engine, 0)


def test_max_docs_takes_the_most_urgent_document_through_every_phase_and_stops(
    docqueue_env, tmp_path, capfd, monkeypatch
):
    """The worker of `docqueue run --max-docs 1 --log-level info` (in-process: a CLI run costs two process starts):
    the older of the two urgent notes is done, roll-ups included; the others are untouched. Its vector runs are
    followed by the tail indexing the recovery schedule does under the daemon."""
    from orchestration.intake import ingest_file
    from orchestration.workers import run_worker
    from queue_db.config import Settings
    from resources.database import open_queue
    from resources.embeddings import DEFAULT_MODEL, MODELS
    from resources.storage_resource import StorageResource
    from resources.vector_resource import QdrantResource

    monkeypatch.setenv("DOCQUEUE_QDRANT_INDEX_TAIL", "1")

    queue = open_queue(Settings.from_env())
    storage = StorageResource.from_settings(Settings.from_env()).get_storage()
    for n, priority in ((1, 0), (2, 7), (3, 7)):
        path = tmp_path / f"note{n}.md"
        path.write_text(NOTE.format(n=n))
        ingest_file(queue, storage, path, priority=priority)
    capfd.readouterr()
    report = run_worker(
        queue,
        until_idle=True,
        index=0,
        workers=1,
        max_seconds=240,
        group=0,
        max_docs=1,
        log_level="info",
        settings=Settings.from_env(),
    )
    logged = capfd.readouterr().err
    with queue.engine.connect() as conn:
        rows = {
            r["filename"]: r
            for r in conn.exec_driver_sql(
                "SELECT id::text, filename, ocr_status::text, vector_index_status::text, graphrag_index_status::text, "
                "graphrag_rollup_at FROM documents"
            ).mappings()
        }
    assert report["documents"] == [rows["note2.md"]["id"]]
    assert (rows["note2.md"]["vector_index_status"], rows["note2.md"]["graphrag_index_status"]) == ("completed",) * 2
    assert rows["note2.md"]["graphrag_rollup_at"] is not None
    for other in ("note1.md", "note3.md"):
        assert (rows[other]["ocr_status"], rows[other]["graphrag_index_status"]) == ("pending", "pending")
    # the runs' Dagster console at INFO instead of silent
    assert "- dagster - INFO - graphrag_chunk_job" in logged and "note3" not in logged
    store = QdrantResource.from_settings(Settings.from_env()).get_store(DEFAULT_MODEL, MODELS[DEFAULT_MODEL].dim)
    try:
        assert store.count() > 0 and store.unindexed() == 0  # written, then handed to optimize() by the runner
    finally:
        store.close()


def test_log_level_sets_docqueue_and_dagster_loggers():
    from orchestration.runner import LEVELLED_LOGGERS, apply_log_level, run_config

    before = {name: logging.getLogger(name).level for name in ("", *LEVELLED_LOGGERS)}
    try:
        apply_log_level("debug")
        assert {logging.getLogger(name).level for name in LEVELLED_LOGGERS} == {logging.DEBUG}
        assert logging.getLogger().level == logging.WARNING  # other libraries stay quiet
        apply_log_level("error")
        assert logging.getLogger().level == logging.getLogger("dagster").level == logging.ERROR
    finally:
        for name, level in before.items():
            logging.getLogger(name).setLevel(level)
    assert run_config("warning") == {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    assert run_config(None)["loggers"]["console"]["config"]["log_level"] == "CRITICAL"


@pytest.mark.parametrize(
    "args, says",
    [
        (["--max-docs", "0"], "Invalid value for '--max-docs': 0 is not in the range 1<=x<=1000."),
        (
            ["--max-docs", "2", "--workers", "2"],
            "docqueue: --max-docs runs in one worker: drop --workers or --max-docs",
        ),
        (["--log-level", "loud"], "Invalid value for '--log-level': 'loud' is not one of"),
    ],
)
def test_bad_operator_controls_are_one_sentence(args, says):
    proc = subprocess.run([DOCQUEUE, "run", *args], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr


def test_a_runs_summary_covers_its_documents_through_their_indexes(queue):
    """`docqueue run --max-docs` sums up only its documents: another document's failure neither shows in its
    summary nor makes it unclean, and the counts are read through each table's document index rather than
    the whole queue (0.7-0.8 s more at a million chunks)."""
    from queue_db.outcomes import _blocked_documents_sql, _tasks_sql, task_outcomes
    from queue_db.readmodels import phase_progress
    from tests.queue_support import build_document

    mine, other = build_document(queue), build_document(queue, name="other.pdf")
    with queue.engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE task_queue_chunk SET vector_status = 'failed', vector_retry_count = max_retries, "
            "vector_error_class = 'permanent' WHERE document_id = %s",
            (str(other["id"]),),
        )
    scope = [str(mine["id"])]
    whole, scoped = task_outcomes(queue.engine), task_outcomes(queue.engine, documents=scope)
    assert whole.failed_total == 6 and not whole.clean
    assert scoped.clean and scoped.failed_total == 0 and scoped.by_kind["vector_chunk"] == {"open": 6}
    assert phase_progress(queue.engine, documents=scope)["vector"] == {"total": 6, "completed": 0, "failed": 0}
    assert phase_progress(queue.engine)["vector"] == {"total": 12, "completed": 0, "failed": 6}
    assert task_outcomes(queue.engine, documents=[]).by_kind == {}
    with queue.engine.connect() as conn:
        conn.exec_driver_sql("SET enable_seqscan = off; SET enable_bitmapscan = off")  # as on a large table
        plans = [
            "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + sql, {"documents": scope}))
            for sql in (_tasks_sql(scoped=True), _blocked_documents_sql(scoped=True))
        ]
    assert "Seq Scan" not in plans[0], plans[0]
    assert "idx_tqc_document" in plans[0] and "idx_tqp_document" in plans[0], plans[0]
    # its per-document EXISTS checks go through the same indexes (a small table also plans a hashed alternative)
    assert "Index Scan using documents_pkey on documents d" in plans[1] and "idx_tqc_document" in plans[1], plans[1]
