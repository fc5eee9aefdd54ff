"""The queue's transitions: claims, heartbeats, fenced completions and failures, expansion into
child tasks, and the bubble-up that runs in the same transaction as each of them."""

from __future__ import annotations

import json
import os
import socket
import uuid
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import psycopg
import psycopg.rows
import psycopg.types.json
import psycopg.types.string

from .chunk_rows import insert_chunk_rows
from .claim_cursor import ClaimCursors, claim_sql
from .phases import NEVER, OCR_DOCUMENT, VECTOR_PAGE, Level, PhaseSpec, TaskKind
from .registration import Registration
from .rollup_sql import GENERIC_PLANS, after_transition, lock_sql, recount_sql
from .text import clean_text
from .transactions import with_named_argument, with_retries

if TYPE_CHECKING:
    import sqlalchemy as sa


@dataclass(frozen=True)
class Transition:
    """What a fenced transition did: ids it applied to and ids it refused (lost ownership)."""

    applied: list[str]
    rejected: list[str]


@dataclass(frozen=True)
class Settlement:
    """What Transitions.settle did: its completions, its failures, and the rows it claimed next."""

    completed: Transition
    failed: Transition
    claimed: list[dict]


@dataclass(frozen=True)
class Correction:
    """A parent whose status bubble-up changed: level, id, phase, old and new status."""

    level: str
    id: str
    phase: str
    old: str | None
    new: str


def make_worker_id(label: str = "worker") -> str:
    """Unique per worker instance: a recovered-and-reclaimed task never has the same owner twice."""
    return f"{label}:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"[-100:]


class Transitions(Registration):
    """Claims, heartbeats, fenced completions and failures, expansion into child tasks, and bubble-up."""

    def _run(
        self,
        kind: TaskKind | None,
        statement: str,
        args: dict,
        *,
        bubble: bool = True,
        conn: sa.Connection | None = None,
    ) -> list[dict]:
        """Run one data-modifying statement ($1 = `args` as jsonb) and bubble the parents it returns (page_id,
        document_id) up, in one transaction: inside `conn` when given, else a transaction of its own."""
        phase = kind.phase if (bubble and kind is not None and kind.level is not Level.DOCUMENT) else None
        sql = statement.replace("%", "%%").replace("$1", "%(args)s::jsonb")

        def work(c: sa.Connection) -> list[dict]:
            rows = [dict(r) for r in c.exec_driver_sql(sql, {"args": json.dumps(args)}).mappings()]
            for row in rows:
                for column in ("id", "page_id", "document_id"):
                    if row.get(column) is not None:
                        row[column] = str(row[column])
            if phase is not None and rows:
                self._bubble(
                    c,
                    phase,
                    sorted({r["page_id"] for r in rows if r.get("page_id")}),
                    sorted({r["document_id"] for r in rows if r.get("document_id")}),
                )
            return rows

        if conn is not None:
            return work(conn)
        # one statement without a bubble-up is a transaction by itself
        return self._transaction(work) if phase is not None else self._autocommit(work)

    def _pipelined(
        self,
        kind: TaskKind,
        worker_id: str,
        statements: Sequence[tuple[str, dict, bool]],
        settled: Sequence[str] | None,
    ) -> list[list[dict]]:
        """The hot path (claim, complete, fail, settle): BEGIN, each transition as a prepared statement (its plan is
        cached, unlike dynamic SQL), one bubble-up pass for all of them (rollup_sql.after_transition, prepared
        too), COMMIT, sent as one pipelined batch with a single sync at its end: one round trip. `settled` are the
        rows completed or failed; rows claimed are found by the bubble-up (worker and heartbeat = now()). Returns
        each statement's rows.

        BEGIN and COMMIT are written out on an autocommit connection rather than left to psycopg's transaction(),
        which syncs after BEGIN and again before COMMIT: two more round trips, and the parents the bubble-up locked
        stayed locked while the server waited for the worker to read the results and send the COMMIT. Every other
        transaction settling a sibling waited behind that wait.

        A statement marked generic runs on its generic plan (planned once per connection): the claim after the
        cursor, whose two laps took longer to plan, each time, than to run."""
        prepared = [(with_named_argument(sql), *rest) for sql, *rest in statements]
        bubble_args = {"worker": worker_id, "ids": list(settled) if settled else None}
        bubble = [(sql, bubble_args if "%(" in sql else None) for sql in after_transition(kind)]

        def attempt() -> list[list[dict]]:
            raw = self.engine.raw_connection()
            pg = raw.driver_connection
            assert pg is not None, "a connection checked out of the pool holds its driver connection"
            autocommit = pg.autocommit
            try:
                pg.autocommit = True
                with pg.pipeline() as pipeline:
                    pg.execute("BEGIN")
                    cursors = []
                    for sql, args, generic in prepared:
                        if generic:  # transaction-local: the statements after it run on generic plans too
                            pg.execute(GENERIC_PLANS, prepare=True)
                        cursor = pg.cursor(row_factory=psycopg.rows.dict_row)
                        # ids leave the queue as strings; loading them as text skips a uuid.UUID per value
                        cursor.adapters.register_loader("uuid", psycopg.types.string.TextLoader)
                        cursor.execute(sql, {"args": psycopg.types.json.Jsonb(args)}, prepare=True)
                        cursors.append(cursor)
                    for sql, params in bubble:
                        pg.execute(sql, params, prepare=True)
                    pg.execute("COMMIT")
                    pipeline.sync()
                results = [cursor.fetchall() for cursor in cursors]
                pg.autocommit = autocommit
            except psycopg.Error as exc:
                # a broken connection must not go back to the pool; a failed one goes back rolled back, as it was
                if pg.closed or isinstance(exc, psycopg.OperationalError) or not _restored(pg, autocommit):
                    raw.invalidate()
                else:
                    raw.close()
                raise
            except BaseException:
                raw.invalidate()  # its autocommit and transaction are unknown: it is not reused
                raise
            raw.close()
            return results

        return with_retries(attempt)

    def claim_sql(
        self, kind: TaskKind, *, only_ids: bool = False, override_retry_limit: bool = False, after: bool = False
    ) -> str:
        """The claim statement of `kind` (claim_cursor.claim_sql). Public so the EXPLAIN tests check it."""
        return claim_sql(kind, only_ids=only_ids, override_retry_limit=override_retry_limit, after=after)

    def claim(
        self,
        kind: TaskKind,
        worker_id: str,
        limit: int = 1,
        *,
        only_ids: Sequence[str] | None = None,
        override_retry_limit: bool = False,
    ) -> list[dict]:
        """Claim up to `limit` ready tasks of `kind` for `worker_id` and bubble `processing` up, atomically.

        `only_ids` restricts the claim to those rows (a Dagster partition range). `override_retry_limit` also
        takes failed rows whose retries are exhausted or whose back-off has not elapsed: a manual backfill.
        """
        cursors, rescan_s = self._claim_cursors, self.settings.claim_rescan_s
        statement = cursors.statement(kind, worker_id, limit, only_ids, override_retry_limit, rescan_s)
        if not statement:
            return []
        sent = [(statement.sql, statement.args, statement.after)]
        return cursors.claimed(kind, statement, self._pipelined(kind, worker_id, sent, None)[0])

    @cached_property
    def _claim_cursors(self) -> ClaimCursors:
        """This queue object's claim cursors (its process's, as a worker holds one queue object)."""
        return ClaimCursors()

    def heartbeat(self, kind: TaskKind, worker_id: str, ids: Iterable[str]) -> set[str]:
        """Refresh the heartbeat of tasks still owned by `worker_id`; returns the ids still owned."""
        ids = [str(i) for i in ids]
        if not ids:
            return set()
        sql = f"""
            WITH mine AS (
                SELECT id FROM {kind.table}
                WHERE id = ANY(ARRAY(SELECT jsonb_array_elements_text($1->'ids'))::uuid[])
                  AND {fence_sql(kind, kind.table)}
                ORDER BY id FOR UPDATE
            )
            UPDATE {kind.table} t SET {kind.col("last_heartbeat")} = now()
            FROM mine WHERE t.id = mine.id RETURNING t.id"""
        return {r["id"] for r in self._run(kind, sql, {"ids": ids, "worker": worker_id}, bubble=False)}

    def _fenced_sql(self, kind: TaskKind, set_sql: str, value_columns: dict[str, str]) -> str:
        """Update only rows still `processing` by $1.worker; $1.values carries per-row data.

        The fence is in the UPDATE's own WHERE: READ COMMITTED re-checks it on the newest row version when a
        concurrent writer (recovery, a new owner) got there first, so no separate FOR UPDATE pass is needed. The
        values are sorted by id and are the outer side of the join, so rows are updated in id order, the order
        heartbeat() locks them in; should a plan ever take another order, the deadlock is transient and the whole
        transaction is retried (transactions.with_retries)."""
        record = ", ".join(["id uuid", *(f"{c} {t}" for c, t in value_columns.items())])
        return f"""
            UPDATE {kind.table} t SET {set_sql}, updated_at = now()
            FROM (SELECT * FROM jsonb_to_recordset($1->'values') AS v({record}) ORDER BY v.id) v
            WHERE t.id = v.id AND {fence_sql(kind, "t")}
              -- the ids as one array probe the primary key in one index scan (not one scan per row)
              AND t.id = ANY(ARRAY(SELECT x.id FROM jsonb_to_recordset($1->'values') AS x(id uuid)))
            RETURNING t.id{parent_columns(kind)}"""

    def complete(self, kind: TaskKind, worker_id: str, results: Sequence[dict] | Sequence[str]) -> Transition:
        """Mark tasks completed (fenced) and bubble up. `results` are ids or dicts {id, <result columns>}."""
        return self.settle(kind, worker_id, completed=results).completed

    def settle(
        self,
        kind: TaskKind,
        worker_id: str,
        *,
        completed: Sequence[dict] | Sequence[str] | None = None,
        failed: Sequence[dict] = (),
        claim: int = 0,
        only_ids: Sequence[str] | None = None,
        override_retry_limit: bool = False,
    ) -> Settlement:
        """Complete and fail a batch (both fenced) and claim up to `claim` next tasks (as `claim()` would), in one
        transaction with one bubble-up pass: what a worker loop sends between two batches, in one round trip."""
        complete = self._complete_statement(kind, worker_id, completed)
        fail = self._fail_statement(kind, worker_id, failed)
        # a task failed here may be claimable at once (no back-off): it sorts first, so the next claim starts at the
        # head, this settle's or a later one
        cursors, rescan_s = self._claim_cursors, self.settings.claim_rescan_s
        next_claim = cursors.statement(kind, worker_id, claim, only_ids, override_retry_limit, rescan_s, bool(fail))
        if fail and next_claim is None:
            cursors.drop(kind)
        statements = [(s[0], s[1], False) for s in (complete, fail) if s is not None]
        if next_claim is not None:
            statements.append((next_claim.sql, next_claim.args, next_claim.after))
        settled = [i for s in (complete, fail) if s is not None for i in s[2]]
        if not statements:
            return Settlement(Transition([], []), Transition([], []), [])
        results = iter(self._pipelined(kind, worker_id, statements, settled))
        return Settlement(
            _outcome(complete[2], next(results)) if complete else Transition([], []),
            _outcome(fail[2], next(results)) if fail else Transition([], []),
            cursors.claimed(kind, next_claim, next(results)) if next_claim else [],
        )

    def _complete_statement(
        self, kind: TaskKind, worker_id: str, results: Sequence[dict] | Sequence[str] | None
    ) -> tuple[str, dict, list[str]] | None:
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
        set_sql = ", ".join(
            [
                f"{kind.status} = 'completed'",
                f"{kind.col('completed_at')} = now()",
                f"{kind.col('error')} = NULL",
                f"{kind.col('error_class')} = NULL",
                f"{kind.col('next_attempt_at')} = NULL",
                *(f"{c} = v.{c}" for c in columns),
            ]
        )
        values = [
            {"id": str(r["id"]), **{c: (clean_text(r[c]) if isinstance(r.get(c), str) else r.get(c)) for c in columns}}
            for r in results
        ]
        return self._fenced_sql(kind, set_sql, columns), {"worker": worker_id, "values": values}, ids

    def complete_document_expansion(
        self,
        worker_id: str,
        document_id: str,
        *,
        page_count: int,
        encrypted: bool = False,
        metadata: dict | None = None,
    ) -> bool:
        """Create the document's page tasks (fenced on the expansion claim). A document with zero pages fails:
        nothing can be indexed from it, and calling it complete would hide a broken file."""
        sql = self._fenced_sql(
            OCR_DOCUMENT,
            "pages_created_at = now(), page_count = ($1->>'pages')::int, encrypted = ($1->>'encrypted')::boolean, "
            "metadata = t.metadata || ($1->'metadata'), ocr_error = NULL, ocr_error_class = NULL, "
            "next_attempt_at = NULL, extraction_skipped = false",
            {},
        )
        args = {
            "worker": worker_id,
            "values": [{"id": str(document_id)}],
            "pages": page_count,
            "encrypted": encrypted,
            "metadata": metadata or {},
        }

        def work(conn: sa.Connection) -> bool:
            if not self._run(OCR_DOCUMENT, sql, args, bubble=False, conn=conn):
                return False
            if page_count <= 0:
                conn.exec_driver_sql(
                    f"""UPDATE documents SET ocr_status = 'failed', ocr_error = 'empty: document has no pages',
                              ocr_error_class = 'empty', next_attempt_at = '{NEVER}', updated_at = now()
                       WHERE id = %(id)s""",
                    {"id": str(document_id)},
                )
                return True
            conn.exec_driver_sql(
                """INSERT INTO task_queue_page (document_id, page_number, priority, max_retries)
                   SELECT d.id, n, d.priority, d.max_retries FROM documents d, generate_series(1, %(n)s) n
                   WHERE d.id = %(id)s
                   ON CONFLICT (document_id, page_number) DO NOTHING""",
                {"id": str(document_id), "n": page_count},
            )
            self._bubble(conn, self.phases.phases, document_ids=[str(document_id)])
            return True

        return self._transaction(work)

    def complete_chunking(self, worker_id: str, page_id: str, chunks: Sequence[dict]) -> bool:
        """Create the chunk tasks of one page (complete_chunkings)."""
        return str(page_id) in self.complete_chunkings(worker_id, {str(page_id): chunks})

    def complete_chunkings(self, worker_id: str, pages: Mapping[str, Sequence[dict]]) -> set[str]:
        """Create the chunk tasks of pages (page id -> chunk dicts: chunk_index, content_hash, content, token_count),
        each page fenced on its vector claim, in one transaction with one bubble-up; returns the pages accepted. A
        page with no chunks is complete in both later phases.

        The queue derives each chunk_id (keys.chunk_id: document key, page number, chunk index, content hash), which
        makes ids unique by construction; a chunk dict may carry its chunk_id, and one that differs is refused
        (ValueError, nothing written) rather than stored under an id another row could also have."""
        sql = self._fenced_sql(
            VECTOR_PAGE,
            "chunked_at = now(), chunk_count = v.n, embedding_skipped = (v.n = 0), "
            "vector_error = NULL, vector_error_class = NULL, vector_next_attempt_at = NULL",
            {"n": "integer"},
        )
        args = {"worker": worker_id, "values": [{"id": str(p), "n": len(chunks)} for p, chunks in pages.items()]}

        def work(conn: sa.Connection) -> set[str]:
            rows = self._run(VECTOR_PAGE, sql, args, bubble=False, conn=conn) if pages else []
            accepted = {str(r["id"]) for r in rows}
            insert_chunk_rows(conn, {str(p): chunks for p, chunks in pages.items() if str(p) in accepted})
            if rows:
                documents = sorted({str(r["document_id"]) for r in rows})
                self._bubble(conn, self.phases.phases, sorted(accepted), documents)
            return accepted

        return self._transaction(work)

    def fail(self, kind: TaskKind, worker_id: str, failures: Sequence[dict]) -> Transition:
        """Record failed attempts (fenced). Each failure: {id, error, error_class='error', retryable=True}.

        The retry count rises on every failed attempt; a retryable task with retries left is claimable again
        after the back-off; a non-retryable one (unreadable, encrypted, unsupported) never is, until an operator
        retries it."""
        return self.settle(kind, worker_id, failed=failures).failed

    def _fail_statement(
        self, kind: TaskKind, worker_id: str, failures: Sequence[dict]
    ) -> tuple[str, dict, list[str]] | None:
        ids = [str(f["id"]) for f in failures]
        if not ids:
            return None
        retries = kind.col("retry_count")
        set_sql = f"""{kind.status} = 'failed', {retries} = COALESCE(t.{retries}, 0) + 1,
                      {kind.col("failed_at")} = now(),
                      {kind.col("error")} = v.err, {kind.col("error_class")} = v.cls,
                      {kind.col("next_attempt_at")} = CASE WHEN v.retryable
                          THEN {self.phases.retry_policy(kind).next_attempt_sql(f"COALESCE(t.{retries}, 0)")}
                          ELSE '{NEVER}'::timestamptz END"""
        values = [
            {
                "id": str(f["id"]),
                "err": clean_text(str(f.get("error") or "unknown error")),
                "cls": str(f.get("error_class") or "error")[:32],
                "retryable": bool(f.get("retryable", True)),
            }
            for f in failures
        ]
        sql = self._fenced_sql(kind, set_sql, {"err": "text", "cls": "text", "retryable": "boolean"})
        return sql, {"worker": worker_id, "values": values}, ids

    def _bubble(
        self,
        conn: sa.Connection,
        phases: PhaseSpec | Sequence[PhaseSpec],
        page_ids: Sequence[str] = (),
        document_ids: Sequence[str] = (),
    ) -> list[Correction]:
        """Recompute the roll-ups of `phases` on these pages, then on these documents (rollup_sql.recount_sql: the
        one implementation of the rule's application), locking each level's parents in id order, once for all
        the phases, before reading their children."""
        phases = (phases,) if isinstance(phases, PhaseSpec) else tuple(phases)
        corrections = []
        for level, ids in ((Level.PAGE, page_ids), (Level.DOCUMENT, document_ids)):
            rolled_up = [phase for phase in phases if level in phase.rollup_levels]
            if not ids or not rolled_up:
                continue
            params = {"ids": sorted(str(i) for i in ids)}
            conn.exec_driver_sql(lock_sql(level, "%(ids)s::uuid[]"), params)
            for phase in rolled_up:
                rows = conn.exec_driver_sql(recount_sql(phase, level, "%(ids)s::uuid[]"), params).all()
                corrections += [Correction(r[0], str(r[1]), phase.value, r[2], r[3]) for r in rows]
        return corrections


def fence_sql(kind: TaskKind, alias: str) -> str:
    """Over `alias`: the row is still `processing` by $1.worker. The status test is written IS NOT DISTINCT FROM
    (the same, for a column that is never NULL) so that the planner cannot prove from it the predicate of the
    kind's heartbeat index (status = 'processing') and answer the fence from that index: it thinks the index small,
    but while a session holds an old snapshot it keeps an entry for every task held since, none of which can be
    marked dead, and a scan of it walks them all, on every completion and heartbeat. The ids probe the primary key."""
    status, worker = f"{alias}.{kind.status}", f"{alias}.{kind.col('worker_id')}"
    return f"{status} IS NOT DISTINCT FROM 'processing' AND {worker} = $1->>'worker'"


def parent_columns(kind: TaskKind) -> str:
    cols = {Level.DOCUMENT: "", Level.PAGE: ", t.document_id", Level.CHUNK: ", t.page_id, t.document_id"}
    return cols[kind.level]


def _restored(pg: psycopg.Connection, autocommit: bool) -> bool:
    """Roll back what a failed pipelined batch left open (an error inside BEGIN ... COMMIT leaves the transaction
    aborted until a ROLLBACK) and put the connection's autocommit back; False when that fails too."""
    try:
        if pg.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            pg.rollback()
        pg.autocommit = autocommit
        return True
    except psycopg.Error:
        return False


def _outcome(requested: list[str], rows: list[dict]) -> Transition:
    applied = [str(r["id"]) for r in rows]
    applied_set = set(applied)
    return Transition(applied, [i for i in requested if i not in applied_set])
