"""Poison input and repeated chaos.

- A document whose OCR exceeds the OCR child's memory cap on every attempt ends `failed` after the maximum
  retries with the reason, and the other documents complete.
- A document that kills its worker process every time (a native crash) ends `failed` ("worker lost") after the
  maximum retries, while workers are also killed at random moments; every good document completes, the stores are
  consistent and hold no duplicates.
"""

from __future__ import annotations

import random
import time
from collections import Counter

from queue_db.inspection import outlook
from queue_db.phases import ALL_KINDS
from tests import pdf_factory as pf
from tests.reliability.support import Stores, document_statuses, figures_line, store_figures

ALL_COMPLETED = ("completed", "completed", "completed")
ROUNDS, CHAOS_SECONDS, MAX_RETRIES = 12, 40, 5


def test_a_page_over_the_ocr_memory_cap_fails_after_its_retries_and_blocks_nothing(
    pipeline, tmp_path, monkeypatch, say
):
    # the OCR engine alone needs more than this; text pages need far less
    monkeypatch.setenv("DOCQUEUE_WORKER_MEMORY_MB", "900")
    monkeypatch.setenv("MAX_TASK_RETRIES", "2")
    pipeline.reload_settings()
    scan, _ = pf.scanned_pdf(tmp_path, "scan.pdf")
    good = pf.text_pdf(tmp_path, "good.pdf", [pf.TWO_TOPICS["beekeeping"]])
    pipeline.ingest([scan, good])
    report = pipeline.run_until_idle()
    statuses = document_statuses(pipeline.queue)
    assert statuses["good.pdf"] == ALL_COMPLETED
    document = pipeline.queue.document(_document_id(pipeline.queue, "scan.pdf"))
    assert document["ocr_status"] == "failed"
    assert document["ocr_error"] == "page 1: resource limit: page 1 exceeded the 900 MB memory cap"
    page = pipeline.queue.pages(document["id"])[0]
    assert (page["ocr_status"], page["ocr_error_class"]) == ("failed", "resource_limit")
    assert page["ocr_retry_count"] == page["max_retries"] == 2
    say(
        figures_line(
            "poison (memory cap)",
            {"faults": page["ocr_retry_count"], "runs": report.runs, "reason": document["ocr_error"]},
        )
    )


def _document_id(queue, filename: str) -> str:
    with queue.engine.connect() as conn:
        return str(conn.exec_driver_sql("SELECT id FROM documents WHERE filename = %(f)s", {"f": filename}).scalar())


def _held_by(queue, pid: int) -> dict[str, set[str]]:
    """Tasks in processing whose worker id names this process (make_worker_id: label:host:pid:random)."""
    held = {}
    with queue.engine.connect() as conn:
        for kind in ALL_KINDS:
            ids = {
                r[0]
                for r in conn.exec_driver_sql(
                    f"SELECT t.id::text FROM {kind.table} t WHERE {kind.held_sql('t')} "
                    f"AND t.{kind.col('worker_id')} LIKE %(p)s",
                    {"p": f"%:{pid}:%"},
                ).all()
            }
            if ids:
                held[kind.name] = ids
    return held


def _still_processing(queue, held: dict[str, set[str]]) -> bool:
    with queue.engine.connect() as conn:
        for kind in ALL_KINDS:
            if (
                kind.name in held
                and conn.exec_driver_sql(
                    f"SELECT count(*) FROM {kind.table} t WHERE {kind.held_sql('t')} AND t.id = ANY(%(ids)s::uuid[])",
                    {"ids": list(held[kind.name])},
                ).scalar()
            ):
                return True
    return False


def _settled(queue) -> bool:
    """Nothing processing, nothing claimable, nothing waiting for a retry: the work is over, one way or another.
    One snapshot answers all three: read apart, a worker claiming a task between the reads hides it from both."""
    return outlook(queue.engine).settled


def _note_recoveries(queue, pending: list, recoveries: list) -> list:
    """Record how long each killed worker's tasks took to be released; returns the kills still unrecovered."""
    still = []
    for held, killed_at in pending:
        if _still_processing(queue, held):
            still.append((held, killed_at))
        else:
            recoveries.append(time.monotonic() - killed_at)
    return still


def test_chaos_random_kills_and_a_poison_document(pipeline, zygote, tmp_path, monkeypatch, say):
    rng = random.Random(20261125)
    # a good task may be hit by several random kills; the poison page then needs as many attempts to fail
    monkeypatch.setenv("MAX_TASK_RETRIES", str(MAX_RETRIES))
    pipeline.reload_settings()
    queue = pipeline.queue
    # ten good pages: the poison page shares the last OCR batch (four pages) with two of them
    good = [
        pf.text_pdf(tmp_path, f"{topic}-{i}.pdf", [blocks[:2], blocks[2:]], footer_page_numbers=False)
        for i in range(3)
        for topic, blocks in pf.TWO_TOPICS.items()
    ][:5]
    poison = pf.text_pdf(tmp_path, "poison.pdf", [["# Poison", "This page crashes every worker that opens it."]])
    pipeline.ingest([*good, poison])

    spawned = []

    def spawn():
        spawned.append(zygote.spawn("chaos", tmp_path, crash_on="poison"))
        return spawned[-1]

    workers = [spawn() for _ in range(2)]
    kills, recoveries, pending, rounds = [], [], [], 0
    hits: Counter[str] = Counter()  # the chaos's kills per task
    deadline = time.monotonic() + CHAOS_SECONDS
    while rounds < ROUNDS and time.monotonic() < deadline:
        rounds += 1
        time.sleep(rng.uniform(0.4, 2.0))
        queue.recover_stale()  # what the every-minute recovery job does, more often
        pending = _note_recoveries(queue, pending, recoveries)
        live = [w for w in workers if w.alive()]
        # a random moment, and a random worker among those holding tasks if any (a kill of a worker still starting
        # up costs nothing to recover). A killed worker's task is claimed alone, first, by the next worker, so
        # random kills concentrate on it: the chaos spares a task it has already hit MAX_RETRIES - 2 times, or it
        # would fail a good task as poison, which is the queue's rule, not a fault
        holding = {w.pid: _held_by(queue, w.pid) for w in live}
        spared = {
            w.pid for w in live if any(hits[i] >= MAX_RETRIES - 2 for ids in holding[w.pid].values() for i in ids)
        }
        victims = [w for w in live if holding[w.pid] and w.pid not in spared] or [w for w in live if not holding[w.pid]]
        if victims:
            victim = rng.choice(victims)
            held = holding[victim.pid]
            victim.kill()
            kills.append(sum(len(ids) for ids in held.values()))
            hits.update(i for ids in held.values() for i in ids)
            if held:
                pending.append((held, time.monotonic()))
        workers = [w for w in workers if w.alive()]
        workers += [spawn() for _ in range(2 - len(workers))]
    # no more chaos: the workers alive (and a fresh one if the poison took them all) finish the work
    while not _settled(queue):
        workers = [w for w in workers if w.alive()] or [spawn()]
        queue.recover_stale()
        pending = _note_recoveries(queue, pending, recoveries)
        time.sleep(0.3)
        assert time.monotonic() < deadline + 180, document_statuses(queue)
    for worker in workers:
        # a worker can meet the poison after the loop's last look at it and before the queue settles (its task is
        # then released as a killed worker's and fails for good): its -9 is one of the self-kills counted below
        worker.finish(120, killed_ok=True)
    self_kills = sum(1 for w in spawned if zygote.exited.get(w.pid) == -9) - len(kills)

    statuses = document_statuses(queue)
    assert all(statuses[p.name] == ALL_COMPLETED for p in good), statuses
    poisoned = queue.document(_document_id(queue, "poison.pdf"))
    pages = queue.pages(poisoned["id"])
    # the poison kills its worker at its page's OCR; but a killed worker's task is claimed alone, first, by the
    # next one, so the chaos kills can also land on the poison's page split three times and fail it before its
    # page exists: either way the poison ends failed as worker-killing, its attempts spent
    failed = pages[0] if pages else poisoned
    retries = failed["ocr_retry_count"] if pages else failed["retry_count"]
    assert (poisoned["ocr_status"], failed["ocr_status"], failed["ocr_error_class"]) == (
        "failed",
        "failed",
        "worker_lost",
    ), {k: failed[k] for k in ("ocr_status", "ocr_error_class", "ocr_error")}
    assert retries == failed["max_retries"] and "heartbeat stale" in failed["ocr_error"]
    stores = Stores.open()
    try:
        figures = store_figures(queue, stores)
    finally:
        stores.close()
    assert figures["verify"]["consistent"], figures["verify"]
    assert figures["points"] == figures["chunks"] and set(figures["duplicates"].values()) == {0}
    with queue.engine.connect() as conn:
        lost = conn.exec_driver_sql(
            "SELECT (SELECT count(*) FROM task_queue_page p JOIN documents d ON d.id = p.document_id "
            "        WHERE d.filename <> 'poison.pdf' AND p.ocr_status <> 'completed')"
            " + (SELECT count(*) FROM task_queue_chunk WHERE vector_status <> 'completed'"
            "    OR graphrag_status <> 'completed')"
        ).scalar()
    assert lost == 0
    say(
        figures_line(
            "chaos",
            {
                "faults": len(kills) + self_kills,
                "rounds": rounds,
                "kills": len(kills),
                "poison_self_kills": self_kills,
                "tasks_recovered": sum(kills),
                "recovery_s_median": round(sorted(recoveries)[len(recoveries) // 2], 1) if recoveries else "-",
                "recovery_s_max": round(max(recoveries), 1) if recoveries else "-",
                "documents_completed": sum(s == ALL_COMPLETED for s in statuses.values()),
                "chunks": figures["chunks"],
                "duplicates": sum(figures["duplicates"].values()),
                "tasks_lost": lost,
                "poison": f"failed after {retries} attempts{'' if pages else ' (at its page split)'}",
            },
        )
    )
