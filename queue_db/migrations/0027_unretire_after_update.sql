-- The unretire triggers run after the update instead of before it. A BEFORE ROW trigger makes PostgreSQL lock
-- each row it is about to update before evaluating the trigger's WHEN clause, and that lock writes a WAL record
-- of its own: every fenced completion paid one per chunk, for a clause that is false for all but retired rows
-- put back to work. An AFTER ROW trigger evaluates its WHEN clause on the new row without a lock, and only for a
-- retired row leaving `completed` does it forget the partition, in the same transaction, by a second update.
CREATE OR REPLACE FUNCTION docqueue_unretire_partition_after() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('UPDATE %I.%I SET partition_retired_at = NULL, partition_block = NULL, partition_pos = NULL '
                   'WHERE id = $1 AND partition_retired_at IS NOT NULL', TG_TABLE_SCHEMA, TG_TABLE_NAME)
        USING NEW.id;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER trg_tqc_unretire AFTER UPDATE ON task_queue_chunk FOR EACH ROW
    WHEN (NEW.partition_retired_at IS NOT NULL
          AND (NEW.vector_status <> 'completed' OR NEW.graphrag_status <> 'completed'))
    EXECUTE FUNCTION docqueue_unretire_partition_after();
COMMENT ON TRIGGER trg_tqc_unretire ON task_queue_chunk IS 'phases: vector,graphrag';

CREATE OR REPLACE TRIGGER trg_tqp_unretire AFTER UPDATE ON task_queue_page FOR EACH ROW
    WHEN (NEW.partition_retired_at IS NOT NULL
          AND (NEW.ocr_status <> 'completed' OR NEW.vector_status <> 'completed' OR NEW.graphrag_status <> 'completed'))
    EXECUTE FUNCTION docqueue_unretire_partition_after();
COMMENT ON TRIGGER trg_tqp_unretire ON task_queue_page IS 'phases: ocr,vector,graphrag';
