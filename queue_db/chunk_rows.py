"""The chunk rows a page's chunking creates: their ids, derived from what the chunk is, and one statement that writes
the rows of many pages with their texts. Used by TaskQueue.complete_chunkings inside its transaction."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

from .keys import chunk_id
from .text import clean_text

if TYPE_CHECKING:
    import sqlalchemy as sa

_PAGES_SQL = """SELECT p.id::text AS id, d.document_key, p.page_number FROM task_queue_page p
                JOIN documents d ON d.id = p.document_id WHERE p.id = ANY(%(pages)s::uuid[])"""

# every page's chunks as one set: rows the pages' keys already hold are left alone (a retried chunking), and the
# text goes to its own table, written once (migration 0012)
_INSERT_SQL = """
    WITH c AS (
        SELECT * FROM unnest(%(pages)s::uuid[], %(ids)s::text[], %(idx)s::int[], %(hashes)s::text[],
                             %(texts)s::text[], %(tokens)s::int[])
                      AS c(page_id, chunk_id, chunk_index, content_hash, content, token_count)),
    created AS (
        INSERT INTO task_queue_chunk (page_id, document_id, chunk_id, chunk_index, chunk_content_hash, token_count,
                                      priority, max_retries)
        SELECT p.id, p.document_id, c.chunk_id, c.chunk_index, c.content_hash, c.token_count, p.priority,
               p.max_retries
        FROM c JOIN task_queue_page p ON p.id = c.page_id
        ON CONFLICT DO NOTHING
        RETURNING id, page_id, chunk_index)
    INSERT INTO task_queue_chunk_text (chunk_task_id, content)
    SELECT created.id, c.content FROM created JOIN c USING (page_id, chunk_index)
    WHERE c.content IS NOT NULL"""


def insert_chunk_rows(conn: sa.Connection, pages: Mapping[str, Sequence[dict]]) -> None:
    """Write the chunk rows of `pages` (page id -> chunk dicts: chunk_index, content_hash, content, token_count, and
    optionally chunk_id, which must equal the derived one: derived_chunk_ids)."""
    pages = {page: chunks for page, chunks in pages.items() if chunks}
    if not pages:
        return
    keys = {row.id: row for row in conn.exec_driver_sql(_PAGES_SQL, {"pages": list(pages)})}
    columns: dict[str, list] = {"pages": [], "ids": [], "idx": [], "hashes": [], "texts": [], "tokens": []}
    for page, chunks in pages.items():
        columns["pages"] += [page] * len(chunks)
        columns["ids"] += derived_chunk_ids(keys[page].document_key, keys[page].page_number, chunks)
        columns["idx"] += [c["chunk_index"] for c in chunks]
        columns["hashes"] += [c.get("content_hash") for c in chunks]
        columns["texts"] += [clean_text(c.get("content"), 10**7) for c in chunks]
        columns["tokens"] += [c.get("token_count") for c in chunks]
    conn.exec_driver_sql(_INSERT_SQL, columns)


def derived_chunk_ids(document_key: str, page_number: int, chunks: Sequence[dict]) -> list[str]:
    """Each chunk's id (keys.chunk_id: document key, page number, chunk index, content hash); a chunk dict whose own
    chunk_id differs is refused (ValueError) rather than stored under an id another row could also have."""
    ids = [chunk_id(document_key, page_number, c["chunk_index"], c.get("content_hash")) for c in chunks]
    for given, derived in zip((c.get("chunk_id") for c in chunks), ids):
        if given is not None and given != derived:
            raise ValueError(
                f"chunk_id {given!r} is not this chunk's derived id {derived!r} "
                "(queue_db.keys.chunk_id: document key, page number, chunk index, content hash)"
            )
    return ids
