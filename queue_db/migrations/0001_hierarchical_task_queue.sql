-- Phase 1 of the seed's migration path (hierarchical-task-queue-v2.md): the enum, the status columns on
-- `documents`, and the two queue tables with every column, constraint and index of the seed, verbatim.
-- `documents` is "existing" in the seed; a fresh database gets a minimal one first, a legacy database keeps
-- its own (the ADD COLUMN IF NOT EXISTS statements below are exactly the seed's).

CREATE TABLE IF NOT EXISTS documents (
    id UUID PRIMARY KEY DEFAULT gen_random_uuid(),
    filename VARCHAR(1000) NOT NULL,
    created_at TIMESTAMP WITH TIME ZONE DEFAULT NOW(),
    updated_at TIMESTAMP WITH TIME ZONE DEFAULT NOW()
);

DO $$ BEGIN
    CREATE TYPE task_status AS ENUM ('pending', 'processing', 'completed', 'failed');
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;

ALTER TABLE documents
ADD COLUMN IF NOT EXISTS ocr_status task_status DEFAULT 'pending',
ADD COLUMN IF NOT EXISTS vector_index_status task_status DEFAULT 'pending',
ADD COLUMN IF NOT EXISTS graphrag_index_status task_status DEFAULT 'pending';

ALTER TABLE documents
ADD COLUMN IF NOT EXISTS ocr_started_at TIMESTAMP WITH TIME ZONE,
ADD COLUMN IF NOT EXISTS ocr_completed_at TIMESTAMP WITH TIME ZONE,
ADD COLUMN IF NOT EXISTS ocr_error TEXT,
ADD COLUMN IF NOT EXISTS vector_started_at TIMESTAMP WITH TIME ZONE,
ADD COLUMN IF NOT EXISTS vector_completed_at TIMESTAMP WITH TIME ZONE,
ADD COLUMN IF NOT EXISTS vector_error TEXT,
ADD COLUMN IF NOT EXISTS graphrag_started_at TIMESTAMP WITH TIME ZONE,
ADD COLUMN IF NOT EXISTS graphrag_completed_at TIMESTAMP WITH TIME ZONE,
ADD COLUMN IF NOT EXISTS graphrag_error TEXT;

ALTER TABLE documents
ADD COLUMN IF NOT EXISTS current_worker_id VARCHAR(100),
ADD COLUMN IF NOT EXISTS last_heartbeat TIMESTAMP WITH TIME ZONE;

CREATE TABLE IF NOT EXISTS task_queue_page (
    id UUID PRIMARY KEY DEFAULT gen_random_uuid(),
    document_id UUID NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
    page_number INTEGER NOT NULL,
    page_file_path VARCHAR(1000),
    ocr_status task_status NOT NULL DEFAULT 'pending',
    ocr_worker_id VARCHAR(100),
    ocr_started_at TIMESTAMP WITH TIME ZONE,
    ocr_completed_at TIMESTAMP WITH TIME ZONE,
    ocr_error TEXT,
    ocr_retry_count INTEGER DEFAULT 0,
    ocr_last_heartbeat TIMESTAMP WITH TIME ZONE,
    vector_status task_status NOT NULL DEFAULT 'pending',
    vector_worker_id VARCHAR(100),
    vector_started_at TIMESTAMP WITH TIME ZONE,
    vector_completed_at TIMESTAMP WITH TIME ZONE,
    vector_error TEXT,
    vector_retry_count INTEGER DEFAULT 0,
    vector_last_heartbeat TIMESTAMP WITH TIME ZONE,
    graphrag_status task_status NOT NULL DEFAULT 'pending',
    graphrag_worker_id VARCHAR(100),
    graphrag_started_at TIMESTAMP WITH TIME ZONE,
    graphrag_completed_at TIMESTAMP WITH TIME ZONE,
    graphrag_error TEXT,
    graphrag_retry_count INTEGER DEFAULT 0,
    graphrag_last_heartbeat TIMESTAMP WITH TIME ZONE,
    chunk_count INTEGER DEFAULT 0,
    max_retries INTEGER DEFAULT 3,
    created_at TIMESTAMP WITH TIME ZONE DEFAULT NOW(),
    updated_at TIMESTAMP WITH TIME ZONE DEFAULT NOW(),
    UNIQUE(document_id, page_number)
);

CREATE INDEX IF NOT EXISTS idx_tqp_ocr_status ON task_queue_page(ocr_status) WHERE ocr_status IN ('pending', 'failed');
CREATE INDEX IF NOT EXISTS idx_tqp_vector_status ON task_queue_page(vector_status) WHERE vector_status IN ('pending', 'failed');
CREATE INDEX IF NOT EXISTS idx_tqp_graphrag_status ON task_queue_page(graphrag_status) WHERE graphrag_status IN ('pending', 'failed');
CREATE INDEX IF NOT EXISTS idx_tqp_document ON task_queue_page(document_id);
CREATE INDEX IF NOT EXISTS idx_tqp_ocr_heartbeat ON task_queue_page(ocr_last_heartbeat) WHERE ocr_status = 'processing';
CREATE INDEX IF NOT EXISTS idx_tqp_vector_heartbeat ON task_queue_page(vector_last_heartbeat) WHERE vector_status = 'processing';
CREATE INDEX IF NOT EXISTS idx_tqp_graphrag_heartbeat ON task_queue_page(graphrag_last_heartbeat) WHERE graphrag_status = 'processing';

CREATE TABLE IF NOT EXISTS task_queue_chunk (
    id UUID PRIMARY KEY DEFAULT gen_random_uuid(),
    page_id UUID NOT NULL REFERENCES task_queue_page(id) ON DELETE CASCADE,
    document_id UUID NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
    chunk_id VARCHAR(64) NOT NULL,
    chunk_index INTEGER NOT NULL,
    chunk_content_hash VARCHAR(64),
    vector_status task_status NOT NULL DEFAULT 'pending',
    vector_worker_id VARCHAR(100),
    vector_started_at TIMESTAMP WITH TIME ZONE,
    vector_completed_at TIMESTAMP WITH TIME ZONE,
    vector_error TEXT,
    vector_retry_count INTEGER DEFAULT 0,
    vector_last_heartbeat TIMESTAMP WITH TIME ZONE,
    graphrag_status task_status NOT NULL DEFAULT 'pending',
    graphrag_worker_id VARCHAR(100),
    graphrag_started_at TIMESTAMP WITH TIME ZONE,
    graphrag_completed_at TIMESTAMP WITH TIME ZONE,
    graphrag_error TEXT,
    graphrag_retry_count INTEGER DEFAULT 0,
    graphrag_last_heartbeat TIMESTAMP WITH TIME ZONE,
    entities_extracted INTEGER DEFAULT 0,
    relationships_extracted INTEGER DEFAULT 0,
    max_retries INTEGER DEFAULT 3,
    created_at TIMESTAMP WITH TIME ZONE DEFAULT NOW(),
    updated_at TIMESTAMP WITH TIME ZONE DEFAULT NOW(),
    UNIQUE(page_id, chunk_index)
);

CREATE INDEX IF NOT EXISTS idx_tqc_vector_status ON task_queue_chunk(vector_status) WHERE vector_status IN ('pending', 'failed');
CREATE INDEX IF NOT EXISTS idx_tqc_graphrag_status ON task_queue_chunk(graphrag_status) WHERE graphrag_status IN ('pending', 'failed');
CREATE INDEX IF NOT EXISTS idx_tqc_page ON task_queue_chunk(page_id);
CREATE INDEX IF NOT EXISTS idx_tqc_document ON task_queue_chunk(document_id);
CREATE INDEX IF NOT EXISTS idx_tqc_vector_heartbeat ON task_queue_chunk(vector_last_heartbeat) WHERE vector_status = 'processing';
CREATE INDEX IF NOT EXISTS idx_tqc_graphrag_heartbeat ON task_queue_chunk(graphrag_last_heartbeat) WHERE graphrag_status = 'processing';
