"""Worker bodies the fault tests run in forked processes (tests/reliability/zygote.py `target`).

Each one talks to the test through small files named in its spec, so the test can freeze (SIGSTOP), kill or
release it at a precise point of its work."""
from __future__ import annotations

import json
import time
from pathlib import Path


def _wait_for_file(path: str) -> None:
    while not Path(path).exists():
        time.sleep(0.05)


def late_finisher(spec: dict) -> None:
    """Claim every ready task of one kind, announce the claim, wait for "go" (the test freezes us meanwhile), then
    process the batch through the real Pipeline, counting what this worker writes to Qdrant / the graph."""
    from orchestration.work import Pipeline
    from queue_db.queue import make_worker_id
    from queue_db.tasks import KINDS_BY_NAME, VECTOR_CHUNK
    from queue_db.worker import Heartbeat
    from resources.database import get_queue

    kind = KINDS_BY_NAME[spec["kind"]]
    queue = get_queue()
    pipeline = Pipeline.from_env(queue)
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
        graph.write_chunks = lambda chunks: (writes.__setitem__("graph_chunks", writes["graph_chunks"] + len(chunks)),
                                             write_chunks(chunks))[1]
    worker_id = make_worker_id("late-finisher")
    tasks = queue.claim(kind, worker_id, 1000)
    Path(spec["claimed"]).write_text(json.dumps({"worker": worker_id, "ids": [str(t["id"]) for t in tasks]}))
    with Heartbeat(queue, kind, worker_id, [t["id"] for t in tasks]):
        _wait_for_file(spec["go"])
        outcomes = pipeline.process(kind, worker_id, tasks)
    pipeline.close()
    Path(spec["result"]).write_text(json.dumps({
        "writes": writes, "rejected": [o.id for o in outcomes if o.rejected],
        "applied": [o.id for o in outcomes if not o.rejected]}))
