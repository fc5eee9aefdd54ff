"""The deployment as a person runs it: `docqueue ui` (dagster dev: webserver, daemon, code server), files dropped
into the inbox, the sensors carrying them through OCR, vectors and the graph, and the UI's own GraphQL API for what
a person sees and does. The graph goes away, re-indexing fails until the retries are spent, and a backfill of
exactly the failed partitions -- what the UI launches -- brings them back once the graph is reachable again."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from queue_db.keys import chunk_partition_key, page_partition_key
from queue_db.phases import GRAPHRAG_CHUNK
from tests import pdf_factory as pf
from tests.integration.bolt_fixture import free_port

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCQUEUE = Path(sys.executable).with_name("docqueue")

PARTITION_STATUSES = """
query ($path: [String!]!) {
  assetNodeOrError(assetKey: {path: $path}) {
    __typename
    ... on AssetNode { assetPartitionStatuses { __typename
        ... on DefaultPartitionStatuses { materializedPartitions failedPartitions materializingPartitions } } }
  }
}"""
LAUNCH_BACKFILL = """
mutation ($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on Error { message }
  }
}"""
BACKFILL_STATUS = """
query ($id: String!) {
  partitionBackfillOrError(backfillId: $id) { __typename ... on PartitionBackfill { status } ... on Error { message } }
}"""


class BoltGate:
    """A TCP relay in front of a server (the Bolt server here), listening on `host`. `close()` is an outage as every
    client sees it (new connections refused, open ones cut); `open()` serves again on the same port."""

    def __init__(self, upstream: tuple[str, int], host: str = "127.0.0.1"):
        self.upstream, self.host, self.port = upstream, host, free_port()
        self._listener: socket.socket | None = None
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()

    def open(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            _shut(listener)
        with self._lock:
            connections, self._connections = self._connections, set()
        for connection in connections:
            _shut(connection)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=10)
                server.settimeout(None)
            except OSError:
                _shut(client)
                continue
            with self._lock:
                self._connections |= {client, server}
            for source, target in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, target), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass
        finally:
            _shut(source)
            _shut(target)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept() or recv()
    except OSError:
        pass
    sock.close()


class Ui:
    """`docqueue ui` in its own process group, its output in a log file; `graphql()` is what the browser sends."""

    def __init__(self, env: dict[str, str], log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/graphql"
        self.log = log
        self._log_handle = open(log, "wb")
        self.process = subprocess.Popen(
            [str(DOCQUEUE), "ui", "--port", str(self.port)],
            cwd=REPO_ROOT,
            env=env,
            stdout=self._log_handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.client = httpx.Client(timeout=60)

    def graphql(self, query: str, **variables) -> dict:
        response = self.client.post(self.url, json={"query": query, "variables": variables})
        response.raise_for_status()
        body = response.json()
        assert "errors" not in body, body["errors"]
        return body["data"]

    def partition_statuses(self, asset: str) -> dict[str, set[str]]:
        node = self.graphql(PARTITION_STATUSES, path=[asset])["assetNodeOrError"]
        statuses = node["assetPartitionStatuses"]
        return {
            "materialized": set(statuses["materializedPartitions"]),
            "failed": set(statuses["failedPartitions"]),
            "materializing": set(statuses["materializingPartitions"]),
        }

    def wait_until_serving(self, timeout_s: float) -> None:
        wait_for(lambda: self._answers(), timeout_s, "the webserver to answer GraphQL", self)

    def _answers(self) -> bool:
        assert self.process.poll() is None, f"docqueue ui exited with {self.process.returncode}"
        try:
            return "version" in self.graphql("{ version }")
        except (httpx.HTTPError, AssertionError):
            return False

    def stop(self) -> None:
        """Every process this test started, by id: the ui command and all its descendants."""
        try:
            tree = [psutil.Process(self.process.pid), *psutil.Process(self.process.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        _, alive = psutil.wait_procs(tree, timeout=5)
        for process in alive:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=10)
        self.client.close()
        self._log_handle.close()

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def wait_for(predicate, timeout_s: float, what: str, ui: Ui | None = None, poll_s: float = 1.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(
        f"timed out after {timeout_s:.0f} s waiting for {what}"
        + (f"\n--- docqueue ui log ---\n{ui.log_tail()}" if ui else "")
    )


# the daemon's pass over the queued runs, in seconds: dagster.yaml's 5 s suits runs of minutes, but each of a test's
# runs of seconds would wait 2.5 s for it on average (4-16 s on a loaded machine, a pass being slower there)
TEST_DEQUEUE_INTERVAL_S = 1


def quick_dequeue_instance(folder: Path) -> Path:
    """dagster.yaml with the daemon dequeuing every TEST_DEQUEUE_INTERVAL_S, for DOCQUEUE_DAGSTER_YAML: set in the
    test process too, so that every process that writes the instance config into DAGSTER_HOME writes this one."""
    import yaml

    config = yaml.safe_load((REPO_ROOT / "dagster.yaml").read_text())
    config["run_coordinator"]["config"]["dequeue_interval_seconds"] = TEST_DEQUEUE_INTERVAL_S
    path = folder / "dagster-test.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


# ------------------------------------------------------------------------------------------------ queue views
def _rows(queue, sql: str) -> list[tuple]:
    with queue.engine.connect() as conn:
        return [tuple(r) for r in conn.exec_driver_sql(sql).all()]


def documents_done(queue, expected: int) -> bool:
    rows = _rows(
        queue, "SELECT ocr_status::text, vector_index_status::text, graphrag_index_status::text FROM documents"
    )
    failed = [r for r in rows if "failed" in r]
    assert not failed, f"a document failed a phase: {rows}"
    return len(rows) == expected and all(r == ("completed", "completed", "completed") for r in rows)


def chunk_rows(queue) -> list[tuple]:
    """(id, partition key, graphrag status, retries, max retries) of every chunk."""
    rows = _rows(
        queue,
        """SELECT c.id::text, d.document_key, p.page_number, c.chunk_index, c.graphrag_status::text,
                                  c.graphrag_retry_count, c.max_retries
                           FROM task_queue_chunk c JOIN task_queue_page p ON p.id = c.page_id
                           JOIN documents d ON d.id = c.document_id""",
    )
    return [(r[0], chunk_partition_key(r[1], r[2], r[3]), r[4], r[5], r[6]) for r in rows]


def graphrag_runs_in_flight(instance) -> int:
    import dagster as dg

    from orchestration.planning import IN_FLIGHT_STATUSES

    return len(instance.get_runs(filters=dg.RunsFilter(statuses=IN_FLIGHT_STATUSES, job_name="graphrag_chunk_job")))


# ------------------------------------------------------------------------------------------------ the test
@pytest.fixture
def deployment(docqueue_env, tmp_path, monkeypatch):
    from orchestration.environment import dagster_instance
    from queue_db.config import Settings
    from resources.database import open_queue

    monkeypatch.setenv("DOCQUEUE_DAGSTER_YAML", str(quick_dequeue_instance(tmp_path)))
    upstream = docqueue_env.bolt.uri.rsplit("//", 1)[1].rsplit(":", 1)
    gate = BoltGate((upstream[0], int(upstream[1])))
    gate.open()
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    env = {
        **os.environ,
        "DOCQUEUE_INBOX": str(inbox),
        "DOCQUEUE_SENSOR_INTERVAL": "1",
        "DOCQUEUE_NEO4J_URI": f"bolt://127.0.0.1:{gate.port}",
        "MAX_TASK_RETRIES": "1",  # the graph outage spends every retry at once: only a person's backfill can help
        "DOCQUEUE_GRAPH_TX_TIMEOUT_S": "5",  # how long a graph write keeps retrying an unreachable server
        "PYTHONUNBUFFERED": "1",
    }
    ui = Ui(env, tmp_path / "docqueue-ui.log")
    instance = dagster_instance(Settings.from_env())
    try:
        yield ui, gate, inbox, open_queue(Settings.from_env()), instance, tmp_path
    finally:
        ui.stop()
        gate.close()
        instance.dispose()


def test_sensors_carry_the_inbox_through_and_a_ui_backfill_repairs_failed_partitions(deployment):
    ui, gate, inbox, queue, instance, tmp = deployment
    started = time.monotonic()
    ui.wait_until_serving(180)
    serving = time.monotonic()

    staging = tmp / "staging"
    staging.mkdir()
    pdfs = [
        pf.text_pdf(
            staging,
            "lovelace.pdf",
            [
                ["# Notes", "Ada Lovelace worked with Charles Babbage in London."],
                ["## Engines", "The Analytical Engine was designed in England."],
            ],
        ),
        pf.text_pdf(
            staging,
            "curie.pdf",
            [
                ["# Radium", "Marie Curie studied radioactivity in Paris."],
                ["## Later", "Pierre Curie shared the Nobel Prize in Stockholm."],
            ],
        ),
    ]
    for pdf in pdfs:  # a rename is atomic: the sensor never sees half a file
        os.replace(pdf, inbox / pdf.name)

    wait_for(lambda: documents_done(queue, len(pdfs)), 420, "both documents through all three phases", ui)
    through = time.monotonic()
    chunks = chunk_rows(queue)
    chunk_keys = {row[1] for row in chunks}
    page_keys = {
        page_partition_key(r[0], r[1])
        for r in _rows(
            queue,
            "SELECT d.document_key, p.page_number FROM task_queue_page p JOIN documents d ON d.id = p.document_id",
        )
    }
    assert len(page_keys) == 4 and chunk_keys

    # what the UI shows: every partition of every phase materialized, none failed
    assert ui.partition_statuses("ocr_page")["materialized"] == page_keys
    for asset in ("vector_chunk", "graphrag_chunk"):
        statuses = ui.partition_statuses(asset)
        assert statuses["materialized"] == chunk_keys and not statuses["failed"], asset

    # the graph becomes unreachable and the chunks are sent back for re-indexing
    gate.close()
    requeued = queue.requeue(GRAPHRAG_CHUNK, [row[0] for row in chunks], "test: re-index after a graph rebuild")
    assert requeued == len(chunks)

    def graph_failures_shown() -> bool:
        rows = chunk_rows(queue)
        spent = all(r[2] == "failed" and r[3] >= r[4] for r in rows)
        return spent and graphrag_runs_in_flight(instance) == 0 and ui.partition_statuses("graphrag_chunk")["failed"]

    wait_for(graph_failures_shown, 240, "the re-index to fail with every retry spent", ui)
    failed = ui.partition_statuses("graphrag_chunk")["failed"]
    assert failed == chunk_keys
    error = _rows(queue, "SELECT graphrag_error, graphrag_error_class FROM task_queue_chunk LIMIT 1")[0]
    assert error[1] == "connection", error
    failed_at = time.monotonic()

    # a sensor never retries a task out of retries: the partitions stay failed until a person acts
    time.sleep(3)
    assert all(r[2] == "failed" for r in chunk_rows(queue)) and graphrag_runs_in_flight(instance) == 0

    # the graph is back; the person backfills exactly the failed partitions, as the UI does
    gate.open()
    launched = ui.graphql(
        LAUNCH_BACKFILL,
        params={
            "partitionNames": sorted(failed),
            "assetSelection": [{"path": ["graphrag_chunk"]}],
            "fromFailure": False,
            "tags": [],
        },
    )["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    backfill_id = launched["backfillId"]

    def backfill_finished() -> str | None:
        status = ui.graphql(BACKFILL_STATUS, id=backfill_id)["partitionBackfillOrError"]["status"]
        return status if status not in ("REQUESTED", "CANCELING", "FAILING") else None

    status = wait_for(backfill_finished, 240, "the backfill to finish", ui)
    assert status in ("COMPLETED", "COMPLETED_SUCCESS"), status
    assert all(r[2] == "completed" for r in chunk_rows(queue)), "every re-indexed chunk completed in the queue"
    statuses = ui.partition_statuses("graphrag_chunk")
    assert statuses["materialized"] == chunk_keys and not statuses["failed"]
    import dagster as dg

    backfill_runs = instance.get_runs(filters=dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
    assert backfill_runs and all("graphrag" in (r.run_op_concurrency.all_pools or ()) for r in backfill_runs), (
        "a UI backfill needs its phase's pool slot"
    )
    _assert_one_run_per_pool_at_a_time(instance)

    from queue_db.config import Settings
    from resources.graph_stores import Neo4jResource

    # straight to the server, not through the gate
    with Neo4jResource.from_settings(Settings.from_env()).get_store() as graph:
        assert {r[0] for r in _rows(queue, "SELECT chunk_id FROM task_queue_chunk")} <= graph.chunk_ids_with_writes()
    _print_timeline(instance)
    print(
        f"\ndaemon e2e: webserver up in {serving - started:.0f} s, 2 PDFs through 3 phases in "
        f"{through - serving:.0f} s, outage failed in {failed_at - through:.0f} s, backfill repaired in "
        f"{time.monotonic() - failed_at:.0f} s"
    )


def _assert_one_run_per_pool_at_a_time(instance) -> None:
    """dagster.yaml's pools (run granularity, one slot each): the sensors' runs and the person's backfill of a
    phase never ran side by side."""
    import dagster as dg

    by_pool: dict[str, list] = {}
    for record in instance.get_run_records(filters=dg.RunsFilter()):
        concurrency = record.dagster_run.run_op_concurrency
        if record.start_time and concurrency:
            for pool in concurrency.all_pools or ():
                by_pool.setdefault(pool, []).append(
                    (record.start_time, record.end_time or float("inf"), record.dagster_run.job_name)
                )
    assert "graphrag" in by_pool, by_pool.keys()
    for pool, spans in by_pool.items():
        spans.sort()
        for (_, end, job), (start, _, next_job) in zip(spans, spans[1:]):
            assert start >= end, f"{job} and {next_job} held the {pool!r} pool at the same time"


def _print_timeline(instance) -> None:
    """Where the time went: each run's creation, start and end, in seconds from the first run's creation."""
    import dagster as dg

    records = sorted(instance.get_run_records(filters=dg.RunsFilter()), key=lambda r: r.create_timestamp)
    origin = records[0].create_timestamp.timestamp()

    def offset(value) -> str:
        return f"{value - origin:6.1f}" if value else "     -"

    for record in records:
        run = record.dagster_run
        print(
            f"  {run.job_name:28s} {run.status.value:8s} created {offset(record.create_timestamp.timestamp())} "
            f"started {offset(record.start_time)} ended {offset(record.end_time)}"
        )
