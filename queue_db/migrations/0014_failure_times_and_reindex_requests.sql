-- When each task last failed: an attempt that failed, or one whose worker was lost. `status` shows the latest.
ALTER TABLE documents ADD COLUMN IF NOT EXISTS ocr_failed_at TIMESTAMP WITH TIME ZONE;
ALTER TABLE task_queue_page ADD COLUMN IF NOT EXISTS ocr_failed_at TIMESTAMP WITH TIME ZONE,
                            ADD COLUMN IF NOT EXISTS vector_failed_at TIMESTAMP WITH TIME ZONE;
ALTER TABLE task_queue_chunk ADD COLUMN IF NOT EXISTS vector_failed_at TIMESTAMP WITH TIME ZONE,
                             ADD COLUMN IF NOT EXISTS graphrag_failed_at TIMESTAMP WITH TIME ZONE;

-- A re-index asked for while a chunk's task was running: applied by the recovery job once the task has settled.
-- The earliest phase asked for wins (re-indexing the vector phase re-runs GraphRAG too).
CREATE TABLE IF NOT EXISTS reindex_requests (
    chunk_task_id UUID PRIMARY KEY REFERENCES task_queue_chunk(id) ON DELETE CASCADE,
    phase TEXT NOT NULL CHECK (phase IN ('vector', 'graphrag')),
    requested_at TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now()
);
