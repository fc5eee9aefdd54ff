-- Partition retention: Dagster resolves a ranged run's keys by loading every key of its dynamic partitions
-- definition, so a run's fixed cost grows with the partitions ever registered (2.0 s per run at a million chunk
-- keys). The retention job (orchestration/retention.py) deletes the Dagster partitions of page and chunk tasks
-- whose phases all completed long enough ago, and stamps partition_retired_at; the queue rows stay.
ALTER TABLE task_queue_page ADD COLUMN IF NOT EXISTS partition_retired_at TIMESTAMPTZ;
ALTER TABLE task_queue_chunk ADD COLUMN IF NOT EXISTS partition_retired_at TIMESTAMPTZ;

-- The live completed partitions, oldest first: the retention job reads a batch from the old end, and the
-- max-completed rule counts from the new end. Failed and pending rows are never in them (they stay backfillable).
CREATE INDEX IF NOT EXISTS idx_tqc_retirable ON task_queue_chunk (GREATEST(vector_completed_at, graphrag_completed_at))
    WHERE vector_status = 'completed' AND graphrag_status = 'completed'
      AND partition_block IS NOT NULL AND partition_retired_at IS NULL;
CREATE INDEX IF NOT EXISTS idx_tqp_retirable
    ON task_queue_page (GREATEST(ocr_completed_at, vector_completed_at, graphrag_completed_at))
    WHERE ocr_status = 'completed' AND vector_status = 'completed' AND graphrag_status = 'completed'
      AND partition_block IS NOT NULL AND partition_retired_at IS NULL;

-- A retired task put back to work (retry, reindex, nightly repair, requeue) needs its partition again: forgetting
-- its block makes the sensors register its key anew (idx_*_unregistered), at the end of Dagster's key order.
-- The WHEN clause keeps the trigger function off every other update.
CREATE OR REPLACE FUNCTION docqueue_unretire_partition() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    NEW.partition_retired_at := NULL;
    NEW.partition_block := NULL;
    NEW.partition_pos := NULL;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS trg_tqc_unretire ON task_queue_chunk;
CREATE TRIGGER trg_tqc_unretire BEFORE UPDATE ON task_queue_chunk FOR EACH ROW
    WHEN (NEW.partition_retired_at IS NOT NULL
          AND (NEW.vector_status <> 'completed' OR NEW.graphrag_status <> 'completed'))
    EXECUTE FUNCTION docqueue_unretire_partition();

DROP TRIGGER IF EXISTS trg_tqp_unretire ON task_queue_page;
CREATE TRIGGER trg_tqp_unretire BEFORE UPDATE ON task_queue_page FOR EACH ROW
    WHEN (NEW.partition_retired_at IS NOT NULL
          AND (NEW.ocr_status <> 'completed' OR NEW.vector_status <> 'completed' OR NEW.graphrag_status <> 'completed'))
    EXECUTE FUNCTION docqueue_unretire_partition();

-- The roll-up sensors' candidates (queue_db.partitions.rollup_candidates): documents whose phase reached a final
-- status since their roll-up was last written, in the sensors' order. Without these each tick of each roll-up
-- sensor read the whole documents table; with them it reads only the documents waiting for a roll-up.
CREATE INDEX IF NOT EXISTS idx_documents_ocr_rollup ON documents (priority DESC, updated_at)
    WHERE partition_block IS NOT NULL AND ocr_status IN ('completed', 'failed')
      AND (ocr_rollup_at IS NULL OR ocr_rollup_at < COALESCE(ocr_completed_at, updated_at));
CREATE INDEX IF NOT EXISTS idx_documents_vector_rollup ON documents (priority DESC, updated_at)
    WHERE partition_block IS NOT NULL AND vector_index_status IN ('completed', 'failed')
      AND (vector_rollup_at IS NULL OR vector_rollup_at < COALESCE(vector_completed_at, updated_at));
CREATE INDEX IF NOT EXISTS idx_documents_graphrag_rollup ON documents (priority DESC, updated_at)
    WHERE partition_block IS NOT NULL AND graphrag_index_status IN ('completed', 'failed')
      AND (graphrag_rollup_at IS NULL OR graphrag_rollup_at < COALESCE(graphrag_completed_at, updated_at));
