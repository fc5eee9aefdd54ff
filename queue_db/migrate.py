"""Versioned schema migrations: ordered SQL files in queue_db/migrations, recorded in a version table.

`upgrade()` is idempotent and safe to run from several processes at once (an advisory lock serialises them).
An empty database is built by the migrations too, never from queue_db/schema.sql (the readable dump of their
result): one path builds every database, so the files every deployment runs are the ones every test database runs.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources as importlib_resources
from typing import TYPE_CHECKING

from .phases import PHASES, PhaseRegistry
from .rollup_sql import missing_phase_ddl

if TYPE_CHECKING:
    import sqlalchemy as sa

VERSION_TABLE = "docqueue_schema_version"
# arbitrary constant: identifies "docqueue schema upgrade" among advisory locks
_UPGRADE_LOCK_KEY = 0x646F6371
_NAME_PATTERN = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def available_migrations() -> list[Migration]:
    folder = importlib_resources.files("queue_db") / "migrations"
    found = []
    for entry in folder.iterdir():
        match = _NAME_PATTERN.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"two migration files share a version number: {versions}")
    return found


_VERSION_TABLE_DDL = f"""CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    checksum VARCHAR(64) NOT NULL,
    applied_at TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT NOW())"""


def _ensure_version_table(conn: sa.Connection) -> None:
    conn.exec_driver_sql(_VERSION_TABLE_DDL)


def _recorded(migration: Migration) -> str:
    return (
        f"INSERT INTO {VERSION_TABLE} (version, name, checksum) "
        f"VALUES ({migration.version}, '{migration.name}', '{migration.checksum}')"
    )


def upgrade_script(after_version: int = 0) -> str:
    """The SQL `upgrade()` would run on a database at `after_version`, as one psql script: each migration in its
    own transaction with its version recorded, for a DBA who applies it by hand. Reads no database."""
    parts = [
        f"-- docqueue schema migrations after version {after_version} (docqueue db upgrade --sql)",
        f"{_VERSION_TABLE_DDL};",
    ]
    for migration in available_migrations():
        if migration.version > after_version:
            parts.append(
                f"-- {migration.version:04d}_{migration.name}\nBEGIN;\n{migration.sql.rstrip()}\n"
                f"{_recorded(migration)};\nCOMMIT;"
            )
    return "\n\n".join(parts) + "\n"


def applied_versions(conn: sa.Connection) -> dict[int, str]:
    exists = conn.exec_driver_sql("SELECT to_regclass(%(t)s)", {"t": VERSION_TABLE}).scalar()
    if exists is None:
        return {}
    rows = conn.exec_driver_sql(f"SELECT version, checksum FROM {VERSION_TABLE}").all()
    return {int(v): c for v, c in rows}


def _execute_script(conn: sa.Connection, sql: str) -> None:
    """Run a multi-statement script verbatim: no parameters, so `%` in the SQL is not a placeholder."""
    dbapi = conn.connection.dbapi_connection
    assert dbapi is not None, "an open Connection always holds its DBAPI connection"
    cursor = dbapi.cursor()
    try:
        cursor.execute(sql)
    finally:
        cursor.close()


def pending_migrations(engine: sa.Engine) -> list[Migration]:
    with engine.connect() as conn:
        done = applied_versions(conn)
    return [m for m in available_migrations() if m.version not in done]


def upgrade(engine: sa.Engine, target: int | None = None, phases: PhaseRegistry = PHASES) -> list[Migration]:
    """Apply every migration not yet applied (up to `target`), each in its own transaction, then (without a
    `target`) the columns and indexes of `phases` that do not exist yet (rollup_sql.phase_ddl). Returns the
    migrations applied."""
    applied: list[Migration] = []
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT pg_advisory_lock(%(k)s)", {"k": _UPGRADE_LOCK_KEY})
        conn.commit()  # a session-level lock outlives the transaction; close the implicit one
        try:
            with conn.begin():
                _ensure_version_table(conn)
            done = applied_versions(conn)
            conn.commit()
            for migration in available_migrations():
                if target is not None and migration.version > target:
                    break
                if migration.version in done:
                    if done[migration.version] != migration.checksum:
                        # an edited, already-applied migration means two databases could silently differ
                        raise RuntimeError(
                            f"migration {migration.version:04d}_{migration.name} changed after it was applied; "
                            "add a new migration instead of editing an old one"
                        )
                    continue
                with conn.begin():
                    _execute_script(conn, migration.sql)
                    conn.exec_driver_sql(
                        f"INSERT INTO {VERSION_TABLE} (version, name, checksum) VALUES (%(v)s, %(n)s, %(c)s)",
                        {"v": migration.version, "n": migration.name, "c": migration.checksum},
                    )
                applied.append(migration)
            if target is None:
                with conn.begin():
                    for statement in missing_phase_ddl(conn, phases):
                        conn.exec_driver_sql(statement)
        finally:
            conn.exec_driver_sql("SELECT pg_advisory_unlock(%(k)s)", {"k": _UPGRADE_LOCK_KEY})
            conn.commit()
    return applied
