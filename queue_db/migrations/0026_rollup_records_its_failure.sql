-- A roll-up records the failure it wrote (`<phase>_rollup_error`, the phase's error, or 'failed' without one;
-- NULL after a completed roll-up). A phase that fails again with the same error is no news: the roll-up sensors
-- mark it rolled up without a run (queue_db.partition_keys.settle_known_failures), so a document that can never
-- succeed fails its roll-up once, not after every retry or backfill.
ALTER TABLE documents
    ADD COLUMN IF NOT EXISTS ocr_rollup_error TEXT,
    ADD COLUMN IF NOT EXISTS vector_rollup_error TEXT,
    ADD COLUMN IF NOT EXISTS graphrag_rollup_error TEXT;
