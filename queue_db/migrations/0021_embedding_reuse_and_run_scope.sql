-- Identical chunk text is embedded once (seed: chunk_content_hash "for deduplication"). The vector phase looks up an
-- already embedded chunk of the same text through the first index, and records on the chunk whose vector it copied
-- (`vector_reused_from`, a chunk_id); the second index lets `docqueue run` count the vectors it reused without
-- reading every chunk.
ALTER TABLE task_queue_chunk ADD COLUMN IF NOT EXISTS vector_reused_from VARCHAR(64);
CREATE INDEX IF NOT EXISTS idx_tqc_embedded_by_hash ON task_queue_chunk (chunk_content_hash)
    WHERE vector_status = 'completed';
CREATE INDEX IF NOT EXISTS idx_tqc_reused_vectors ON task_queue_chunk (vector_completed_at)
    WHERE vector_reused_from IS NOT NULL;
-- `docqueue run --max-docs N` takes the N most urgent unfinished documents (priority, then oldest) from this index.
CREATE INDEX IF NOT EXISTS idx_documents_unfinished ON documents (priority DESC, created_at, id)
    WHERE graphrag_index_status IN ('pending', 'processing');
