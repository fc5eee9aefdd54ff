-- Cheaper bubble-up, same rule (docqueue_status_rule) in the same place, and one pass per transaction:
--  * the per-parent count runs once: `computed` is referenced by several SET expressions, and an inlined CTE
--    re-ran the count over the children for each of them (five counts per parent, measured with auto_explain);
--  * a claimed child is `processing`, so by the rule its parent is processing whatever its other children are:
--    parents of claimed rows are set without a count; only parents with settled children and no claimed ones
--    are recounted;
--  * the changed pages' documents are looked up by primary key (the join on a function scan was planned as a
--    hash join over a sequential scan of every page);
--  * one bubble-up pass for everything a transaction did to one task kind: the rows it settled (completed or
--    failed: `ids`) and the rows it claimed (found by worker and heartbeat = now()). A worker can then settle a
--    batch and claim the next one in a single transaction (TaskQueue.settle) while parents are still locked
--    once, pages before documents, each level in id order: two passes (one for the settled rows, one for the
--    claimed) would lock pages, then documents, then pages again, which deadlocks against another worker doing
--    the same.
--
-- Parents are locked FOR NO KEY UPDATE (was FOR UPDATE): bubble-ups still exclude each other, but no longer
-- conflict with the KEY SHARE lock a foreign-key check takes on a parent. That check runs when a transaction
-- updates a child row a second time (a task failed and, its back-off being zero, claimed again in the same
-- settle) and took the parent out of the pages-then-documents order: a deadlock. It also let chunk inserts
-- wait for a bubble-up of their page for nothing.

CREATE OR REPLACE FUNCTION docqueue_bubble(phase text, page_ids uuid[], document_ids uuid[])
RETURNS TABLE(level text, id uuid, old_status task_status, new_status task_status)
LANGUAGE plpgsql AS $fn$
BEGIN
    IF phase NOT IN ('ocr', 'vector', 'graphrag') THEN
        RAISE EXCEPTION 'unknown phase %', phase;
    END IF;
    IF phase <> 'ocr' AND COALESCE(cardinality(page_ids), 0) > 0 THEN
        PERFORM 1 FROM task_queue_page p WHERE p.id = ANY(page_ids) ORDER BY p.id FOR NO KEY UPDATE;
        IF phase = 'vector' THEN
            RETURN QUERY
            WITH computed AS MATERIALIZED (
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
            WITH computed AS MATERIALIZED (
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
        PERFORM 1 FROM documents d WHERE d.id = ANY(document_ids) ORDER BY d.id FOR NO KEY UPDATE;
        IF phase = 'ocr' THEN
            RETURN QUERY
            WITH computed AS MATERIALIZED (
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
            WITH computed AS MATERIALIZED (
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
            WITH computed AS MATERIALIZED (
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

-- Pages of `phase` (vector or graphrag): returns the documents of the pages whose status changed.
CREATE OR REPLACE FUNCTION docqueue_bubble_pages(phase text, settled uuid[], claimed uuid[])
RETURNS uuid[]
LANGUAGE plpgsql AS $fn$
DECLARE
    processing CONSTANT task_status := docqueue_status_rule(1, 0, 0, 1);
    settled_only uuid[];
    changed uuid[];
    recounted uuid[];
BEGIN
    settled := COALESCE(settled, '{}');
    claimed := COALESCE(claimed, '{}');
    IF cardinality(settled) + cardinality(claimed) = 0 THEN
        RETURN NULL;
    END IF;
    PERFORM 1 FROM task_queue_page p WHERE p.id = ANY(settled || claimed) ORDER BY p.id FOR NO KEY UPDATE;
    IF cardinality(claimed) > 0 THEN
        IF phase = 'vector' THEN
            WITH done AS (
                UPDATE task_queue_page p
                SET vector_status = processing, vector_started_at = COALESCE(p.vector_started_at, now()),
                    vector_completed_at = NULL, updated_at = now()
                WHERE p.id = ANY(claimed) AND p.chunked_at IS NOT NULL AND p.vector_status IS DISTINCT FROM processing
                RETURNING p.document_id)
            SELECT array_agg(DISTINCT document_id) INTO changed FROM done;
        ELSE
            WITH done AS (
                UPDATE task_queue_page p
                SET graphrag_status = processing, graphrag_started_at = COALESCE(p.graphrag_started_at, now()),
                    graphrag_completed_at = NULL, updated_at = now()
                WHERE p.id = ANY(claimed) AND p.chunked_at IS NOT NULL AND p.graphrag_status IS DISTINCT FROM processing
                RETURNING p.document_id)
            SELECT array_agg(DISTINCT document_id) INTO changed FROM done;
        END IF;
    END IF;
    SELECT array_agg(DISTINCT s) INTO settled_only FROM unnest(settled) s WHERE NOT (s = ANY(claimed));
    IF settled_only IS NOT NULL THEN
        SELECT array_agg(b.id) INTO recounted FROM docqueue_bubble(phase, settled_only, NULL) b WHERE b.level = 'page';
        IF recounted IS NOT NULL THEN
            changed := COALESCE(changed, '{}') || ARRAY(SELECT DISTINCT p.document_id FROM task_queue_page p
                                                        WHERE p.id = ANY(recounted));
        END IF;
    END IF;
    RETURN changed;
END
$fn$;

-- Documents of `phase`: claimed ones (a page of theirs was claimed) become processing, settled ones are recounted.
CREATE OR REPLACE FUNCTION docqueue_bubble_documents(phase text, settled uuid[], claimed uuid[])
RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    processing CONSTANT task_status := docqueue_status_rule(1, 0, 0, 1);
    settled_only uuid[];
BEGIN
    settled := COALESCE(settled, '{}');
    claimed := COALESCE(claimed, '{}');
    IF cardinality(settled) + cardinality(claimed) = 0 THEN
        RETURN;
    END IF;
    PERFORM 1 FROM documents d WHERE d.id = ANY(settled || claimed) ORDER BY d.id FOR NO KEY UPDATE;
    IF cardinality(claimed) > 0 THEN
        IF phase = 'ocr' THEN
            UPDATE documents d SET ocr_status = processing, ocr_started_at = COALESCE(d.ocr_started_at, now()),
                                   ocr_completed_at = NULL, updated_at = now()
            WHERE d.id = ANY(claimed) AND d.pages_created_at IS NOT NULL AND d.ocr_status IS DISTINCT FROM processing;
        ELSIF phase = 'vector' THEN
            UPDATE documents d SET vector_index_status = processing,
                                   vector_started_at = COALESCE(d.vector_started_at, now()),
                                   vector_completed_at = NULL, updated_at = now()
            WHERE d.id = ANY(claimed) AND d.pages_created_at IS NOT NULL
              AND d.vector_index_status IS DISTINCT FROM processing;
        ELSE
            UPDATE documents d SET graphrag_index_status = processing,
                                   graphrag_started_at = COALESCE(d.graphrag_started_at, now()),
                                   graphrag_completed_at = NULL, updated_at = now()
            WHERE d.id = ANY(claimed) AND d.pages_created_at IS NOT NULL
              AND d.graphrag_index_status IS DISTINCT FROM processing;
        END IF;
    END IF;
    SELECT array_agg(DISTINCT s) INTO settled_only FROM unnest(settled) s WHERE NOT (s = ANY(claimed));
    IF settled_only IS NOT NULL THEN
        PERFORM docqueue_bubble(phase, NULL, settled_only);
    END IF;
END
$fn$;

CREATE OR REPLACE FUNCTION docqueue_bubble_after(kind text, worker text, ids uuid[])
RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    settled_pages uuid[];
    claimed_pages uuid[];
    settled_documents uuid[];
    claimed_documents uuid[];
BEGIN
    -- separate statements per kind, so each one is planned on its own index (an OR of them would scan)
    IF kind = 'ocr_document' THEN
        RETURN;  -- the expansion task writes the document's own status
    ELSIF kind = 'ocr_page' THEN
        SELECT array_agg(DISTINCT p.document_id) INTO settled_documents FROM task_queue_page p WHERE p.id = ANY(ids);
        SELECT array_agg(DISTINCT p.document_id) INTO claimed_documents FROM task_queue_page p
        WHERE p.ocr_status = 'processing' AND p.ocr_last_heartbeat = now() AND p.ocr_worker_id = worker;
        PERFORM docqueue_bubble_documents('ocr', settled_documents, claimed_documents);
    ELSIF kind = 'vector_page' THEN
        SELECT array_agg(DISTINCT p.document_id) INTO settled_documents FROM task_queue_page p WHERE p.id = ANY(ids);
        SELECT array_agg(DISTINCT p.document_id) INTO claimed_documents FROM task_queue_page p
        WHERE p.vector_status = 'processing' AND p.vector_last_heartbeat = now()
          AND p.vector_worker_id = worker AND p.chunked_at IS NULL;
        PERFORM docqueue_bubble_documents('vector', settled_documents, claimed_documents);
    ELSIF kind = 'vector_chunk' THEN
        SELECT array_agg(DISTINCT c.page_id) INTO settled_pages FROM task_queue_chunk c WHERE c.id = ANY(ids);
        SELECT array_agg(DISTINCT c.page_id) INTO claimed_pages FROM task_queue_chunk c
        WHERE c.vector_status = 'processing' AND c.vector_last_heartbeat = now() AND c.vector_worker_id = worker;
        PERFORM docqueue_bubble(
            'vector', NULL, docqueue_bubble_pages('vector', settled_pages, claimed_pages));
    ELSIF kind = 'graphrag_chunk' THEN
        SELECT array_agg(DISTINCT c.page_id) INTO settled_pages FROM task_queue_chunk c WHERE c.id = ANY(ids);
        SELECT array_agg(DISTINCT c.page_id) INTO claimed_pages FROM task_queue_chunk c
        WHERE c.graphrag_status = 'processing' AND c.graphrag_last_heartbeat = now() AND c.graphrag_worker_id = worker;
        PERFORM docqueue_bubble(
            'graphrag', NULL, docqueue_bubble_pages('graphrag', settled_pages, claimed_pages));
    ELSE
        RAISE EXCEPTION 'unknown task kind %', kind;
    END IF;
END
$fn$;


-- superseded by docqueue_bubble_pages (migration 0008's documents-only-when-a-page-changed rule lives there)
DROP FUNCTION IF EXISTS docqueue_bubble_chunks(text, uuid[]);

-- Generic plans for the bubble-up statements: with custom plans PostgreSQL re-planned them on every call (their
-- parameters are arrays of ids), and planning cost more than executing (measured: bubble after a completion
-- 1.8 -> 1.05 ms per batch of 50). Their parameters are id arrays probed through primary keys and the
-- parent-id indexes, so one plan fits every call.
ALTER FUNCTION docqueue_bubble(text, uuid[], uuid[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION docqueue_bubble_pages(text, uuid[], uuid[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION docqueue_bubble_documents(text, uuid[], uuid[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION docqueue_bubble_after(text, text, uuid[]) SET plan_cache_mode = force_generic_plan;
