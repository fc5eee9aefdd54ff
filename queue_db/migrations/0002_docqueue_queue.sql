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

-- Bubble-up of one phase from changed children to their parents: pages (from chunks), then documents (from
-- pages). Each parent row is locked (in id order) BEFORE it is recomputed; each statement of a PL/pgSQL function
-- takes a fresh snapshot under READ COMMITTED, so the recomputation sees every child change committed by whoever
-- held the lock before us. The last transaction to touch a parent therefore always leaves it equal to the rule.
-- A page is only derived from chunks once it has been chunked (before that its vector status belongs to the
-- chunking task); a chunked page without chunks is complete. A document is only derived once it has pages.
CREATE OR REPLACE FUNCTION docqueue_bubble(phase text, page_ids uuid[], document_ids uuid[])
RETURNS TABLE(level text, id uuid, old_status task_status, new_status task_status)
LANGUAGE plpgsql AS $fn$
DECLARE
    doc_col text := CASE phase WHEN 'ocr' THEN 'ocr_status' WHEN 'vector' THEN 'vector_index_status'
                               WHEN 'graphrag' THEN 'graphrag_index_status' END;
    col text := phase || '_status';
    page_doc_ids uuid[];
BEGIN
    IF doc_col IS NULL THEN
        RAISE EXCEPTION 'unknown phase %', phase;
    END IF;
    IF phase <> 'ocr' AND COALESCE(cardinality(page_ids), 0) > 0 THEN
        PERFORM 1 FROM task_queue_page p WHERE p.id = ANY(page_ids) ORDER BY p.id FOR UPDATE;
        RETURN QUERY EXECUTE format($q$
            WITH computed AS (
                SELECT p.id, p.%1$I AS old,
                       COALESCE((SELECT docqueue_rollup(c.%1$I) FROM task_queue_chunk c WHERE c.page_id = p.id),
                                'completed') AS new
                FROM task_queue_page p WHERE p.id = ANY($1) AND p.chunked_at IS NOT NULL
            )
            UPDATE task_queue_page p
            SET %1$I = computed.new,
                %2$I = COALESCE(p.%2$I, CASE WHEN computed.new = 'processing' THEN now() END),
                %3$I = CASE WHEN computed.new = 'completed' THEN now() END,
                %4$I = CASE WHEN computed.new = 'failed' THEN (
                           SELECT 'chunk ' || c.chunk_index || ': ' || c.%4$I FROM task_queue_chunk c
                           WHERE c.page_id = p.id AND c.%1$I = 'failed' ORDER BY c.chunk_index LIMIT 1)
                       ELSE p.%4$I END,
                updated_at = now()
            FROM computed
            WHERE p.id = computed.id AND p.%1$I IS DISTINCT FROM computed.new
            RETURNING 'page'::text, p.id, computed.old, computed.new $q$,
            col, phase || '_started_at', phase || '_completed_at', phase || '_error')
        USING page_ids;
    END IF;
    IF COALESCE(cardinality(document_ids), 0) > 0 THEN
        PERFORM 1 FROM documents d WHERE d.id = ANY(document_ids) ORDER BY d.id FOR UPDATE;
        RETURN QUERY EXECUTE format($q$
            WITH computed AS (
                SELECT d.id, d.%1$I AS old,
                       (SELECT docqueue_rollup(pg.%2$I) FROM task_queue_page pg WHERE pg.document_id = d.id) AS new
                FROM documents d WHERE d.id = ANY($1) AND d.pages_created_at IS NOT NULL
            )
            UPDATE documents d
            SET %1$I = computed.new,
                %3$I = COALESCE(d.%3$I, CASE WHEN computed.new = 'processing' THEN now() END),
                %4$I = CASE WHEN computed.new = 'completed' THEN now() END,
                %5$I = CASE WHEN computed.new = 'failed' THEN (
                           SELECT 'page ' || pg.page_number || ': ' || pg.%5$I FROM task_queue_page pg
                           WHERE pg.document_id = d.id AND pg.%2$I = 'failed' ORDER BY pg.page_number LIMIT 1)
                       ELSE d.%5$I END,
                updated_at = now()
            FROM computed
            WHERE d.id = computed.id AND computed.new IS NOT NULL AND d.%1$I IS DISTINCT FROM computed.new
            RETURNING 'document'::text, d.id, computed.old, computed.new $q$,
            doc_col, col, phase || '_started_at', phase || '_completed_at', phase || '_error')
        USING document_ids;
    END IF;
END
$fn$;

-- One task transition in one round trip: run the data-modifying `statement` (its arguments are the jsonb $1),
-- then bubble the phase up from the parents named in its RETURNING rows (page_id, document_id). Called in
-- autocommit, the whole function is one transaction. `phase` NULL: no bubble-up (heartbeats, expansion claims).
CREATE OR REPLACE FUNCTION docqueue_transition(statement text, phase text, args jsonb)
RETURNS jsonb
LANGUAGE plpgsql AS $fn$
DECLARE
    changed jsonb;
    page_ids uuid[];
    document_ids uuid[];
BEGIN
    EXECUTE 'WITH changed AS (' || statement || ') SELECT COALESCE(jsonb_agg(to_jsonb(changed)), ''[]''::jsonb) FROM changed'
        INTO changed USING args;
    IF phase IS NOT NULL AND jsonb_array_length(changed) > 0 THEN
        SELECT array_agg(DISTINCT (e->>'page_id')::uuid) FILTER (WHERE e ? 'page_id'),
               array_agg(DISTINCT (e->>'document_id')::uuid) FILTER (WHERE e ? 'document_id')
        INTO page_ids, document_ids
        FROM jsonb_array_elements(changed) e;
        PERFORM docqueue_bubble(phase, page_ids, document_ids);
    END IF;
    RETURN changed;
END
$fn$;
