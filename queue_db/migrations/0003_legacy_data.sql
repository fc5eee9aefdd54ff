-- Phase 2 of the seed's migration path: carry a legacy database's progress into the new columns and tables.
-- On a fresh database every block below finds no legacy column and does nothing.
--
-- Legacy shape handled (the seed names the columns but not their contents; this is the contract we assume):
--   documents.convert_status  'converted' when OCR finished
--   documents.index_status    'indexed' when vector and graph indexing finished
--   documents.ocr_details      JSONB {"pages": [{"page_number": 1, "page_file_path": "..."}, ...]}
--   documents.indexing_details JSONB {"chunks": [{"page_number": 1, "chunk_index": 0, "chunk_id": "...",
--                                                "content_hash": "..."}, ...]}
-- The legacy `task_queue` table is left untouched (seed Phase 1: kept for backward compatibility).

DO $$
DECLARE
    has_convert boolean;
    has_index boolean;
    has_ocr_details boolean;
    has_indexing_details boolean;
BEGIN
    SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema()
                   AND table_name = 'documents' AND column_name = 'convert_status') INTO has_convert;
    SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema()
                   AND table_name = 'documents' AND column_name = 'index_status') INTO has_index;
    SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema()
                   AND table_name = 'documents' AND column_name = 'ocr_details') INTO has_ocr_details;
    SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema()
                   AND table_name = 'documents' AND column_name = 'indexing_details') INTO has_indexing_details;

    IF has_convert THEN
        EXECUTE $q$ UPDATE documents SET ocr_status = 'completed', ocr_completed_at = COALESCE(ocr_completed_at, NOW())
                    WHERE convert_status::text = 'converted' $q$;
    END IF;
    IF has_index THEN
        EXECUTE $q$ UPDATE documents SET vector_index_status = 'completed', graphrag_index_status = 'completed',
                           vector_completed_at = COALESCE(vector_completed_at, NOW()),
                           graphrag_completed_at = COALESCE(graphrag_completed_at, NOW())
                    WHERE index_status::text = 'indexed' $q$;
    END IF;

    IF has_ocr_details THEN
        EXECUTE $q$
            INSERT INTO task_queue_page (document_id, page_number, page_file_path, ocr_status, ocr_completed_at)
            SELECT d.id, (p->>'page_number')::int, p->>'page_file_path', 'completed', NOW()
            FROM documents d, jsonb_array_elements(COALESCE(d.ocr_details::jsonb->'pages', '[]'::jsonb)) p
            WHERE d.ocr_status = 'completed'
            ON CONFLICT (document_id, page_number) DO NOTHING $q$;
        EXECUTE $q$
            UPDATE documents d SET page_count = s.n, pages_created_at = COALESCE(d.pages_created_at, NOW())
            FROM (SELECT document_id, count(*) AS n FROM task_queue_page GROUP BY document_id) s
            WHERE s.document_id = d.id AND d.pages_created_at IS NULL $q$;
    END IF;

    IF has_indexing_details THEN
        EXECUTE $q$
            INSERT INTO task_queue_chunk (page_id, document_id, chunk_id, chunk_index, chunk_content_hash,
                                          vector_status, vector_completed_at, graphrag_status, graphrag_completed_at)
            SELECT p.id, d.id, c->>'chunk_id', (c->>'chunk_index')::int, c->>'content_hash',
                   'completed', NOW(), 'completed', NOW()
            FROM documents d
            CROSS JOIN LATERAL jsonb_array_elements(COALESCE(d.indexing_details::jsonb->'chunks', '[]'::jsonb)) c
            JOIN task_queue_page p ON p.document_id = d.id AND p.page_number = (c->>'page_number')::int
            WHERE d.vector_index_status = 'completed'
            ON CONFLICT DO NOTHING $q$;
        -- pages of indexed documents are chunked; their phase status follows their chunks (none -> completed)
        EXECUTE $q$
            UPDATE task_queue_page p
            SET chunked_at = NOW(),
                chunk_count = (SELECT count(*) FROM task_queue_chunk c WHERE c.page_id = p.id),
                vector_status = COALESCE((SELECT docqueue_rollup(c.vector_status) FROM task_queue_chunk c WHERE c.page_id = p.id), 'completed'),
                graphrag_status = COALESCE((SELECT docqueue_rollup(c.graphrag_status) FROM task_queue_chunk c WHERE c.page_id = p.id), 'completed')
            FROM documents d
            WHERE d.id = p.document_id AND d.vector_index_status = 'completed' AND p.chunked_at IS NULL $q$;
    END IF;
END $$;

-- every document needs a stable, comma-free key for its Dagster partition
UPDATE documents
SET document_key = left(trim(both '-' from regexp_replace(lower(regexp_replace(filename, '\.[^.]*$', '')), '[^a-z0-9]+', '-', 'g')), 60)
                   || '-' || left(replace(id::text, '-', ''), 8)
WHERE document_key IS NULL;
