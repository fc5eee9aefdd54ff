"""Worker bodies the fault tests run in forked processes (tests/reliability/zygote.py `target`).

Each one talks to the test through small files named in its spec, so the test can freeze (SIGSTOP), kill or
release it at a precise point of its work."""

from __future__ import annotations

import json
import time
from pathlib import Path


def inject_crash(marker: str) -> None:
    """Fault injection: SIGKILL this process whenever it is about to OCR a page of a document whose filename
    contains `marker` (a native crash that recurs on every attempt: poison input)."""
    import os
    import signal

    from orchestration.pipeline import Pipeline

    original = Pipeline.ocr_pages

    def ocr_pages(self, worker_id, tasks):
        for task in tasks:
            document = self.queue.document(task["document_id"])
            if marker in (document or {}).get("filename", ""):
                os.kill(os.getpid(), signal.SIGKILL)
        return original(self, worker_id, tasks)

    Pipeline.ocr_pages = ocr_pages


def inject_delay(kinds: list[str], seconds: float) -> None:
    """Slow work: each batch of these task kinds takes `seconds` longer (after its claim), so a test polling the
    queue reliably finds the tasks `processing` however fast the machine is."""
    from orchestration.assets.handlers import HandledTasks

    original = HandledTasks.process

    def process(self, kind, worker_id, tasks):
        if kind.name in kinds and tasks:
            time.sleep(seconds)
        return original(self, kind, worker_id, tasks)

    HandledTasks.process = process


def _wait_for_file(path: str) -> None:
    while not Path(path).exists():
        time.sleep(0.05)


def late_finisher(spec: dict) -> None:
    """Claim every ready task of one kind, announce the claim, wait for "go" (the test freezes us meanwhile), then
    process the batch through the real Pipeline, counting what this worker writes to Qdrant / the graph."""
    from orchestration.assets.handlers import process_tasks
    from orchestration.pipeline import Pipeline
    from queue_db.config import Settings
    from queue_db.heartbeat import Heartbeat
    from queue_db.phases import KINDS_BY_NAME, VECTOR_CHUNK
    from queue_db.queue import make_worker_id
    from resources.database import open_queue

    kind = KINDS_BY_NAME[spec["kind"]]
    queue = open_queue(Settings.from_env())
    pipeline = Pipeline.from_settings(queue, Settings.from_env())
    writes = {"points": 0, "graph_chunks": 0}
    if kind is VECTOR_CHUNK:
        pipeline.embedder.embed(["warm up"])
        store = pipeline.vector_store
        upsert = store.upsert
        store.upsert = lambda points: (writes.__setitem__("points", writes["points"] + len(points)), upsert(points))[1]
    else:
        pipeline.extractor.extract(["Ada Lovelace lived in London."])
        graph = pipeline.graph
        write_chunks = graph.write_chunks
        graph.write_chunks = lambda chunks: (
            writes.__setitem__("graph_chunks", writes["graph_chunks"] + len(chunks)),
            write_chunks(chunks),
        )[1]
    worker_id = make_worker_id("late-finisher")
    tasks = queue.claim(kind, worker_id, 1000)
    Path(spec["claimed"]).write_text(json.dumps({"worker": worker_id, "ids": [str(t["id"]) for t in tasks]}))
    with Heartbeat(queue, kind, worker_id, [t["id"] for t in tasks]):
        _wait_for_file(spec["go"])
        outcomes = process_tasks(pipeline, kind, worker_id, tasks)
    pipeline.close()
    Path(spec["result"]).write_text(
        json.dumps(
            {
                "writes": writes,
                "rejected": [o.id for o in outcomes if o.rejected],
                "applied": [o.id for o in outcomes if not o.rejected],
            }
        )
    )


def _busy_python(seconds: float) -> int:
    """CPU-bound pure Python (no I/O, no C call that releases the GIL): the interpreter hands the GIL to other
    threads only at its switch interval, the way tokenising or parsing in Python does."""
    deadline, rounds, text = time.monotonic() + seconds, 0, "lorem ipsum dolor sit amet " * 40
    while time.monotonic() < deadline:
        counts: dict[str, int] = {}
        for word in text.split():
            counts[word] = counts.get(word, 0) + sum(ord(ch) for ch in word) % 7
        rounds += 1
    return rounds


def busy_holder(spec: dict) -> None:
    """Claim OCR page tasks, keep them with the Heartbeat thread while the main thread computes in pure Python
    for `busy_s` seconds, then complete them. Reports beats, what the completion applied and what it refused."""
    from queue_db.config import Settings
    from queue_db.heartbeat import Heartbeat
    from queue_db.phases import OCR_PAGE
    from queue_db.queue import make_worker_id
    from resources.database import open_queue

    queue = open_queue(Settings.from_env())
    worker_id = make_worker_id("busy")
    ids = [str(t["id"]) for t in queue.claim(OCR_PAGE, worker_id, 100)]
    Path(spec["claimed"]).write_text(json.dumps({"worker": worker_id, "ids": ids}))
    started = time.monotonic()
    with Heartbeat(queue, OCR_PAGE, worker_id, ids) as heartbeat:
        rounds = _busy_python(spec["busy_s"])
    busy = time.monotonic() - started
    outcome = queue.complete(OCR_PAGE, worker_id, ids)
    Path(spec["result"]).write_text(
        json.dumps(
            {
                "beats": heartbeat.beats,
                "errors": heartbeat.errors,
                "lost": sorted(heartbeat.lost),
                "rounds": rounds,
                "busy_s": busy,
                "applied": outcome.applied,
                "rejected": outcome.rejected,
            }
        )
    )
