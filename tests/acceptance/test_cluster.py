"""Cluster mode end to end: the Dagster webserver and daemon on this host, three Celery worker "machines", each a
network namespace of its own that reaches the host only through a veth pair on a private bridge.

The host side listens on the bridge's address: a private Redis broker, and TCP relays in front of the session's
PostgreSQL and Bolt server (they listen on loopback, which a namespace cannot reach). The workers share nothing
with the host but those addresses and one storage folder: stored files, page markdown and -- because no Qdrant
server can be installed here -- the embedded vector store (DOCQUEUE_QDRANT_PATH), which the workers take turns on
through its lock file. Production points every machine at a Qdrant server (DOCQUEUE_QDRANT_URL) instead.

A corpus is dropped into the inbox and carried through by the sensors, the daemon and Celery. One worker machine
is killed (SIGKILL to its whole process tree) while it holds tasks; the broker hands its step to another worker,
which waits for the dead holder's heartbeats to go stale, and the others finish the work: every chunk is one
vector point, the graph holds no duplicate, and the partitions show the queue's truth. Then the graph becomes
unreachable, a re-index fails until its retries are spent, and a UI backfill of the failed partitions runs on the
cluster once the graph is back."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from queue_db.keys import page_partition_key
from queue_db.phases import ALL_KINDS, GRAPHRAG_CHUNK
from tests.acceptance.test_daemon_backfill import (
    BACKFILL_STATUS,
    DOCQUEUE,
    LAUNCH_BACKFILL,
    BoltGate,
    Ui,
    _rows,
    chunk_rows,
    documents_done,
    wait_for,
)
from tests.conftest import CORPUS_DIR
from tests.integration.bolt_fixture import free_port
from tests.network_hosts import Machines, namespaces_unusable, wait_port
from tests.reliability.support import Stores, graph_duplicates

pytestmark = pytest.mark.slow

WORKERS = 3
# small real-world PDFs with a text layer (OCR of scans would dominate the run time, not the cluster)
CORPUS_SUBSET = ("pypdf__multicolumn.pdf",)
TIMING = {
    "HEARTBEAT_INTERVAL": "2",
    "STALE_TASK_TIMEOUT": "12",
    "DOCQUEUE_RETRY_BACKOFF_BASE": "1",
    "DOCQUEUE_RETRY_BACKOFF_MAX": "4",
    # a step whose worker vanished is handed to another worker after this many seconds without an ack
    "DOCQUEUE_CELERY_VISIBILITY_TIMEOUT": "20",
    "DOCQUEUE_GRAPH_TX_TIMEOUT_S": "5",
}


class Worker:
    """`docqueue worker` inside one namespace, in its own session; its output goes to a log file."""

    def __init__(self, namespace: str, env: dict[str, str], log: Path, broker: str):
        self.namespace, self.log = namespace, log
        self._log_handle = open(log, "wb")
        self.process = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                namespace,
                str(DOCQUEUE),
                "worker",
                "--broker",
                broker,
                "--concurrency",
                "1",
                "--name",
                f"docqueue@{namespace}",
            ],
            cwd=log.parent,
            env=env,
            stdout=self._log_handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def pids(self) -> set[int]:
        try:
            root = psutil.Process(self.process.pid)
            return {root.pid, *(child.pid for child in root.children(recursive=True))}
        except psutil.NoSuchProcess:
            return set()

    def signal_tree(self, signum: int) -> list:
        try:
            tree = [psutil.Process(self.process.pid), *psutil.Process(self.process.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        for process in tree:
            try:
                process.send_signal(signum)
            except psutil.NoSuchProcess:
                pass
        return tree

    def kill_tree(self) -> None:
        """SIGKILL to every process of this machine at once: nothing gets to say goodbye."""
        psutil.wait_procs(self.signal_tree(signal.SIGKILL), timeout=10)

    def stop(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            self.kill_tree()
        self._log_handle.close()

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _with_host(url: str, host: str, port: int) -> str:
    """postgresql://user@127.0.0.1:5432/db -> the same URL through host:port."""
    scheme, rest = url.split("://", 1)
    credentials, _, location = rest.rpartition("@")
    path = location.split("/", 1)[1]
    return f"{scheme}://{credentials + '@' if credentials else ''}{host}:{port}/{path}"


def _holders(queue) -> dict[str, set[str]]:
    """worker pid -> ids of the tasks it holds (`processing`) right now, across every kind."""
    held: dict[str, set[str]] = {}
    for kind in ALL_KINDS:
        for task_id, worker in _rows(
            queue, f"SELECT t.id::text, t.{kind.col('worker_id')} FROM {kind.table} t WHERE {kind.held_sql('t')}"
        ):
            if worker:
                held.setdefault(worker.rsplit(":", 2)[-2], set()).add(f"{kind.name}:{task_id}")
    return held


def _finishers(queue) -> set[int]:
    """Pids of the workers that settled tasks (the worker id stays on a settled row)."""
    pids = set()
    for kind in ALL_KINDS:
        for (worker,) in _rows(
            queue,
            f"SELECT DISTINCT {kind.col('worker_id')} FROM {kind.table} "
            f"WHERE {kind.status} = 'completed' AND {kind.col('worker_id')} IS NOT NULL",
        ):
            pids.add(int(worker.rsplit(":", 2)[-2]))
    return pids


@pytest.fixture
def cluster(docqueue_env, tmp_path, monkeypatch):
    reason = namespaces_unusable()
    if reason:
        pytest.skip(f"cluster test skipped: {reason}")
    from orchestration.environment import dagster_instance
    from queue_db.config import Settings
    from resources.database import open_queue

    machines = Machines(WORKERS)
    started: list = []
    try:
        machines.create()
        shared = tmp_path / "shared"  # the one folder the machines share (NFS in production)
        for sub in ("storage", "qdrant"):
            (shared / sub).mkdir(parents=True)
        monkeypatch.setenv("DOCQUEUE_QDRANT_PATH", str(shared / "qdrant"))
        monkeypatch.setenv("DOCQUEUE_STORAGE_DIR", str(shared / "storage"))
        redis_port = free_port()
        redis = subprocess.Popen(
            [
                "redis-server",
                "--bind",
                machines.host_ip,
                "--port",
                str(redis_port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        started.append(lambda: (redis.terminate(), redis.wait(timeout=10)))
        wait_port(machines.host_ip, redis_port)
        broker = f"redis://{machines.host_ip}:{redis_port}/0"
        pg_port = int(docqueue_env.queue_url.rsplit(":", 1)[1].split("/", 1)[0])
        postgres_relay = BoltGate(("127.0.0.1", pg_port), host=machines.host_ip)
        bolt_upstream = docqueue_env.bolt.uri.rsplit("//", 1)[1].rsplit(":", 1)
        bolt_relay = BoltGate((bolt_upstream[0], int(bolt_upstream[1])), host=machines.host_ip)
        for relay in (postgres_relay, bolt_relay):
            relay.open()
            started.append(relay.close)
        unreachable = [ns for ns in machines.namespaces if not machines.reaches(ns, redis_port)]
        if unreachable:
            pytest.skip(
                f"cluster test skipped: namespaces {unreachable} cannot reach {machines.host_ip} over the "
                "bridge (a firewall on this host?)"
            )

        common = {
            **TIMING,
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            "DOCQUEUE_EXECUTOR": "celery",
            "DOCQUEUE_BROKER_URL": broker,
            "DOCQUEUE_STORAGE_DIR": str(shared / "storage"),
            "DOCQUEUE_QDRANT_PATH": str(shared / "qdrant"),
            "DOCQUEUE_QDRANT_URL": "",
        }
        workers = []
        for i, namespace in enumerate(machines.namespaces):
            home = tmp_path / f"machine-{i}"
            home.mkdir()
            env = {
                **os.environ,
                **common,
                "DOCQUEUE_HOME": str(home / "home"),
                "DAGSTER_HOME": str(home / "dagster"),
                "DOCQUEUE_DATABASE_URL": _with_host(docqueue_env.queue_url, machines.host_ip, postgres_relay.port),
                "DOCQUEUE_DAGSTER_PG_URL": _with_host(docqueue_env.dagster_url, machines.host_ip, postgres_relay.port),
                "DOCQUEUE_NEO4J_URI": f"bolt://{machines.host_ip}:{bolt_relay.port}",
            }
            worker = Worker(namespace, env, home / "worker.log", broker)
            workers.append(worker)
            started.append(worker.stop)

        inbox = tmp_path / "inbox"
        inbox.mkdir()
        ui_env = {
            **os.environ,
            **common,
            "DOCQUEUE_INBOX": str(inbox),
            "DOCQUEUE_SENSOR_INTERVAL": "1",
            # one run per worker slot and phase; small ranges, so every phase spreads over the machines
            "DOCQUEUE_PHASE_RUN_LIMITS": "ocr=3,vector=3,graphrag=3",
            "DOCQUEUE_RUN_MAX_KEYS_OCR_PAGE": "4",
            "DOCQUEUE_RUN_MAX_KEYS_VECTOR_PAGE": "4",
            "DOCQUEUE_RUN_MAX_KEYS_VECTOR_CHUNK": "8",
            "DOCQUEUE_RUN_MAX_KEYS_GRAPHRAG_CHUNK": "8",
        }
        ui = Ui(ui_env, tmp_path / "docqueue-ui.log")
        started.append(ui.stop)
        instance = dagster_instance(Settings.from_env())
        started.append(instance.dispose)
        queue = open_queue(Settings.from_env())
        yield ui, workers, bolt_relay, inbox, queue, instance, tmp_path
    finally:
        for stop in reversed(started):
            try:
                stop()
            except Exception:  # noqa: BLE001 - every other resource still gets cleaned up
                pass
        machines.remove()


def test_three_worker_machines_finish_the_corpus_when_one_is_killed_and_backfill_on_the_cluster(cluster):
    from bench.orchestration_overhead import make_corpus

    ui, workers, bolt_relay, inbox, queue, instance, tmp = cluster
    started = time.monotonic()
    ui.wait_until_serving(180)
    staging = tmp / "staging"
    corpus = make_corpus(staging, documents=3, pages=2)
    corpus += [CORPUS_DIR / name for name in CORPUS_SUBSET if (CORPUS_DIR / name).is_file()]
    for path in corpus:
        target = inbox / path.name
        shutil.copyfile(path, staging / f".{path.name}.part")
        os.replace(staging / f".{path.name}.part", target)  # the sensor never sees half a file

    # a worker machine dies while it holds tasks of a step. It is frozen first (SIGSTOP), so what it holds
    # cannot change between looking and killing; a machine caught holding nothing is thawed and watched again.
    all_worker_pids: set[int] = set()

    def victim():
        held = _holders(queue)
        for worker in workers:
            pids = worker.pids()
            all_worker_pids.update(pids)
            if not any(
                t.startswith(("vector", "graphrag"))
                for pid in held
                if pid.isdigit() and int(pid) in pids
                for t in held[pid]
            ):
                continue
            worker.signal_tree(signal.SIGSTOP)
            time.sleep(1.0)  # a commit already on the wire lands before we look again
            held = _holders(queue)
            mine = {pid for pid in held if pid.isdigit() and int(pid) in pids}
            if mine:
                return worker, set().union(*(held[pid] for pid in mine)), {int(p) for p in mine}
            worker.signal_tree(signal.SIGCONT)
        return None

    killed, killed_tasks, killed_pids = wait_for(
        victim, 300, "a worker machine to hold vector or graph tasks", ui, poll_s=0.2
    )
    killed.kill_tree()
    killed_at = time.monotonic()

    wait_for(
        lambda: documents_done(queue, len(corpus)),
        600,
        "every document through all three phases on the two surviving machines",
        ui,
    )
    through = time.monotonic()
    all_worker_pids.update(*(w.pids() for w in workers if w is not killed))

    # nothing lost: the dead machine's tasks were released (their lost attempt counted) and finished elsewhere
    for task in killed_tasks:
        name, task_id = task.split(":", 1)
        kind = next(k for k in ALL_KINDS if k.name == name)
        status, worker, retries = _rows(
            queue,
            f"SELECT {kind.status}::text, {kind.col('worker_id')}, "
            f"COALESCE({kind.col('retry_count')}, 0) FROM {kind.table} "
            f"WHERE id = '{task_id}'",
        )[0]
        assert status == "completed" and int(worker.rsplit(":", 2)[-2]) not in killed_pids and retries >= 1, (
            task,
            status,
            worker,
            retries,
        )
    # every task ran on a worker machine, never on the Dagster host, and on more than one machine
    finishers = _finishers(queue)
    assert finishers <= all_worker_pids, finishers - all_worker_pids
    machines_used = {
        w.namespace for w in workers for pid in finishers if pid in w.pids() or (w is killed and pid in killed_pids)
    }
    assert len(machines_used) >= 2, machines_used

    # nothing duplicated: one point per chunk, no duplicate node or relationship in the graph
    chunks = chunk_rows(queue)
    chunk_keys = {row[1] for row in chunks}
    stores = Stores.open()
    try:
        from orchestration.verify import verify_stores

        report = verify_stores(queue, stores.vector, stores.graph)
        assert report.consistent, report.as_dict()
        assert stores.vector.count() == len(chunks)
        assert not any(graph_duplicates(stores.graph).values()), graph_duplicates(stores.graph)
    finally:
        stores.close()

    # the partitions tell the queue's truth
    page_keys = {
        page_partition_key(r[0], r[1])
        for r in _rows(
            queue,
            "SELECT d.document_key, p.page_number FROM task_queue_page p JOIN documents d ON d.id = p.document_id",
        )
    }
    assert ui.partition_statuses("ocr_page")["materialized"] == page_keys
    for asset in ("vector_chunk", "graphrag_chunk"):
        statuses = ui.partition_statuses(asset)
        assert statuses["materialized"] == chunk_keys and not statuses["failed"], asset

    # the graph becomes unreachable for the workers; one document's chunks are re-indexed and fail for good
    document_key = _rows(queue, "SELECT document_key FROM documents ORDER BY document_key LIMIT 1")[0][0]
    victims = [row for row in chunks if row[1].startswith(document_key + "/")]
    bolt_relay.close()
    with queue.engine.begin() as conn:  # one attempt for the re-index: its failure is final at once
        conn.exec_driver_sql(
            "UPDATE task_queue_chunk SET max_retries = 1 WHERE id::text = ANY(%(ids)s)",
            {"ids": [row[0] for row in victims]},
        )
    assert queue.requeue(GRAPHRAG_CHUNK, [row[0] for row in victims], "test: re-index after a graph rebuild") == len(
        victims
    )
    victim_keys = {row[1] for row in victims}

    def spent() -> bool:
        rows = [r for r in chunk_rows(queue) if r[1] in victim_keys]
        return (
            all(r[2] == "failed" and r[3] >= r[4] for r in rows)
            and victim_keys <= ui.partition_statuses("graphrag_chunk")["failed"]
        )

    wait_for(spent, 240, "the re-index to fail with every retry spent", ui)
    failed = ui.partition_statuses("graphrag_chunk")["failed"]
    assert failed == victim_keys

    # the graph is back; a person backfills exactly the failed partitions, and the cluster runs the backfill
    bolt_relay.open()
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

    def backfill_finished() -> str | None:
        status = ui.graphql(BACKFILL_STATUS, id=launched["backfillId"])["partitionBackfillOrError"]["status"]
        return status if status not in ("REQUESTED", "CANCELING", "FAILING") else None

    status = wait_for(backfill_finished, 240, "the backfill to finish", ui)
    assert status in ("COMPLETED", "COMPLETED_SUCCESS"), status
    rows = [r for r in chunk_rows(queue) if r[1] in victim_keys]
    assert all(r[2] == "completed" for r in rows)
    surviving = set().union(*(w.pids() for w in workers if w is not killed))
    backfillers = {
        int(w.rsplit(":", 2)[-2])
        for (w,) in _rows(
            queue,
            f"SELECT DISTINCT graphrag_worker_id FROM task_queue_chunk WHERE id::text IN "
            f"({', '.join(repr(r[0]) for r in rows)})",
        )
    }
    assert backfillers <= surviving, "the backfill's step ran on a worker machine"
    statuses = ui.partition_statuses("graphrag_chunk")
    assert statuses["materialized"] == chunk_keys and not statuses["failed"]
    print(
        f"\ncluster e2e: {len(corpus)} documents, {len(chunks)} chunks on {WORKERS} machines; one killed after "
        f"{killed_at - started:.0f} s holding {len(killed_tasks)} task(s); all done {through - killed_at:.0f} s "
        f"later; backfill of {len(victims)} partitions; total {time.monotonic() - started:.0f} s"
    )
