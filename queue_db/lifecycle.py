"""Operations beyond the task flow (the other queue designs' update / delete / rescan): versions, deletion and
re-indexing a phase. Only the queue's side; the caller removes outputs from the stores (orchestration.store_cleanup)."""

from __future__ import annotations

from .inspection import document_held_counts, tenant_held_count
from .phases import Level, PhaseRegistry, PhaseSpec
from .queue import TaskQueue, source_path_text
from .tenants import BASE_TENANT


def previous_version(queue: TaskQueue, source_path: str, content_hash: str, tenant: str = BASE_TENANT) -> dict | None:
    """The newest document of `tenant` registered from the same path with other content (the one a new version
    replaces)."""
    with queue.engine.connect() as conn:
        row = (
            conn.exec_driver_sql(
                """SELECT id::text AS id, document_key FROM documents
               WHERE source_path = %(p)s AND content_hash <> %(h)s AND tenant_id = %(t)s
                 AND NOT EXISTS (SELECT 1 FROM documents newer WHERE newer.supersedes = documents.id)
               ORDER BY created_at DESC LIMIT 1""",
                {"p": source_path_text(source_path), "h": content_hash, "t": tenant},
            )
            .mappings()
            .first()
        )
    return dict(row) if row else None


def mark_supersedes(queue: TaskQueue, new_id: str, old_id: str) -> None:
    with queue.engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE documents SET supersedes = %(old)s WHERE id = %(new)s AND supersedes IS NULL",
            {"old": old_id, "new": new_id},
        )


def move_source(queue: TaskQueue, document_id: str, source_path: str) -> None:
    """The document's file now lives at `source_path` (renamed or moved): nothing is processed again."""
    queue._transaction(
        lambda conn: conn.exec_driver_sql(
            "UPDATE documents SET source_path = %(p)s, updated_at = now() WHERE id = %(d)s",
            {"p": source_path_text(source_path), "d": document_id},
        )
    )


def superseded_ready_for_removal(queue: TaskQueue) -> list[dict]:
    """Old versions whose successor completed every phase: safe to remove (search switches over atomically)."""
    completed = " AND ".join(f"new.{p.document_status_column} = 'completed'" for p in queue.phases)
    with queue.engine.connect() as conn:
        return [
            dict(r)
            for r in conn.exec_driver_sql(
                f"""SELECT old.id::text AS id, old.document_key, new.id::text AS replaced_by
               FROM documents new JOIN documents old ON old.id = new.supersedes
               WHERE {completed}"""
            ).mappings()
        ]


def hidden_from_search(queue: TaskQueue) -> list[str]:
    """Document ids search must not show: a new version until its vectors are complete, and an old version once
    its successor's are. Between the two, exactly one version of a document is visible."""
    with queue.engine.connect() as conn:
        return [
            str(r[0])
            for r in conn.exec_driver_sql(
                """SELECT CASE WHEN new.vector_index_status = 'completed' THEN old.id ELSE new.id END
               FROM documents new JOIN documents old ON old.id = new.supersedes"""
            ).all()
        ]


def partition_keys_of(queue: TaskQueue, document_id: str) -> dict[str, list[str]]:
    """The Dagster partition keys that belong to a document, per level."""
    from .keys import chunk_partition_key, page_partition_key

    with queue.engine.connect() as conn:
        key = conn.exec_driver_sql("SELECT document_key FROM documents WHERE id = %(d)s", {"d": document_id}).scalar()
        pages = conn.exec_driver_sql(
            "SELECT page_number FROM task_queue_page WHERE document_id = %(d)s AND partition_block IS NOT NULL",
            {"d": document_id},
        ).all()
        chunks = conn.exec_driver_sql(
            """SELECT p.page_number, c.chunk_index FROM task_queue_chunk c JOIN task_queue_page p ON p.id = c.page_id
               WHERE c.document_id = %(d)s AND c.partition_block IS NOT NULL""",
            {"d": document_id},
        ).all()
    if key is None:
        return {"documents": [], "pages": [], "chunks": []}
    return {
        "documents": [key],
        "pages": [page_partition_key(key, r[0]) for r in pages],
        "chunks": [chunk_partition_key(key, r[0], r[1]) for r in chunks],
    }


def tenant_documents(queue: TaskQueue, tenant: str, limit: int) -> list[dict]:
    """The first `limit` documents of `tenant` in registration order (idx_documents_tenant_listing): a batch of
    `docqueue delete --tenant`, which deletes them and asks again."""
    with queue.engine.connect() as conn:
        return [
            dict(r)
            for r in conn.exec_driver_sql(
                "SELECT * FROM documents WHERE tenant_id = %(t)s ORDER BY created_at, id LIMIT %(n)s",
                {"t": tenant, "n": int(limit)},
            ).mappings()
        ]


def tenant_running_tasks(queue: TaskQueue, tenant: str) -> int:
    """How many tasks of `tenant`'s documents workers hold right now."""
    with queue.engine.connect() as conn:
        return tenant_held_count(conn, tenant, queue.phases.kinds)


def delete_rows(queue: TaskQueue, document_id: str) -> bool:
    """Remove the document and (by cascade) its pages and chunks. Refused while any of its tasks is running."""
    with queue.engine.begin() as conn:
        busy = sum(document_held_counts(conn, document_id, queue.phases.kinds).values())
        if busy:
            raise RuntimeError(f"document has {busy} task(s) running; wait for them or recover them first")
        return conn.exec_driver_sql("DELETE FROM documents WHERE id = %(d)s", {"d": document_id}).rowcount > 0


def _chunk_phases(phases: PhaseRegistry) -> tuple[PhaseSpec, ...]:
    """The phases that work on chunks: the ones a re-index runs again (the text they read is kept)."""
    return tuple(p for p in phases if p.leaf.level is Level.CHUNK)


def _phases_from(phases: PhaseRegistry, phase: PhaseSpec) -> tuple[PhaseSpec, ...]:
    chunk_phases = _chunk_phases(phases)
    if phase not in chunk_phases:
        names = " or ".join(p.name for p in chunk_phases)
        raise ValueError(f"re-indexing starts at the {names} phase; {phase.name} is kept")
    return chunk_phases[chunk_phases.index(phase) :]


def _idle_sql(phases: PhaseRegistry) -> str:
    """Over chunks c: none of its tasks is running."""
    return " AND ".join(f"c.{p.leaf.status} <> 'processing'" for p in _chunk_phases(phases))


def _chunk_resets(phases: PhaseRegistry, phase: PhaseSpec) -> list[str]:
    """A chunk's columns as they are before its `phase` and the later ones ever ran (timings included)."""
    sets = []
    for kind in (p.leaf for p in _chunk_phases(phases)):
        if kind.phase in _phases_from(phases, phase):
            sets += [
                f"{kind.status} = 'pending'",
                f"{kind.col('retry_count')} = 0",
                *(
                    f"{kind.col(c)} = NULL"
                    for c in (
                        "next_attempt_at",
                        "error",
                        "error_class",
                        "started_at",
                        "completed_at",
                        "worker_id",
                        "last_heartbeat",
                    )
                ),
            ]
    return sets + ["entities_extracted = 0", "relationships_extracted = 0"]


def _reset_chunks(queue: TaskQueue, conn, phase: PhaseSpec, where: str, params: dict) -> tuple[list[tuple], int]:
    """Reset the chunks `where` selects (alias c) whose tasks are not running; ask again for the running ones.
    Returns (page, document) of each chunk reset, and how many were running."""
    idle = _idle_sql(queue.phases)
    # two requests for one chunk keep the earlier phase (it re-runs the later ones too)
    earliest = " ".join(
        f"WHEN '{p.name}' IN (reindex_requests.phase, EXCLUDED.phase) THEN '{p.name}'"
        for p in _chunk_phases(queue.phases)
    )
    rows = conn.exec_driver_sql(
        f"""UPDATE task_queue_chunk c SET {", ".join(_chunk_resets(queue.phases, phase))}, updated_at = now()
            WHERE {idle} AND {where} RETURNING c.page_id::text, c.document_id::text""",
        params,
    ).all()
    running = conn.exec_driver_sql(
        f"""INSERT INTO reindex_requests (chunk_task_id, phase)
            SELECT c.id, %(phase)s FROM task_queue_chunk c WHERE NOT ({idle}) AND {where}
            ON CONFLICT (chunk_task_id) DO UPDATE
                SET phase = CASE {earliest} ELSE EXCLUDED.phase END,
                    requested_at = now()""",
        {**params, "phase": phase.value},
    ).rowcount
    pages, documents = sorted({r[0] for r in rows}), sorted({r[1] for r in rows})
    for rerun in _phases_from(queue.phases, phase):
        # the parents' phase starts afresh: their started_at is kept by bubble-up while set, which would time the
        # re-index from the first indexing
        for table, ids in (("task_queue_page", pages), ("documents", documents)):
            conn.exec_driver_sql(
                f"UPDATE {table} SET {rerun.column_prefix}_started_at = NULL, "
                f"{rerun.column_prefix}_completed_at = NULL "
                f"WHERE id = ANY(%(ids)s::uuid[])",
                {"ids": ids},
            )
        queue._bubble(conn, rerun, pages, documents)
        conn.exec_driver_sql(
            f"UPDATE documents SET {rerun.column_prefix}_rollup_at = NULL WHERE id = ANY(%(ids)s::uuid[])",
            {"ids": documents},
        )
    # the later phases run again on the text extracted before: extraction is skipped this time
    conn.exec_driver_sql(
        "UPDATE documents SET extraction_skipped = true WHERE id = ANY(%(ids)s::uuid[])", {"ids": documents}
    )
    return rows, running


def reset_phase(queue: TaskQueue, phase: PhaseSpec, document_id: str | None = None) -> dict[str, int]:
    """Re-run `phase` and the phases after it, keeping the earlier phases' results (a new embedding model or
    extractor). Vector: chunks keep their identity and text, their vector and GraphRAG tasks go back to pending.
    GraphRAG: chunks' GraphRAG tasks go back to pending. A chunk whose task is running is re-indexed once it has
    settled (`apply_reindex_requests`, called by the recovery job); `running` counts those."""
    phase = queue.phases.phase(phase.name)
    _phases_from(queue.phases, phase)
    where, params = ("c.document_id = %(d)s", {"d": document_id}) if document_id else ("TRUE", {})
    rows, running = queue._transaction(lambda conn: _reset_chunks(queue, conn, phase, where, params))
    return {
        "chunks": len(rows),
        "pages": len({r[0] for r in rows}),
        "documents": len({r[1] for r in rows}),
        "running": running,
    }


def reindex_due(queue: TaskQueue) -> bool:
    """Whether a re-index request waits whose chunk's tasks have settled (what `apply_reindex_requests` would apply
    now); stops at the first one found."""
    with queue.engine.connect() as conn:
        return bool(
            conn.exec_driver_sql(
                f"""SELECT EXISTS (SELECT 1 FROM reindex_requests r JOIN task_queue_chunk c ON c.id = r.chunk_task_id
                               WHERE r.phase = ANY(%(phases)s) AND {_idle_sql(queue.phases)})""",
                {"phases": [p.value for p in _chunk_phases(queue.phases)]},
            ).scalar()
        )


def apply_reindex_requests(queue: TaskQueue, limit: int = 1000) -> int:
    """Re-index the requested chunks whose tasks have settled since; the others keep waiting."""
    applied = 0
    for phase in _chunk_phases(queue.phases):

        def work(conn, phase=phase):
            ids = [
                r[0]
                for r in conn.exec_driver_sql(
                    f"""DELETE FROM reindex_requests r WHERE r.chunk_task_id IN (
                       SELECT r2.chunk_task_id FROM reindex_requests r2
                       JOIN task_queue_chunk c ON c.id = r2.chunk_task_id
                       WHERE r2.phase = %(phase)s AND {_idle_sql(queue.phases)}
                       ORDER BY r2.chunk_task_id LIMIT %(limit)s FOR UPDATE OF r2 SKIP LOCKED)
                   RETURNING r.chunk_task_id::text""",
                    {"phase": phase.value, "limit": limit},
                ).all()
            ]
            if not ids:
                return 0
            rows, _ = _reset_chunks(queue, conn, phase, "c.id = ANY(%(ids)s::uuid[])", {"ids": ids})
            return len(rows)

        applied += queue._transaction(work)
    return applied
