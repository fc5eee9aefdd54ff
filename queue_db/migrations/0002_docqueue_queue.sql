-- What docqueue adds to the seed's schema (only additions: nothing of the seed is renamed or dropped).
--   documents: identity of the file (key, path, storage key, size, content hash), priority, the expansion
--              task's own retry bookkeeping, per-phase error classes.
--   pages/chunks: denormalised priority (so claims sort on one table), back-off times, error classes,
--              per-task measurements, the chunk text.
--   claim indexes whose predicate is exactly the claim rule and whose key is exactly the claim order, so a
--   claim reads the first N index entries instead of sorting every pending row.
--   docqueue_rollup(task_status): THE bubble-up rule, as an aggregate every parent update calls.

ALTER TABLE documents
ADD COLUMN IF NOT EXISTS document_key VARCHAR(200),
ADD COLUMN IF NOT EXISTS source_path TEXT,
ADD COLUMN IF NOT EXISTS filename_bytes BYTEA,
ADD COLUMN IF NOT EXISTS storage_key VARCHAR(1000),
ADD COLUMN IF NOT EXISTS size_bytes BIGINT,
ADD COLUMN IF NOT EXISTS content_hash VARCHAR(64),
ADD COLUMN IF NOT EXISTS mime_type VARCHAR(100),
ADD COLUMN IF NOT EXISTS priority SMALLINT NOT NULL DEFAULT 0,
ADD COLUMN IF NOT EXISTS page_count INTEGER,
ADD COLUMN IF NOT EXISTS encrypted BOOLEAN,
ADD COLUMN IF NOT EXISTS password_ref TEXT,
ADD COLUMN IF NOT EXISTS metadata JSONB NOT NULL DEFAULT '{}'::jsonb,
ADD COLUMN IF NOT EXISTS pages_created_at TIMESTAMP WITH TIME ZONE,
ADD COLUMN IF NOT EXISTS retry_count INTEGER NOT NULL DEFAULT 0,
ADD COLUMN IF NOT EXISTS max_retries INTEGER NOT NULL DEFAULT 3,
ADD COLUMN IF NOT EXISTS next_attempt_at TIMESTAMP WITH TIME ZONE,
ADD COLUMN IF NOT EXISTS ocr_error_class VARCHAR(32),
ADD COLUMN IF NOT EXISTS vector_error_class VARCHAR(32),
ADD COLUMN IF NOT EXISTS graphrag_error_class VARCHAR(32);

DO $$ BEGIN
    ALTER TABLE documents ADD CONSTRAINT documents_priority_range CHECK (priority BETWEEN 0 AND 10);
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;

CREATE UNIQUE INDEX IF NOT EXISTS uq_documents_document_key ON documents(document_key);
CREATE UNIQUE INDEX IF NOT EXISTS uq_documents_content_hash ON documents(content_hash) WHERE content_hash IS NOT NULL;
CREATE INDEX IF NOT EXISTS idx_documents_heartbeat ON documents(last_heartbeat) WHERE ocr_status = 'processing' AND pages_created_at IS NULL;
CREATE INDEX IF NOT EXISTS idx_documents_expand_claim ON documents
    (priority DESC, (CASE WHEN ocr_status = 'failed' THEN 0 ELSE 1 END), retry_count, created_at)
    WHERE pages_created_at IS NULL AND (ocr_status = 'pending' OR (ocr_status = 'failed' AND retry_count < max_retries));

ALTER TABLE task_queue_page
ADD COLUMN IF NOT EXISTS priority SMALLINT NOT NULL DEFAULT 0,
ADD COLUMN IF NOT EXISTS ocr_next_attempt_at TIMESTAMP WITH TIME ZONE,
ADD COLUMN IF NOT EXISTS ocr_error_class VARCHAR(32),
ADD COLUMN IF NOT EXISTS ocr_method VARCHAR(40),
ADD COLUMN IF NOT EXISTS ocr_chars INTEGER,
ADD COLUMN IF NOT EXISTS ocr_seconds REAL,
ADD COLUMN IF NOT EXISTS vector_next_attempt_at TIMESTAMP WITH TIME ZONE,
ADD COLUMN IF NOT EXISTS vector_error_class VARCHAR(32),
ADD COLUMN IF NOT EXISTS graphrag_error_class VARCHAR(32),
ADD COLUMN IF NOT EXISTS chunked_at TIMESTAMP WITH TIME ZONE;

CREATE INDEX IF NOT EXISTS idx_tqp_ocr_claim ON task_queue_page
    (priority DESC, (CASE WHEN ocr_status = 'failed' THEN 0 ELSE 1 END), ocr_retry_count, created_at)
    WHERE ocr_status = 'pending' OR (ocr_status = 'failed' AND ocr_retry_count < max_retries);
CREATE INDEX IF NOT EXISTS idx_tqp_vector_claim ON task_queue_page
    (priority DESC, (CASE WHEN vector_status = 'failed' THEN 0 ELSE 1 END), vector_retry_count, created_at)
    WHERE chunked_at IS NULL AND ocr_status = 'completed'
      AND (vector_status = 'pending' OR (vector_status = 'failed' AND vector_retry_count < max_retries));

ALTER TABLE task_queue_chunk
ADD COLUMN IF NOT EXISTS priority SMALLINT NOT NULL DEFAULT 0,
ADD COLUMN IF NOT EXISTS content TEXT,
ADD COLUMN IF NOT EXISTS token_count INTEGER,
ADD COLUMN IF NOT EXISTS vector_next_attempt_at TIMESTAMP WITH TIME ZONE,
ADD COLUMN IF NOT EXISTS vector_error_class VARCHAR(32),
ADD COLUMN IF NOT EXISTS vector_seconds REAL,
ADD COLUMN IF NOT EXISTS graphrag_next_attempt_at TIMESTAMP WITH TIME ZONE,
ADD COLUMN IF NOT EXISTS graphrag_error_class VARCHAR(32),
ADD COLUMN IF NOT EXISTS graphrag_seconds REAL;

CREATE INDEX IF NOT EXISTS idx_tqc_vector_claim ON task_queue_chunk
    (priority DESC, (CASE WHEN vector_status = 'failed' THEN 0 ELSE 1 END), vector_retry_count, created_at)
    WHERE vector_status = 'pending' OR (vector_status = 'failed' AND vector_retry_count < max_retries);
CREATE INDEX IF NOT EXISTS idx_tqc_graphrag_claim ON task_queue_chunk
    (priority DESC, (CASE WHEN graphrag_status = 'failed' THEN 0 ELSE 1 END), graphrag_retry_count, created_at)
    WHERE vector_status = 'completed'
      AND (graphrag_status = 'pending' OR (graphrag_status = 'failed' AND graphrag_retry_count < max_retries));
CREATE UNIQUE INDEX IF NOT EXISTS uq_tqc_chunk_id ON task_queue_chunk(chunk_id);

-- The bubble-up rule (seed "Status Bubble-Up Logic"), in priority order:
--   any processing -> processing; else any pending -> pending; else all completed -> completed; else failed.
-- No children -> NULL: the caller decides what an empty set means (blank page: completed; see queue.py).
CREATE OR REPLACE FUNCTION docqueue_rollup_step(state integer, child task_status) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT state | CASE child WHEN 'processing' THEN 1 WHEN 'pending' THEN 2 WHEN 'failed' THEN 4
                              WHEN 'completed' THEN 8 ELSE 0 END
$$;
CREATE OR REPLACE FUNCTION docqueue_rollup_final(state integer) RETURNS task_status
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (CASE WHEN state = 0 THEN NULL
                 WHEN state & 1 <> 0 THEN 'processing'
                 WHEN state & 2 <> 0 THEN 'pending'
                 WHEN state = 8 THEN 'completed'
                 ELSE 'failed' END)::task_status
$$;
CREATE OR REPLACE AGGREGATE docqueue_rollup(task_status) (
    SFUNC = docqueue_rollup_step, STYPE = integer, INITCOND = '0',
    FINALFUNC = docqueue_rollup_final, COMBINEFUNC = int4or, PARALLEL = SAFE
);
