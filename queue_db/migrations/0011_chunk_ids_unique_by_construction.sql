-- Chunk ids are unique by construction: TaskQueue.complete_chunking derives every one from (document key, page
-- number, chunk index, content hash) (queue_db.keys.chunk_id) and refuses a chunk that brings another id; document
-- keys are unique (uq_documents_document_key), page numbers within a document (the seed's UNIQUE(document_id,
-- page_number)) and chunk indexes within a page (the seed's UNIQUE(page_id, chunk_index)). The unique index on the
-- 32-character id only re-checked that, on every row version: each claim and each completion of a chunk inserted
-- into it, with a uniqueness probe, and it was the largest index of the table (measured: about a tenth of the WAL
-- written per task of the vector phase). Rows from before (legacy imports, 0003) keep the ids they came with;
-- they were unique when they were inserted.
DROP INDEX IF EXISTS uq_tqc_chunk_id;
