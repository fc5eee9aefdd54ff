"""What the fault tests share: worker processes to kill, polling the queue, and duplicate counts in the stores."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from queue_db.phases import TaskKind
from queue_db.queue import TaskQueue
from tests.figures import announce  # noqa: F401  (the reliability tests import it from here)

REPO_ROOT = Path(__file__).resolve().parents[2]


class QueueWatcher:
    """Looks at the queue from a thread, every 0.1 s while its `with` block runs, through the subclass's `_look`
    (which brings a service back or frees a disk once the fault has been met); a look that raises is retried and
    its error kept in `problems`, for the test to assert empty."""

    def __init__(self):
        self.problems: list[str] = []
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)

    def _watch(self) -> None:
        while not self._stop.wait(0.1):
            try:
                self._look()
            except Exception as exc:  # noqa: BLE001 - a failed look is retried; the failure is reported
                self.problems.append(repr(exc))

    def _look(self) -> None:
        raise NotImplementedError


def wait_for(predicate: Callable[[], object], timeout_s: float, interval_s: float = 0.05, what: str = "condition"):
    """Poll until `predicate()` is truthy; returns its value. Fails the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


def processing_ids(queue: TaskQueue, kind: TaskKind) -> set[str]:
    with queue.engine.connect() as conn:
        return {
            r[0]
            for r in conn.exec_driver_sql(f"SELECT t.id::text FROM {kind.table} t WHERE {kind.held_sql('t')}").all()
        }


def status_of(queue: TaskQueue, kind: TaskKind, ids: Iterable[str]) -> dict[str, str]:
    with queue.engine.connect() as conn:
        return {
            r[0]: r[1]
            for r in conn.exec_driver_sql(
                f"SELECT id::text, {kind.status}::text FROM {kind.table} WHERE id = ANY(%(ids)s::uuid[])",
                {"ids": list(ids)},
            ).all()
        }


@dataclass
class Recovery:
    kind: str
    tasks: int
    seconds: float  # from the kill until the queue released the tasks


def recover_after_kill(
    queue: TaskQueue, kind: TaskKind, ids: set[str], killed_at: float, timeout_s: float = 30.0
) -> Recovery:
    """Run stale recovery as the recovery job would (often), until every task of the dead worker is released."""

    def released():
        queue.recover_stale()
        return all(s != "processing" for s in status_of(queue, kind, ids).values())

    wait_for(released, timeout_s, 0.1, f"{kind.name} tasks {sorted(ids)[:3]} to be released")
    return Recovery(kind.name, len(ids), time.monotonic() - killed_at)


@dataclass
class Stores:
    """The run's vector and graph stores (opened from the environment, as the pipeline opens them)."""

    vector: object
    graph: object
    closers: list = field(default_factory=list)

    @classmethod
    def open(cls) -> "Stores":
        from queue_db.config import Settings
        from resources.embeddings import DEFAULT_MODEL, MODELS
        from resources.graph_stores import Neo4jResource
        from resources.vector_resource import QdrantResource

        spec = MODELS[DEFAULT_MODEL]
        vector = QdrantResource.from_settings(Settings.from_env()).get_store(spec.model_id, spec.dim)
        graph = Neo4jResource.from_settings(Settings.from_env()).get_store()
        return cls(vector, graph, [vector.close, graph.close])

    def close(self) -> None:
        for close in self.closers:
            close()


_DUPLICATE_QUERIES = {
    "documents": "MATCH (n:Document) WITH n.id AS k, count(*) AS c WHERE c > 1 RETURN count(*) AS n",
    "pages": "MATCH (n:Page) WITH n.id AS k, count(*) AS c WHERE c > 1 RETURN count(*) AS n",
    "chunks": "MATCH (n:Chunk) WITH n.id AS k, count(*) AS c WHERE c > 1 RETURN count(*) AS n",
    "entities": "MATCH (n:Entity) WITH n.key AS k, count(*) AS c WHERE c > 1 RETURN count(*) AS n",
    "mentions": "MATCH (c:Chunk)-[m:MENTIONS]->(e:Entity) WITH c.id AS a, e.key AS b, count(m) AS c "
    "WHERE c > 1 RETURN count(*) AS n",
    "relationships": "MATCH (a:Entity)-[r:RELATED_TO]->(b:Entity) WITH a.key AS s, b.key AS t, r.type AS ty, "
    "count(r) AS c WHERE c > 1 RETURN count(*) AS n",
    "has_chunk": "MATCH (p:Page)-[r:HAS_CHUNK]->(c:Chunk) WITH p.id AS a, c.id AS b, count(r) AS c "
    "WHERE c > 1 RETURN count(*) AS n",
}


def graph_duplicates(graph) -> dict[str, int]:
    """Nodes or relationships that exist more than once for one identity (all zero when writes are idempotent)."""
    return {name: graph._read(query)[0]["n"] for name, query in _DUPLICATE_QUERIES.items()}


def store_figures(queue: TaskQueue, stores: Stores) -> dict:
    """Counts that must not change when completed work is re-run."""
    from orchestration.verify import verify_stores

    with queue.engine.connect() as conn:
        chunks = conn.exec_driver_sql("SELECT count(*) FROM task_queue_chunk").scalar()
    report = verify_stores(queue, stores.vector, stores.graph)
    return {
        "chunks": int(chunks),
        "points": stores.vector.count(),
        "graph": stores.graph.counts(),
        "duplicates": graph_duplicates(stores.graph),
        "verify": report.as_dict(),
    }


def document_statuses(queue: TaskQueue) -> dict[str, tuple[str, str, str]]:
    with queue.engine.connect() as conn:
        return {
            r[0]: (r[1], r[2], r[3])
            for r in conn.exec_driver_sql(
                "SELECT filename, ocr_status::text, vector_index_status::text, graphrag_index_status::text "
                "FROM documents"
            ).all()
        }


RECORDED: list[tuple[str, dict]] = []  # every test's figures, totalled at the end of the session


def figures_line(title: str, figures: dict) -> str:
    """One greppable line of measured figures for the closing note (also kept for the session's totals)."""
    RECORDED.append((title, figures))
    return f"[reliability] {title}: " + ", ".join(f"{k}={v}" for k, v in figures.items())


def totals_line() -> str | None:
    if not RECORDED:
        return None
    values = lambda key: [f[key] for _, f in RECORDED if isinstance(f.get(key), (int, float))]  # noqa: E731
    return (
        f"[reliability] totals over {len(RECORDED)} fault tests: faults injected={sum(values('faults'))}, "
        f"tasks recovered={sum(values('tasks_recovered'))}, "
        f"slowest recovery={max(values('recovery_s_max'), default=0):.1f} s, "
        f"duplicates={sum(values('duplicates'))}, tasks lost={sum(values('tasks_lost'))}"
    )


class Zygote:
    """Test side of tests/reliability/zygote.py: fork workers (started in well under a second) and watch them."""

    def __init__(self, log_dir: Path):
        import threading

        self.log_path = Path(log_dir) / "zygote.stderr"
        self._stderr = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.zygote"],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self._changed = threading.Condition()
        self.ready = False
        self.spawned: dict[str, int] = {}
        self.exited: dict[int, int] = {}
        self.reports: dict[int, dict] = {}
        self._reader = threading.Thread(target=self._read, name="zygote-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            kind, _, rest = line.strip().partition(" ")
            with self._changed:
                if kind == "ready":
                    self.ready = True
                elif kind == "spawned":
                    name, pid = rest.split(" ")
                    self.spawned[name] = int(pid)
                elif kind == "exited":
                    _, pid, code = rest.split(" ")
                    self.exited[int(pid)] = int(code)
                elif kind == "report":
                    _, pid, payload = rest.split(" ", 2)
                    self.reports[int(pid)] = json.loads(payload)
                self._changed.notify_all()
        with self._changed:
            self.ready = None  # the zygote itself is gone
            self._changed.notify_all()

    def _wait(self, predicate, timeout_s: float, what: str):
        with self._changed:
            if not self._changed.wait_for(lambda: predicate() or self.ready is None, timeout_s):
                raise AssertionError(f"timed out waiting for {what}")
            if self.ready is None and not predicate():
                raise AssertionError(
                    f"the zygote died while waiting for {what}:\n{self.log_path.read_text(errors='replace')[-3000:]}"
                )
            return predicate()

    def wait_ready(self, timeout_s: float = 180.0) -> "Zygote":
        self._wait(lambda: self.ready, timeout_s, "the zygote to import everything")
        return self

    def spawn(self, name: str, log_dir: Path, **options) -> "ForkedWorker":
        self._count = getattr(self, "_count", 0) + 1
        name = f"{name}-{self._count}"
        spec = {"env": dict(os.environ), "stderr": str(Path(log_dir) / f"worker-{name}.stderr"), **options}
        self.proc.stdin.write(f"spawn {name} {json.dumps(spec)}\n")
        self.proc.stdin.flush()
        pid = self._wait(lambda: self.spawned.get(name), 30, f"worker {name} to fork")
        return ForkedWorker(self, name, pid, Path(spec["stderr"]))

    def close(self) -> None:
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            self.proc.wait(30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self._stderr.close()


@dataclass
class ForkedWorker:
    zygote: Zygote
    name: str
    pid: int
    log_path: Path

    def alive(self) -> bool:
        return self.pid not in self.zygote.exited

    def kill(self) -> None:
        if self.alive():
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.zygote._wait(lambda: self.pid in self.zygote.exited, 30, f"worker {self.name} to be reaped")

    def finish(self, timeout_s: float = 240.0, killed_ok: bool = False) -> dict:
        """Wait for the worker to end; it must end cleanly, or (`killed_ok`) by SIGKILL, as a worker that met a
        poison task does."""
        self.zygote._wait(lambda: self.pid in self.zygote.exited, timeout_s, f"worker {self.name} to go idle")
        code = self.zygote.exited[self.pid]
        assert code == 0 or (killed_ok and code == -signal.SIGKILL), (
            f"worker {self.name} exited {code}:\n{self.stderr_tail()}"
        )
        return self.zygote.reports.get(self.pid, {})

    def stderr_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


class TcpProxy:
    """A TCP forwarder on 127.0.0.1 in front of a real server. `down()` closes the port and cuts every open
    connection (a crashed server, a network partition: clients get resets, then refusals); `up()` listens again
    on the same port (the server is back)."""

    def __init__(self, target_port: int, port: int | None = None):
        import socket
        import threading

        self.target_port = target_port
        probe = socket.socket()
        probe.bind(("127.0.0.1", port or 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self._lock = threading.Lock()
        self._sockets: list = []
        self._listener = None
        self.connections = 0

    def up(self) -> "TcpProxy":
        import socket
        import threading

        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def down(self) -> None:
        import socket

        with self._lock:
            listener, self._listener = self._listener, None
            sockets, self._sockets = self._sockets, []
        for sock in ([listener] if listener else []) + sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _accept(self, listener) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    server.close()
                    return
                self._sockets += [client, server]
                self.connections += 1
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source, sink) -> None:
        import socket

        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
