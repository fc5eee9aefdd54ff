-- A legacy document marked converted without its page details (ocr_details) has OCR completed and no pages, so no
-- later phase can ever start for it. It fails instead, saying what to do; an operator retry then asks for the file,
-- which the legacy schema never stored.
UPDATE documents d
SET ocr_status = 'failed', ocr_error_class = 'legacy', ocr_failed_at = now(), updated_at = now(),
    ocr_error = 'legacy: converted in the old schema without its page details (ocr_details); re-ingest the original file',
    next_attempt_at = '9999-12-31T00:00:00Z'
WHERE d.ocr_status = 'completed' AND d.pages_created_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM task_queue_page p WHERE p.document_id = d.id);
