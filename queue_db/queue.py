"""The hierarchical task queue: registration, expansion, claiming, heartbeats, fenced transitions, bubble-up,
stale recovery and reconciliation. Plain SQL on SQLAlchemy connections; no orchestration concepts here.

Concurrency design, in one place:
- claims use `FOR UPDATE OF t SKIP LOCKED` over the kind's claim index, so workers never wait on each other's
  candidate rows;
- every transition that touches task rows locks them in id order first, then their parent pages in id order,
  then their documents in id order. One global order (chunks -> pages -> documents, by id) means no deadlocks;
- a parent is recomputed by a statement that runs AFTER the parent row lock is held. Under READ COMMITTED that
  statement sees every child change committed by whoever held the lock before, so the last transaction to touch
  a parent always leaves it equal to the rule applied to its children (no lost bubble-up under concurrency);
- completions and failures are fenced: they apply only to rows still `processing` by the same worker id.
"""
from __future__ import annotations

import json
import re
import socket
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, Callable, Iterable, Sequence

import psycopg
import psycopg.rows
import psycopg.types.json
import psycopg.types.string
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError, OperationalError

from .config import QueueSettings
from .idempotency import IdempotencyConflict, checked_key
from .keys import chunk_id
from .tasks import (
    ALL_KINDS,
    GRAPHRAG_CHUNK,
    OCR_DOCUMENT,
    OCR_PAGE,
    VECTOR_CHUNK,
    VECTOR_PAGE,
    Level,
    Phase,
    TaskKind,
    kinds_of_phase,
)

MAX_ERROR_CHARS = 4000
# 'never retry automatically': a finite far-future time (drivers cannot load 'infinity' into datetime)
NEVER = "9999-12-31T00:00:00Z"
_RETRYABLE_SQLSTATES = {"40P01", "40001"}  # deadlock detected, serialization failure


def make_worker_id(label: str = "worker") -> str:
    """Unique per worker instance: a recovered-and-reclaimed task never has the same owner twice."""
    return f"{label}:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"[-100:]


def clean_text(value: str | None, limit: int = MAX_ERROR_CHARS) -> str | None:
    """PostgreSQL text cannot hold NUL; keep everything else verbatim, bounded."""
    if value is None:
        return None
    value = value.replace("\x00", "\\x00")
    try:  # undecodable bytes (surrogate escapes from file names) are shown as \xNN rather than refused
        value = value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value if len(value) <= limit else value[: limit - 1] + "…"


def source_path_text(path: str) -> str:
    """A file path as documents.source_path holds it (and as lookups by path must give it): undecodable bytes of
    the name as \\xNN escapes, bounded."""
    return clean_text(path, 10000)


def document_key_for(filename: str, content_hash: str, length: int = 8) -> str:
    """`<filename-stem>-<hash8>`: readable, stable, and safe as a Dagster partition key (no commas, no slashes)."""
    stem = PurePath(filename.replace("\\", "/")).stem
    slug = re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-")[:60] or "document"
    return f"{slug}-{content_hash[:length]}"


@dataclass(frozen=True)
class Transition:
    """What a fenced transition did: ids it applied to and ids it refused (lost ownership)."""

    applied: list[str]
    rejected: list[str]


@dataclass(frozen=True)
class Settlement:
    """What TaskQueue.settle did: its completions, its failures, and the rows it claimed next."""

    completed: Transition
    failed: Transition
    claimed: list[dict]


@dataclass(frozen=True)
class Correction:
    level: str
    id: str
    phase: str
    old: str | None
    new: str


class TaskQueue:
    def __init__(self, engine: sa.Engine | str, settings: QueueSettings | None = None):
        if isinstance(engine, str):
            engine = create_queue_engine(engine)
        self.engine = engine
        self.settings = settings or QueueSettings.from_env()

    # ------------------------------------------------------------------ transactions
    def _transaction(self, work: Callable[[sa.Connection], Any], attempts: int = 6) -> Any:
        """Run `work` in one transaction; retry deadlocks/serialization failures and dropped connections."""
        delay = 0.05
        for attempt in range(1, attempts + 1):
            try:
                with self.engine.begin() as conn:
                    return work(conn)
            except DBAPIError as exc:
                if attempt == attempts or not _is_transient(exc):
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    # ------------------------------------------------------------------ intake
    def register_document(
        self,
        *,
        filename: str,
        content_hash: str,
        size_bytes: int,
        storage_key: str | None = None,
        source_path: str | None = None,
        priority: int = 0,
        password_ref: str | None = None,
        mime_type: str | None = "application/pdf",
        filename_bytes: bytes | None = None,
        metadata: dict | None = None,
        idempotency_key: str | None = None,
    ) -> tuple[dict, bool]:
        """Idempotent on content hash: the same bytes twice give the same document. Returns (row, created).

        With `idempotency_key`, the same key twice is one document too, and the key with other bytes raises
        IdempotencyConflict. Bytes already registered without a key take the key, so it names them from then on;
        bytes already registered under another key stay one document, under that other key."""
        idempotency_key = checked_key(idempotency_key)
        if not 0 <= priority <= 10:
            raise ValueError(f"priority must be between 0 and 10, got {priority}")
        if not re.fullmatch(r"[0-9a-f]{64}", content_hash):
            raise ValueError("content_hash must be a sha256 hex digest")

        def keyed(conn: sa.Connection) -> dict | None:
            """The document the key names (None when the key is new); IdempotencyConflict for other bytes."""
            row = conn.exec_driver_sql("SELECT * FROM documents WHERE idempotency_key = %(k)s",
                                       {"k": idempotency_key}).mappings().first()
            if row is not None and row["content_hash"] != content_hash:
                raise IdempotencyConflict(idempotency_key, row["document_key"])
            return dict(row) if row is not None else None

        def work(conn: sa.Connection) -> tuple[dict, bool]:
            for key_length in (8, 12, 16, 64):
                row = conn.exec_driver_sql(
                    """INSERT INTO documents (filename, filename_bytes, document_key, source_path, storage_key,
                                              size_bytes, content_hash, mime_type, priority, password_ref,
                                              metadata, max_retries, idempotency_key)
                       VALUES (%(filename)s, %(filename_bytes)s, %(key)s, %(source_path)s, %(storage_key)s,
                               %(size)s, %(hash)s, %(mime)s, %(priority)s, %(password_ref)s, %(metadata)s::jsonb,
                               %(max_retries)s, %(idempotency_key)s)
                       ON CONFLICT DO NOTHING
                       RETURNING *""",
                    {
                        "filename": clean_text(filename, 1000), "filename_bytes": filename_bytes,
                        "key": document_key_for(filename, content_hash, key_length),
                        "source_path": source_path_text(source_path) if source_path else None, "storage_key": storage_key,
                        "size": size_bytes, "hash": content_hash, "mime": mime_type, "priority": priority,
                        "password_ref": password_ref, "metadata": json.dumps(metadata or {}),
                        "max_retries": self.settings.max_retries, "idempotency_key": idempotency_key,
                    },
                ).mappings().first()
                if row is not None:
                    return dict(row), True
                named = keyed(conn) if idempotency_key is not None else None
                if named is not None:
                    return named, False
                existing = conn.exec_driver_sql(
                    "SELECT * FROM documents WHERE content_hash = %(hash)s", {"hash": content_hash}
                ).mappings().first()
                if existing is not None:
                    if idempotency_key is not None and existing["idempotency_key"] is None:
                        try:
                            with conn.begin_nested():
                                existing = conn.exec_driver_sql(
                                    "UPDATE documents SET idempotency_key = %(k)s WHERE id = %(id)s RETURNING *",
                                    {"k": idempotency_key, "id": existing["id"]}).mappings().first()
                        except sa.exc.IntegrityError:
                            # other bytes took the key since the INSERT above: the key is theirs
                            return keyed(conn) or dict(existing), False
                    return dict(existing), False
                # the key collided with a different file's key: lengthen the hash part and try again
            raise RuntimeError("could not allocate a unique document key")

        return self._transaction(work)

    def set_storage_key(self, document_id: str, storage_key: str) -> None:
        self._transaction(lambda conn: conn.exec_driver_sql(
            "UPDATE documents SET storage_key = %(k)s, updated_at = now() WHERE id = %(id)s",
            {"k": storage_key, "id": document_id}))

    # ------------------------------------------------------------------ the transition primitive
    def _run(self, kind: TaskKind | None, statement: str, args: dict, *, bubble: bool = True,
             conn: sa.Connection | None = None) -> list[dict]:
        """Run one data-modifying statement ($1 = `args` as jsonb) and bubble its parents up, atomically and in
        one round trip (docqueue_transition, migrations/0002). Inside `conn` when given, else autocommit."""
        phase = kind.phase.value if (bubble and kind is not None and kind.level is not Level.DOCUMENT) else None
        call = "SELECT docqueue_transition(%(sql)s, %(phase)s, %(args)s::jsonb)"
        params = {"sql": statement, "phase": phase, "args": json.dumps(args)}
        if conn is not None:
            return list(conn.exec_driver_sql(call, params).scalar())
        return self._autocommit(lambda c: list(c.exec_driver_sql(call, params).scalar()))

    def _pipelined(self, kind: TaskKind, worker_id: str, statements: Sequence[tuple[str, dict]],
                   settled: Sequence[str] | None) -> list[list[dict]]:
        """The hot path (claim, complete, fail, settle): BEGIN, each transition as a prepared statement (its plan is
        cached, unlike dynamic SQL), one docqueue_bubble_after() for all of them, COMMIT, sent as one pipelined
        batch: one round trip. `settled` are the rows completed or failed; rows claimed are found by the function
        (worker and heartbeat = now()). Returns each statement's rows."""
        prepared = [(sql.replace("%", "%%").replace("$1", "%(args)s::jsonb"), args) for sql, args in statements]
        delay = 0.05
        for attempt in range(1, 7):
            raw = self.engine.raw_connection()
            try:
                pg = raw.driver_connection
                with pg.pipeline():
                    with pg.transaction():
                        cursors = []
                        for sql, args in prepared:
                            cursor = pg.cursor(row_factory=psycopg.rows.dict_row)
                            # ids leave the queue as strings; loading them as text skips a uuid.UUID per value
                            cursor.adapters.register_loader("uuid", psycopg.types.string.TextLoader)
                            cursor.execute(sql, {"args": psycopg.types.json.Jsonb(args)}, prepare=True)
                            cursors.append(cursor)
                        pg.execute("SELECT docqueue_bubble_after(%s, %s, %s::uuid[])",
                                   (kind.name, worker_id, list(settled) if settled else None), prepare=True)
                    results = [cursor.fetchall() for cursor in cursors]
                raw.close()
                return results
            except psycopg.Error as exc:
                transient = getattr(exc, "sqlstate", None) in _RETRYABLE_SQLSTATES or isinstance(exc, psycopg.OperationalError)
                if pg.closed or isinstance(exc, psycopg.OperationalError):
                    raw.invalidate()
                else:
                    raw.close()
                if attempt == 6 or not transient:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
        raise AssertionError("unreachable")

    def _autocommit(self, work: Callable[[sa.Connection], Any], attempts: int = 6) -> Any:
        """One statement = one transaction; retried on deadlock/serialization failure or a dropped connection."""
        delay = 0.05
        for attempt in range(1, attempts + 1):
            try:
                with self.engine.connect() as conn:
                    return work(conn.execution_options(isolation_level="AUTOCOMMIT"))
            except DBAPIError as exc:
                if attempt == attempts or not _is_transient(exc):
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    # ------------------------------------------------------------------ claiming
    def claim_sql(self, kind: TaskKind, *, only_ids: bool = False, override_retry_limit: bool = False) -> str:
        """The claim statement of `kind` ($1: {worker, limit, only}). Public so the EXPLAIN test checks it."""
        where = kind.claimable_sql("t")
        if override_retry_limit:
            where = f"({kind.ready_sql}) AND t.{kind.status} IN ('pending', 'failed')"
        if only_ids:
            where += " AND t.id = ANY(ARRAY(SELECT jsonb_array_elements_text($1->'only'))::uuid[])"
        returning = kind.returning_sql("t")
        return f"""
            WITH picked AS (
                SELECT t.id FROM {kind.table} t
                WHERE {where}
                ORDER BY {kind.claim_order_sql("t")}
                LIMIT ($1->>'limit')::int
                FOR UPDATE OF t SKIP LOCKED
            )
            UPDATE {kind.table} t
            SET {kind.status} = 'processing', {kind.col('worker_id')} = $1->>'worker',
                {kind.col('started_at')} = now(), {kind.col('last_heartbeat')} = now(), updated_at = now()
            WHERE t.id = ANY(ARRAY(SELECT id FROM picked))  -- probe the primary key, never a hash join over the table
            RETURNING {returning}, EXTRACT(EPOCH FROM now() - t.created_at)::float8 AS queue_wait_s"""

    def claim(self, kind: TaskKind, worker_id: str, limit: int = 1, *, only_ids: Sequence[str] | None = None,
              override_retry_limit: bool = False) -> list[dict]:
        """Claim up to `limit` ready tasks of `kind` for `worker_id` and bubble `processing` up, atomically.

        `only_ids` restricts the claim to those rows (a Dagster partition range). `override_retry_limit` also
        takes failed rows whose retries are exhausted or whose back-off has not elapsed: a manual backfill.
        """
        statement = self._claim_statement(kind, worker_id, limit, only_ids, override_retry_limit)
        return self._pipelined(kind, worker_id, [statement], None)[0] if statement else []

    def _claim_statement(self, kind: TaskKind, worker_id: str, limit: int, only_ids: Sequence[str] | None,
                         override_retry_limit: bool) -> tuple[str, dict] | None:
        if limit <= 0 or (only_ids is not None and not only_ids):
            return None
        sql = self.claim_sql(kind, only_ids=only_ids is not None, override_retry_limit=override_retry_limit)
        args: dict[str, Any] = {"worker": worker_id, "limit": limit}
        if only_ids is not None:
            args["only"] = [str(i) for i in only_ids]
        return sql, args

    def heartbeat(self, kind: TaskKind, worker_id: str, ids: Iterable[str]) -> set[str]:
        """Refresh the heartbeat of tasks still owned by `worker_id`; returns the ids still owned."""
        ids = [str(i) for i in ids]
        if not ids:
            return set()
        sql = f"""
            WITH mine AS (
                SELECT id FROM {kind.table}
                WHERE id = ANY(ARRAY(SELECT jsonb_array_elements_text($1->'ids'))::uuid[])
                  AND {kind.status} = 'processing' AND {kind.col('worker_id')} = $1->>'worker'
                ORDER BY id FOR UPDATE
            )
            UPDATE {kind.table} t SET {kind.col('last_heartbeat')} = now()
            FROM mine WHERE t.id = mine.id RETURNING t.id"""
        return {r["id"] for r in self._run(kind, sql, {"ids": ids, "worker": worker_id}, bubble=False)}

    # ------------------------------------------------------------------ completions (fenced)
    def _fenced_sql(self, kind: TaskKind, set_sql: str, value_columns: dict[str, str]) -> str:
        """Update only rows still `processing` by $1.worker; $1.values carries per-row data.

        The fence is in the UPDATE's own WHERE: READ COMMITTED re-checks it on the newest row version when a
        concurrent writer (recovery, a new owner) got there first, so no separate FOR UPDATE pass is needed; that
        pass wrote one more WAL record per row. The values are sorted by id and are the outer side of the join (the
        plan seen: a hash join probing with them), so rows are updated in id order, the order heartbeat() locks them
        in; should a plan ever take another order, a deadlock is retried like any other (_RETRYABLE_SQLSTATES)."""
        record = ", ".join(["id uuid", *(f"{c} {t}" for c, t in value_columns.items())])
        return f"""
            UPDATE {kind.table} t SET {set_sql}, updated_at = now()
            FROM (SELECT * FROM jsonb_to_recordset($1->'values') AS v({record}) ORDER BY v.id) v
            WHERE t.id = v.id AND t.{kind.status} = 'processing' AND t.{kind.col('worker_id')} = $1->>'worker'
            RETURNING t.id{_parent_columns(kind)}"""

    def complete(self, kind: TaskKind, worker_id: str, results: Sequence[dict] | Sequence[str]) -> Transition:
        """Mark tasks completed (fenced) and bubble up. `results` are ids or dicts {id, <result columns>}."""
        return self.settle(kind, worker_id, completed=results).completed

    def settle(self, kind: TaskKind, worker_id: str, *, completed: Sequence[dict] | Sequence[str] | None = None,
               failed: Sequence[dict] = (), claim: int = 0, only_ids: Sequence[str] | None = None,
               override_retry_limit: bool = False) -> Settlement:
        """Complete and fail a batch (both fenced) and claim up to `claim` next tasks (as `claim()` would), in one
        transaction with one bubble-up pass: what a worker loop sends between two batches, in one round trip."""
        complete = self._complete_statement(kind, worker_id, completed)
        fail = self._fail_statement(kind, worker_id, failed)
        next_claim = self._claim_statement(kind, worker_id, claim, only_ids, override_retry_limit)
        statements = [s[:2] for s in (complete, fail, next_claim) if s is not None]
        settled = [i for s in (complete, fail) if s is not None for i in s[2]]
        if not statements:
            return Settlement(Transition([], []), Transition([], []), [])
        results = iter(self._pipelined(kind, worker_id, statements, settled))
        return Settlement(_outcome(complete[2], next(results)) if complete else Transition([], []),
                          _outcome(fail[2], next(results)) if fail else Transition([], []),
                          next(results) if next_claim else [])

    def _complete_statement(self, kind: TaskKind, worker_id: str,
                            results: Sequence[dict] | Sequence[str] | None) -> tuple[str, dict, list[str]] | None:
        """None: nothing to complete (`results` None means the caller completes nothing, as settle's default)."""
        if results is None:
            return None
        if kind in (OCR_DOCUMENT, VECTOR_PAGE):
            raise ValueError(f"{kind.name} completes through its own method (it creates child tasks)")
        results = [r if isinstance(r, dict) else {"id": r} for r in results]
        ids = [str(r["id"]) for r in results]
        if not ids:
            return None
        columns = {c: t for c, t in kind.result_columns.items() if any(c in r for r in results)}
        set_sql = ", ".join([
            f"{kind.status} = 'completed'", f"{kind.col('completed_at')} = now()",
            f"{kind.col('error')} = NULL", f"{kind.col('error_class')} = NULL",
            f"{kind.col('next_attempt_at')} = NULL", *(f"{c} = v.{c}" for c in columns),
        ])
        values = [{"id": str(r["id"]), **{c: (clean_text(r[c]) if isinstance(r.get(c), str) else r.get(c))
                                          for c in columns}} for r in results]
        return self._fenced_sql(kind, set_sql, columns), {"worker": worker_id, "values": values}, ids

    def complete_document_expansion(self, worker_id: str, document_id: str, *, page_count: int,
                                    encrypted: bool = False, metadata: dict | None = None) -> bool:
        """Create the document's page tasks (fenced on the expansion claim). A document with zero pages fails:
        nothing can be indexed from it, and calling it complete would hide a broken file."""
        sql = self._fenced_sql(
            OCR_DOCUMENT,
            "pages_created_at = now(), page_count = ($1->>'pages')::int, encrypted = ($1->>'encrypted')::boolean, "
            "metadata = t.metadata || ($1->'metadata'), ocr_error = NULL, ocr_error_class = NULL, "
            "next_attempt_at = NULL", {})
        args = {"worker": worker_id, "values": [{"id": str(document_id)}], "pages": page_count,
                "encrypted": encrypted, "metadata": metadata or {}}

        def work(conn: sa.Connection) -> bool:
            if not self._run(OCR_DOCUMENT, sql, args, bubble=False, conn=conn):
                return False
            if page_count <= 0:
                conn.exec_driver_sql(
                    f"""UPDATE documents SET ocr_status = 'failed', ocr_error = 'empty: document has no pages',
                              ocr_error_class = 'empty', next_attempt_at = '{NEVER}', updated_at = now()
                       WHERE id = %(id)s""", {"id": str(document_id)})
                return True
            conn.exec_driver_sql(
                """INSERT INTO task_queue_page (document_id, page_number, priority, max_retries)
                   SELECT d.id, n, d.priority, d.max_retries FROM documents d, generate_series(1, %(n)s) n
                   WHERE d.id = %(id)s
                   ON CONFLICT (document_id, page_number) DO NOTHING""",
                {"id": str(document_id), "n": page_count})
            for phase in Phase:
                self._bubble(conn, phase, document_ids=[str(document_id)])
            return True

        return self._transaction(work)

    def complete_chunking(self, worker_id: str, page_id: str, chunks: Sequence[dict]) -> bool:
        """Create the chunk tasks of a page (fenced on the page's vector claim). Chunk dicts carry chunk_index,
        content_hash, content, token_count. A page with no chunks is complete in both later phases.

        The queue derives each chunk_id (keys.chunk_id: document key, page number, chunk index, content hash), which
        makes ids unique by construction; a chunk dict may carry its chunk_id, and one that differs is refused
        (ValueError) rather than stored under an id another row could also have."""
        sql = self._fenced_sql(
            VECTOR_PAGE,
            "chunked_at = now(), chunk_count = ($1->>'n')::int, vector_error = NULL, vector_error_class = NULL, "
            "vector_next_attempt_at = NULL", {})
        args = {"worker": worker_id, "values": [{"id": str(page_id)}], "n": len(chunks)}

        def work(conn: sa.Connection) -> bool:
            rows = self._run(VECTOR_PAGE, sql, args, bubble=False, conn=conn)
            if not rows:
                return False
            if chunks:
                page = conn.exec_driver_sql(
                    """SELECT d.document_key, p.page_number FROM task_queue_page p
                       JOIN documents d ON d.id = p.document_id WHERE p.id = %(page)s""",
                    {"page": str(page_id)}).one()
                ids = _derived_chunk_ids(page.document_key, page.page_number, chunks)
                conn.exec_driver_sql(
                    """WITH c AS (
                           SELECT * FROM unnest(%(ids)s::text[], %(idx)s::int[], %(hashes)s::text[], %(texts)s::text[],
                                                %(tokens)s::int[]) AS c(chunk_id, chunk_index, content_hash, content,
                                                                        token_count)),
                       created AS (
                           INSERT INTO task_queue_chunk (page_id, document_id, chunk_id, chunk_index,
                                                         chunk_content_hash, token_count, priority, max_retries)
                           SELECT p.id, p.document_id, c.chunk_id, c.chunk_index, c.content_hash, c.token_count,
                                  p.priority, p.max_retries
                           FROM task_queue_page p, c
                           WHERE p.id = %(page)s
                           ON CONFLICT DO NOTHING
                           RETURNING id, chunk_index)
                       -- the text goes to its own table, written once (migration 0012)
                       INSERT INTO task_queue_chunk_text (chunk_task_id, content)
                       SELECT created.id, c.content FROM created JOIN c USING (chunk_index)
                       WHERE c.content IS NOT NULL""",
                    {"page": str(page_id), "ids": ids,
                     "idx": [c["chunk_index"] for c in chunks], "hashes": [c.get("content_hash") for c in chunks],
                     "texts": [clean_text(c.get("content"), 10**7) for c in chunks],
                     "tokens": [c.get("token_count") for c in chunks]})
            document_ids = [str(rows[0]["document_id"])]
            for phase in (Phase.VECTOR, Phase.GRAPHRAG):
                self._bubble(conn, phase, [str(page_id)], document_ids)
            return True

        return self._transaction(work)

    def fail(self, kind: TaskKind, worker_id: str, failures: Sequence[dict]) -> Transition:
        """Record failed attempts (fenced). Each failure: {id, error, error_class='error', retryable=True}.

        The retry count rises on every failed attempt; a retryable task with retries left is claimable again
        after the back-off; a non-retryable one (unreadable, encrypted, unsupported) never is, until an operator
        retries it."""
        return self.settle(kind, worker_id, failed=failures).failed

    def _fail_statement(self, kind: TaskKind, worker_id: str,
                        failures: Sequence[dict]) -> tuple[str, dict, list[str]] | None:
        ids = [str(f["id"]) for f in failures]
        if not ids:
            return None
        retries = kind.col("retry_count")
        set_sql = f"""{kind.status} = 'failed', {retries} = COALESCE(t.{retries}, 0) + 1,
                      {kind.col('error')} = v.err, {kind.col('error_class')} = v.cls,
                      {kind.col('next_attempt_at')} = CASE WHEN v.retryable
                          THEN now() + make_interval(secs => LEAST(($1->>'backoff_max')::float8,
                                          ($1->>'backoff_base')::float8 * power(2, COALESCE(t.{retries}, 0))))
                          ELSE '{NEVER}'::timestamptz END"""
        values = [{"id": str(f["id"]), "err": clean_text(str(f.get("error") or "unknown error")),
                   "cls": str(f.get("error_class") or "error")[:32], "retryable": bool(f.get("retryable", True))}
                  for f in failures]
        sql = self._fenced_sql(kind, set_sql, {"err": "text", "cls": "text", "retryable": "boolean"})
        return sql, {"worker": worker_id, "values": values, "backoff_base": self.settings.retry_backoff_base_s,
                     "backoff_max": self.settings.retry_backoff_max_s}, ids

    # ------------------------------------------------------------------ recovery
    def recover_stale(self, stale_after_s: float | None = None) -> dict[str, int]:
        """Release `processing` tasks whose heartbeat is older than the timeout, counting the lost attempt, so a
        task that keeps killing its worker ends `failed` instead of looping forever. Returns counts per kind."""
        stale_after_s = self.settings.stale_timeout_s if stale_after_s is None else stale_after_s
        where = "{hb} < now() - make_interval(secs => ($1->>'stale')::float8)"
        reason = ("'worker lost: heartbeat stale since ' || to_char({hb} AT TIME ZONE 'UTC', "
                  "'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') || ' (worker ' || COALESCE({worker}, '?') || ')'")
        return {kind.name: self._release(kind, where, reason, {"stale": stale_after_s}) for kind in ALL_KINDS}

    def release_workers(self, worker_ids: Iterable[str], reason: str = "worker lost: its run is no longer alive") -> dict[str, int]:
        """Release tasks held by workers known to be dead (e.g. their Dagster run ended), counting the attempt."""
        worker_ids = list(worker_ids)
        if not worker_ids:
            return {kind.name: 0 for kind in ALL_KINDS}
        return {kind.name: self._release(kind, "{worker} = ANY(ARRAY(SELECT jsonb_array_elements_text($1->'workers')))",
                                         "$1->>'reason'", {"workers": worker_ids, "reason": clean_text(reason)})
                for kind in ALL_KINDS}

    def _release(self, kind: TaskKind, where_template: str, reason_template: str, args: dict) -> int:
        names = {"hb": f"t.{kind.col('last_heartbeat')}", "worker": f"t.{kind.col('worker_id')}"}
        retries = kind.col("retry_count")
        gate = "AND t.pages_created_at IS NULL" if kind is OCR_DOCUMENT else ""
        sql = f"""
            WITH lost AS (
                SELECT t.id FROM {kind.table} t
                WHERE t.{kind.status} = 'processing' {gate} AND {where_template.format(**names)}
                ORDER BY t.id FOR UPDATE SKIP LOCKED
            )
            UPDATE {kind.table} t
            SET {retries} = COALESCE(t.{retries}, 0) + 1,
                {kind.status} = (CASE WHEN COALESCE(t.{retries}, 0) + 1 >= t.max_retries THEN 'failed'
                                      ELSE 'pending' END)::task_status,
                {kind.col('error')} = {reason_template.format(**names)},
                {kind.col('error_class')} = 'worker_lost',
                {kind.col('worker_id')} = NULL, {kind.col('started_at')} = NULL,
                {kind.col('last_heartbeat')} = NULL, updated_at = now()
            FROM lost WHERE t.id = lost.id
            RETURNING t.id{_parent_columns(kind)}"""
        return len(self._run(kind, sql, args))

    def retry_failed(self, phase: Phase | None = None, document_id: str | None = None) -> dict[str, int]:
        """Operator retry: failed tasks go back to pending with their retry counts reset."""
        counts = {}
        for kind in ALL_KINDS if phase is None else kinds_of_phase(phase):
            doc_filter = ""
            if document_id is not None:
                doc_filter = ("AND t.id = ($1->>'doc')::uuid" if kind is OCR_DOCUMENT
                              else "AND t.document_id = ($1->>'doc')::uuid")
            sql = f"""
                WITH failed AS (
                    SELECT t.id FROM {kind.table} t
                    WHERE t.{kind.status} = 'failed' AND ({kind.ready_sql}) {doc_filter}
                    ORDER BY t.id FOR UPDATE
                )
                UPDATE {kind.table} t SET {kind.status} = 'pending', {kind.col('retry_count')} = 0,
                       {kind.col('next_attempt_at')} = NULL, updated_at = now()
                FROM failed WHERE t.id = failed.id
                RETURNING t.id{_parent_columns(kind)}"""
            counts[kind.name] = len(self._run(kind, sql, {"doc": str(document_id) if document_id else None}))
        return counts

    # ------------------------------------------------------------------ bubble-up
    def _bubble(self, conn: sa.Connection, phase: Phase, page_ids: list[str] = (),
                document_ids: list[str] = ()) -> list[Correction]:
        """Recompute parents through docqueue_bubble() (migrations/0002): the one implementation of the rule's
        application, locking parents before reading their children."""
        if not page_ids and not document_ids:
            return []
        rows = conn.exec_driver_sql(
            "SELECT level, id, old_status, new_status FROM docqueue_bubble(%(phase)s, %(pages)s::uuid[], %(docs)s::uuid[])",
            {"phase": phase.value, "pages": sorted(page_ids), "docs": sorted(document_ids)}).all()
        return [Correction(r[0], str(r[1]), phase.value, r[2], r[3]) for r in rows]

    def _parents_out_of_line(self) -> dict[tuple[str, Phase], list[str]]:
        """Read-only: (level, phase) -> ids of parents whose status differs from the rule over their children."""
        found: dict[tuple[str, Phase], list[str]] = {}
        with self.engine.connect() as conn:
            for phase in (Phase.VECTOR, Phase.GRAPHRAG):
                col = f"{phase.value}_status"
                found[("page", phase)] = [str(r[0]) for r in conn.exec_driver_sql(
                    f"""SELECT p.id FROM task_queue_page p WHERE p.chunked_at IS NOT NULL
                        AND p.{col} IS DISTINCT FROM COALESCE(
                            (SELECT docqueue_rollup(c.{col}) FROM task_queue_chunk c WHERE c.page_id = p.id), 'completed')
                        ORDER BY p.id""").all()]
            for phase in Phase:
                doc_col, page_col = phase.document_status_column, f"{phase.value}_status"
                found[("document", phase)] = [str(r[0]) for r in conn.exec_driver_sql(
                    f"""SELECT d.id FROM documents d WHERE d.pages_created_at IS NOT NULL
                        AND EXISTS (SELECT 1 FROM task_queue_page pg WHERE pg.document_id = d.id)
                        AND d.{doc_col} IS DISTINCT FROM
                            (SELECT docqueue_rollup(pg.{page_col}) FROM task_queue_page pg WHERE pg.document_id = d.id)
                        ORDER BY d.id""").all()]
        return found

    def disagreeing_parents(self) -> dict[str, int]:
        """How many parents disagree with their children, per level and phase (0 everywhere when healthy)."""
        return {f"{level}_{phase.value}": len(ids) for (level, phase), ids in self._parents_out_of_line().items()}

    def reconcile(self, batch_size: int = 500) -> list[Correction]:
        """Recompute every parent from its children (the nightly job); returns what it corrected.

        Candidates are found by a read-only scan, then fixed through the same locked bubble-up as live
        transitions, in batches (pages before documents), so it is safe while workers run."""
        corrections: list[Correction] = []
        for level in ("page", "document"):
            for (found_level, phase), ids in self._parents_out_of_line().items():
                if found_level != level:
                    continue
                for start in range(0, len(ids), batch_size):
                    batch = ids[start:start + batch_size]
                    if level == "page":
                        corrections += self._transaction(lambda c, b=batch, ph=phase: self._bubble(c, ph, page_ids=b))
                    else:
                        corrections += self._transaction(lambda c, b=batch, ph=phase: self._bubble(c, ph, document_ids=b))
        return corrections

    def requeue(self, kind: TaskKind, ids: Sequence[str], reason: str) -> int:
        """Put tasks back to pending with fresh retries (repair after verification found their output missing).
        Requeuing a chunk's vector task also requeues its GraphRAG task: the later phase depends on it."""
        ids = [str(i) for i in ids]
        if not ids:
            return 0
        cascade = ""
        if kind is VECTOR_CHUNK:
            cascade = ", graphrag_status = 'pending', graphrag_retry_count = 0, graphrag_next_attempt_at = NULL"
        sql = f"""
            WITH target AS (
                SELECT t.id FROM {kind.table} t
                WHERE t.id = ANY(ARRAY(SELECT jsonb_array_elements_text($1->'ids'))::uuid[])
                  AND t.{kind.status} <> 'processing'
                ORDER BY t.id FOR UPDATE
            )
            UPDATE {kind.table} t SET {kind.status} = 'pending', {kind.col('retry_count')} = 0,
                   {kind.col('next_attempt_at')} = NULL, {kind.col('error')} = $1->>'reason',
                   {kind.col('error_class')} = 'requeued'{cascade}, updated_at = now()
            WHERE t.id = ANY(ARRAY(SELECT id FROM target))
            RETURNING t.id{_parent_columns(kind)}"""
        rows = self._run(kind, sql, {"ids": ids, "reason": clean_text(reason)})
        if kind is VECTOR_CHUNK and rows:
            self._transaction(lambda conn: self._bubble(
                conn, Phase.GRAPHRAG, sorted({r["page_id"] for r in rows}), sorted({r["document_id"] for r in rows})))
        return len(rows)

    def chunk_context(self, ids: Sequence[str]) -> dict[str, dict]:
        """What a chunk's outputs carry besides its text: document id/key/filename and page number."""
        if not ids:
            return {}
        with self.engine.connect() as conn:
            rows = conn.exec_driver_sql(
                """SELECT c.id::text AS id, c.document_id::text AS document_id, d.document_key, d.filename,
                          p.page_number, c.chunk_index, c.chunk_id, c.chunk_content_hash
                   FROM task_queue_chunk c JOIN documents d ON d.id = c.document_id
                   JOIN task_queue_page p ON p.id = c.page_id
                   WHERE c.id = ANY(%(ids)s::uuid[])""", {"ids": [str(i) for i in ids]}).mappings().all()
        return {r["id"]: dict(r) for r in rows}

    # ------------------------------------------------------------------ lookups
    def document(self, ref: str) -> dict | None:
        """A document by id, document key or content hash."""
        with self.engine.connect() as conn:
            row = conn.exec_driver_sql(
                """SELECT * FROM documents
                   WHERE document_key = %(r)s OR content_hash = %(r)s
                      OR (%(r)s ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' AND id::text = lower(%(r)s))
                   LIMIT 1""", {"r": ref}).mappings().first()
        return dict(row) if row else None

    def pages(self, document_id: str) -> list[dict]:
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.exec_driver_sql(
                "SELECT * FROM task_queue_page WHERE document_id = %(d)s ORDER BY page_number",
                {"d": str(document_id)}).mappings().all()]

    def chunks(self, *, document_id: str | None = None, page_id: str | None = None) -> list[dict]:
        clauses, params = [], {}
        if document_id is not None:
            clauses.append("c.document_id = %(d)s")
            params["d"] = str(document_id)
        if page_id is not None:
            clauses.append("c.page_id = %(p)s")
            params["p"] = str(page_id)
        where = ("WHERE " + " AND ".join(clauses)) if clauses else ""
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.exec_driver_sql(
                f"""SELECT c.*, x.content FROM task_queue_chunk c
                    LEFT JOIN task_queue_chunk_text x ON x.chunk_task_id = c.id
                    {where} ORDER BY c.document_id, c.page_id, c.chunk_index""",
                params).mappings().all()]

    def ready_counts(self) -> dict[str, int]:
        """How many tasks of each kind could be claimed right now (what sensors and --until-idle look at)."""
        with self.engine.connect() as conn:
            return {kind.name: int(conn.exec_driver_sql(
                f"SELECT count(*) FROM {kind.table} t WHERE {kind.claimable_sql('t')}").scalar())
                for kind in ALL_KINDS}


# ---------------------------------------------------------------------- helpers
def create_queue_engine(url: str, pool_size: int = 5, max_overflow: int = 5) -> sa.Engine:
    from .server import normalize_url

    # no pre-ping: it costs a round trip per checkout; a dead pooled connection raises on use instead, the
    # pool discards it, and the transition is retried on a fresh one (_is_transient)
    return sa.create_engine(normalize_url(url), pool_size=pool_size, max_overflow=max_overflow,
                            pool_pre_ping=False, pool_recycle=1800)


def _is_transient(exc: DBAPIError) -> bool:
    sqlstate = getattr(getattr(exc, "orig", None), "sqlstate", None)
    if sqlstate in _RETRYABLE_SQLSTATES:
        return True
    # a restarted server or a dropped connection: the pool discards the connection, a new one is tried
    return isinstance(exc, OperationalError) or bool(getattr(exc, "connection_invalidated", False))


def _derived_chunk_ids(document_key: str, page_number: int, chunks: Sequence[dict]) -> list[str]:
    ids = [chunk_id(document_key, page_number, c["chunk_index"], c.get("content_hash")) for c in chunks]
    for given, derived in zip((c.get("chunk_id") for c in chunks), ids):
        if given is not None and given != derived:
            raise ValueError(f"chunk_id {given!r} is not this chunk's derived id {derived!r} "
                             "(queue_db.keys.chunk_id: document key, page number, chunk index, content hash)")
    return ids


def _parent_columns(kind: TaskKind) -> str:
    cols = {Level.DOCUMENT: "", Level.PAGE: ", t.document_id", Level.CHUNK: ", t.page_id, t.document_id"}
    return cols[kind.level]


def _outcome(requested: list[str], rows: list[dict]) -> Transition:
    applied = [str(r["id"]) for r in rows]
    applied_set = set(applied)
    return Transition(applied, [i for i in requested if i not in applied_set])
