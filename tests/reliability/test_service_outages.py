"""Qdrant and the Bolt server unavailable: the affected chunks fail with the connection error, are retried with
back-off, and complete once the service is back; the OCR work already done is not touched."""

from __future__ import annotations

import subprocess
import sys
import time
from urllib.parse import urlsplit

from tests import pdf_factory as pf
from tests.reliability.support import QueueWatcher, Stores, TcpProxy, document_statuses, figures_line, store_figures

ALL_COMPLETED = ("completed", "completed", "completed")
FAILED_ATTEMPTS_BEFORE_RECOVERY = 2


class _Outages(QueueWatcher):
    """Watches the queue from a thread while the pipeline runs: keeps Qdrant locked and the Bolt port closed
    until the chunks of each phase have failed twice, then brings the service back."""

    def __init__(self, queue, qdrant_holder: subprocess.Popen, bolt: TcpProxy):
        self.queue, self.qdrant_holder, self.bolt = queue, qdrant_holder, bolt
        self.errors: dict[str, set[str]] = {"vector": set(), "graphrag": set()}
        self.ocr_before: dict | None = None
        self.down_s: dict[str, float] = {}
        super().__init__()

    def _look(self) -> None:
        for phase in self.errors:
            with self.queue.engine.connect() as conn:
                rows = conn.exec_driver_sql(
                    f"SELECT min({phase}_retry_count), {phase}_error_class || ': ' || {phase}_error "
                    f"FROM task_queue_chunk WHERE {phase}_status = 'failed' GROUP BY 2"
                ).all()
            self.errors[phase] |= {r[1] for r in rows}
            if self.ocr_before is None and rows:
                self.ocr_before = _ocr_pages(self.queue)  # OCR is done once vectors are attempted
            if phase not in self.down_s and any(r[0] >= FAILED_ATTEMPTS_BEFORE_RECOVERY for r in rows):
                self._recover(phase)

    def _recover(self, phase: str) -> None:
        if phase == "vector":
            if not self.qdrant_holder.stdin.closed:
                self.qdrant_holder.stdin.close()  # the other process lets go of the embedded storage
            self.qdrant_holder.wait(10)
        else:
            self.bolt.up()
        self.down_s[phase] = time.monotonic() - self.started


def _ocr_pages(queue) -> dict:
    with queue.engine.connect() as conn:
        return {
            r[0]: (r[1], r[2], r[3])
            for r in conn.exec_driver_sql(
                "SELECT id::text, ocr_status::text, ocr_completed_at, ocr_retry_count FROM task_queue_page"
            ).all()
        }


def _hold_qdrant_lock(folder) -> subprocess.Popen:
    """Another process holding the embedded Qdrant shard (a long CLI command, a stuck run) until stdin closes."""
    from resources.embeddings import DEFAULT_MODEL
    from resources.qdrant_base import collection_name
    from resources.qdrant_edge import TAIL_SUFFIX

    lock = folder / "edge" / f"{collection_name(DEFAULT_MODEL)}{TAIL_SUFFIX}.lock"  # the shard writes go to
    lock.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import portalocker, sys; h = open(sys.argv[1], 'a+'); "
            "portalocker.lock(h, portalocker.LockFlags.EXCLUSIVE); print('locked', flush=True); sys.stdin.read()",
            str(lock),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_qdrant_and_bolt_outages_are_retried_until_the_services_are_back(pipeline, tmp_path, monkeypatch, rel_env, say):
    bolt = TcpProxy(urlsplit(rel_env.bolt.uri).port)  # down until the watcher brings it up
    for name, value in {
        "DOCQUEUE_NEO4J_URI": f"bolt://127.0.0.1:{bolt.port}",
        "DOCQUEUE_QDRANT_LOCK_TIMEOUT": "1",
        "DOCQUEUE_GRAPH_TX_TIMEOUT_S": "2",
        "MAX_TASK_RETRIES": "6",
        "DOCQUEUE_RETRY_BACKOFF_BASE": "0.2",
        "DOCQUEUE_RETRY_BACKOFF_MAX": "1",
        # runs of the maximum size: one run a phase meets every chunk during each outage, as the scenario counts
        # (sized runs would leave some chunks to runs after the service is back)
        "DOCQUEUE_RUN_OVERHEAD_SHARE": "0",
    }.items():
        monkeypatch.setenv(name, value)
    # the settings above: the queue's retries and back-off, the graph's address, the store's lock timeout
    pipeline.reload_settings()
    queue = pipeline.queue
    pipeline.ingest([pf.text_pdf(tmp_path, "report.pdf", [pf.DEMO_PAGE, pf.TWO_TOPICS["volcanoes"]])])
    holder = _hold_qdrant_lock(rel_env.home / "qdrant")
    try:
        with _Outages(queue, holder, bolt) as outages:
            report = pipeline.run_until_idle()
    finally:
        if holder.poll() is None:
            holder.kill()
        bolt.down()
        bolt.up()  # for the verification below
    assert set(document_statuses(queue).values()) == {ALL_COMPLETED}, (
        document_statuses(queue),
        [
            (c["vector_status"], c["vector_retry_count"], c["vector_error"], c["graphrag_status"], c["graphrag_error"])
            for c in queue.chunks()
        ],
        outages.errors,
        outages.down_s,
        outages.problems,
    )
    assert set(outages.down_s) == {"vector", "graphrag"}
    assert any("QdrantStorageBusy" in e and e.startswith("connection: ") for e in outages.errors["vector"])
    assert any("ServiceUnavailable" in e and e.startswith("connection: ") for e in outages.errors["graphrag"]), (
        outages.errors
    )
    assert outages.ocr_before and _ocr_pages(queue) == outages.ocr_before  # OCR untouched by the retries
    assert {v[2] for v in outages.ocr_before.values()} == {0}
    with queue.engine.connect() as conn:
        retries = conn.exec_driver_sql(
            "SELECT min(vector_retry_count), min(graphrag_retry_count) FROM task_queue_chunk"
        ).one()
    assert min(retries) >= FAILED_ATTEMPTS_BEFORE_RECOVERY
    stores = Stores.open()
    try:
        figures = store_figures(queue, stores)
    finally:
        stores.close()
    assert figures["verify"]["consistent"] and figures["points"] == figures["chunks"]
    assert set(figures["duplicates"].values()) == {0}
    say(
        figures_line(
            "service outages",
            {
                "faults": 2,
                "duplicates": sum(figures["duplicates"].values()),
                "tasks_lost": 0,
                "qdrant_down_s": round(outages.down_s["vector"], 1),
                "bolt_down_s": round(outages.down_s["graphrag"] - outages.down_s["vector"], 1),
                "failed_attempts_vector": retries[0],
                "failed_attempts_graphrag": retries[1],
                "runs": report.runs,
                "failed_runs": report.failed_runs,
                "ocr_pages_untouched": len(outages.ocr_before),
            },
        )
    )


def test_a_back_off_ending_during_planning_does_not_end_the_run(pipeline, tmp_path, monkeypatch, say):
    """The runner goes idle only when nothing is ready: a failed task whose back-off runs out after a planning
    round looked at it (slow planning on a busy machine) is planned on the next round, not abandoned."""
    import orchestration.runner as runner
    from queue_db.config import QueueSettings
    from queue_db.phases import OCR_DOCUMENT
    from queue_db.queue import TaskQueue, make_worker_id

    queue = pipeline.queue
    pipeline.ingest([pf.text_pdf(tmp_path, "memo.pdf", [pf.TWO_TOPICS["beekeeping"]])])
    worker = make_worker_id("flaky")
    [task] = queue.claim(OCR_DOCUMENT, worker, 1)
    slow_to_retry = TaskQueue(queue.engine, QueueSettings(retry_backoff_base_s=2.0, retry_backoff_max_s=2.0))
    assert slow_to_retry.fail(OCR_DOCUMENT, worker, [{"id": task["id"], "error": "ConnectionError: flaky"}]).applied
    plan_next, rounds = runner.plan_next, []

    def slow_planning(*args, **kwargs):
        planned = plan_next(*args, **kwargs)
        if not planned and not rounds.count(0):
            time.sleep(3.0)  # the back-off ends while this round, which found nothing ready, is still running
        rounds.append(len(planned))
        return planned

    monkeypatch.setattr(runner, "plan_next", slow_planning)
    report = pipeline.run_until_idle()
    assert 0 in rounds and report.runs_by_name.get("ocr_document") == 1, (rounds, report)
    assert set(document_statuses(queue).values()) == {ALL_COMPLETED}
    say(
        figures_line(
            "back-off ending during planning",
            {"faults": 1, "rounds": len(rounds), "runs": report.runs, "tasks_lost": 0},
        )
    )
