"""A process's copy of each dynamic partitions definition's keys, reused while the keys are unchanged.

Dagster resolves a ranged run's keys by reading every key of its definition (`get_partition_keys_in_range` calls
`get_partition_keys()`), and does so for every run; so does the webserver for a partitions page. The live keys are
the backlog plus the recently completed ones: at a million chunks with a backlog of 100,000, that read is 0.25-0.5 s
of every run, and it returns the same list run after run.

Statement-level triggers on Dagster's `dynamic_partitions` table count the changes of each definition in
`docqueue_partition_key_versions`, in the transaction of the change, whoever makes it (this storage, a stock
Dagster storage, a SQL session). A read asks for the definition's version (one row by its primary key) and reuses
the keys read at that version. The version is read before the keys, so a change committed between the two costs
one more read later and never leaves a stale list in use.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import sqlalchemy as db

log = logging.getLogger(__name__)

VERSIONS_TABLE = "docqueue_partition_key_versions"
_INSTALL_LOCK = 0x646F6371  # advisory lock key: processes that start together install the triggers once
_TRIGGERS = (
    "docqueue_partition_keys_added",
    "docqueue_partition_keys_changed",
    "docqueue_partition_keys_deleted",
    "docqueue_partition_keys_truncated",
)

INSTALL_SQL = f"""
CREATE TABLE IF NOT EXISTS {VERSIONS_TABLE} (
    partitions_def_name text PRIMARY KEY,
    version bigint NOT NULL
);
CREATE OR REPLACE FUNCTION docqueue_count_partition_key_changes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {VERSIONS_TABLE} AS v (partitions_def_name, version)
    SELECT DISTINCT partitions_def_name, 1 FROM changed
    ON CONFLICT (partitions_def_name) DO UPDATE SET version = v.version + 1;
    RETURN NULL;
EXCEPTION WHEN undefined_table THEN
    RETURN NULL;  -- never fail Dagster's write: a reader finds the table missing and reinstalls it
END $$;
CREATE OR REPLACE FUNCTION docqueue_count_partition_key_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE {VERSIONS_TABLE} SET version = version + 1;
    RETURN NULL;
EXCEPTION WHEN undefined_table THEN
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS {_TRIGGERS[0]} ON dynamic_partitions;
CREATE TRIGGER {_TRIGGERS[0]} AFTER INSERT ON dynamic_partitions REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION docqueue_count_partition_key_changes();
DROP TRIGGER IF EXISTS {_TRIGGERS[1]} ON dynamic_partitions;
CREATE TRIGGER {_TRIGGERS[1]} AFTER UPDATE ON dynamic_partitions REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION docqueue_count_partition_key_changes();
DROP TRIGGER IF EXISTS {_TRIGGERS[2]} ON dynamic_partitions;
CREATE TRIGGER {_TRIGGERS[2]} AFTER DELETE ON dynamic_partitions REFERENCING OLD TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION docqueue_count_partition_key_changes();
DROP TRIGGER IF EXISTS {_TRIGGERS[3]} ON dynamic_partitions;
CREATE TRIGGER {_TRIGGERS[3]} AFTER TRUNCATE ON dynamic_partitions
    FOR EACH STATEMENT EXECUTE FUNCTION docqueue_count_partition_key_truncate();
UPDATE {VERSIONS_TABLE} SET version = version + 1;
"""

_INSTALLED_SQL = (
    "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'dynamic_partitions'::regclass AND tgname IN "
    f"({', '.join(repr(name) for name in _TRIGGERS)})"
)
# the version, and whether the triggers are all there: a table Dagster re-creates (a wiped instance) has none
_VERSION_SQL = f"SELECT (SELECT version FROM {VERSIONS_TABLE} WHERE partitions_def_name = %s), ({_INSTALLED_SQL})"


class PartitionKeyCache:
    """The keys of each definition as last read, with the version they were read at; at most `max_keys` keys
    per definition are kept (a larger set is read every time, as without this cache), so the memory it takes is
    bounded by DOCQUEUE_PARTITION_KEY_CACHE_MAX."""

    def __init__(self, max_keys: int):
        self.max_keys = max_keys
        self._keys: dict[str, tuple[int, list[str]]] = {}
        self._refused = False  # the triggers could not be installed: every read is whole
        self._lock = threading.Lock()

    def keys(self, connect: Callable[[], object], name: str, read: Callable[[object], list[str]]) -> list[str]:
        """The keys of definition `name`: `read(conn)` reads them all; `connect()` gives an autocommit
        SQLAlchemy connection context on the Dagster database."""
        with connect() as conn:
            version = self._version(conn, name) if self.max_keys > 0 else None
            if version is None:
                return read(conn)
            cached = self._keys.get(name)
            if cached is not None and cached[0] == version:
                return list(cached[1])  # a copy: callers may change their list
            keys = read(conn)
        if len(keys) <= self.max_keys:
            self._keys[name] = (version, keys)
            return list(keys)
        self._keys.pop(name, None)
        return keys

    def _version(self, conn, name: str) -> int | None:
        """The definition's change count (0: none since the triggers were installed), or None when it cannot be
        trusted: the triggers are missing and this role may not install them."""
        for attempt in range(2):
            if self._refused:
                return None
            try:
                version, triggers = conn.exec_driver_sql(_VERSION_SQL, (name,)).one()
            except db.exc.ProgrammingError:  # the version table is missing
                conn.rollback()
                version, triggers = None, 0
            if triggers == len(_TRIGGERS):
                return 0 if version is None else int(version)
            if attempt == 0:
                with self._lock:
                    # changes made while the triggers were missing went uncounted: nothing read before is kept,
                    # and the installation counts a change of every definition, for the other processes' copies
                    self._keys.clear()
                    self._refused = not _install(conn)
        return None


def _install(conn) -> bool:
    """(Re)install the version table and triggers, which is idempotent; False (and one warning) if this role may
    not."""
    try:
        # the storages' connections autocommit: a session lock, and the script as one statement string, which
        # PostgreSQL runs as one transaction
        conn.exec_driver_sql("SELECT pg_advisory_lock(%s)", (_INSTALL_LOCK,))
        try:
            conn.exec_driver_sql(INSTALL_SQL)
        finally:
            conn.exec_driver_sql("SELECT pg_advisory_unlock(%s)", (_INSTALL_LOCK,))
        return True
    except db.exc.DBAPIError as exc:
        log.warning(
            "Dagster's partition keys are read whole for every run: the version triggers on dynamic_partitions "
            "could not be installed (%s)",
            type(exc.orig).__name__,
        )
        return False
