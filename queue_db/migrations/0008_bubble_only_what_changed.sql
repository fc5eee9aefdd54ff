-- A document's status depends only on its pages' statuses. When a chunk transition leaves every page's status
-- as it was (the common case: a page stays `processing` while its other chunks run), nothing can change for
-- the document, so its row is neither locked nor recomputed. The argument that keeps parents right under
-- concurrency is unchanged: every transaction that changes a page recomputes that page's document under the
-- document's lock, so the last one to change any page sees them all.
CREATE OR REPLACE FUNCTION docqueue_bubble_chunks(phase text, page_ids uuid[])
RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    document_ids uuid[];
BEGIN
    SELECT array_agg(DISTINCT p.document_id) INTO document_ids
    FROM docqueue_bubble(phase, page_ids, NULL) changed
    JOIN task_queue_page p ON p.id = changed.id
    WHERE changed.level = 'page';
    IF document_ids IS NOT NULL THEN
        PERFORM docqueue_bubble(phase, NULL, document_ids);
    END IF;
END
$fn$;

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
            WHERE p.ocr_status = 'processing' AND p.ocr_last_heartbeat = now() AND p.ocr_worker_id = worker;
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
            SELECT array_agg(DISTINCT c.page_id) INTO page_ids FROM task_queue_chunk c
            WHERE c.vector_status = 'processing' AND c.vector_last_heartbeat = now() AND c.vector_worker_id = worker;
        ELSE
            SELECT array_agg(DISTINCT c.page_id) INTO page_ids FROM task_queue_chunk c WHERE c.id = ANY(ids);
        END IF;
        PERFORM docqueue_bubble_chunks('vector', page_ids);
    ELSIF kind = 'graphrag_chunk' THEN
        IF ids IS NULL THEN
            SELECT array_agg(DISTINCT c.page_id) INTO page_ids FROM task_queue_chunk c
            WHERE c.graphrag_status = 'processing' AND c.graphrag_last_heartbeat = now() AND c.graphrag_worker_id = worker;
        ELSE
            SELECT array_agg(DISTINCT c.page_id) INTO page_ids FROM task_queue_chunk c WHERE c.id = ANY(ids);
        END IF;
        PERFORM docqueue_bubble_chunks('graphrag', page_ids);
    ELSE
        RAISE EXCEPTION 'unknown task kind %', kind;
    END IF;
END
$fn$;
