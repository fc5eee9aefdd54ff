-- Bubble-up after a claim or a fenced transition, given what the client knows without a round trip: the task
-- kind and either the ids it transitioned (complete/fail) or its worker id (a claim: the rows it just took are
-- the ones it holds whose heartbeat is this transaction's now(), found through the heartbeat partial index).
-- This lets a transition be sent as one pipelined batch: BEGIN, the transition, this call, COMMIT.
CREATE OR REPLACE FUNCTION docqueue_bubble_after(kind text, worker text, ids uuid[])
RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    page_ids uuid[];
    document_ids uuid[];
BEGIN
    -- separate statements per case, so each one is planned on its own index (an OR of both would scan)
    IF kind = 'ocr_document' THEN
        RETURN;  -- the expansion task writes the document's own status
    ELSIF kind = 'ocr_page' THEN
        IF ids IS NULL THEN
            SELECT array_agg(DISTINCT p.document_id) INTO document_ids FROM task_queue_page p
            WHERE p.ocr_status = 'processing' AND p.ocr_last_heartbeat = now()
              AND p.ocr_worker_id = worker;
        ELSE
            SELECT array_agg(DISTINCT p.document_id) INTO document_ids FROM task_queue_page p WHERE p.id = ANY(ids);
        END IF;
        PERFORM docqueue_bubble('ocr', NULL, document_ids);
    ELSIF kind = 'vector_page' THEN
        IF ids IS NULL THEN
            SELECT array_agg(DISTINCT p.document_id) INTO document_ids FROM task_queue_page p
            WHERE p.vector_status = 'processing' AND p.vector_last_heartbeat = now()
              AND p.vector_worker_id = worker AND p.chunked_at IS NULL;
        ELSE
            SELECT array_agg(DISTINCT p.document_id) INTO document_ids FROM task_queue_page p WHERE p.id = ANY(ids);
        END IF;
        PERFORM docqueue_bubble('vector', NULL, document_ids);
    ELSIF kind = 'vector_chunk' THEN
        IF ids IS NULL THEN
            SELECT array_agg(DISTINCT c.page_id), array_agg(DISTINCT c.document_id) INTO page_ids, document_ids FROM task_queue_chunk c
            WHERE c.vector_status = 'processing' AND c.vector_last_heartbeat = now()
              AND c.vector_worker_id = worker;
        ELSE
            SELECT array_agg(DISTINCT c.page_id), array_agg(DISTINCT c.document_id) INTO page_ids, document_ids FROM task_queue_chunk c WHERE c.id = ANY(ids);
        END IF;
        PERFORM docqueue_bubble('vector', page_ids, document_ids);
    ELSIF kind = 'graphrag_chunk' THEN
        IF ids IS NULL THEN
            SELECT array_agg(DISTINCT c.page_id), array_agg(DISTINCT c.document_id) INTO page_ids, document_ids FROM task_queue_chunk c
            WHERE c.graphrag_status = 'processing' AND c.graphrag_last_heartbeat = now()
              AND c.graphrag_worker_id = worker;
        ELSE
            SELECT array_agg(DISTINCT c.page_id), array_agg(DISTINCT c.document_id) INTO page_ids, document_ids FROM task_queue_chunk c WHERE c.id = ANY(ids);
        END IF;
        PERFORM docqueue_bubble('graphrag', page_ids, document_ids);
    ELSE
        RAISE EXCEPTION 'unknown task kind %', kind;
    END IF;
END
$fn$;
