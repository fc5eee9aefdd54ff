-- Faster bubble-up with the same rule in one place:
--   docqueue_status_rule(): the seed's four rules over child counts (the aggregate's final function uses it too);
--   docqueue_bubble(): static statements per phase instead of dynamic SQL, so PL/pgSQL caches their plans
--   (planning the dynamic version cost more than executing it), and built-in count(*) FILTER aggregates.
CREATE OR REPLACE FUNCTION docqueue_status_rule(processing bigint, pending bigint, failed bigint, total bigint)
RETURNS task_status
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (CASE WHEN total = 0 THEN NULL
                 WHEN processing > 0 THEN 'processing'
                 WHEN pending > 0 THEN 'pending'
                 WHEN failed = 0 THEN 'completed'
                 ELSE 'failed' END)::task_status
$$;

CREATE OR REPLACE FUNCTION docqueue_rollup_final(state integer) RETURNS task_status
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT docqueue_status_rule(state & 1, state & 2, state & 4, state)
$$;

CREATE OR REPLACE FUNCTION docqueue_bubble(phase text, page_ids uuid[], document_ids uuid[])
RETURNS TABLE(level text, id uuid, old_status task_status, new_status task_status)
LANGUAGE plpgsql AS $fn$
BEGIN
    IF phase NOT IN ('ocr', 'vector', 'graphrag') THEN
        RAISE EXCEPTION 'unknown phase %', phase;
    END IF;
    IF phase <> 'ocr' AND COALESCE(cardinality(page_ids), 0) > 0 THEN
        PERFORM 1 FROM task_queue_page p WHERE p.id = ANY(page_ids) ORDER BY p.id FOR UPDATE;
        IF phase = 'vector' THEN
            RETURN QUERY
            WITH computed AS (
                SELECT p.id, p.vector_status AS old,
                       COALESCE((SELECT docqueue_status_rule(count(*) FILTER (WHERE c.vector_status = 'processing'),
                                                             count(*) FILTER (WHERE c.vector_status = 'pending'),
                                                             count(*) FILTER (WHERE c.vector_status = 'failed'), count(*))
                                 FROM task_queue_chunk c WHERE c.page_id = p.id), 'completed') AS new
                FROM task_queue_page p WHERE p.id = ANY(page_ids) AND p.chunked_at IS NOT NULL
            )
            UPDATE task_queue_page p
            SET vector_status = computed.new,
                vector_started_at = COALESCE(p.vector_started_at, CASE WHEN computed.new = 'processing' THEN now() END),
                vector_completed_at = CASE WHEN computed.new = 'completed' THEN now() END,
                vector_error = CASE WHEN computed.new = 'failed' THEN (
                        SELECT 'chunk ' || c.chunk_index || ': ' || c.vector_error FROM task_queue_chunk c
                        WHERE c.page_id = p.id AND c.vector_status = 'failed' ORDER BY c.chunk_index LIMIT 1)
                    ELSE p.vector_error END,
                updated_at = now()
            FROM computed
            WHERE p.id = computed.id AND p.vector_status IS DISTINCT FROM computed.new
            RETURNING 'page'::text, p.id, computed.old, computed.new;
        ELSE
            RETURN QUERY
            WITH computed AS (
                SELECT p.id, p.graphrag_status AS old,
                       COALESCE((SELECT docqueue_status_rule(count(*) FILTER (WHERE c.graphrag_status = 'processing'),
                                                             count(*) FILTER (WHERE c.graphrag_status = 'pending'),
                                                             count(*) FILTER (WHERE c.graphrag_status = 'failed'), count(*))
                                 FROM task_queue_chunk c WHERE c.page_id = p.id), 'completed') AS new
                FROM task_queue_page p WHERE p.id = ANY(page_ids) AND p.chunked_at IS NOT NULL
            )
            UPDATE task_queue_page p
            SET graphrag_status = computed.new,
                graphrag_started_at = COALESCE(p.graphrag_started_at, CASE WHEN computed.new = 'processing' THEN now() END),
                graphrag_completed_at = CASE WHEN computed.new = 'completed' THEN now() END,
                graphrag_error = CASE WHEN computed.new = 'failed' THEN (
                        SELECT 'chunk ' || c.chunk_index || ': ' || c.graphrag_error FROM task_queue_chunk c
                        WHERE c.page_id = p.id AND c.graphrag_status = 'failed' ORDER BY c.chunk_index LIMIT 1)
                    ELSE p.graphrag_error END,
                updated_at = now()
            FROM computed
            WHERE p.id = computed.id AND p.graphrag_status IS DISTINCT FROM computed.new
            RETURNING 'page'::text, p.id, computed.old, computed.new;
        END IF;
    END IF;
    IF COALESCE(cardinality(document_ids), 0) > 0 THEN
        PERFORM 1 FROM documents d WHERE d.id = ANY(document_ids) ORDER BY d.id FOR UPDATE;
        IF phase = 'ocr' THEN
            RETURN QUERY
            WITH computed AS (
                SELECT d.id, d.ocr_status AS old,
                       (SELECT docqueue_status_rule(count(*) FILTER (WHERE pg.ocr_status = 'processing'),
                                                    count(*) FILTER (WHERE pg.ocr_status = 'pending'),
                                                    count(*) FILTER (WHERE pg.ocr_status = 'failed'), count(*))
                        FROM task_queue_page pg WHERE pg.document_id = d.id) AS new
                FROM documents d WHERE d.id = ANY(document_ids) AND d.pages_created_at IS NOT NULL
            )
            UPDATE documents d
            SET ocr_status = computed.new,
                ocr_started_at = COALESCE(d.ocr_started_at, CASE WHEN computed.new = 'processing' THEN now() END),
                ocr_completed_at = CASE WHEN computed.new = 'completed' THEN now() END,
                ocr_error = CASE WHEN computed.new = 'failed' THEN (
                        SELECT 'page ' || pg.page_number || ': ' || pg.ocr_error FROM task_queue_page pg
                        WHERE pg.document_id = d.id AND pg.ocr_status = 'failed' ORDER BY pg.page_number LIMIT 1)
                    ELSE d.ocr_error END,
                updated_at = now()
            FROM computed
            WHERE d.id = computed.id AND computed.new IS NOT NULL AND d.ocr_status IS DISTINCT FROM computed.new
            RETURNING 'document'::text, d.id, computed.old, computed.new;
        ELSIF phase = 'vector' THEN
            RETURN QUERY
            WITH computed AS (
                SELECT d.id, d.vector_index_status AS old,
                       (SELECT docqueue_status_rule(count(*) FILTER (WHERE pg.vector_status = 'processing'),
                                                    count(*) FILTER (WHERE pg.vector_status = 'pending'),
                                                    count(*) FILTER (WHERE pg.vector_status = 'failed'), count(*))
                        FROM task_queue_page pg WHERE pg.document_id = d.id) AS new
                FROM documents d WHERE d.id = ANY(document_ids) AND d.pages_created_at IS NOT NULL
            )
            UPDATE documents d
            SET vector_index_status = computed.new,
                vector_started_at = COALESCE(d.vector_started_at, CASE WHEN computed.new = 'processing' THEN now() END),
                vector_completed_at = CASE WHEN computed.new = 'completed' THEN now() END,
                vector_error = CASE WHEN computed.new = 'failed' THEN (
                        SELECT 'page ' || pg.page_number || ': ' || pg.vector_error FROM task_queue_page pg
                        WHERE pg.document_id = d.id AND pg.vector_status = 'failed' ORDER BY pg.page_number LIMIT 1)
                    ELSE d.vector_error END,
                updated_at = now()
            FROM computed
            WHERE d.id = computed.id AND computed.new IS NOT NULL AND d.vector_index_status IS DISTINCT FROM computed.new
            RETURNING 'document'::text, d.id, computed.old, computed.new;
        ELSE
            RETURN QUERY
            WITH computed AS (
                SELECT d.id, d.graphrag_index_status AS old,
                       (SELECT docqueue_status_rule(count(*) FILTER (WHERE pg.graphrag_status = 'processing'),
                                                    count(*) FILTER (WHERE pg.graphrag_status = 'pending'),
                                                    count(*) FILTER (WHERE pg.graphrag_status = 'failed'), count(*))
                        FROM task_queue_page pg WHERE pg.document_id = d.id) AS new
                FROM documents d WHERE d.id = ANY(document_ids) AND d.pages_created_at IS NOT NULL
            )
            UPDATE documents d
            SET graphrag_index_status = computed.new,
                graphrag_started_at = COALESCE(d.graphrag_started_at, CASE WHEN computed.new = 'processing' THEN now() END),
                graphrag_completed_at = CASE WHEN computed.new = 'completed' THEN now() END,
                graphrag_error = CASE WHEN computed.new = 'failed' THEN (
                        SELECT 'page ' || pg.page_number || ': ' || pg.graphrag_error FROM task_queue_page pg
                        WHERE pg.document_id = d.id AND pg.graphrag_status = 'failed' ORDER BY pg.page_number LIMIT 1)
                    ELSE d.graphrag_error END,
                updated_at = now()
            FROM computed
            WHERE d.id = computed.id AND computed.new IS NOT NULL AND d.graphrag_index_status IS DISTINCT FROM computed.new
            RETURNING 'document'::text, d.id, computed.old, computed.new;
        END IF;
    END IF;
END
$fn$;
