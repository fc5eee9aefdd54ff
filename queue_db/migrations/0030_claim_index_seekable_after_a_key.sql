-- A claim may start after the last task its process claimed instead of at the head of the claim index
-- (queue_db.transitions: the claim cursor). While a session holds an old snapshot, no index entry of a task
-- claimed or completed since can be marked dead, so a claim from the head walks every one of them, visiting the
-- heap for each; a row comparison over the index's columns seeks past them. For that the columns all ascend (the
-- priority is negated: a row comparison cannot mix directions) and end in the id, so that the key is unique and a
-- seek lands exactly after the last task claimed, also among the many tasks created in one transaction, which
-- share their created_at. Before the id, a page's or chunk's parent id and its number under the parent keep the
-- rows as their insertion did, parent by parent: a batch claims one parent's rows together (its bubble-up updates
-- few parents) and a walk over them reads the table's pages in order. The order is otherwise the same: highest
-- priority first, then failed rows, fewest retries, oldest.
DROP INDEX IF EXISTS idx_documents_expand_claim;
CREATE INDEX idx_documents_expand_claim ON documents
    ((-priority), (CASE WHEN ocr_status = 'failed' THEN 0 ELSE 1 END), retry_count, created_at, id)
    WHERE pages_created_at IS NULL AND (ocr_status = 'pending' OR (ocr_status = 'failed' AND retry_count < max_retries));

DROP INDEX IF EXISTS idx_tqp_ocr_claim;
CREATE INDEX idx_tqp_ocr_claim ON task_queue_page
    ((-priority), (CASE WHEN ocr_status = 'failed' THEN 0 ELSE 1 END), ocr_retry_count, created_at, document_id, page_number, id)
    WHERE ocr_status = 'pending' OR (ocr_status = 'failed' AND ocr_retry_count < max_retries);

DROP INDEX IF EXISTS idx_tqp_vector_claim;
CREATE INDEX idx_tqp_vector_claim ON task_queue_page
    ((-priority), (CASE WHEN vector_status = 'failed' THEN 0 ELSE 1 END), vector_retry_count, created_at, document_id, page_number, id)
    WHERE chunked_at IS NULL AND ocr_status = 'completed'
      AND (vector_status = 'pending' OR (vector_status = 'failed' AND vector_retry_count < max_retries));

DROP INDEX IF EXISTS idx_tqc_vector_claim;
CREATE INDEX idx_tqc_vector_claim ON task_queue_chunk
    ((-priority), (CASE WHEN vector_status = 'failed' THEN 0 ELSE 1 END), vector_retry_count, created_at, page_id, chunk_index, id)
    WHERE vector_status = 'pending' OR (vector_status = 'failed' AND vector_retry_count < max_retries);

DROP INDEX IF EXISTS idx_tqc_graphrag_claim;
CREATE INDEX idx_tqc_graphrag_claim ON task_queue_chunk
    ((-priority), (CASE WHEN graphrag_status = 'failed' THEN 0 ELSE 1 END), graphrag_retry_count, created_at, page_id, chunk_index, id)
    WHERE vector_status = 'completed'
      AND (graphrag_status = 'pending' OR (graphrag_status = 'failed' AND graphrag_retry_count < max_retries));
