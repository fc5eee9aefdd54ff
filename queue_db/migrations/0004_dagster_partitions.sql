-- Where each task sits among its level's Dagster dynamic partitions. Partitions are registered in blocks: one
-- add call per block, keys in (page, chunk) order, so positions block/pos are contiguous in Dagster's own
-- insertion order and a run over positions [a, b] of one block is exactly a Dagster partition range.
-- Roll-up times record when a document's phase roll-up was materialized.
CREATE SEQUENCE IF NOT EXISTS docqueue_partition_block_seq;

ALTER TABLE documents
ADD COLUMN IF NOT EXISTS partition_block BIGINT,
ADD COLUMN IF NOT EXISTS partition_pos INTEGER,
ADD COLUMN IF NOT EXISTS ocr_rollup_at TIMESTAMP WITH TIME ZONE,
ADD COLUMN IF NOT EXISTS vector_rollup_at TIMESTAMP WITH TIME ZONE,
ADD COLUMN IF NOT EXISTS graphrag_rollup_at TIMESTAMP WITH TIME ZONE;
ALTER TABLE task_queue_page
ADD COLUMN IF NOT EXISTS partition_block BIGINT,
ADD COLUMN IF NOT EXISTS partition_pos INTEGER;
ALTER TABLE task_queue_chunk
ADD COLUMN IF NOT EXISTS partition_block BIGINT,
ADD COLUMN IF NOT EXISTS partition_pos INTEGER;

CREATE INDEX IF NOT EXISTS idx_documents_unregistered ON documents(created_at) WHERE partition_block IS NULL;
CREATE INDEX IF NOT EXISTS idx_tqp_unregistered ON task_queue_page(created_at) WHERE partition_block IS NULL;
CREATE INDEX IF NOT EXISTS idx_tqc_unregistered ON task_queue_chunk(created_at) WHERE partition_block IS NULL;
CREATE INDEX IF NOT EXISTS idx_tqp_partition ON task_queue_page(partition_block, partition_pos);
CREATE INDEX IF NOT EXISTS idx_tqc_partition ON task_queue_chunk(partition_block, partition_pos);
