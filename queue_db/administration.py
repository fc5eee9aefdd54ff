"""Administration of the queue: stale recovery, releasing dead workers' tasks, operator retries, re-queuing
repairs and reconciliation of every parent with its children."""

from __future__ import annotations

from functools import partial
from typing import Iterable, Sequence

from .phases import EXPANDED_SQL, TABLE_OF_LEVEL, Level, PhaseSpec, TaskKind
from .registration import apply_priority, check_priority
from .rollup_sql import child_column
from .text import clean_text
from .transitions import Correction, Transitions, parent_columns


class Administration(Transitions):
    def recover_stale(self, stale_after_s: float | None = None) -> dict[str, int]:
        """Release `processing` tasks whose heartbeat is older than the timeout, counting the lost attempt, so a
        task that keeps killing its worker ends `failed` instead of looping forever. Returns counts per kind."""
        stale_after_s = self.settings.stale_timeout_s if stale_after_s is None else stale_after_s
        where = "{hb} < now() - make_interval(secs => ($1->>'stale')::float8)"
        reason = (
            "'worker lost: heartbeat stale since ' || to_char({hb} AT TIME ZONE 'UTC', "
            "'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') || ' (worker ' || COALESCE({worker}, '?') || ')'"
        )
        return {kind.name: self._release(kind, where, reason, {"stale": stale_after_s}) for kind in self.phases.kinds}

    def release_workers(
        self, worker_ids: Iterable[str], reason: str = "worker lost: its run is no longer alive"
    ) -> dict[str, int]:
        """Release tasks held by workers known to be dead (e.g. their Dagster run ended), counting the attempt."""
        worker_ids = list(worker_ids)
        if not worker_ids:
            return {kind.name: 0 for kind in self.phases.kinds}
        return {
            kind.name: self._release(
                kind,
                "{worker} = ANY(ARRAY(SELECT jsonb_array_elements_text($1->'workers')))",
                "$1->>'reason'",
                {"workers": worker_ids, "reason": clean_text(reason)},
            )
            for kind in self.phases.kinds
        }

    def _release(self, kind: TaskKind, where_template: str, reason_template: str, args: dict) -> int:
        names = {"hb": f"t.{kind.col('last_heartbeat')}", "worker": f"t.{kind.col('worker_id')}"}
        retries = kind.col("retry_count")
        sql = f"""
            WITH lost AS (
                SELECT t.id FROM {kind.table} t
                WHERE {kind.held_sql("t")} AND {where_template.format(**names)}
                ORDER BY t.id FOR UPDATE SKIP LOCKED
            )
            UPDATE {kind.table} t
            SET {retries} = COALESCE(t.{retries}, 0) + 1,
                {kind.status} = (CASE WHEN COALESCE(t.{retries}, 0) + 1 >= {kind.max_retries_sql("t")} THEN 'failed'
                                      ELSE 'pending' END)::task_status,
                {kind.col("error")} = {reason_template.format(**names)},
                {kind.col("error_class")} = 'worker_lost', {kind.col("failed_at")} = now(),
                {kind.col("worker_id")} = NULL, {kind.col("started_at")} = NULL,
                {kind.col("last_heartbeat")} = NULL, updated_at = now()
            FROM lost WHERE t.id = lost.id
            RETURNING t.id{parent_columns(kind)}"""
        return len(self._run(kind, sql, args))

    def retry_failed(self, phase: PhaseSpec | None = None, document_id: str | None = None) -> dict[str, int]:
        """Operator retry: failed tasks go back to pending with their retry counts reset."""
        counts = {}
        for kind in self.phases.kinds if phase is None else self.phases.phase(phase.name).kinds:
            doc_filter = f"AND t.{kind.document_column} = ($1->>'doc')::uuid" if document_id is not None else ""
            sql = f"""
                WITH failed AS (
                    SELECT t.id FROM {kind.table} t
                    WHERE t.{kind.status} = 'failed' AND ({kind.owns("t")}) {doc_filter}
                    ORDER BY t.id FOR UPDATE
                )
                UPDATE {kind.table} t SET {kind.status} = 'pending', {kind.col("retry_count")} = 0,
                       {kind.col("next_attempt_at")} = NULL, updated_at = now()
                FROM failed WHERE t.id = failed.id
                RETURNING t.id{parent_columns(kind)}"""
            counts[kind.name] = len(self._run(kind, sql, {"doc": str(document_id) if document_id else None}))
        return counts

    def requeue(self, kind: TaskKind, ids: Sequence[str], reason: str) -> int:
        """Put tasks back to pending with fresh retries (repair after verification found their output missing).
        Requeuing a chunk's vector task also requeues its GraphRAG task: the later phase depends on it."""
        ids = [str(i) for i in ids]
        if not ids:
            return 0
        # the kinds of the same row that wait on this one, directly or through each other, start again too
        later = self._dependents(kind)
        cascade = "".join(
            f", {k.status} = 'pending', {k.col('retry_count')} = 0, {k.col('next_attempt_at')} = NULL" for k in later
        )
        sql = f"""
            WITH target AS (
                SELECT t.id FROM {kind.table} t
                WHERE t.id = ANY(ARRAY(SELECT jsonb_array_elements_text($1->'ids'))::uuid[])
                  AND t.{kind.status} <> 'processing' AND ({kind.owns("t")})
                ORDER BY t.id FOR UPDATE
            )
            UPDATE {kind.table} t SET {kind.status} = 'pending', {kind.col("retry_count")} = 0,
                   {kind.col("next_attempt_at")} = NULL, {kind.col("error")} = $1->>'reason',
                   {kind.col("error_class")} = 'requeued'{cascade}, updated_at = now()
            WHERE t.id = ANY(ARRAY(SELECT id FROM target))
            RETURNING t.id{parent_columns(kind)}"""
        rows = self._run(kind, sql, {"ids": ids, "reason": clean_text(reason)})
        if rows:
            page_ids = sorted({r["page_id"] for r in rows if r.get("page_id")})
            document_ids = sorted({r["document_id"] for r in rows if r.get("document_id")})
            for phase in dict.fromkeys(k.phase for k in later):
                self._transaction(partial(self._bubble, phases=phase, page_ids=page_ids, document_ids=document_ids))
        return len(rows)

    def _dependents(self, kind: TaskKind) -> list[TaskKind]:
        """The chunk kinds whose tasks on the same row wait on `kind`'s, directly or through each other. A page's
        later task is left alone: once it has chunked, its status is its chunks' roll-up, not a task's."""
        later: list[TaskKind] = []
        for other in self.phases.kinds:
            if (
                other.level is Level.CHUNK
                and other.depends_on is not None
                and (other.depends_on is kind or other.depends_on in later)
            ):
                later.append(other)
        return later

    def _parents_out_of_line(
        self, document_ids: Sequence[str] | None = None, phases: Sequence[PhaseSpec] | None = None
    ) -> dict[tuple[str, PhaseSpec], list[str]]:
        """Read-only: (level, phase) -> ids of parents whose status differs from the rule over their children;
        `document_ids`: of these documents and their pages only (through their primary key and page index), so the
        cost is theirs, not the corpus's; `phases`: of these phases only."""
        found: dict[tuple[str, PhaseSpec], list[str]] = {}
        # without a scope the statement goes without parameters, as before (no placeholder to fill)
        scope = None if document_ids is None else {"ids": list(document_ids)}
        with self.engine.connect() as conn:
            for level in (Level.PAGE, Level.DOCUMENT):
                table, child = TABLE_OF_LEVEL[level], {Level.PAGE: Level.CHUNK, Level.DOCUMENT: Level.PAGE}[level]
                fk = "page_id" if level is Level.PAGE else "document_id"
                expanded = EXPANDED_SQL[level].replace("t.", "p.")
                only = (
                    ""
                    if document_ids is None
                    else f"AND p.{'document_id' if level is Level.PAGE else 'id'} = ANY(%(ids)s::uuid[])"
                )
                for phase in self.phases:
                    if level not in phase.rollup_levels or (phases is not None and phase not in phases):
                        continue
                    col, child_col = phase.rollup_column(level, "status"), child_column(phase, child, "status")
                    rollup = (
                        f"(SELECT docqueue_rollup(c.{child_col}) FROM {TABLE_OF_LEVEL[child]} c WHERE c.{fk} = p.id)"
                    )
                    # a page with no chunks is complete; a document with no pages keeps its expansion's status
                    expected = f"COALESCE({rollup}, 'completed')" if level is Level.PAGE else rollup
                    present = (
                        ""
                        if level is Level.PAGE
                        else f"AND EXISTS (SELECT 1 FROM {TABLE_OF_LEVEL[child]} c WHERE c.{fk} = p.id)"
                    )
                    found[(level.value, phase)] = [
                        str(r[0])
                        for r in conn.exec_driver_sql(
                            f"""SELECT p.id FROM {table} p WHERE {expanded} {present} {only}
                            AND p.{col} IS DISTINCT FROM {expected} ORDER BY p.id""",
                            scope,
                        ).all()
                    ]
        return found

    def disagreeing_parents(
        self, document_ids: Sequence[str] | None = None, phases: Sequence[PhaseSpec] | None = None
    ) -> dict[str, int]:
        """How many parents disagree with their children, per level and phase (0 everywhere when healthy);
        `document_ids`, `phases`: among these documents (and their pages) and phases only."""
        out_of_line = self._parents_out_of_line(document_ids, phases)
        return {f"{level}_{phase.value}": len(ids) for (level, phase), ids in out_of_line.items()}

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
                    batch = ids[start : start + batch_size]
                    if level == "page":
                        corrections += self._transaction(partial(self._bubble, phases=phase, page_ids=batch))
                    else:
                        corrections += self._transaction(partial(self._bubble, phases=phase, document_ids=batch))
        return corrections

    def set_priority(self, document_id: str, priority: int) -> dict[str, int]:
        """Give a document and its unfinished pages and chunks a new priority (0-10): claims take higher first.
        Finished tasks keep theirs; returns how many rows of each level changed."""
        check_priority(priority)
        return self._transaction(lambda conn: apply_priority(conn, str(document_id), priority, self.phases.kinds))
