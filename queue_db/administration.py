"""Administration of the queue: stale recovery, releasing dead workers' tasks, operator retries, re-queuing
repairs and reconciliation of every parent with its children."""
from __future__ import annotations

from typing import Iterable, Sequence

from .phases import ALL_KINDS, OCR_DOCUMENT, VECTOR_CHUNK, VECTOR_PAGE, Phase, TaskKind, kinds_of_phase
from .text import clean_text
from .transitions import Correction, Transitions, apply_priority, check_priority, parent_columns


class Administration(Transitions):
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
        sql = f"""
            WITH lost AS (
                SELECT t.id FROM {kind.table} t
                WHERE {kind.held_sql('t')} AND {where_template.format(**names)}
                ORDER BY t.id FOR UPDATE SKIP LOCKED
            )
            UPDATE {kind.table} t
            SET {retries} = COALESCE(t.{retries}, 0) + 1,
                {kind.status} = (CASE WHEN COALESCE(t.{retries}, 0) + 1 >= t.max_retries THEN 'failed'
                                      ELSE 'pending' END)::task_status,
                {kind.col('error')} = {reason_template.format(**names)},
                {kind.col('error_class')} = 'worker_lost', {kind.col('failed_at')} = now(),
                {kind.col('worker_id')} = NULL, {kind.col('started_at')} = NULL,
                {kind.col('last_heartbeat')} = NULL, updated_at = now()
            FROM lost WHERE t.id = lost.id
            RETURNING t.id{parent_columns(kind)}"""
        return len(self._run(kind, sql, args))

    def retry_failed(self, phase: Phase | None = None, document_id: str | None = None) -> dict[str, int]:
        """Operator retry: failed tasks go back to pending with their retry counts reset."""
        counts = {}
        for kind in ALL_KINDS if phase is None else kinds_of_phase(phase):
            doc_filter = f"AND t.{kind.document_column} = ($1->>'doc')::uuid" if document_id is not None else ""
            sql = f"""
                WITH failed AS (
                    SELECT t.id FROM {kind.table} t
                    WHERE t.{kind.status} = 'failed' AND ({kind.owns('t')}) {doc_filter}
                    ORDER BY t.id FOR UPDATE
                )
                UPDATE {kind.table} t SET {kind.status} = 'pending', {kind.col('retry_count')} = 0,
                       {kind.col('next_attempt_at')} = NULL, updated_at = now()
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
        cascade = ""
        if kind is VECTOR_CHUNK:
            cascade = ", graphrag_status = 'pending', graphrag_retry_count = 0, graphrag_next_attempt_at = NULL"
        sql = f"""
            WITH target AS (
                SELECT t.id FROM {kind.table} t
                WHERE t.id = ANY(ARRAY(SELECT jsonb_array_elements_text($1->'ids'))::uuid[])
                  AND t.{kind.status} <> 'processing' AND ({kind.owns('t')})
                ORDER BY t.id FOR UPDATE
            )
            UPDATE {kind.table} t SET {kind.status} = 'pending', {kind.col('retry_count')} = 0,
                   {kind.col('next_attempt_at')} = NULL, {kind.col('error')} = $1->>'reason',
                   {kind.col('error_class')} = 'requeued'{cascade}, updated_at = now()
            WHERE t.id = ANY(ARRAY(SELECT id FROM target))
            RETURNING t.id{parent_columns(kind)}"""
        rows = self._run(kind, sql, {"ids": ids, "reason": clean_text(reason)})
        if kind is VECTOR_CHUNK and rows:
            self._transaction(lambda conn: self._bubble(
                conn, Phase.GRAPHRAG, sorted({r["page_id"] for r in rows}), sorted({r["document_id"] for r in rows})))
        return len(rows)

    def _parents_out_of_line(self) -> dict[tuple[str, Phase], list[str]]:
        """Read-only: (level, phase) -> ids of parents whose status differs from the rule over their children."""
        found: dict[tuple[str, Phase], list[str]] = {}
        with self.engine.connect() as conn:
            for phase in (Phase.VECTOR, Phase.GRAPHRAG):
                col = f"{phase.value}_status"
                found[("page", phase)] = [str(r[0]) for r in conn.exec_driver_sql(
                    f"""SELECT p.id FROM task_queue_page p WHERE NOT ({VECTOR_PAGE.owns('p')})
                        AND p.{col} IS DISTINCT FROM COALESCE(
                            (SELECT docqueue_rollup(c.{col}) FROM task_queue_chunk c WHERE c.page_id = p.id), 'completed')
                        ORDER BY p.id""").all()]
            for phase in Phase:
                doc_col, page_col = phase.document_status_column, f"{phase.value}_status"
                found[("document", phase)] = [str(r[0]) for r in conn.exec_driver_sql(
                    f"""SELECT d.id FROM documents d WHERE NOT ({OCR_DOCUMENT.owns('d')})
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

    def set_priority(self, document_id: str, priority: int) -> dict[str, int]:
        """Give a document and its unfinished pages and chunks a new priority (0-10): claims take higher first.
        Finished tasks keep theirs; returns how many rows of each level changed."""
        check_priority(priority)
        return self._transaction(lambda conn: apply_priority(conn, str(document_id), priority))
