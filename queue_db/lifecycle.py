"""Operations beyond the task flow (the other queue designs' update / delete / rescan): versions, deletion and
re-indexing a phase. Only the queue's side; the caller removes outputs from the stores (orchestration.lifecycle)."""
from __future__ import annotations

from .inspection import document_held_counts
from .queue import TaskQueue, source_path_text
from .tasks import Phase


def previous_version(queue: TaskQueue, source_path: str, content_hash: str) -> dict | None:
    """The newest document registered from the same path with other content (the one a new version replaces)."""
    with queue.engine.connect() as conn:
        row = conn.exec_driver_sql(
            """SELECT id::text AS id, document_key FROM documents
               WHERE source_path = %(p)s AND content_hash <> %(h)s
                 AND NOT EXISTS (SELECT 1 FROM documents newer WHERE newer.supersedes = documents.id)
               ORDER BY created_at DESC LIMIT 1""",
            {"p": source_path_text(source_path), "h": content_hash}).mappings().first()
    return dict(row) if row else None


def mark_supersedes(queue: TaskQueue, new_id: str, old_id: str) -> None:
    with queue.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE documents SET supersedes = %(old)s WHERE id = %(new)s AND supersedes IS NULL",
                             {"old": old_id, "new": new_id})


def superseded_ready_for_removal(queue: TaskQueue) -> list[dict]:
    """Old versions whose successor completed every phase: safe to remove (search switches over atomically)."""
    with queue.engine.connect() as conn:
        return [dict(r) for r in conn.exec_driver_sql(
            """SELECT old.id::text AS id, old.document_key, new.id::text AS replaced_by
               FROM documents new JOIN documents old ON old.id = new.supersedes
               WHERE new.ocr_status = 'completed' AND new.vector_index_status = 'completed'
                 AND new.graphrag_index_status = 'completed'""").mappings()]


def hidden_from_search(queue: TaskQueue) -> list[str]:
    """Document ids search must not show: a new version until its vectors are complete, and an old version once
    its successor's are. Between the two, exactly one version of a document is visible."""
    with queue.engine.connect() as conn:
        return [str(r[0]) for r in conn.exec_driver_sql(
            """SELECT CASE WHEN new.vector_index_status = 'completed' THEN old.id ELSE new.id END
               FROM documents new JOIN documents old ON old.id = new.supersedes""").all()]


def partition_keys_of(queue: TaskQueue, document_id: str) -> dict[str, list[str]]:
    """The Dagster partition keys that belong to a document, per level."""
    from .keys import chunk_partition_key, page_partition_key

    with queue.engine.connect() as conn:
        key = conn.exec_driver_sql("SELECT document_key FROM documents WHERE id = %(d)s", {"d": document_id}).scalar()
        pages = conn.exec_driver_sql(
            "SELECT page_number FROM task_queue_page WHERE document_id = %(d)s AND partition_block IS NOT NULL",
            {"d": document_id}).all()
        chunks = conn.exec_driver_sql(
            """SELECT p.page_number, c.chunk_index FROM task_queue_chunk c JOIN task_queue_page p ON p.id = c.page_id
               WHERE c.document_id = %(d)s AND c.partition_block IS NOT NULL""", {"d": document_id}).all()
    if key is None:
        return {"documents": [], "pages": [], "chunks": []}
    return {"documents": [key], "pages": [page_partition_key(key, r[0]) for r in pages],
            "chunks": [chunk_partition_key(key, r[0], r[1]) for r in chunks]}


def delete_rows(queue: TaskQueue, document_id: str) -> bool:
    """Remove the document and (by cascade) its pages and chunks. Refused while any of its tasks is running."""
    with queue.engine.begin() as conn:
        busy = sum(document_held_counts(conn, document_id).values())
        if busy:
            raise RuntimeError(f"document has {busy} task(s) running; wait for them or recover them first")
        return conn.exec_driver_sql("DELETE FROM documents WHERE id = %(d)s", {"d": document_id}).rowcount > 0


def reset_phase(queue: TaskQueue, phase: Phase, document_id: str | None = None) -> dict[str, int]:
    """Re-run `phase` and the phases after it, keeping the earlier phases' results (a new embedding model or
    extractor). Vector: chunks keep their identity and text, their vector and GraphRAG tasks go back to pending.
    GraphRAG: chunks' GraphRAG tasks go back to pending."""
    if phase is Phase.OCR:
        raise ValueError("re-indexing starts at the vector or graphrag phase; OCR is kept")
    doc_filter = "AND c.document_id = %(d)s" if document_id else ""
    sets = ["graphrag_status = 'pending'", "graphrag_retry_count = 0", "graphrag_next_attempt_at = NULL",
            "graphrag_error = NULL", "graphrag_error_class = NULL", "entities_extracted = 0",
            "relationships_extracted = 0"]
    if phase is Phase.VECTOR:
        sets += ["vector_status = 'pending'", "vector_retry_count = 0", "vector_next_attempt_at = NULL",
                 "vector_error = NULL", "vector_error_class = NULL"]
    with queue.engine.begin() as conn:
        rows = conn.exec_driver_sql(
            f"""UPDATE task_queue_chunk c SET {', '.join(sets)}, updated_at = now()
                WHERE c.vector_status <> 'processing' AND c.graphrag_status <> 'processing' {doc_filter}
                RETURNING c.page_id::text, c.document_id::text""",
            {"d": document_id}).all()
        pages = sorted({r[0] for r in rows})
        documents = sorted({r[1] for r in rows})
        for bubble_phase in (Phase.VECTOR, Phase.GRAPHRAG) if phase is Phase.VECTOR else (Phase.GRAPHRAG,):
            queue._bubble(conn, bubble_phase, pages, documents)
        if phase is Phase.VECTOR:
            conn.exec_driver_sql(
                "UPDATE documents SET vector_rollup_at = NULL, graphrag_rollup_at = NULL "
                "WHERE id = ANY(%(ids)s::uuid[])", {"ids": documents})
        else:
            conn.exec_driver_sql("UPDATE documents SET graphrag_rollup_at = NULL WHERE id = ANY(%(ids)s::uuid[])",
                                 {"ids": documents})
    return {"chunks": len(rows), "pages": len(pages), "documents": len(documents)}
