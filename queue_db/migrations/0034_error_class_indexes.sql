-- Each task kind's rows that carry an error class: the open tasks `docqueue stats` lists by class. They are a
-- handful (completion clears the class), yet reading them meant a scan of every row of the table, 0.43 s at a
-- million chunks. A row without a class has no entry, so the hot path's transitions add none.
CREATE INDEX IF NOT EXISTS idx_documents_ocr_error_class ON documents (ocr_error_class) WHERE ocr_error_class IS NOT NULL;
CREATE INDEX IF NOT EXISTS idx_tqp_ocr_error_class ON task_queue_page (ocr_error_class) WHERE ocr_error_class IS NOT NULL;
CREATE INDEX IF NOT EXISTS idx_tqp_vector_error_class ON task_queue_page (vector_error_class)
    WHERE vector_error_class IS NOT NULL;
CREATE INDEX IF NOT EXISTS idx_tqc_vector_error_class ON task_queue_chunk (vector_error_class)
    WHERE vector_error_class IS NOT NULL;
CREATE INDEX IF NOT EXISTS idx_tqc_graphrag_error_class ON task_queue_chunk (graphrag_error_class)
    WHERE graphrag_error_class IS NOT NULL;
